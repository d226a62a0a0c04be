"""Data parallelism on one process's GPUs over NCCL equals single-GPU training.

Runs on GPU hosts only (``make test-gpu``); see gpuutil.py for what every test proves.
"""
import os

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import corpusutil
import epl
from epl.communicators import select_backend
from epl.communicators.nccl import NcclBackend
from eplutil import (MEASURED, copy_values, dataset_input, initial_weights, make_data,
                     max_diff, mlp, serial_train, train_step)
from gpuutil import (DEVICE_TYPE, FP16_TOL, ON_CPU, TOL, assert_compute_ran_on_devices,
                     assert_over_nccl, assert_ran_on_devices, collectives, gpu_cluster,
                     needs_gpus, require_nccl, traced_run)
from realmodels import CORPUS

STEPS, BATCH = 4, 8


def _train_mlp(devices, opt_name="momentum", config=None):
    """``devices`` replicas of the MLP, ``BATCH`` rows each; the last step is traced.

    Returns (x, y, copies of each variable, gradient collectives, {node: device it ran on}).
    """
    x, y = make_data(devices * BATCH * STEPS)
    epl.init(epl.Config(config or {}), cluster=gpu_cluster(devices))
    epl.set_default_strategy(epl.replicate(1))
    loss = mlp(*dataset_input(x, y, BATCH), weights=initial_weights())
    train = train_step(loss, opt_name)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(STEPS - 1):
            sess.run(train)
        _, ran = traced_run(sess, train)
        names = [v.op.name for v in tf.trainable_variables()]
        copies = dict((name, copy_values(sess, name)) for name in names)
        graph = tf.get_default_graph()
        grads = collectives(epl.Graph.get(graph).parallel, graph, "grads/") if devices > 1 \
            else []
    return x, y, copies, grads, ran


def _assert_matches(reference, copies, devices, tol=TOL):
    for name, copy_list in copies.items():
        assert len(copy_list) == devices, name
        assert max_diff(reference[name], copy_list) < tol, name


@needs_gpus(1)
def test_epl_discovers_the_gpus_and_picks_nccl():
    require_nccl()
    cluster = epl.Cluster() if not ON_CPU else gpu_cluster(2)
    assert cluster.device_type == DEVICE_TYPE
    assert all(("/device:%s:" % DEVICE_TYPE) in d for d in cluster.available_devices)
    assert isinstance(select_backend(cluster.available_devices), NcclBackend) != ON_CPU


@needs_gpus(1)
def test_one_gpu_matches_single_gpu_training():
    x, y, copies, _, ran = _train_mlp(1)
    _, reference = serial_train(x, y, BATCH, STEPS)
    _assert_matches(reference, copies, 1)
    assert_compute_ran_on_devices(ran)


@needs_gpus(2)
@pytest.mark.parametrize("opt_name", ["momentum", "adam_eps"])
def test_two_gpus_reduce_over_nccl_and_match_single_gpu_training(opt_name):
    require_nccl()
    x, y, copies, grads, ran = _train_mlp(2, opt_name)
    _, reference = serial_train(x, y, 2 * BATCH, STEPS, opt_name)
    _assert_matches(reference, copies, 2)
    assert_over_nccl(grads)
    assert_ran_on_devices(ran, grads)
    assert_compute_ran_on_devices(ran)


@needs_gpus(2)
def test_fp16_compression_over_nccl():
    """communication.fp16: gradients cross NCCL as float16 (NCCL reduces half natively)."""
    require_nccl()
    fp16 = {"communication.fp16": True, "communication.fp16_scale": 64}
    x, y, copies, grads, ran = _train_mlp(2, config=fp16)
    _, reference = serial_train(x, y, 2 * BATCH, STEPS)
    _assert_matches(reference, copies, 2, FP16_TOL)
    assert_over_nccl(grads)
    assert_ran_on_devices(ran, grads)
    if not ON_CPU:
        assert all(op.get_attr("T") == tf.float16 for op in grads), [op.name for op in grads]


@needs_gpus(2)
@pytest.mark.parametrize("model_class", CORPUS, ids=[c.name for c in CORPUS])
def test_real_models_on_two_gpus_match_single_gpu_training(model_class):
    """The corpus (batch-norm ResNet, BERT-style encoder, sparse embeddings, odd sizes)."""
    require_nccl()
    model = model_class()
    arrays = model.data(2 * model.batch * corpusutil.STEPS)
    ref_curve, reference = corpusutil.serial_reference(model, arrays, 2, stats="first")
    epl.init(epl.Config({}), cluster=gpu_cluster(2))
    epl.set_default_strategy(epl.replicate(1))
    curve, copies = corpusutil._train(model, arrays, corpusutil.STEPS, monitored=True)
    worst, where = corpusutil.max_difference(reference, copies, "first")
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], worst))
    assert worst < TOL, "%s differs from single-GPU training by %.3g" % (where, worst)
    np.testing.assert_allclose(curve, ref_curve, rtol=TOL, atol=TOL)
    graph = tf.get_default_graph()
    assert_over_nccl(collectives(epl.Graph.get(graph).parallel, graph, "grads/"))
