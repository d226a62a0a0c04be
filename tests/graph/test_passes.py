"""Each rewrite pass runs alone on a tiny graph (``parallelize(passes=...)``)."""
import gc

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from epl.parallel import rewriter
from epl.ir.phase import Phase
from epl.protocols.passes import LAYERS, MODEL, Pass, PassOrderError, check_order, describe
from epl.parallel.passes.classify import ClassifyRoles
from epl.parallel.passes.gradients import GradientAggregation
from epl.parallel.passes.placement import Placement
from epl.parallel.repeat import RepeatStep
from eplutil import (all_copy_values, dataset_input, initial_weights, make_data, mlp,
                     staged_mlp, train_step)


def _tiny(devices=2, config=None):
    epl.init(epl.Config(config or {}), cluster=Cluster(devices_per_worker=devices))
    epl.set_default_strategy(epl.replicate(1))
    x, y = make_data(16)
    loss = mlp(*dataset_input(x, y, 4), weights=initial_weights())
    train_step(loss)
    env = epl.Env.get()
    return epl.Graph.get(), env


def _parallelize(passes, devices=2, config=None):
    view, env = _tiny(devices, config)
    program = rewriter.parallelize(view, env.config, env.cluster, passes=passes)
    return view, program


def _device(op):
    return op.device.rsplit("/", 1)[-1]


def test_classify_and_placement_alone_place_copy_zero():
    view, program = _parallelize((ClassifyRoles(), Placement()))
    kernel = tf.get_default_graph().get_operation_by_name("d1/kernel")
    assert _device(kernel) == "device:CPU:0"
    get_next = [op for op in tf.get_default_graph().get_operations()
                if op.type == "IteratorGetNext"][0]
    assert _device(get_next) == "device:CPU:0" and program.num_copies == 2
    assert not any(op.name.startswith("EPL_REPLICA") for op in tf.get_default_graph()
                   .get_operations())
    assert not program.collective_ops and program.sync_op is None


def test_repeat_step_alone_builds_copy_one_on_its_device():
    view, program = _parallelize((ClassifyRoles(), Placement(), RepeatStep()))
    clone = tf.get_default_graph().get_operation_by_name("EPL_REPLICA_1/d1/kernel")
    assert _device(clone) == "device:CPU:1"
    info = view.info(clone)
    assert (info.copy, info.micro_batch, info.origin) == (1, 0, "d1/kernel")
    assert not program.collective_ops


def test_gradient_aggregation_records_a_plan_per_copy():
    view, program = _parallelize((ClassifyRoles(), Placement(), RepeatStep(),
                                  GradientAggregation()), config={"communication.max_splits": 2})
    assert len(program.gradient_plans) == 2
    plan = program.gradient_plans[1]
    assert {e.group.name for e in plan.entries} == {"taskgraph_0/dp"}
    assert sorted(set(e.bucket for e in plan.entries)) == [0, 1]
    assert program.collective_ops  # the all-reduces of both copies


def test_pass_order_is_checked():
    with pytest.raises(PassOrderError, match="placement.*after a pass of phase lower"):
        check_order((ClassifyRoles(), GradientAggregation(), Placement()))
    text = describe(rewriter.PASSES)
    assert text.startswith("model:\n  auto_stages") and "io_slicing" in text
    assert "split_lowering" in text
    assert "classify_roles" in text


class _Failing(Pass):
    name = "test_failing"
    phase = MODEL

    def run(self, ctx):
        raise RuntimeError("this pass fails")


def test_a_failed_rewrite_leaves_a_finalized_graph_finalized():
    """MonitoredTrainingSession finalizes the graph before EPL rewrites it; a rewrite
    that fails must not leave the user's graph open to changes (before, it did)."""
    view, env = _tiny()
    # finalized as TF does it, without EPL's hook on finalize (which would rewrite first)
    tf.get_default_graph()._finalized = True
    with pytest.raises(RuntimeError, match="this pass fails"):
        rewriter.parallelize(view, env.config, env.cluster, passes=(_Failing(),))
    assert tf.get_default_graph().finalized
    assert "this pass fails" in view.rewrite_error


class _CollectorProbe(Pass):
    """Records whether Python's garbage collector is on while a pass runs."""

    name = "test_collector_probe"
    phase = MODEL

    def __init__(self, fail=False):
        self.seen, self.fail = [], fail

    def run(self, ctx):
        self.seen.append(gc.isenabled())
        if self.fail:
            raise RuntimeError("this pass fails")


def test_the_collector_is_paused_during_the_rewrite_and_restored():
    """The rewrite's objects pushed Python into a full collection (0.1 s CPU on the
    small shapes, freeing nothing); the collector's state afterwards is the
    program's, also after a failed rewrite or when the program turned it off."""
    assert gc.isenabled()
    view, env = _tiny()
    probe = _CollectorProbe()
    rewriter.parallelize(view, env.config, env.cluster, passes=(probe, ClassifyRoles()))
    assert probe.seen == [False] and gc.isenabled()
    tf.reset_default_graph()
    view, env = _tiny()
    failing = _CollectorProbe(fail=True)
    with pytest.raises(RuntimeError, match="this pass fails"):
        rewriter.parallelize(view, env.config, env.cluster, passes=(failing,))
    assert failing.seen == [False] and gc.isenabled()
    tf.reset_default_graph()
    view, env = _tiny()
    gc.disable()
    try:
        rewriter.parallelize(view, env.config, env.cluster,
                             passes=(_CollectorProbe(), ClassifyRoles()))
        assert not gc.isenabled()
    finally:
        gc.enable()


