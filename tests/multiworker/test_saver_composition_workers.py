"""Memory savers on data parallelism over 2 workers x 1 device (in-process servers).

ZeRO v0/v1 alone and with grouped apply, offload or AMP; the other savers and
their pairs. Every cell trains the odd-sized corpus model (tests/realmodels.py
``OddSizes``) and ends within ``TOL`` of serial training on every worker (AMP:
loss curve within 1e-2 relative, model weights within 1e-2). An overflow on one
worker skips the step on both, with ZeRO too (v1: the workers agree through a sum
of "not finite"). ZeRO with pipelines and accumulation across workers:
tests/multiworker/test_zero_layouts.py.
"""
import os

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import corpusutil
import epl
from eplutil import (MEASURED, dataset_input, initial_weights, make_data, mlp, run_workers,
                     worker_rows)
from realmodels import OddSizes

TOL = 2e-5
AMP_RTOL = 1e-2
GROUPED = {"optimizer.num_apply_group": 3}
OFFLOAD = {"offload.level": "v0"}
AMP = {"amp.level": "O1"}
GC = {"gradient_checkpoint.type": "auto"}


def _merge(*parts):
    merged = {}
    for part in parts:
        merged.update(part)
    return merged


SAVERS = {
    "zero_v0": {"zero.level": "v0"},
    "zero_v1": {"zero.level": "v1"},
    "zero_v0+grouped": _merge({"zero.level": "v0"}, GROUPED),
    "zero_v1+grouped": _merge({"zero.level": "v1"}, GROUPED),
    "zero_v1+offload": _merge({"zero.level": "v1"}, OFFLOAD),
    "zero_v1+gc": _merge({"zero.level": "v1"}, GC),
    "zero_v2+grouped": _merge({"zero.level": "v2"}, GROUPED),
    "offload": OFFLOAD,
    "grouped": GROUPED,
    "offload+grouped": _merge(OFFLOAD, GROUPED),
    "gc+offload+grouped": _merge(GC, OFFLOAD, GROUPED),
    "amp": AMP,
    "amp+grouped": _merge(AMP, GROUPED),
}


def _is_slot(name):
    return name.endswith(("/Adam", "/Adam_1", "/Momentum")) or "_power" in name


@pytest.mark.parametrize("saver", sorted(SAVERS))
def test_savers_on_two_workers_match_serial(saver):
    config = SAVERS[saver]
    model = OddSizes()
    arrays = model.data(2 * model.batch * corpusutil.STEPS)
    with tf.Graph().as_default():
        ref_curve, reference = corpusutil.serial_reference(model, arrays, 2, stats="first")
    results = corpusutil.run_workers_dp(model, arrays, 2, 1, config)
    with_amp = bool(config.get("amp.level"))
    worst_all = 0.0
    for worker, (curve, copies) in enumerate(results):
        copies = dict((n, v) for n, v in copies.items() if n in reference)
        if with_amp:
            copies = dict((n, v) for n, v in copies.items() if not _is_slot(n))
            np.testing.assert_allclose(curve, ref_curve, rtol=AMP_RTOL)  # the local losses
        worst, where = corpusutil.max_difference(reference, copies,
                                                 "first" if worker == 0 else "skip")
        worst_all = max(worst_all, worst)
        message = "%s, worker %d: %s differs from serial training by %.3g" % (
            saver, worker, where, worst)
        assert worst < (AMP_RTOL if with_amp else TOL), message
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], worst_all))
    if config.get("zero.level"):  # Adam's slots are ZeRO's state, on their owner only
        for _, copies in results:  # (tests/multiworker/test_zero_layouts.py counts them)
            assert not [n for n in copies if n.endswith(("/Adam", "/Adam_1"))]


# ---- an overflow on one worker ---------------------------------------------------------
def _overflow(config, inject):
    """Train the MLP plus a probe variable whose gradient overflows on worker ``inject``
    at step 1; [(values after each step)] per worker."""
    x, y = make_data(2 * 4 * 3)

    def worker(index):
        epl.set_default_strategy(epl.replicate(1))
        loss = mlp(*dataset_input(worker_rows(x, 3, 2, 4, index),
                                  worker_rows(y, 3, 2, 4, index), 4), weights=initial_weights())
        boost = tf.placeholder_with_default(0.0, [], name="boost")
        probe = tf.get_variable("probe", [], initializer=tf.constant_initializer(0.5))
        step = tf.train.get_or_create_global_step()
        train = tf.train.MomentumOptimizer(0.1, 0.9).minimize(loss + probe * boost,
                                                              global_step=step)
        fetch = dict((n, tf.get_default_graph().get_tensor_by_name(n + ":0")) for n in (
            "d1/kernel", "d2/bias", "probe", "EPL_AMP/loss_scale", "global_step"))
        states = []
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            for run in range(3):
                sess.run(train, {boost: 1e35} if run == 1 and index == inject else {})
                states.append(sess.run(fetch))
        return states

    return run_workers(worker, 2, 1, epl.Config(_merge(AMP, config)), timeout=60)


@pytest.mark.parametrize("inject", [0, 1])
@pytest.mark.parametrize("saver", ["amp", "amp+grouped", "amp+zero_v0", "amp+zero_v1",
                                   "amp+zero_v2"])
def test_overflow_on_one_worker_skips_the_step_on_both(saver, inject):
    """Before, ZeRO v1 with AMP was refused ("zero.level='v1' with amp.level='O1'"): a
    worker checked the reduced gradients of its own variables only."""
    config = {"amp": {}, "amp+grouped": GROUPED, "amp+zero_v0": {"zero.level": "v0"},
              "amp+zero_v1": {"zero.level": "v1"}, "amp+zero_v2": {"zero.level": "v2"}}[saver]
    states = _overflow(config, inject)
    for name in states[0][0]:
        for run in range(3):
            np.testing.assert_array_equal(states[0][run][name], states[1][run][name],
                                          err_msg="%s after run %d" % (name, run))
    ours = states[0]
    for name in ("d1/kernel", "d2/bias"):
        np.testing.assert_array_equal(ours[1][name], ours[0][name], err_msg=name)
        assert not np.array_equal(ours[2][name], ours[1][name]), name
    assert [s["global_step"] for s in ours] == [1, 2, 3]  # a skipped step counts too
    assert ours[1]["EPL_AMP/loss_scale"] == ours[0]["EPL_AMP/loss_scale"] / 2
