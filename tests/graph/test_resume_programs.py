"""Exact resume for every way of writing the program, and what it cannot resume.

tf.Session with a Saver and an initializable iterator, an Estimator, two workers (in
one process, threads) with IO slicing; a kill during a snapshot's write; a damaged
newest snapshot; a snapshot directory that cannot be written; inputs whose position no
snapshot can hold (warned once). Kills are exceptions raised after a seeded random
number of runs (tests/graph/test_resume.py explains the method).
"""
import logging
import os
import random
import sys

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from epl.session import snapshot_store
from eplutil import MEASURED, initial_weights, make_data, mlp, run_workers
from test_resume import LAST_STEP, TOL, KillAfter, Killed

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "multiworker",
                                "scripts"))
from estimator_model import checkpoint_weights, input_fn, make_model_fn, run_config  # noqa

SNAPSHOTS = 2


def _config(snapshots, **more):
    settings = {"checkpoint.snapshot_steps": SNAPSHOTS, "checkpoint.snapshot_dir": snapshots}
    settings.update(more)
    return epl.Config(settings)


def _kill_step(label):
    kill = random.Random(label).randint(4, LAST_STEP - 1)
    print("%s: killed after %d runs (seed %r)" % (label, kill, label))
    return kill


def _record(reference, resumed, names):
    worst = max(float(np.abs(np.asarray(reference[n]) - resumed[n]).max()) for n in names)
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], worst))
    return worst


# ---- tf.Session + Saver, initializable iterator -----------------------------------------
def _session_program(checkpoints, snapshots, kill_after=None, every=SNAPSHOTS):
    """A plain loop: initializable iterator, restore the user's latest checkpoint, train
    until the global step reaches LAST_STEP, save every 3 steps."""
    x, y = make_data(256, seed=4)
    with tf.Graph().as_default():
        epl.init(_config(snapshots, **{"checkpoint.snapshot_steps": every}),
                 cluster=Cluster(devices_per_worker=2))
        epl.set_default_strategy(epl.replicate(1))
        data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(32, seed=2).batch(4)
        iterator = tf.data.make_initializable_iterator(data)
        loss = mlp(*iterator.get_next(), weights=initial_weights())
        step = tf.train.get_or_create_global_step()
        train = tf.train.MomentumOptimizer(0.1, 0.9).minimize(loss, global_step=step)
        saver = tf.train.Saver()
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            sess.run(iterator.initializer)
            latest = tf.train.latest_checkpoint(checkpoints)
            if latest:
                saver.restore(sess, latest)
            runs = 0
            while sess.run(step) < LAST_STEP:
                sess.run(train)
                runs += 1
                if runs == kill_after:
                    return None
                if sess.run(step) % 3 == 0:
                    saver.save(sess, os.path.join(checkpoints, "model.ckpt"), global_step=step)
            return sess.run(dict((v.op.name, v) for v in tf.global_variables()))


@pytest.mark.timeout(200)
def test_session_with_saver_and_initializable_iterator(tmp_path):
    reference = _session_program(str(tmp_path / "r"), str(tmp_path / "rs"))
    checkpoints, snapshots = str(tmp_path / "c"), str(tmp_path / "s")
    os.makedirs(checkpoints)
    assert _session_program(checkpoints, snapshots, _kill_step("session")) is None
    resumed = _session_program(checkpoints, snapshots)
    assert _record(reference, resumed, reference) <= TOL
    assert resumed["global_step"] == LAST_STEP


@pytest.mark.timeout(200)
def test_a_kill_before_the_first_periodic_snapshot_resumes_from_the_start(tmp_path):
    """Snapshots every 5 steps, the user's checkpoint at step 3, a kill after 4 runs: the
    job's starting point is a snapshot (written at its first step), so the restart
    resumes from step 0 with the input at its beginning, not from the user's step 3."""
    reference = _session_program(str(tmp_path / "r"), str(tmp_path / "rs"), every=5)
    checkpoints, snapshots = str(tmp_path / "c"), str(tmp_path / "s")
    os.makedirs(checkpoints)
    assert _session_program(checkpoints, snapshots, 4, every=5) is None
    assert tf.train.latest_checkpoint(checkpoints).endswith("-3")
    assert snapshot_store.steps(snapshots) == [0]
    resumed = _session_program(checkpoints, snapshots, every=5)
    assert _record(reference, resumed, reference) <= TOL


@pytest.mark.timeout(200)
def test_the_users_checkpoints_are_unchanged(tmp_path):
    """The user's Saver writes the same names with and without snapshots: EPL's savers
    (model state, iterator positions) are in no collection."""
    listed = []
    for every in (0, SNAPSHOTS):
        checkpoints = str(tmp_path / ("c%d" % every))
        os.makedirs(checkpoints)
        _session_program(checkpoints, str(tmp_path / ("s%d" % every)), every=every)
        listed.append(tf.train.list_variables(tf.train.latest_checkpoint(checkpoints)))
    assert listed[0] == listed[1]
    assert not [name for name, _ in listed[1] if "EPL" in name or "Iterator" in name]


