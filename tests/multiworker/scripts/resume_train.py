"""Worker script for the self-healing tests and benchmarks/recovery.py.

Usage: resume_train.py OUT_DIR LAYOUT LAST_STEP [FAULTS]

Trains the eplutil MLP with Adam (a MonitoredTrainingSession that writes the user's
checkpoints every 3 steps to EPL_TASK_DIR and stops at LAST_STEP), then writes every
driving worker's final values (copy 0) to OUT_DIR/worker_<i>.npz. LAYOUT:

* ``dp``: ``epl.replicate(1)`` over every device (W x D data parallelism), each worker
  reading a shuffled shard of the rows; ``ga``: the same with 2 runs per step;
  ``zero_v0``, ``zero_v1``, ``zero_v2``: with ZeRO; ``amp``: with AMP O1;
* ``pipeline``: the 2-layer MLP as 2 stages with 2 micro-batches (2 workers x 1 device:
  the pipeline spans the workers);
* ``split``: one model replica spanning every device of every worker: a backbone under
  ``epl.replicate(W x D)`` and a 7-class classifier under ``epl.split(W x D)``;
* ``estimator``: tf.estimator.Estimator (tests/multiworker/scripts/estimator_model.py's
  model_fn; checkpoints every 3 steps), values read from worker 0's checkpoint.

FAULTS: comma-separated ``ATTEMPT:WORKER:RUNS:KIND`` (KIND ``kill`` = SIGKILL, ``hang`` =
SIGSTOP, ``write`` = SIGKILL while writing the snapshot of global step RUNS, after its
files and before its manifest): on restart ATTEMPT (EPL_RESTART_COUNT), worker WORKER
does KIND after RUNS training runs. Each fault is printed with its time, and so is
every finished step (``STEP_DONE <time>``) and the start (``START <time>``).
"""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import tensorflow.compat.v1 as tf  # noqa: E402

import epl  # noqa: E402
from epl.session import snapshot_store  # noqa: E402
from eplutil import initial_weights, make_data, mlp, staged_mlp  # noqa: E402
from estimator_model import checkpoint_weights, input_fn, make_model_fn  # noqa: E402

LAYOUTS = {"dp": {}, "ga": {"pipeline.num_micro_batch": 2},
           "pipeline": {"pipeline.num_micro_batch": 2}, "zero_v0": {"zero.level": "v0"},
           "zero_v1": {"zero.level": "v1"}, "zero_v2": {"zero.level": "v2"},
           "amp": {"amp.level": "O1"}, "split": {"cluster.colocate_split_and_replicate": True},
           "estimator": {}}


def faults_of(text, attempt, worker):
    """[(runs, kind)] that strike this process."""
    found = []
    for item in filter(None, (text or "").split(",")):
        at, who, runs, kind = item.split(":")
        if int(at) == attempt and int(who) == worker:
            found.append((int(runs), kind))
    return found


def strike(kind, what):
    print("FAULT %s: %s at %.3f" % (kind, what, time.time()), flush=True)
    os.kill(os.getpid(), signal.SIGSTOP if kind == "hang" else signal.SIGKILL)


class Faults(tf.train.SessionRunHook):
    """Kills or stops this process after a number of training runs."""

    def __init__(self, faults):
        self.faults = [(runs, kind) for runs, kind in faults if kind != "write"]
        self.runs = 0

    def after_run(self, run_context, run_values):
        self.runs += 1
        for runs, kind in self.faults:
            if runs == self.runs:
                strike(kind, "after %d runs" % runs)


def kill_during_write(step):
    """SIGKILL between the snapshot's files and its manifest, at global step ``step``."""
    commit = snapshot_store.commit_part

    def commit_part(root, at, *args, **kwargs):
        if at == step:
            strike("write", "while writing the snapshot of step %d" % at)
        return commit(root, at, *args, **kwargs)
    snapshot_store.commit_part = commit_part


