"""A job with AMP always ends: skipped steps still advance global_step, and say so.

FastNN's ResNet flags train raw 0-255 images with ``amp.loss_scale`` fixed at 10000:
every step overflows float16 and is skipped. Before, global_step never advanced and
StopAtStepHook waited forever. Now every step counts (as TF 2's Keras
LossScaleOptimizer and apex count skipped iterations), weights stay unchanged on
skipped steps, and a warning with the count in a row and the scale is printed on
the 1st, 2nd, 4th, ... skipped step, once per worker. Data parallelism, gradient
accumulation and a pipeline all end. AMP on CPU devices (float16 kernels there are
far slower) is said once per process.
"""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from eplutil import dataset_input, initial_weights, make_data, mlp, staged_mlp, train_step

MAX_RUNS = 30   # a loop that would not end fails the test instead of hanging it


def _train_until_stop(config, devices, last_step, staged=False, strategy=True, scale=255.0):
    """Train under StopAtStepHook(last_step); (runs, global step, weights before, after)."""
    epl.init(epl.Config(config), cluster=Cluster(devices_per_worker=devices))
    x, y = make_data(8 * MAX_RUNS * 4)
    features, labels = dataset_input(x * scale, y, 8)
    if staged:
        loss = staged_mlp(features, labels, initial_weights())
    else:
        if strategy:
            epl.set_default_strategy(epl.replicate(1))
        loss = mlp(features, labels, initial_weights())
    train = train_step(loss, "adam")
    kernel = [v for v in tf.global_variables() if v.op.name == "d1/kernel"][0]
    runs = 0
    hooks = [tf.train.StopAtStepHook(last_step=last_step)]
    with tf.train.MonitoredTrainingSession(hooks=hooks) as sess:
        before = sess.run(kernel)
        while not sess.should_stop() and runs < MAX_RUNS:
            sess.run(train)
            runs += 1
        raw = sess._tf_sess()  # pylint: disable=protected-access
        return runs, raw.run(tf.train.get_global_step()), before, raw.run(kernel)


LAYOUTS = {
    # name: (extra config, devices, staged, runs per step)
    "dp_1x2": ({}, 2, False, 1),
    "ga_2": ({"pipeline.num_micro_batch": 2}, 1, False, 2),
    "pipeline_2x2": ({"pipeline.num_micro_batch": 2}, 2, True, 1),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_fixed_scale_that_overflows_every_step_still_ends(layout, capfd):
    extra, devices, staged, per_step = LAYOUTS[layout]
    config = dict(extra, **{"amp.level": "O1", "amp.loss_scale": 10000})
    runs, step, before, after = _train_until_stop(config, devices, 5, staged)
    assert runs == 5 * per_step and step == 5
    np.testing.assert_array_equal(after, before)  # every step was skipped
    err = capfd.readouterr().err
    for count in (1, 2, 4):
        line = ("EPL AMP: skipped a training step, its gradients are not finite (%d skipped "
                "in a row) with the fixed amp.loss_scale 10000." % count)
        assert err.count(line) == 1, (count, err[-2000:])
    assert "(3 skipped in a row)" not in err and "(5 skipped in a row)" not in err
    assert 'set amp.loss_scale to "dynamic" or lower it' in err


def test_dynamic_scale_that_overflows_every_step_still_ends(capfd):
    """Inputs so large that float16 overflows at any scale: the scale falls to 1 and the
    job still ends at its last step."""
    config = {"amp.level": "O1"}
    runs, step, before, after = _train_until_stop(config, 2, 20, scale=1e6)
    assert runs == 20 and step == 20
    np.testing.assert_array_equal(after, before)
    err = capfd.readouterr().err
    assert "(16 skipped in a row). Weights and optimizer slots are unchanged; global_step " \
        "advances. Dynamic loss scale lowered to 1 (if it stays at 1" in err
    assert err.count("skipped in a row") == 5   # 1, 2, 4, 8, 16


def test_skipped_then_applied_steps_each_advance_global_step_once():
    """A dynamic scale that starts too high skips a few steps, then trains: every run
    advances global_step by exactly one, skipped or applied."""
    epl.init(epl.Config({"amp.level": "O1"}), cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1))
    x, y = make_data(8 * 2 * 12)
    loss = mlp(*dataset_input(x * 255.0, y, 8), weights=initial_weights())
    train = train_step(loss, "adam")
    step = tf.train.get_global_step()
    kernel = [v for v in tf.global_variables() if v.op.name == "d1/kernel"][0]
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        values, steps = [sess.run(kernel)], []
        for _ in range(12):
            sess.run(train)
            steps.append(sess.run(step))
            values.append(sess.run(kernel))
    assert steps == list(range(1, 13))
    changed = [not np.array_equal(a, b) for a, b in zip(values, values[1:])]
    assert not changed[0] and changed[-1], changed  # skipped first, trained later


def test_amp_on_cpu_devices_warns_once(caplog, monkeypatch):
    import logging
    from epl.runtime import amp
    monkeypatch.setattr(amp, "_CPU_WARNED", [])
    with caplog.at_level(logging.WARNING, logger="epl.amp"):
        for _ in range(2):
            epl.init(epl.Config({"amp.level": "O1"}), cluster=Cluster(devices_per_worker=1))
            loss = mlp(*dataset_input(*make_data(16), 8), weights=initial_weights())
            train_step(loss)
    warned = [r.getMessage() for r in caplog.records if "on CPU devices" in r.getMessage()]
    assert len(warned) == 1 and "runs 4 op(s) in float16" in warned[0]
    assert "far slower than float32" in warned[0]