# ---- Estimator -------------------------------------------------------------------------
def _estimator(model_dir, snapshots, kill_after=None):
    x, y = make_data(256, seed=5)
    with tf.Graph().as_default():
        epl.init(_config(snapshots), cluster=Cluster(devices_per_worker=2))
        epl.set_default_strategy(epl.replicate(1))
        estimator = tf.estimator.Estimator(
            make_model_fn(), config=run_config(model_dir, save_checkpoints_steps=3))
        hooks = [KillAfter(kill_after)] if kill_after else []
        try:
            estimator.train(input_fn(x, y, 4), max_steps=LAST_STEP, hooks=hooks)
        except Killed:
            return None
    return checkpoint_weights(model_dir)


@pytest.mark.timeout(200)
def test_estimator_resumes_exactly(tmp_path):
    reference = _estimator(str(tmp_path / "r"), str(tmp_path / "rs"))
    assert _estimator(str(tmp_path / "m"), str(tmp_path / "s"), _kill_step("estimator")) is None
    resumed = _estimator(str(tmp_path / "m"), str(tmp_path / "s"))
    assert _record(reference, resumed, reference) <= TOL
    assert resumed["global_step"] == LAST_STEP


# ---- two workers, IO slicing -----------------------------------------------------------
def _files(directory, count=4, rows=64):
    """TFRecord files of float rows; returns their paths."""
    x, _ = make_data(count * rows, seed=6)
    paths = []
    for index in range(count):
        paths.append(os.path.join(directory, "part-%d.tfrecord" % index))
        with tf.io.TFRecordWriter(paths[-1]) as writer:
            for row in x[index * rows:(index + 1) * rows]:
                writer.write(row.tobytes())
    return paths


def _sliced_workers(paths, snapshots, kill_after=None):
    """Each worker has a checkpoint directory of its own, as under epl-launch (worker 0
    writes the user's checkpoints every 3 steps)."""
    def worker(index):
        files = tf.data.Dataset.from_tensor_slices(paths)
        data = tf.data.TFRecordDataset(files).map(
            lambda r: tf.reshape(tf.io.decode_raw(r, tf.float32), [6])).batch(4)
        features = tf.data.make_one_shot_iterator(data).get_next()
        epl.set_default_strategy(epl.replicate(1))
        labels = tf.cast(tf.reduce_sum(features, 1) > 3.0, tf.int64)
        loss = mlp(features, labels, weights=initial_weights())
        step = tf.train.get_or_create_global_step()
        train = tf.train.AdamOptimizer(0.01).minimize(loss, global_step=step)
        hooks = [tf.train.StopAtStepHook(last_step=LAST_STEP)]
        hooks += [KillAfter(kill_after)] if kill_after else []
        try:
            with tf.train.MonitoredTrainingSession(
                    checkpoint_dir="%s_ckpt_%d" % (snapshots, index), save_checkpoint_steps=3,
                    save_summaries_steps=None, hooks=hooks) as sess:
                while not sess.should_stop():
                    sess.run(train)
                raw = sess._tf_sess()  # pylint: disable=protected-access
                return raw.run(dict((v.op.name, v) for v in tf.global_variables()))
        except Killed:
            return None
    return run_workers(worker, 2, 1, _config(snapshots, **{"io.slicing": True}), timeout=150)


@pytest.mark.timeout(300)
def test_two_workers_with_io_slicing_resume_every_input(tmp_path):
    paths = _files(str(tmp_path))
    reference = _sliced_workers(paths, str(tmp_path / "rs"))
    snapshots = str(tmp_path / "s")
    kill = _kill_step("io_slicing")
    assert _sliced_workers(paths, snapshots, kill) == [None, None]
    parts = snapshot_store.complete(snapshots, snapshot_store.newest_step(snapshots))
    assert sorted(parts) == [0, 1] and all(p["inputs"] for p in parts.values())
    resumed = _sliced_workers(paths, snapshots)
    for worker in (0, 1):
        assert _record(reference[worker], resumed[worker], reference[worker]) <= TOL


# ---- kill during a write, damaged snapshot ---------------------------------------------
def _mts(snapshots, kill_after=None, last_step=LAST_STEP):
    x, y = make_data(256, seed=7)
    with tf.Graph().as_default():
        epl.init(_config(snapshots), cluster=Cluster(devices_per_worker=2))
        epl.set_default_strategy(epl.replicate(1))
        data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(32, seed=3).batch(4)
        loss = mlp(*tf.data.make_one_shot_iterator(data).get_next(), weights=initial_weights())
        step = tf.train.get_or_create_global_step()
        train = tf.train.AdamOptimizer(0.01).minimize(loss, global_step=step)
        hooks = [tf.train.StopAtStepHook(last_step=last_step)]
        hooks += [KillAfter(kill_after)] if kill_after else []
        try:
            with tf.train.MonitoredTrainingSession(hooks=hooks) as sess:
                while not sess.should_stop():
                    sess.run(train)
                values = sess._tf_sess().run(  # pylint: disable=protected-access
                    dict((v.op.name, v) for v in tf.global_variables()))
                return values, epl.Env.get().snapshots
        except Killed:
            return None