def rows(worker, workers, layout):
    """This worker's shard of the data (pipeline: worker 0 reads everything)."""
    x, y = make_data(4096, seed=11)
    if layout == "split":
        y = y * 2 + 1  # 7 classes
    if layout == "pipeline":
        return x, y
    share = len(x) // workers
    return x[worker * share:(worker + 1) * share], y[worker * share:(worker + 1) * share]


class StepTimes(tf.train.SessionRunHook):
    """Prints the wall-clock time and global step of every finished training run
    (benchmarks/recovery.py reads them)."""

    def before_run(self, run_context):
        return tf.train.SessionRunArgs(tf.train.get_global_step())

    def after_run(self, run_context, run_values):
        print("STEP_DONE %.3f %d" % (time.time(), run_values.results), flush=True)


def model(layout, features, labels, devices):
    """The loss of ``layout``'s model (``devices``: of the whole job)."""
    if layout == "pipeline":
        return staged_mlp(features, labels, initial_weights())
    if layout == "split":
        with epl.replicate(devices):
            hidden = tf.layers.dense(features, 8, activation=tf.nn.relu, name="backbone")
        with epl.split(devices):
            logits = tf.layers.dense(hidden, 7, name="classifier")
            return tf.losses.sparse_softmax_cross_entropy(labels, logits)
    epl.set_default_strategy(epl.replicate(1))
    return mlp(features, labels, initial_weights())


def train_monitored(layout, data, hooks, last_step, devices):
    """MonitoredTrainingSession training; returns {name: value} of the global variables."""
    features, labels = tf.data.make_one_shot_iterator(data).get_next()
    loss = model(layout, features, labels, devices)
    step = tf.train.get_or_create_global_step()
    train = tf.train.AdamOptimizer(0.01).minimize(loss, global_step=step)
    with tf.train.MonitoredTrainingSession(
            checkpoint_dir=os.environ.get("EPL_TASK_DIR"), save_checkpoint_steps=3,
            save_summaries_steps=None, log_step_count_steps=None,
            hooks=hooks + [tf.train.StopAtStepHook(last_step=last_step)]) as sess:
        while not sess.should_stop():
            sess.run(train)
        raw = sess._tf_sess()  # pylint: disable=protected-access
        return raw.run(dict((v.op.name, v) for v in tf.global_variables()))


def train_estimator(x, y, hooks, last_step):
    """Estimator training; worker 0's checkpoint holds the values (others: None)."""
    model_dir = os.environ["EPL_TASK_DIR"]
    estimator = tf.estimator.Estimator(
        make_model_fn(), config=tf.estimator.RunConfig(
            model_dir=model_dir, save_checkpoints_steps=3, log_step_count_steps=None,
            tf_random_seed=1))
    epl.set_default_strategy(epl.replicate(1))
    estimator.train(input_fn(x, y, 4), max_steps=last_step, hooks=hooks)
    if epl.Env.get().cluster.worker_index != 0:
        return None
    return checkpoint_weights(model_dir)


def main(out_dir, layout, last_step, fault_text):
    print("START %.3f" % time.time(), flush=True)
    print("PID %d" % os.getpid(), flush=True)
    tf.set_random_seed(1)
    epl.init(epl.Config(LAYOUTS[layout]))
    cluster = epl.Env.get().cluster
    worker = cluster.worker_index
    attempt = int(os.environ.get("EPL_RESTART_COUNT", "0"))
    mine = faults_of(fault_text, attempt, worker)
    for runs, kind in mine:
        if kind == "write":
            kill_during_write(runs)
    x, y = rows(worker, cluster.worker_num, layout)
    hooks = [Faults(mine), StepTimes()]
    if layout == "estimator":
        values = train_estimator(x, y, hooks, last_step)
    else:
        data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64, seed=worker).batch(4)
        values = train_monitored(layout, data, hooks, last_step,
                                 cluster.worker_num * cluster.gpu_num_per_worker)
    if values is not None:
        np.savez(os.path.join(out_dir, "worker_%d.npz" % worker),
                 **dict((k.replace("/", "__"), v) for k, v in values.items()))
    print("worker %d done, resumed from %s" % (
        worker, epl.Env.get().snapshots.resumed_from), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "")
