"""What EPL does at start-up that a user's script pays for before its first step
(``benchmarks/startup.py`` measures it on a corpus of shapes): ``epl.init`` imports
nothing the script did not (in its own process, whose imports are its own); a job of
one copy runs no extra TF run before its first step but EPL's own set-up."""
import os
import subprocess
import sys
import threading
import time

import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from epl.session import snapshot_store
from eplutil import dataset_input, make_data, mlp, initial_weights, train_step

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NEW_MODULES = r"""
import sys
import tensorflow.compat.v1 as tf
tf.disable_v2_behavior()
import epl
before = set(sys.modules)
epl.init()
print("NEW", sorted(m for m in set(sys.modules) - before if m.startswith("tensorflow.contrib")))
"""


@pytest.mark.skipif(not tf.version.VERSION.startswith("1."), reason="TF 2.x has no tf.contrib")
@pytest.mark.timeout(150)
def test_epl_init_does_not_import_tf_contrib():
    """epl.init looks for the functions it patches in every imported module; reading
    them with getattr loaded ``tf.contrib``, which TF 1.15 loads lazily (about 800
    modules, 0.3-0.4 s), in every script that never used it. (On TF 2.x, epl.init
    imports Keras, whose optimizers and models it hooks.)"""
    environ = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, "-c", NEW_MODULES], env=environ, cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("NEW ")]
    assert lines == ["NEW []"], out.stdout[-2000:]


def _one_copy_accumulation_step():
    """Gradient accumulation of 2 runs on one device, trained one run; its program."""
    epl.init(epl.Config({"pipeline.num_micro_batch": 2}), cluster=Cluster(devices_per_worker=1))
    epl.set_default_strategy(epl.replicate(1))
    x, y = make_data(16)
    train = train_step(mlp(*dataset_input(x, y, 4), weights=initial_weights()))
    with tf.train.MonitoredTrainingSession() as sess:
        sess.run(train)
        return epl.Graph.get().parallel


def test_one_copy_runs_only_epl_set_up_before_its_first_step():
    """Gradient accumulation on one device keeps EPL state (a counter, accumulators) that
    a set-up op initializes. With one copy there is nothing to broadcast after the
    user's initializer: the first run used to check that every variable was initialized
    and run the "broadcast" (two more TF runs, each pruning, placing and building
    executors for its own graph); now it runs the set-up only."""
    program = _one_copy_accumulation_step()
    assert program.linked_init and program.sync_op is None and program.init_check is None
    assert program.setup_op is not None


def _record_fetch_sets(monkeypatch):
    """[frozenset of the names a session.run fed, fetched or targeted], one per run."""
    fetch_sets = []
    original = tf.Session._do_run

    def _do_run(self, handle, targets, fetches, feeds, *rest):
        fetch_sets.append(frozenset(getattr(t, "name", str(t)) for t in
                                    list(targets) + list(fetches) + list(feeds)))
        return original(self, handle, targets, fetches, feeds, *rest)
    monkeypatch.setattr(tf.Session, "_do_run", _do_run)
    return fetch_sets


def _one_input_job(tmp_path):
    """The train op of an MLP with one tf.data input, 2 replicas under gradient
    accumulation, snapshots into ``tmp_path``."""
    epl.init(epl.Config({"checkpoint.snapshot_steps": 100,
                         "checkpoint.snapshot_dir": str(tmp_path),
                         "pipeline.num_micro_batch": 2}),
             cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1))
    x, y = make_data(32)
    return train_step(mlp(*dataset_input(x, y, 2), weights=initial_weights()))


@pytest.mark.timeout(120)
def test_first_snapshot_of_one_input_is_one_run(tmp_path, monkeypatch):
    """A job with snapshots (``epl-launch`` turns them on) writes one of its starting
    point at its first training run, and each TF run with a new set of fetches prunes,
    places and builds executors of its own (about 0.25 s CPU each on a 12k-op encoder).
    With one input (2 replicas under gradient accumulation: EPL's end-of-input agreement
    adds an iterator of its own, which holds no position), the snapshot is one run that
    saves the model and the input, and that save is the check that the input can be
    saved: no run per input to check it, none per input and model to save them. The
    model's data file is not read back for a checksum (the whole state, 1.3 GB on
    BERT-base: 0.5 s CPU)."""
    train = _one_input_job(tmp_path)
    read_back = []
    checksum = snapshot_store._checksum
    monkeypatch.setattr(snapshot_store, "_checksum",
                        lambda path: read_back.append(os.path.basename(path)) or checksum(path))
    with tf.train.MonitoredTrainingSession() as sess:
        fetch_sets = _record_fetch_sets(monkeypatch)
        for _ in range(4):
            sess.run(train)
    # the model's data file is not read back for a CRC-32 (its index records each
    # tensor's CRC32C); the small files are
    assert sorted(read_back) == ["data-0-0.data-00000-of-00001", "data-0-0.index",
                                 "model.index"], read_back
    iterators = [op.name for op in tf.get_default_graph().get_operations()
                 if op.type == "OneShotIterator"]
    assert len(iterators) == 2, iterators  # the user's and the end-of-input agreement's
    # the global step (read 3 times), the snapshot, the training run (4 times)
    assert len(fetch_sets) == 8 and len(set(fetch_sets)) == 3, fetch_sets
    step, manifests = snapshot_store.choose(str(tmp_path))
    assert step == 0 and list(manifests[0]["inputs"]) == ["OneShotIterator"], manifests