class _LayerAllReduce(Pass):
    """A model pass like split lowering: a collective inside the forward pass."""

    name = "test_layer_all_reduce"
    phase = MODEL

    def run(self, ctx):
        hidden = ctx.tf_graph.get_tensor_by_name("d1/Relu:0")
        consumers = list(hidden.consumers())
        comm = ctx.communicator(ctx.plan.taskgraphs[0].dp_group(), LAYERS)

        def build(copy, micro_batch, inputs):
            return comm.all_reduce(inputs[0], ctx.device(0, copy), "hidden/%d" % micro_batch,
                                   mean=True).op

        with ctx.view.building(0, Phase.FORWARD):
            op = build(0, 0, [hidden])
        ctx.view.specialize(op, build)
        ctx.rewire(hidden, op.outputs[0], consumers)


def _staged_tiny(devices, micro_batches, lowering="unrolled"):
    epl.init(epl.Config({"pipeline.num_micro_batch": micro_batches,
                         "pipeline.micro_batching": lowering}),
             cluster=Cluster(devices_per_worker=devices))
    x, y = make_data(32)
    train = train_step(staged_mlp(*dataset_input(x, y, 4), initial_weights()))
    env = epl.Env.get()
    return epl.Graph.get(), env, train


_LOWERING = {"stage_functions": "stage functions", "unrolled": "unrolled copies"}


@pytest.mark.parametrize("lowering", sorted(_LOWERING))
@pytest.mark.parametrize("pipeline", [False, True], ids=["dp", "pipeline"])
def test_collectives_are_built_per_copy_never_copied(monkeypatch, pipeline, lowering):
    """Copy 1 and every micro-batch get their own all-reduce (their rank, their
    instance), built from their own inputs, whichever lowering repeats the step (stage
    functions keep such collectives ops of each repetition); the graph runs."""
    monkeypatch.setenv("EPL_COLLECTIVE_BACKEND", "ring")
    passes = (_LayerAllReduce(),) + rewriter.PASSES
    if pipeline:  # 2 replicas x 2 stages; stage 0's group is (CPU:0, CPU:2)
        view, env, _ = _staged_tiny(4, 2, lowering)
        program = rewriter.parallelize(view, env.config, env.cluster, passes=passes)
    else:
        view, program = _parallelize(passes, config={"pipeline.micro_batching": lowering})
    assert program.plan.micro_batching[0] == _LOWERING[lowering]
    micro_batches = 2 if pipeline else 1
    graph = tf.get_default_graph()
    ring = [graph.get_operation_by_name(name) for name, group in program.collective_ops.items()
            if group.startswith("layers/")]
    ring = [op for op in ring if op.type == "EplRingAllReduce"]  # not the ring's setup ops
    assert sorted(op.get_attr("rank") for op in ring) == sorted([0, 1] * micro_batches)
    assert len(set(op.get_attr("instance_key") for op in ring)) == micro_batches
    clone = [op for op in ring if op.get_attr("rank") == 1][0]
    assert clone.inputs[0].op.name.startswith("EPL_REPLICA_1/")
    assert _device(clone) == ("device:CPU:2" if pipeline else "device:CPU:1")
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        loss = view.apply_calls[0].grads_and_vars[0][0]
        assert np.isfinite(sess.run(loss)).all()


def test_stage_functions_train_around_collectives_built_per_copy(monkeypatch):
    """A model pass that makes a per-copy collective inside a pipeline stage (as split
    layers do): stage functions call the rest of the stage around it and train exactly
    as unrolled copies do (before, stage functions refused such graphs)."""
    monkeypatch.setenv("EPL_COLLECTIVE_BACKEND", "ring")
    weights = {}
    for lowering in ("unrolled", "stage_functions"):
        tf.reset_default_graph()
        view, env, train = _staged_tiny(4, 2, lowering="auto" if lowering != "unrolled"
                                        else lowering)
        program = rewriter.parallelize(view, env.config, env.cluster,
                                       passes=(_LayerAllReduce(),) + rewriter.PASSES)
        assert program.plan.micro_batching[0] == _LOWERING[lowering]
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            for _ in range(2):  # 32 rows: 2 replicas x 2 micro-batches x 4 rows a step
                sess.run(train)
            weights[lowering] = all_copy_values(
                sess, [v.op.name for v in tf.trainable_variables()])
    assert sorted(weights["unrolled"]) == sorted(weights["stage_functions"])
    for name, copies in weights["unrolled"].items():
        assert len(copies) == 2
        for mine, theirs in zip(weights["stage_functions"][name], copies):
            np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-7, err_msg=name)
