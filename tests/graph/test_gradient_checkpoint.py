"""Gradient checkpointing: recompute instead of store, same training as without it.

Equivalence: ResNet (batch norm) and BERT-style models from the real-model
corpus train like serial training without checkpointing, with checkpoints from
the ``checkpoints`` collection and chosen automatically, on one device, data
parallel over 2 devices, a 2-stage pipeline and gradient accumulation.
Structure: recomputed copies exist, belong to their original's TaskGraph and
the BACKWARD phase, and no backward op reads a non-checkpoint activation.
check_gradients catches a wrong gradient by variable and value; bad input and
graphs where nothing can be saved are reported.
"""
import logging

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import corpusutil
import epl
from epl.cluster import Cluster
from epl.config import ConfigError
from epl.ir.phase import Phase
from epl.runtime import gradient_checkpoint as gc
from eplutil import (MEASURED, copy_values, dataset_input, initial_weights, make_data,
                     max_diff, mlp, serial_train, train_step)
from realmodels import Bert, ResNet

TOL = 1e-5


def _record(value):
    import os
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], value))


def _collect_checkpoints(suffixes):
    """Add the outputs of the ops created since ``start`` whose names end with one of
    ``suffixes`` to the "checkpoints" collection (what a user would do by hand)."""
    graph = tf.get_default_graph()
    for op in graph.get_operations():
        if op.name.endswith(suffixes) and op.outputs[0] not in \
                graph.get_collection("checkpoints"):
            tf.add_to_collection("checkpoints", op.outputs[0])


class CheckpointedResNet(ResNet):
    """ResNet whose user marks each unit's output and the stem's pooling."""

    def loss(self, batch, stage=corpusutil.no_stage, reuse=False):
        loss = super(CheckpointedResNet, self).loss(batch, stage, reuse)
        _collect_checkpoints(("bottleneck_v1/Relu", "pool1/MaxPool"))
        return loss


class CheckpointedBert(Bert):
    """BERT whose user marks each layer's output."""

    def loss(self, batch, stage=corpusutil.no_stage, reuse=False):
        loss = super(CheckpointedBert, self).loss(batch, stage, reuse)
        _collect_checkpoints(("ffn/norm/add_1",))
        return loss


MODELS = {"resnet": (ResNet, CheckpointedResNet), "bert": (Bert, CheckpointedBert)}
MODES = {
    # mode: (runner(model, arrays, config), slices per serial step, moving statistics)
    "single": (lambda m, a, c: corpusutil.run_dp(m, a, devices=1, config=c), 1, "all"),
    "dp_1x2": (lambda m, a, c: corpusutil.run_dp(m, a, devices=2, config=c), 2, "first"),
    "pipeline_2x2": (lambda m, a, c: corpusutil.run_pipeline(m, a, 2, config=c), 2, "all"),
    "ga_2": (lambda m, a, c: corpusutil.run_ga(m, a, micro_batches=2, config=c), 2, "all"),
}


def _recomputed_ops(graph):
    """[(copy, original)] of every call's recomputed (non-checkpoint) ops."""
    pairs = []
    for call in gc.state(graph).calls:
        for copy, original in call.recomputed.items():
            pairs.append((graph.get_operation_by_name(copy),
                          graph.get_operation_by_name(original)))
    return pairs


def _assert_copies_belong_to_their_stage(graph):
    view = epl.Graph.get(graph)
    pairs = _recomputed_ops(graph)
    assert pairs, "nothing was recomputed"
    for copy, original in pairs:
        info, source = view.info(copy), view.info(original)
        assert info.phase == Phase.BACKWARD, copy.name
        assert info.taskgraph == source.taskgraph, (copy.name, info.taskgraph, source.taskgraph)
        assert copy.name.startswith(gc.RECOMPUTE_SCOPE), copy.name
    return set(view.info(copy).taskgraph for copy, _ in pairs)


