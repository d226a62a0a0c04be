"""Every communication option changes the rewritten graph as documented and
training stays equivalent to serial training (fp16 within 1e-3)."""
import logging

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from epl.communicators.gather_v import BUCKETS
from eplutil import (FEATURES, dataset_input, epl_paused, initial_weights, make_data, max_diff,
                     mlp)

STEPS, BATCH, DEVICES = 3, 8, 2
VOCAB, DIM = 20, 4


def _embedding_model(x, y):
    """Sparse gradients: an embedding lookup feeding a dense layer."""
    ids = tf.cast(tf.floor(x[:, :3] * VOCAB), tf.int32)
    table = tf.get_variable("embedding", [VOCAB, DIM],
                            initializer=tf.constant_initializer(
                                np.linspace(-1, 1, VOCAB * DIM).reshape(VOCAB, DIM)))
    features = tf.reduce_mean(tf.nn.embedding_lookup(table, ids), axis=1)
    logits = tf.layers.dense(features, 3, kernel_initializer=tf.constant_initializer(0.1),
                             name="head")
    return tf.losses.sparse_softmax_cross_entropy(y, logits)


def _train_op(loss, clip, opt_name):
    opt = tf.train.MomentumOptimizer(0.1, 0.9) if opt_name == "momentum" else \
        tf.train.GradientDescentOptimizer(0.5)
    grads_and_vars = opt.compute_gradients(loss)
    if clip:
        grads, variables = zip(*grads_and_vars)
        grads, _ = tf.clip_by_global_norm(grads, clip)
        grads_and_vars = list(zip(grads, variables))
    return opt.apply_gradients(grads_and_vars, global_step=tf.train.get_or_create_global_step())


def _run(sess, train, steps):
    for _ in range(steps):
        sess.run(train)
    return dict((v.op.name, sess.run(v)) for v in tf.trainable_variables())


def _serial(model, batch, clip=None, loss_scale=1.0, opt_name="momentum"):
    x, y = make_data(batch * STEPS)
    with epl_paused(), tf.Graph().as_default():
        loss = model(*dataset_input(x, y, batch)) * loss_scale
        train = _train_op(loss, clip, opt_name)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            return _run(sess, train, STEPS)


def _epl(model, config, clip=None, opt_name="momentum"):
    x, y = make_data(DEVICES * BATCH * STEPS)
    epl.init(epl.Config(config), cluster=Cluster(devices_per_worker=DEVICES))
    epl.set_default_strategy(epl.replicate(1))
    loss = model(*dataset_input(x, y, BATCH))
    train = _train_op(loss, clip, opt_name)
    sess = tf.Session()
    sess.run(tf.global_variables_initializer())
    values = _run(sess, train, STEPS)
    return values, epl.Graph.get().parallel, tf.get_default_graph()


def _mlp(x, y):
    return mlp(x, y, initial_weights())


def _assert_close(ref, got, tol):
    for name, value in ref.items():
        assert max_diff(value, [got[name]]) < tol, name


def _grad_collectives(program, graph):
    ops = [graph.get_operation_by_name(n) for n, g in program.collective_ops.items()
           if g.startswith("grads/")]
    return [op for op in ops if op.type in ("CollectiveReduce", "EplRingAllReduce")]


@pytest.mark.parametrize("backend", ["ring", "tf"])
@pytest.mark.parametrize("splits", [1, 2, 5])
def test_max_splits_buckets(monkeypatch, backend, splits):
    monkeypatch.setenv("EPL_COLLECTIVE_BACKEND", backend)
    ref = _serial(_mlp, DEVICES * BATCH)
    got, program, graph = _epl(_mlp, {"communication.max_splits": splits,
                                      "communication.num_communicators": 1})
    # 4 gradients (2 kernels, 2 biases) in at most `splits` buckets, on each of 2 copies
    assert len(_grad_collectives(program, graph)) == DEVICES * min(splits, 4)
    _assert_close(ref, got, 1e-5)


def test_num_communicators_makes_independent_groups():
    got, program, graph = _epl(_mlp, {"communication.max_splits": 4,
                                      "communication.num_communicators": 3})
    groups = set(g for g in program.collective_ops.values() if g.startswith("grads/"))
    assert len(groups) == 3
    keys = set(op.get_attr("communicator") if op.type == "EplRingAllReduce"
               else op.get_attr("group_key") for op in _grad_collectives(program, graph))
    assert len(keys) == 3
    _assert_close(_serial(_mlp, DEVICES * BATCH), got, 1e-5)


