"""ZeRO on every layout (W workers x D devices): the same weights as training without
ZeRO on the same layout, and each device holding only its own share of the slots.
Levels v0, v1 and v2 (v2: bucketed reduce-scatter and all-gather; the MLP's four
variables make four buckets under the default communication.max_splits=5)."""
import os

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from eplutil import (MEASURED, all_copy_values, dataset_input, initial_weights, make_data,
                     mlp, run_workers, slot_bytes_by_device, staged_mlp, worker_rows)

STEPS, BATCH = 3, 8


def _train(workers, devices, config, steps=STEPS, stages=1):
    """Train the MLP (``stages=2``: a two-stage pipeline) on ``workers`` x ``devices``;
    each model replica pulls its own batch."""
    micro_batches = config.get("pipeline.num_micro_batch", 1) if stages > 1 else 1
    per_worker = devices // stages * BATCH * micro_batches
    x, y = make_data(workers * per_worker * steps)

    def worker(index):
        rows = [worker_rows(v, steps, workers, per_worker, index) for v in (x, y)]
        if stages == 1:
            epl.set_default_strategy(epl.replicate(1))
            loss = mlp(*dataset_input(rows[0], rows[1], BATCH), weights=initial_weights())
        else:
            loss = staged_mlp(*dataset_input(rows[0], rows[1], BATCH),
                              weights=initial_weights())
        step = tf.train.get_or_create_global_step()
        train = tf.train.AdamOptimizer(0.01, epsilon=1e-4).minimize(loss, global_step=step)
        names = [v.op.name for v in tf.trainable_variables()]
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            for _ in range(steps):
                sess.run(train)
            return all_copy_values(sess, names), slot_bytes_by_device(sess), sess.run(step)

    return run_workers(worker, workers, devices, epl.Config(config), timeout=240)


_PLAIN = {}


def _plain(workers, devices, config, steps=STEPS, stages=1):
    """Training without ZeRO, once per layout and config (the reference of both levels)."""
    key = (workers, devices, tuple(sorted(config.items())), steps, stages)
    if key not in _PLAIN:
        _PLAIN[key] = _train(workers, devices, config, steps, stages)
    return _PLAIN[key]


def _worst(results, reference):
    worst = 0.0
    for values, _, _ in results:
        for name, copies in values.items():
            for copy in copies:
                worst = max(worst, float(np.abs(copy - reference[name]).max()))
    return worst


LAYOUTS = [(1, 2), (2, 1), (2, 2)]


@pytest.mark.parametrize("level", ["v0", "v1", "v2"])
@pytest.mark.parametrize("workers,devices", LAYOUTS)
def test_zero_matches_training_without_zero_on_the_same_layout(workers, devices, level):
    """Before: 'zero.level='v1' is not supported here: 2 devices per worker'."""
    plain = _plain(workers, devices, {})
    zero = _train(workers, devices, {"zero.level": level})
    reference = dict((name, copies[0]) for name, copies in plain[0][0].items())
    worst = _worst(zero, reference)
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], worst))
    assert worst < 2e-6
    assert all(step == STEPS for _, _, step in zero)
    # every slot exists exactly once, spread over every device of the group
    total = sum(sum(b.values()) for _, b, _ in plain)
    members = workers * devices
    per_device = [n for _, b, _ in zero for n in b.values()]
    assert sum(per_device) * members == total
    assert len(per_device) == members
    assert max(per_device) < sum(per_device)


@pytest.mark.parametrize("workers,devices,level", [
    (1, 2, "v0"), (2, 1, "v1"), (2, 2, "v1"), (1, 2, "v2"), (2, 1, "v2"), (2, 2, "v2")])
def test_zero_with_gradient_accumulation_matches_without(workers, devices, level):
    """Before the fix: 0.018 apart; a copy that does not update a variable never ran
    its accumulator's write (only the update waited for it), so the sums missed it."""
    config = {"pipeline.num_micro_batch": 2}
    plain = _plain(workers, devices, config, steps=4)
    zero = _train(workers, devices, dict(config, **{"zero.level": level}), steps=4)
    reference = dict((name, copies[0]) for name, copies in plain[0][0].items())
    worst = _worst(zero, reference)
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], worst))
    assert worst < 2e-6
    assert [s for _, _, s in zero] == [s for _, _, s in plain]


@pytest.mark.parametrize("workers,devices,level", [
    (1, 4, "v1"), (2, 2, "v0"), (1, 4, "v2"), (2, 2, "v2")])
def test_zero_in_a_pipeline_owns_within_each_stage_group(workers, devices, level):
    """Two stages x two replicas: each stage's variables are owned within that stage's
    data-parallel group (before: refused, '2 TaskGraphs')."""
    config = {"pipeline.num_micro_batch": 2}
    plain = _plain(workers, devices, config, stages=2)
    zero = _train(workers, devices, dict(config, **{"zero.level": level}), stages=2)
    reference = dict((name, copies[0]) for name, copies in plain[0][0].items())
    worst = _worst(zero, reference)
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], worst))
    assert worst < 2e-6
    per_device = [n for _, b, _ in zero for n in b.values()]
    assert len(per_device) == workers * devices  # every device of both stages owns some
    assert sum(per_device) * 2 == sum(sum(b.values()) for _, b, _ in plain)


@pytest.mark.parametrize("level", ["v0", "v1", "v2"])
def test_zero_with_amp_matches_without_and_skips_together(level):
    """AMP under ZeRO: every copy takes the same decision (v0: on the same all-reduced
    gradients; v1: a sum of each member's "not finite" over the group), so all skip or
    apply together (no hang) and the weights match training without ZeRO. Before, v1
    was refused: 'zero.level='v1' with amp.level='O1' is not supported yet'."""
    config = {"amp.level": "O1", "amp.loss_scale": 1024.0}
    plain = _plain(2, 2, config)
    zero = _train(2, 2, dict(config, **{"zero.level": level}))
    reference = dict((name, copies[0]) for name, copies in plain[0][0].items())
    worst = _worst(zero, reference)
    MEASURED.append(("zero %s amp 2x2" % level, worst))
    assert worst < 1e-5