# "auto" on every layout; "collection" (the same machinery, other checkpoints) on the
# layouts where stages matter, to keep the suite's cost down.
CASES = ([(model, mode, "auto") for model in sorted(MODELS) for mode in sorted(MODES)]
         + [(model, mode, "collection") for model in sorted(MODELS)
            for mode in ("single", "pipeline_2x2")])


@pytest.mark.parametrize("model_name,mode,kind", CASES)
def test_corpus_matches_serial_training(model_name, mode, kind, corpus_reference):
    runner, slices, stats = MODES[mode]
    plain_class, marked_class = MODELS[model_name]
    model = (marked_class if kind == "collection" else plain_class)()
    arrays = model.data(slices * model.batch * corpusutil.STEPS)
    ref_curve, reference = corpus_reference(model, arrays, slices, stats)
    curve, copies = runner(model, arrays, {"gradient_checkpoint.type": kind})
    if len(curve) == len(ref_curve):  # fetched losses too (not only the weights)
        np.testing.assert_allclose(curve, ref_curve, rtol=1e-5)
    worst, where = corpusutil.max_difference(reference, copies, stats)
    _record(worst)
    assert worst < TOL, "%s differs from serial training by %.3g" % (where, worst)
    assert set(reference) - {"global_step"} <= set(copies)
    graph = tf.get_default_graph()
    calls = gc.state(graph).calls
    assert len(calls) == 1 and calls[0].method.startswith(kind)
    stages = _assert_copies_belong_to_their_stage(graph)
    if mode == "pipeline_2x2":
        assert stages == {0, 1}, "each stage recomputes its own activations"


def _build_bert(config, model=None):
    model = model or Bert()
    arrays = model.data(model.batch * 2)
    epl.init(epl.Config(config), cluster=Cluster(devices_per_worker=1))
    loss = model.loss(corpusutil.dataset(arrays, model.batch))
    return loss, model.train_op(loss)


def _region_of(loss):
    view = epl.Graph.get()
    call = view.gradient_calls[-1]
    return gc.gc_graph.Region(view, as_list(call.ys), as_list(call.xs))


def as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _backward_readers(op):
    view = epl.Graph.get()
    return [c for t in op.outputs for c in t.consumers()
            if view.info(c) is not None and view.info(c).phase != Phase.FORWARD]


@pytest.mark.parametrize("kind", ["collection", "auto"])
def test_backward_reads_only_checkpoints_and_recomputed_copies(kind):
    model = CheckpointedBert() if kind == "collection" else Bert()
    loss, _ = _build_bert({"gradient_checkpoint.type": kind}, model)
    graph = tf.get_default_graph()
    call = gc.state(graph).calls[0]
    region = _region_of(loss)
    checkpoints = set(call.checkpoints)
    recomputed = set(call.recomputed.values())
    activations = [op for op in region.ops if region.may_recompute(op)
                   and op.name not in checkpoints]
    assert activations and recomputed == set(op.name for op in activations)
    for op in activations:
        assert _backward_readers(op) == [], "backward reads %s" % op.name
    # the checkpoints themselves are read by the recomputed copies
    assert any(_backward_readers(graph.get_operation_by_name(name)) for name in checkpoints)
    if kind == "collection":
        marked = set(t.op.name for t in graph.get_collection("checkpoints"))
        assert marked <= checkpoints


def test_without_checkpointing_backward_reads_the_activations():
    """The control for the test above: plain gradients do read forward activations."""
    loss, _ = _build_bert({})
    region = _region_of(loss)
    read = [op for op in region.ops if region.may_recompute(op) and _backward_readers(op)]
    assert len(read) > 20


def test_recomputation_waits_for_the_gradient_that_needs_it():
    """A level's recomputed copies have control inputs on backward ops (they are not
    computed during the forward pass)."""
    _build_bert({"gradient_checkpoint.type": "auto"})
    graph = tf.get_default_graph()
    view = epl.Graph.get()
    gated = [copy for copy, _ in _recomputed_ops(graph)
             if any(view.info(c).phase == Phase.BACKWARD and
                    not c.name.startswith(gc.RECOMPUTE_SCOPE) for c in copy.control_inputs)]
    assert gated


