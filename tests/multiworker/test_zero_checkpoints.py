"""ZeRO checkpoints: worker 0 saves every worker's optimizer slots, and a restore gives
each owner its slots back, on the same layout or without ZeRO.

FastNN's BERT shape: a TPUEstimator on CPU (use_tpu=False), BERT's own
AdamWeightDecay optimizer (slots made with tf.get_variable inside
apply_gradients), zero.level v1 on 2 workers x 1 device, each worker with its own
model_dir as ``epl-launch`` gives it (only worker 0's holds checkpoints).
"""
import os
import shutil
import sys

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from eplutil import (MEASURED, adamw_step, dataset_input, initial_weights, make_data, mlp,
                     run_workers, worker_rows)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "scripts"))
from estimator_model import input_fn, make_model_fn  # noqa: E402

WORKERS, BATCH, STEPS = 2, 4, 3
TOL = 2e-5


def _estimator(model_dir, batch):
    config = tf.estimator.tpu.RunConfig(
        model_dir=str(model_dir), save_checkpoints_steps=2, log_step_count_steps=None,
        tpu_config=tf.estimator.tpu.TPUConfig(iterations_per_loop=1))
    return tf.estimator.tpu.TPUEstimator(
        model_fn=make_model_fn(tpu=True, step_fn=adamw_step), config=config, use_tpu=False,
        train_batch_size=batch)


def _zero_train(job_dir, x, y, config):
    def worker(index):
        epl.set_default_strategy(epl.replicate(1))
        rows = [worker_rows(v, STEPS, WORKERS, BATCH, index) for v in (x, y)]
        _estimator(os.path.join(job_dir, str(index)), BATCH).train(
            input_fn(rows[0], rows[1], BATCH, repeat=True), steps=STEPS)
    run_workers(worker, WORKERS, 1, epl.Config(config), timeout=200)


def _serial_train(model_dir, x, y):
    with epl.paused():
        _estimator(model_dir, WORKERS * BATCH).train(
            input_fn(x, y, WORKERS * BATCH, repeat=True), steps=STEPS)


def _checkpoint(model_dir):
    reader = tf.train.load_checkpoint(str(model_dir))
    return dict((name, reader.get_tensor(name)) for name, _ in
                tf.train.list_variables(str(model_dir)))


def _worst(reference, values):
    assert sorted(values) == sorted(reference)
    return max(float(np.abs(np.asarray(reference[n]) - values[n]).max()) for n in reference)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("level", ["v1", "v2"])