@pytest.mark.parametrize("backend", ["ring", "tf"])
def test_fp16_communication(monkeypatch, backend):
    monkeypatch.setenv("EPL_COLLECTIVE_BACKEND", backend)
    got, program, graph = _epl(_mlp, {"communication.fp16": True,
                                      "communication.fp16_scale": 64})
    collectives = [graph.get_operation_by_name(n) for n in program.collective_ops]
    if backend == "ring":  # float16 on the wire, converted (and scaled) inside the op
        ring = [op for op in collectives if op.type == "EplRingAllReduce"]
        assert ring and all(op.get_attr("wire_float16") and op.get_attr("scale") == 64
                            for op in ring)
    else:  # TF's CPU collectives have no float16: bit-cast payload, all-gathered
        gathers = [op for op in collectives if op.type == "CollectiveGather"
                   and program.collective_ops[op.name].startswith("grads/")]
        assert gathers and all(op.inputs[0].dtype == tf.int32 for op in gathers)
        assert [op for op in graph.get_operations() if op.type == "Mul" and "EPL_FP16" in op.name]
    _assert_close(_serial(_mlp, DEVICES * BATCH), got, 1e-3)


def _row_gathers(program, graph):
    """All-gathers of sparse gradient rows (values and indices packed as int32 words,
    rank 2; not the rank-1 port exchange of ring setup)."""
    ops = [graph.get_operation_by_name(n) for n, g in program.collective_ops.items()
           if g.startswith("grads/")]
    return [op for op in ops if op.type == "CollectiveGather"
            and op.inputs[0].shape.ndims == 2]


@pytest.mark.parametrize("config,gathers", [
    ({}, DEVICES * len(BUCKETS)),    # rows per copy: a bucket each, the batch is dynamic
    ({"communication.sparse_reduction": "all_reduce"}, 0),         # dense buffer + counts
    ({"communication.sparse_as_dense": True}, 0)])
def test_sparse_gradients_are_gathered_unless_reduced_densely(config, gathers):
    ref = _serial(_embedding_model, DEVICES * BATCH, opt_name="momentum")
    got, program, graph = _epl(_embedding_model, config, opt_name="momentum")
    assert len(_row_gathers(program, graph)) == gathers
    _assert_close(ref, got, 1e-5)
    if "communication.sparse_reduction" in config:   # the sparse update is kept
        plan = str(program.gradient_plans[0])
        assert "embedding: rows_all_reduce" in plan, plan


def _static_batch(batch):
    """The embedding model on batches of static size ``batch`` (static gradient rows)."""
    return lambda x, y: _embedding_model(tf.reshape(x, [batch, FEATURES]), tf.reshape(y, [batch]))


def test_auto_sparse_reduction_all_reduces_a_small_table_with_static_rows(caplog):
    """24 rows of 4 floats per replica against a 20 x 4 table: the all-reduce moves
    fewer bytes; the plan print says so."""
    caplog.set_level(logging.INFO, logger="epl")
    ref = _serial(_static_batch(DEVICES * BATCH), DEVICES * BATCH)
    got, program, graph = _epl(_static_batch(BATCH), {"communication.sparse_reduction": "auto"})
    assert _row_gathers(program, graph) == []
    assert "embedding: rows_all_reduce unfused over" in str(program.gradient_plans[0])
    assert "auto: all-reduce 400 B < gather 480 B" in str(program.gradient_plans[0])
    assert "sparse gradient embedding: rows_all_reduce unfused over taskgraph_0/dp (mean, " \
           "auto: all-reduce 400 B < gather 480 B)" in caplog.text
    _assert_close(ref, got, 1e-5)


def test_clip_after_allreduce_clips_the_reduced_gradient():
    ref = _serial(_mlp, DEVICES * BATCH, clip=0.05)
    got, program, graph = _epl(_mlp, {"communication.clip_after_allreduce": True}, clip=0.05)
    _assert_close(ref, got, 1e-5)
    norm_inputs = [op for op in graph.get_operations()
                   if op.name.endswith("global_norm/L2Loss") and not op.name.startswith("EPL")]
    assert norm_inputs and all("EPL_FUSION" in op.inputs[0].name for op in norm_inputs)
    epl.reset()
    before, _, _ = _epl(_mlp, {}, clip=0.05)  # default: each replica clips its own gradient
    assert max(np.abs(before[n] - ref[n]).max() for n in ref) > 1e-4


def test_gradients_reduce_method_sum():
    ref = _serial(_mlp, DEVICES * BATCH, loss_scale=DEVICES, opt_name="sgd")
    got, _, _ = _epl(_mlp, {"communication.gradients_reduce_method": "sum"}, opt_name="sgd")
    _assert_close(ref, got, 1e-5)