def test_end_taskgraph_limits_recomputation_to_earlier_stages():
    model = Bert()
    arrays = model.data(2 * model.batch * corpusutil.STEPS)
    _, reference = corpusutil.serial_reference(model, arrays, 2)
    config = {"gradient_checkpoint.type": "auto", "gradient_checkpoint.end_taskgraph": 0}
    _, copies = corpusutil.run_pipeline(model, arrays, 2, config=config)
    worst, where = corpusutil.max_difference(reference, copies)
    _record(worst)
    assert worst < TOL, where
    assert _assert_copies_belong_to_their_stage(tf.get_default_graph()) == {0}


def test_end_taskgraph_beyond_the_model_is_an_error():
    model = Bert()
    config = {"pipeline.num_micro_batch": 2, "gradient_checkpoint.type": "auto",
              "gradient_checkpoint.end_taskgraph": 2}
    epl.init(epl.Config(config), cluster=Cluster(devices_per_worker=2))
    stage = lambda index: epl.replicate(1, name="stage_%d" % index)
    loss = model.loss(corpusutil.dataset(model.data(model.batch), model.batch), stage)
    with pytest.raises(ConfigError, match=r"gradient_checkpoint.end_taskgraph = 2 .* 2 "
                                          r"TaskGraph\(s\) \(0..1\)"):
        model.train_op(loss)


@pytest.mark.parametrize("variable,value", [("EPL_GRADIENT_CHECKPOINT_END_TASKGRAPH", "0"),
                                            ("EPL_GRADIENT_CHECKPOINT_CHECK_GRADIENTS", "True")])
def test_gc_keys_exported_without_a_type_train_like_serial(variable, value, monkeypatch):
    """A refinement exported for every job does not break a job without
    gradient_checkpoint.type: it trains data-parallel like serial training, nothing is
    recomputed (the one-time warning: tests/unit/test_availability.py)."""
    monkeypatch.setenv(variable, value)
    x, y = make_data(64)
    _, reference = serial_train(x, y, 16, 4)
    epl.init(cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1))
    train = train_step(mlp(*dataset_input(x, y, 8), weights=initial_weights()))
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(4):
            sess.run(train)
        copies = copy_values(sess, "d1/kernel") + copy_values(sess, "d2/kernel")
    worst = max(max_diff(reference[name], copies[i * 2:i * 2 + 2])
                for i, name in enumerate(("d1/kernel", "d2/kernel")))
    assert worst < TOL
    assert gc.state() is None


# ---- check_gradients ----------------------------------------------------------------------
CHECKED = {"gradient_checkpoint.type": "auto", "gradient_checkpoint.check_gradients": True}


def test_check_gradients_reports_every_variable_and_trains_like_serial():
    model = Bert()
    arrays = model.data(model.batch * corpusutil.STEPS)
    _, reference = corpusutil.serial_reference(model, arrays, 1)
    _, copies = corpusutil.run_dp(model, arrays, devices=1, config=CHECKED)
    worst, where = corpusutil.max_difference(reference, copies)
    _record(worst)
    assert worst < TOL, where
    checks = gc.state(tf.get_default_graph()).calls[0].checks
    names = set(name for name, _ in checks)
    assert names == set(v.op.name for v in tf.trainable_variables())


def test_check_gradients_catches_a_wrong_gradient_by_variable(monkeypatch):
    """One variable's checkpointed gradient is off by 0.1%: the step fails naming it."""
    target = "model/layer_0/ffn/inner/kernel"
    original = gc._sum

    def wrong(view, x, parts):
        grad = original(view, x, parts)
        return grad * 1.001 if x.op.name == target else grad
    monkeypatch.setattr(gc, "_sum", wrong)
    _, train = _build_bert(CHECKED)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        with pytest.raises(tf.errors.InvalidArgumentError) as info:
            sess.run(train)
    message = str(info.value)
    assert "gradient of variable %s differs" % target in message
    assert "max|gc - plain|" in message


