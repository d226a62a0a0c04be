"""Pipeline, operator split and MoE across GPUs equal single-GPU training.

Runs on GPU hosts only (``make test-gpu``); see gpuutil.py for what every test proves.
"""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.ops.moe import moe_layer
from eplutil import (MEASURED, copy_values, dataset_input, initial_weights, make_data,
                     max_diff, serial_train, staged_mlp, train_step)
from gpuutil import (DEVICE_TYPE, TOL, assert_compute_ran_on_devices, assert_over_nccl,
                     assert_ran_on_devices, collectives, gpu_cluster, needs_gpus, require_nccl,
                     traced_run)

STEPS, BATCH = 3, 4


def _record(worst):
    import os
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], worst))


def _device_index(device):
    spec = tf.DeviceSpec.from_string(device)
    assert (spec.device_type or "").upper() == DEVICE_TYPE, device
    return spec.device_index


def _train_staged_mlp(train):
    """STEPS steps of the staged MLP, the last one traced: (what ran, its weights' copies)."""
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(STEPS - 1):
            sess.run(train)
        _, ran = traced_run(sess, train)
        return ran, dict((n, copy_values(sess, n)) for n in ("d1/kernel", "d2/kernel", "d2/bias"))


@needs_gpus(2)
@pytest.mark.parametrize("strategy", ["PreferBackward", "PreferForward"])
def test_pipeline_over_two_gpus_matches_single_gpu_training(strategy):
    micro_batches = 4
    x, y = make_data(micro_batches * BATCH * STEPS)
    epl.init(epl.Config({"pipeline.num_micro_batch": micro_batches,
                         "pipeline.strategy": strategy}), cluster=gpu_cluster(2))
    loss = staged_mlp(*dataset_input(x, y, BATCH), weights=initial_weights())
    train = train_step(loss)
    ran, copies = _train_staged_mlp(train)
    _, reference = serial_train(x, y, micro_batches * BATCH, STEPS)
    for name, values in copies.items():
        assert len(values) == 1 and max_diff(reference[name], values) < TOL, name
    stage_of = lambda name: _device_index(tf.get_default_graph().get_operation_by_name(
        name).device)
    assert (stage_of("d1/kernel"), stage_of("d2/kernel")) == (0, 1)
    assert_compute_ran_on_devices(ran)


@needs_gpus(4)
def test_data_parallel_pipelines_over_four_gpus_reduce_over_nccl():
    """2 stages x 2 replicas: each stage's gradients are all-reduced over NCCL."""
    require_nccl()
    micro_batches = 2
    x, y = make_data(2 * micro_batches * BATCH * STEPS)
    epl.init(epl.Config({"pipeline.num_micro_batch": micro_batches}), cluster=gpu_cluster(4))
    loss = staged_mlp(*dataset_input(x, y, BATCH), weights=initial_weights())
    train = train_step(loss)
    ran, copies = _train_staged_mlp(train)
    _, reference = serial_train(x, y, 2 * micro_batches * BATCH, STEPS)
    for name, values in copies.items():
        assert len(values) == 2 and max_diff(reference[name], values) < TOL, name
    graph = tf.get_default_graph()
    grads = collectives(epl.Graph.get(graph).parallel, graph, "grads/")
    assert_over_nccl(grads)
    assert_ran_on_devices(ran, grads)


def _split_model(x, y, classes, split_devices=None):
    """A dense backbone and a classifier; ``split_devices`` splits the classifier."""
    rng = np.random.RandomState(1)
    backbone_w = rng.rand(x.shape[1], 8).astype(np.float32) - 0.5
    head_w = rng.rand(8, classes).astype(np.float32) - 0.5
    with epl.replicate(split_devices) if split_devices else _Nothing():
        h = tf.layers.dense(x, 8, activation=tf.nn.relu, name="backbone",
                            kernel_initializer=tf.constant_initializer(backbone_w))
    with epl.split(split_devices) if split_devices else _Nothing():
        logits = tf.layers.dense(h, classes, name="classifier",
                                 kernel_initializer=tf.constant_initializer(head_w))
        return tf.losses.sparse_softmax_cross_entropy(y, logits)


