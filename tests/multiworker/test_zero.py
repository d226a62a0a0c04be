"""ZeRO on N workers x 1 device: states (v0) and gradient reduction (v1) partitioned,
training unchanged."""
import os

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from eplutil import (MEASURED, AdamWeightDecay, dataset_input, initial_weights, make_data, mlp,
                     run_workers, serial_train, slot_bytes_by_device,
                     worker_rows)

STEPS, BATCH = 3, 4


def _train(level, workers, optimizer="adam_eps"):
    x, y = make_data(workers * BATCH * STEPS)

    def worker(index):
        epl.set_default_strategy(epl.replicate(1))
        loss = mlp(*dataset_input(worker_rows(x, STEPS, workers, BATCH, index),
                                  worker_rows(y, STEPS, workers, BATCH, index), BATCH),
                   weights=initial_weights())
        step = tf.train.get_or_create_global_step()
        if optimizer == "adamw":  # BERT's: plain assigns, slots from tf.get_variable
            tvars = tf.trainable_variables()
            train = AdamWeightDecay(0.01, epsilon=1e-4).apply_gradients(
                zip(tf.gradients(loss, tvars), tvars), global_step=step)
            train = tf.group(train, step.assign(step + 1))
        else:
            train = tf.train.AdamOptimizer(0.01, epsilon=1e-4).minimize(loss, global_step=step)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            for _ in range(STEPS):
                sess.run(train)
            names = [v.op.name for v in tf.trainable_variables()]
            values = dict(zip(names, sess.run(tf.trainable_variables())))
            slot_bytes = sum(slot_bytes_by_device(sess).values())
            return values, slot_bytes, sess.run(step)

    return x, y, run_workers(worker, workers, 1, epl.Config({"zero.level": level}))


@pytest.mark.parametrize("level", ["v0", "v1", "v2"])
@pytest.mark.parametrize("workers", [2, 4])
def test_zero_matches_serial_and_partitions_optimizer_states(level, workers):
    x, y, results = _train(level, workers)
    with epl.paused():
        _, reference = serial_train(x, y, workers * BATCH, STEPS, "adam_eps")
    worst = 0.0
    for values, _, step in results:
        assert step == STEPS
        for name, value in values.items():
            worst = max(worst, float(np.abs(value - reference[name]).max()))
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], worst))
    assert worst < 2e-5
    # m and v of every variable exist exactly once across the workers
    var_bytes = sum(int(np.prod(v.shape)) * 4 for v in results[0][0].values())
    assert sum(b for _, b, _ in results) == 2 * var_bytes
    assert all(0 < b < 2 * var_bytes for _, b, _ in results)


def _serial_adamw(x, y, batch, steps):
    with epl.paused(), tf.Graph().as_default():
        loss = mlp(*dataset_input(x, y, batch), weights=initial_weights())
        tvars = tf.trainable_variables()
        train = AdamWeightDecay(0.01, epsilon=1e-4).apply_gradients(
            zip(tf.gradients(loss, tvars), tvars))
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            for _ in range(steps):
                sess.run(train)
            return dict((v.op.name, sess.run(v)) for v in tvars)


@pytest.mark.parametrize("level", ["v1", "v2"])
def test_zero_with_an_optimizer_that_updates_by_assign_matches_serial(level):
    """BERT's AdamWeightDecay updates with plain assigns: the owner's new value must be
    read after them (it was read before, racing the update: differences of 0.04)."""
    x, y, results = _train(level, 2, optimizer="adamw")
    reference = _serial_adamw(x, y, 2 * BATCH, STEPS)
    worst = max(float(np.abs(values[name] - reference[name]).max())
                for values, _, _ in results for name in reference)
    MEASURED.append(("zero %s adamw 2 workers" % level, worst))
    assert worst < 2e-5
    var_bytes = sum(int(np.prod(v.shape)) * 4 for v in reference.values())
    assert sum(b for _, b, _ in results) == 2 * var_bytes


def test_zero_refuses_what_it_cannot_partition():
    """One variable cannot give each of two devices one (the member without one would
    have nothing to wait for in the exchange); any layout is fine otherwise."""
    def worker(index):
        epl.set_default_strategy(epl.replicate(1))
        x, y = make_data(8)
        xb, yb = dataset_input(x, y, 4)
        w = tf.get_variable("w", initializer=tf.ones([xb.shape[1], 1]))
        loss = tf.reduce_mean(tf.square(tf.matmul(xb, w) - tf.cast(yb[:, None], tf.float32)))
        train = tf.train.AdamOptimizer(0.01).minimize(loss)
        with tf.Session() as sess:
            with pytest.raises(ValueError, match="cannot give each of the 2 devices"):
                sess.run(tf.global_variables_initializer())
                sess.run(train)
        return True
    assert run_workers(worker, 1, 2, epl.Config({"zero.level": "v1"})) == [True]


@pytest.mark.parametrize("level,key", [("v2", "fp16"), ("v2", "clip_after_allreduce"),
                                       ("v1", "clip_after_allreduce")])
def test_zero_refuses_what_it_cannot_combine_with_naming_both_keys(level, key):
    """v1 and v2 hand each member only its own reduced gradients, without a float16
    wire: a clip of the reduced gradients' global norm would differ between members,
    and v2 refuses an fp16 reduction it would ignore (v1 warns, see
    tests/unit/test_zero_owners.py)."""
    config = epl.Config({"zero.level": level, "communication." + key: True})
    with pytest.raises(ValueError) as info:   # by epl.init: before, at the first run
        epl.init(config, cluster=Cluster(["127.0.0.1:1", "127.0.0.1:2"], 0, 1))
    message = str(info.value)
    assert "zero.level=%r" % level in message and "communication.%s=True" % key in message