def test_check_gradients_values_are_fetchable_per_variable():
    _, train = _build_bert(CHECKED)
    checks = gc.state(tf.get_default_graph()).calls[0].checks
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        diffs = sess.run(dict(checks))
        sess.run(train)
    assert max(diffs.values()) <= 1e-6, diffs


# ---- bad input and graphs it cannot help ----------------------------------------------------
def _mlp(config):
    x, y = make_data(32)
    epl.init(epl.Config(config), cluster=Cluster(devices_per_worker=1))
    features, labels = dataset_input(x, y, 8)
    return features, labels, mlp(features, labels, initial_weights())


def test_empty_collection_names_the_key_and_value():
    _, _, loss = _mlp({"gradient_checkpoint.type": "collection"})
    with pytest.raises(ConfigError, match=r'gradient_checkpoint.type = "collection" but the '
                                          r'tf collection "checkpoints" is empty'):
        train_step(loss)


def test_unknown_checkpoint_tensor_names_the_tensor():
    """Each gradient call uses the entries in its own region; an entry no call uses
    is refused when the graph is parallelized (more: tests/graph/test_gc_collection.py)."""
    features, _, loss = _mlp({"gradient_checkpoint.type": "collection"})
    tf.add_to_collection("checkpoints", features * 2.0)     # not on the way to the loss
    train_step(loss)
    with pytest.raises(ConfigError, match=r'gradient_checkpoint.type = "collection": '
                                          r"checkpoint tensor\(s\) 'mul:0' .* not between"):
        tf.get_default_graph().finalize()


def test_checkpoint_name_missing_from_the_graph_is_named():
    _, _, loss = _mlp({"gradient_checkpoint.type": "collection"})
    tf.add_to_collection("checkpoints", "no_such_layer/Relu:0")
    with pytest.raises(ConfigError, match="no_such_layer/Relu:0"):
        train_step(loss)


def test_graph_it_cannot_help_warns_once_loudly(caplog):
    """One matmul: no checkpoint saves anything. Said once; gradients still built."""
    epl.init(epl.Config({"gradient_checkpoint.type": "auto"}),
             cluster=Cluster(devices_per_worker=1))
    weights = tf.get_variable("w", initializer=tf.ones([3, 2]))
    loss = tf.reduce_sum(tf.matmul(tf.ones([4, 3]), weights))
    with caplog.at_level(logging.WARNING, logger="epl.gradient_checkpoint"):
        first = tf.gradients(loss, [weights])
        second = tf.gradients(loss, [weights])
    warnings = [r for r in caplog.records if r.name == "epl.gradient_checkpoint"]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "does NOT apply" in warnings[0].getMessage()
    assert all(g is not None for g in first + second)
    assert gc.state().calls == []


def test_auto_parallel_stages_are_refused_with_the_keys_by_epl_init():
    """Before: refused at tf.gradients, after the forward model was built."""
    config = {"gradient_checkpoint.type": "auto", "auto.auto_parallel": True,
              "pipeline.num_stages": 2, "pipeline.num_micro_batch": 2}
    with pytest.raises(ConfigError, match=r"auto.auto_parallel = True and "
                                          r"pipeline.num_stages = 2"):
        epl.init(epl.Config(config), cluster=Cluster(devices_per_worker=2))


def test_gradients_of_an_activation_reach_it():
    """xs may be activations: their gradient is the same as without checkpointing."""
    model = Bert()
    arrays = model.data(model.batch)
    values = []
    for config in ({}, {"gradient_checkpoint.type": "auto"}):
        epl.init(epl.Config(config), cluster=Cluster(devices_per_worker=1))
        loss = model.loss(tuple(tf.constant(a) for a in arrays))
        graph = tf.get_default_graph()
        hidden = graph.get_operation_by_name("model/layer_0/ffn/norm/add_1").outputs[0]
        grads = tf.gradients(loss, [hidden] + tf.trainable_variables())
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            values.append(sess.run([tf.convert_to_tensor(g) for g in grads]))
        epl.reset()
    for plain, checkpointed in zip(*values):
        np.testing.assert_allclose(checkpointed, plain, rtol=1e-5, atol=1e-6)