@pytest.mark.timeout(200)
def test_a_kill_during_a_snapshot_write_resumes_from_the_previous_one(tmp_path,
                                                                      monkeypatch):
    """The kill comes after the snapshot's files, before its manifest: that snapshot is
    torn and the one before it is used."""
    reference, _ = _mts(str(tmp_path / "r"))
    snapshots = str(tmp_path / "s")
    commit = snapshot_store.commit_part

    def killed_at_six(root, step, *args, **kwargs):
        if step == 6:
            raise Killed("killed while writing the snapshot of step 6")
        return commit(root, step, *args, **kwargs)
    monkeypatch.setattr(snapshot_store, "commit_part", killed_at_six)
    assert _mts(snapshots) is None
    monkeypatch.setattr(snapshot_store, "commit_part", commit)
    assert snapshot_store.steps(snapshots) == [6, 4, 2]
    resumed, state = _mts(snapshots)
    assert state.resumed_from == 4
    assert _record(reference, resumed, reference) <= TOL


@pytest.mark.timeout(200)
def test_a_damaged_newest_snapshot_falls_back_with_a_warning(tmp_path, caplog):
    reference, _ = _mts(str(tmp_path / "r"))
    snapshots = str(tmp_path / "s")
    assert _mts(snapshots, kill_after=7) is None
    newest = snapshot_store.step_dir(snapshots, 6)
    damaged = os.path.join(newest, [n for n in os.listdir(newest) if n.startswith("model.data")][0])
    with open(damaged, "r+b") as handle:
        handle.seek(5)
        handle.write(b"\xff\xfe")
    caplog.set_level(logging.WARNING, logger="epl")
    resumed, state = _mts(snapshots)
    assert state.resumed_from == 4
    assert "snapshot of step 6" in caplog.text and "is damaged" in caplog.text
    assert _record(reference, resumed, reference) <= TOL


# ---- bad inputs, what cannot be resumed --------------------------------------------------
def test_a_snapshot_dir_that_cannot_be_written_fails_at_init(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(snapshot_store.SnapshotDirError) as info:
        epl.init(_config(str(blocker / "snapshots")))
    assert "checkpoint.snapshot_dir=%r" % str(blocker / "snapshots") in str(info.value)
    epl.init(_config(str(blocker / "snapshots"), **{"checkpoint.snapshot_steps": 0}))


@pytest.mark.timeout(120)
def test_inputs_no_snapshot_can_hold_are_warned_about_once(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="epl")
    x, y = make_data(64)

    def rows():
        for index in range(len(x)):
            yield x[index], y[index]
    with tf.Graph().as_default():
        epl.init(_config(str(tmp_path)), cluster=Cluster(devices_per_worker=1))
        generated = tf.data.Dataset.from_generator(rows, (tf.float32, tf.int64),
                                                   ([6], [])).batch(4)
        features, labels = tf.data.make_one_shot_iterator(generated).get_next()
        scale = tf.placeholder(tf.float32, [])
        loss = mlp(tf.nn.dropout(features, rate=0.1) * scale, labels, initial_weights())
        step = tf.train.get_or_create_global_step()
        train = tf.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
        with tf.train.MonitoredTrainingSession() as sess:
            for _ in range(5):
                sess.run(train, {scale: 1.0})
        assert epl.Env.get().snapshots.written  # the rest is still saved
    text = caplog.text
    assert text.count("TensorFlow cannot save the position of input") == 1
    assert "after a resume it starts at its beginning" in text
    assert text.count("fed through feed_dict (Placeholder:0)") == 1
    assert text.count("stateful random ops (dropout/random_uniform/RandomUniform)") == 1


@pytest.mark.timeout(120)
def test_without_a_global_step_no_snapshot_is_written_and_it_says_so(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="epl")
    x, y = make_data(64)
    with tf.Graph().as_default():
        epl.init(_config(str(tmp_path)), cluster=Cluster(devices_per_worker=1))
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
        loss = mlp(*tf.data.make_one_shot_iterator(data).get_next(), weights=initial_weights())
        train = tf.train.GradientDescentOptimizer(0.1).minimize(loss)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            for _ in range(5):
                sess.run(train)
        assert not epl.Env.get().snapshots.written
    assert caplog.text.count("the graph has no global step") == 1
    assert snapshot_store.steps(str(tmp_path)) == []