def test_zero_estimator_checkpoints_hold_every_slot_and_restore(tmp_path, level):
    """Train 3 steps, restart from worker 0's checkpoint for 3 more (ZeRO again, and
    serially without ZeRO): both equal 6 serial steps, slots included."""
    x, y = make_data(WORKERS * BATCH * STEPS * 2)
    first, second = (x[:len(x) // 2], y[:len(y) // 2]), (x[len(x) // 2:], y[len(y) // 2:])
    serial = tmp_path / "serial"
    _serial_train(serial, *first)
    _serial_train(serial, *second)
    reference = _checkpoint(serial)
    assert any(name.endswith("/adamw_m") for name in reference)

    job = str(tmp_path / "zero")
    _zero_train(job, first[0], first[1], {"zero.level": level})
    assert not os.path.exists(os.path.join(job, "1")) or not os.listdir(os.path.join(job, "1"))
    after_first = _checkpoint(os.path.join(job, "0"))
    assert sorted(after_first) == sorted(reference)  # every worker's slots, serial names
    shutil.copytree(os.path.join(job, "0"), str(tmp_path / "plain"))

    _zero_train(job, second[0], second[1], {"zero.level": level})
    resumed = _checkpoint(os.path.join(job, "0"))
    assert resumed["global_step"] == 2 * STEPS
    zero_diff = _worst(reference, resumed)

    _serial_train(tmp_path / "plain", *second)  # the ZeRO checkpoint, restored without ZeRO
    plain_diff = _worst(reference, _checkpoint(tmp_path / "plain"))
    MEASURED.append(("zero %s checkpoint, resumed under ZeRO" % level, zero_diff))
    MEASURED.append(("zero %s checkpoint, resumed without ZeRO" % level, plain_diff))
    assert zero_diff < TOL and plain_diff < TOL


def _session_step(saver_kind):
    """The eplutil MLP with Adam; returns (train op, saver)."""
    epl.set_default_strategy(epl.replicate(1))
    x, y = make_data(8)
    loss = mlp(*dataset_input(x, y, 4), weights=initial_weights())
    train = tf.train.AdamOptimizer(0.01).minimize(loss)
    if saver_kind == "dict":
        return train, tf.train.Saver(dict((v.op.name, v) for v in tf.global_variables()))
    if saver_kind == "model":
        return train, tf.train.Saver(var_list=tf.trainable_variables())
    return train, tf.train.Saver()


def test_plain_savers_save_every_slot_and_only_worker_0_writes(tmp_path, monkeypatch):
    """A tf.train.Saver() of everything saves the other workers' Adam slots under their
    serial names; a model-only saver saves the model; only worker 0 writes; a training
    step never runs a saver (ZeRO once made every step write ./model)."""
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)

    def worker(index, kind):
        train, saver = _session_step(kind)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            sess.run(train)
            return saver.save(sess, str(tmp_path / kind / "ckpt"))

    for kind in ("everything", "model"):
        results = run_workers(lambda i: worker(i, kind), 2, 1, epl.Config({"zero.level": "v0"}))
        assert results[1] is None and results[0].endswith("ckpt")
    names = set(n for n, _ in tf.train.list_variables(str(tmp_path / "everything")))
    slots = set(v + s for v in ("d1/kernel", "d1/bias", "d2/kernel", "d2/bias")
                for s in ("/Adam", "/Adam_1"))
    assert slots <= names and {"beta1_power", "beta2_power"} <= names
    model = set(n for n, _ in tf.train.list_variables(str(tmp_path / "model")))
    assert model == {"d1/kernel", "d1/bias", "d2/kernel", "d2/bias"}
    assert os.listdir(str(workdir)) == []


class _OnceOnly(tf.train.AdamOptimizer):
    """An optimizer that refuses a second apply_gradients (some wrappers do)."""

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        if getattr(self, "_applied", False):
            raise RuntimeError("apply_gradients may be called only once")
        self._applied = True
        return super(_OnceOnly, self).apply_gradients(grads_and_vars, global_step, name)


class _NamedByOrder(tf.train.GradientDescentOptimizer):
    """Keeps an accumulator per variable named by the order of creation, not by the
    variable: the names worker 0 gets for another worker's variables are not that
    worker's."""

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        updates = []
        for grad, var in grads_and_vars:
            total = tf.Variable(tf.zeros(var.shape), trainable=False, name="grad_total")
            updates.append(total.assign_add(grad))
        with tf.control_dependencies(updates):
            return super(_NamedByOrder, self).apply_gradients(grads_and_vars, global_step, name)


def test_a_checkpoint_that_would_miss_slots_is_refused(monkeypatch):
    monkeypatch.setenv("EPL_COMMUNICATION_TIMEOUT", "15")

    def worker(index):
        train, saver = _session_step("dict")
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            sess.run(train)
            try:
                saver.save(sess, "/nonexistent/ckpt")
            except ValueError as error:
                return str(error)
    refused = run_workers(worker, 2, 1, epl.Config({"zero.level": "v1"}))[0]
    assert refused is not None and "zero.level='v1'" in refused and "var_list" in refused


@pytest.mark.parametrize("case", ["optimizer_called_once", "named_by_order"])
def test_optimizers_worker_0_could_not_describe_now_checkpoint_every_slot(case, tmp_path):
    """ZeRO once called the optimizer a second time on worker 0 to learn the other
    workers' slots: an optimizer that refuses a second call, or names its variables by
    the order of its calls, could not be checkpointed ("apply_gradients may be called
    only once", "grad_total"). Each worker now calls it once for every variable, as
    without ZeRO, so every slot has its serial name on every worker."""
    def worker(index):
        epl.set_default_strategy(epl.replicate(1))
        x, y = make_data(8)
        loss = mlp(*dataset_input(x, y, 4), weights=initial_weights())
        optimizer = _OnceOnly(0.01) if case == "optimizer_called_once" else _NamedByOrder(0.1)
        step = tf.train.get_or_create_global_step()
        train, saver = optimizer.minimize(loss, global_step=step), tf.train.Saver()
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            sess.run(train)
            return saver.save(sess, str(tmp_path / "ckpt"))
    saved = run_workers(worker, 2, 1, epl.Config({"zero.level": "v1"}))
    assert saved[1] is None and saved[0].endswith("ckpt")
    names = set(n for n, _ in tf.train.list_variables(str(tmp_path)))
    if case == "named_by_order":
        assert {"grad_total", "grad_total_1", "grad_total_2", "grad_total_3"} <= names
    else:
        assert set(v + s for v in ("d1/kernel", "d1/bias", "d2/kernel", "d2/bias")
                   for s in ("/Adam", "/Adam_1")) <= names