@pytest.mark.timeout(120)
def test_the_first_snapshot_is_committed_while_the_first_run_computes(tmp_path, monkeypatch):
    """The step-0 snapshot's files are saved before the first training run; flushing
    them to disk, their checksums and the manifest (the commit) run on a thread while
    that run computes, and the snapshot is complete when that run returns (the commit
    here takes 0.5 s longer than the run)."""
    threads = []
    commit = snapshot_store.commit_part

    def slow_commit(*args, **kwargs):
        threads.append(threading.current_thread().name)
        time.sleep(0.5)
        return commit(*args, **kwargs)
    monkeypatch.setattr(snapshot_store, "commit_part", slow_commit)
    train = _one_input_job(tmp_path)
    with tf.train.MonitoredTrainingSession() as sess:
        sess.run(train)
        assert snapshot_store.choose(str(tmp_path))[0] == 0
    assert threads == ["epl-snapshot-commit-0"], threads


def test_the_rewrite_builds_ops_past_create_ops_deprecation_check(monkeypatch):
    """TF 1.15 builds every op through ``Graph.create_op``, whose deprecation decorator
    calls ``getcallargs`` on every call (about 70 us of an op's 220-290 us); EPL's rewrite
    builds thousands of ops, so it builds them past that check (TF 2.x never calls it)."""
    from tensorflow.python.util import tf_inspect
    from epl.parallel import rewriter
    checked, original_check = [], tf_inspect.getcallargs
    original_parallelize = rewriter.parallelize

    def getcallargs(function, *args, **kwargs):
        checked.append(function.__name__)
        return original_check(function, *args, **kwargs)

    def parallelize(*args, **kwargs):
        monkeypatch.setattr(tf_inspect, "getcallargs", getcallargs)
        try:
            return original_parallelize(*args, **kwargs)
        finally:
            monkeypatch.setattr(tf_inspect, "getcallargs", original_check)
    monkeypatch.setattr(rewriter, "parallelize", parallelize)
    decorated = tf.Graph.create_op
    program = _one_copy_accumulation_step()
    assert program is not None and program.setup_op is not None  # the rewrite built ops
    assert "create_op" not in checked, checked[:5]
    assert tf.Graph.create_op is decorated  # as it was outside the rewrite


def test_a_second_replica_clones_no_op_that_nothing_running_reads():
    """With stage functions the cores' constants and the reads of weights and slots
    that only the cores read stay in the user's graph, unused; the second replica
    used to clone them too (half its ops on BERT-base: 1.7k of 3.2k), for the rewrite
    to build and every session run to carry. Now a replica's constants and variable
    reads are each read by something (or wait for an op that running them would run),
and training still runs both replicas."""
    epl.init(epl.Config({"pipeline.micro_batching": "stage_functions"}),
             cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1))
    x, y = make_data(16)
    train = train_step(mlp(*dataset_input(x, y, 8), weights=initial_weights()), "adam")
    with tf.train.MonitoredTrainingSession() as sess:
        sess.run(train)
        step = sess.run(tf.train.get_global_step())
    graph = tf.get_default_graph()
    second = [op for op in graph.get_operations() if op.name.startswith("EPL_REPLICA_1/")]
    assert any(op.type == "ApplyAdam" for op in second), [op.name for op in second]
    unread = [op.name for op in second  # (one waiting for an op would run it: kept)
              if (op.type == "Const" or op.type == "Identity" and op.inputs[0].op.type
                  in ("VariableV2", "VarHandleOp")) and not op.control_inputs
              and not any(t.consumers() for t in op.outputs) and not op._control_outputs]
    assert unread == [], unread
    assert step == 1
