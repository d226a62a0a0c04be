"""Mixture-of-Experts under epl.split trains like the same layer unsplit on one device.

Each device holds E/N experts; tokens go to their expert's device and back by
all-to-all (the einsum pattern of epl/ops/experts.py). Gating is per group, so
the unsplit reference with the same groups routes every token identically.
"""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from epl.ops.moe import moe_layer
from eplutil import MEASURED, copy_values

LENGTH, WIDTH, HIDDEN, STEPS = 6, 4, 5, 3


def _data(groups, seed=0):
    rng = np.random.RandomState(seed)
    return (rng.rand(groups, LENGTH, WIDTH).astype(np.float32) - 0.5,
            rng.rand(groups, LENGTH, WIDTH).astype(np.float32))


def _model(tokens, targets, experts, split):
    init = tf.random_uniform_initializer(-0.5, 0.5, seed=3)
    output, aux = moe_layer(tokens, experts, HIDDEN, split=split, capacity_factor=1.0,
                            initializer=init)
    return tf.reduce_mean(tf.square(output - targets)) + 0.01 * aux


def _dataset(x, y, batch):
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
    return tf.data.make_one_shot_iterator(data).get_next()


def _serial(experts, groups):
    x, y = _data(groups * STEPS)
    with epl.paused(), tf.Graph().as_default():
        loss = _model(*_dataset(x, y, groups), experts, None)
        train = tf.train.AdamOptimizer(0.05, epsilon=1e-4).minimize(loss)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            for _ in range(STEPS):
                sess.run(train)
            names = ("moe/gate", "moe/w_in", "moe/w_out")
            graph = tf.get_default_graph()
            return dict(zip(names, sess.run([graph.get_tensor_by_name(n + ":0")
                                             for n in names])))


@pytest.mark.parametrize("devices,experts,lowering", [(2, 4, "auto"), (4, 4, "auto"),
                                                      (2, 6, "auto"), (2, 6, "unrolled")])
def test_moe_matches_unsplit(devices, experts, lowering):
    """The all-to-alls of the experts stay ops of each copy; stage functions (the
    default) call the rest of the step, unrolled copies clone it."""
    groups = 2 * devices
    ref = _serial(experts, groups)
    x, y = _data(groups * STEPS)
    epl.init(epl.Config({"cluster.colocate_split_and_replicate": True,
                         "pipeline.micro_batching": lowering}),
             cluster=Cluster(devices_per_worker=devices))
    epl.set_default_strategy(epl.replicate(devices))
    loss = _model(*_dataset(x, y, groups), experts, epl.split(devices))
    train = tf.train.AdamOptimizer(0.05, epsilon=1e-4).minimize(loss)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(STEPS):
            sess.run(train)
        copies = dict((n, copy_values(sess, n)) for n in ("moe/gate", "moe/w_in", "moe/w_out"))
    assert epl.Graph.get().parallel.plan.micro_batching[0] == (
        "unrolled copies" if lowering == "unrolled" else "stage functions")
    worst = max(float(np.abs(c - ref["moe/gate"]).max()) for c in copies["moe/gate"])
    for name in ("moe/w_in", "moe/w_out"):
        assert copies[name][0].shape[0] == experts // devices
        full = np.concatenate(copies[name], axis=0)
        worst = max(worst, float(np.abs(full - ref[name]).max()))
    import os
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], worst))
    assert worst < 2e-5


def test_experts_must_divide_over_the_devices():
    epl.init(epl.Config({"cluster.colocate_split_and_replicate": True}),
             cluster=Cluster(devices_per_worker=4))
    tokens = tf.placeholder(tf.float32, [None, LENGTH, WIDTH])
    with pytest.raises(ValueError, match="first axis, which must be a multiple of 4"):
        moe_layer(tokens, 6, HIDDEN, split=epl.split(4))


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_moe_in_the_default_placement_is_refused_naming_both_taskgraphs(micro_batches):
    """Without the colocate key the experts' split TaskGraph gets devices of its own, but
    the MoE einsums run in the replicated TaskGraph: the plan cannot route their
    all-to-alls, and the error says where each TaskGraph is and which key to set."""
    epl.init(epl.Config({"pipeline.num_micro_batch": micro_batches}),
             cluster=Cluster(devices_per_worker=4))
    x, y = _data(4)
    epl.set_default_strategy(epl.replicate(2))
    loss = _model(*_dataset(x, y, 4), 4, epl.split(2))
    train = tf.train.AdamOptimizer(0.05, epsilon=1e-4).minimize(loss)
    with pytest.raises(ValueError, match=(
            r"runs in TaskGraph 0 'taskgraph_0' \(replicate on .*CPU:0, .*CPU:1\), but the "
            r"split weights are in 'taskgraph_1' split on .*CPU:2, .*CPU:3; with "
            r"cluster.colocate_split_and_replicate=False .*Set "
            r"cluster.colocate_split_and_replicate=True")), tf.Session() as sess:
        sess.run(train)  # the session rewrites the graph