class _Nothing(object):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _train_values(loss, names, traced=False):
    train = tf.train.MomentumOptimizer(0.1, 0.9).minimize(loss)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(STEPS - 1 if traced else STEPS):
            sess.run(train)
        ran = traced_run(sess, train)[1] if traced else None
        graph = tf.get_default_graph()
        if not traced:
            return dict((n, sess.run(graph.get_tensor_by_name(n + ":0"))) for n in names), None
        return dict((n, copy_values(sess, n)) for n in names), ran


@needs_gpus(2)
@pytest.mark.parametrize("classes", [10, 1001])
def test_split_classifier_over_nccl_matches_single_gpu_training(classes):
    require_nccl()
    devices, batch = 2, 8
    x, y = make_data(batch * STEPS)
    y = (y * 7919 % classes).astype(np.int64)
    names = ("backbone/kernel", "classifier/kernel", "classifier/bias")
    with epl.paused(), tf.Graph().as_default():
        reference, _ = _train_values(_split_model(*dataset_input(x, y, batch), classes), names)
    epl.init(epl.Config({"cluster.colocate_split_and_replicate": True}),
             cluster=gpu_cluster(devices))
    loss = _split_model(*dataset_input(x, y, batch), classes, devices)
    copies, ran = _train_values(loss, names, traced=True)
    worst = max_diff(reference["backbone/kernel"], copies["backbone/kernel"])
    kernel = np.concatenate(copies["classifier/kernel"], axis=1)
    bias = np.concatenate(copies["classifier/bias"], axis=0)
    worst = max(worst, float(np.abs(kernel - reference["classifier/kernel"]).max()),
                float(np.abs(bias - reference["classifier/bias"]).max()))
    _record(worst)
    assert worst < TOL
    graph = tf.get_default_graph()
    split_ops = collectives(epl.Graph.get(graph).parallel, graph)
    assert_over_nccl(split_ops)
    assert_ran_on_devices(ran, split_ops)


def _moe_loss(tokens, targets, experts, split):
    init = tf.random_uniform_initializer(-0.5, 0.5, seed=3)
    output, aux = moe_layer(tokens, experts, 5, split=split, capacity_factor=1.0,
                            initializer=init)
    return tf.reduce_mean(tf.square(output - targets)) + 0.01 * aux


@needs_gpus(2)
def test_moe_all_to_all_over_nccl_matches_single_gpu_training():
    require_nccl()
    devices, experts, groups = 2, 4, 4
    rng = np.random.RandomState(0)
    x = rng.rand(groups * STEPS, 6, 4).astype(np.float32) - 0.5
    y = rng.rand(groups * STEPS, 6, 4).astype(np.float32)
    names = ("moe/gate", "moe/w_in", "moe/w_out")

    def train(split):
        loss = _moe_loss(*dataset_input(x, y, groups), experts, split)
        opt = tf.train.AdamOptimizer(0.05, epsilon=1e-4).minimize(loss)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            for _ in range(STEPS - 1):
                sess.run(opt)
            ran = traced_run(sess, opt)[1]
            if split is None:
                graph = tf.get_default_graph()
                return dict((n, sess.run(graph.get_tensor_by_name(n + ":0"))) for n in names), ran
            return dict((n, copy_values(sess, n)) for n in names), ran

    with epl.paused(), tf.Graph().as_default():
        reference, _ = train(None)
    epl.init(epl.Config({"cluster.colocate_split_and_replicate": True}),
             cluster=gpu_cluster(devices))
    epl.set_default_strategy(epl.replicate(devices))
    copies, ran = train(epl.split(devices))
    worst = max_diff(reference["moe/gate"], copies["moe/gate"])
    for name in ("moe/w_in", "moe/w_out"):
        assert copies[name][0].shape[0] == experts // devices
        worst = max(worst, float(np.abs(np.concatenate(copies[name]) - reference[name]).max()))
    _record(worst)
    assert worst < TOL
    graph = tf.get_default_graph()
    ops = collectives(epl.Graph.get(graph).parallel, graph)
    assert_over_nccl(ops)
    assert_ran_on_devices(ran, ops)
    if DEVICE_TYPE == "GPU":
        assert "EplNcclAllToAll" in set(op.type for op in ops)
