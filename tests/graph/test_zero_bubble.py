"""ZeroBubble (ZB-H1): each stage's backward run as B (input gradients) and W (weight
gradients) actions. The same weights as serial training and as PreferBackward, under
both lowerings of the repeated step and with the runtime's memory savers; B and W
apart in the graph and in the trace; peak memory per stage against 1F1B's."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf
from tensorflow.core.protobuf import rewriter_config_pb2

import corpusutil
import epl
from epl.cluster import Cluster
from epl.parallel.repeat.backward_split import weight_ops
from eplutil import (MEASURED, copy_values, dataset_input, initial_weights, make_data,
                     max_diff, serial_train, stage_peak_bytes, staged_mlp, trace_times,
                     train_step)
from realmodels import CORPUS, Bert, ResNet

TOL = 1e-5
CORPUS_TOL = 2e-5
B, K = 4, 3
NAMES = ("d1/kernel", "d2/kernel", "d1/bias", "d2/bias")


def _pipeline(devices, depth, micro_batches, strategy="ZeroBubble", lowering="auto",
              steps=K, extra=None):
    replicas = devices // depth
    x, y = make_data(micro_batches * B * replicas * (steps + 1))
    settings = {"pipeline.num_micro_batch": micro_batches, "pipeline.strategy": strategy,
                "pipeline.micro_batching": lowering}
    settings.update(extra or {})
    epl.init(epl.Config(settings), cluster=Cluster(devices_per_worker=devices))
    loss = staged_mlp(*dataset_input(x, y, B), weights=initial_weights(), depth=depth)
    train = train_step(loss)
    sess = tf.Session()
    sess.run(tf.global_variables_initializer())
    for _ in range(steps):
        sess.run(train)
    values = dict((name, copy_values(sess, name)) for name in NAMES)
    return x, y, sess, values


def _record(value):
    import os
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], value))


@pytest.mark.parametrize("lowering", ["stage_functions", "unrolled"])
@pytest.mark.parametrize("depth,micro_batches", [(2, 4), (3, 4), (2, 2), (3, 2), (2, 5)])
def test_matches_serial_and_prefer_backward(depth, micro_batches, lowering):
    x, y, sess, zero_bubble = _pipeline(depth, depth, micro_batches, lowering=lowering)
    program = epl.Graph.get().parallel
    assert program.schedule.name == "ZeroBubble" and program.schedule.splits_backward
    _, ref = serial_train(x, y, micro_batches * B, K, depth=depth)
    for name in NAMES:
        assert max_diff(ref[name], zero_bubble[name]) < TOL, name
    sess.close()
    tf.reset_default_graph()
    _, _, _, one_f_one_b = _pipeline(depth, depth, micro_batches, "PreferBackward", lowering)
    worst = max(float(np.abs(np.asarray(zero_bubble[n]) - np.asarray(one_f_one_b[n])).max())
                for n in NAMES)
    _record(worst)
    # Every gradient is summed over the micro-batches in micro-batch order under both
    # schedules: the same additions in the same order.
    assert worst == 0.0


@pytest.mark.parametrize("lowering", ["stage_functions", "unrolled"])
def test_data_parallel_over_pipelines(lowering):
    x, y, _, values = _pipeline(4, 2, 4, lowering=lowering)
    plan = epl.Graph.get().parallel.plan
    assert plan.num_replicas == 2 and len(plan.stages) == 2
    _, ref = serial_train(x, y, 2 * 4 * B, K)
    for name in NAMES:
        assert len(values[name]) == 2 and max_diff(ref[name], values[name]) < TOL, name


def _clipped(strategy, clip_after):
    """Weights after 2 steps with the user's global-norm clipping, which reads every
    stage's gradients (a W part's results) before any update."""
    tf.reset_default_graph()
    x, y = make_data(4 * B * 3)
    epl.init(epl.Config({"pipeline.num_micro_batch": 4, "pipeline.strategy": strategy,
                         "communication.clip_after_allreduce": clip_after}),
             cluster=Cluster(devices_per_worker=2))
    loss = staged_mlp(*dataset_input(x, y, B), weights=initial_weights())
    opt = tf.train.GradientDescentOptimizer(0.1)
    grads, variables = zip(*opt.compute_gradients(loss))
    grads, _ = tf.clip_by_global_norm(grads, 0.01)
    train = opt.apply_gradients(list(zip(grads, variables)))
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(2):
            sess.run(train)
        return dict((name, copy_values(sess, name)) for name in NAMES)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("clip_after", [False, True])
def test_global_norm_clipping_matches_prefer_backward(clip_after):
    zero_bubble = _clipped("ZeroBubble", clip_after)
    one_f_one_b = _clipped("PreferBackward", clip_after)
    for name in NAMES:
        np.testing.assert_array_equal(zero_bubble[name], one_f_one_b[name], err_msg=name)


def test_stage_memory_option_matches_serial():
    x, y, _, values = _pipeline(3, 3, 4, extra={"pipeline.zero_bubble_memory": "stage"})
    assert epl.Graph.get().parallel.schedule.stage(2)[1:3] == tuple(
        epl.strategies.schedule.Action.parse(a) for a in ("2B0", "2W0"))
    _, ref = serial_train(x, y, 4 * B, K, depth=3)
    for name in NAMES:
        assert max_diff(ref[name], values[name]) < TOL, name


def test_weight_gradients_are_w_and_input_gradients_are_b():
    """Stage 1's dx (MatMul with the kernel transposed) is B, its kernel gradient W.
    Stage 0 runs every W right after its B (ZB-H1 defers none there): its backward is
    not split, one fused action per micro-batch, as PreferBackward's. Split, its
    kernel gradient would be W and its B empty (nothing before it waits)."""
    _pipeline(2, 2, 2, lowering="unrolled", steps=1)
    view = epl.Graph.get()
    program = view.parallel
    entrances, exits = program.boundaries[0]
    assert not [key for key in list(entrances) + list(exits) if key[:2] == (0, "W")]
    for m in range(2):
        assert (0, "B", m) in exits and (1, "W", m) in exits and (1, "B", m) in exits
    grads = dict((v.op.name, g) for g, v in _gradients(view))
    weights = weight_ops(_Ctx(view), frozenset([1]))
    assert grads["d2/kernel"].op.name in weights and grads["d1/kernel"].op.name not in weights
    assert grads["d1/kernel"].op.name in weight_ops(_Ctx(view), frozenset([0, 1]))
    b_ops = set(op.name for key, ops in exits.items() if key[:2] == (1, "B") for op in ops)
    assert not b_ops & weights and b_ops


def test_bias_gradients_run_in_b():
    """Stage 1's bias gradient (``BiasAddGrad``, a sum over the rows of the output
    gradient B has just computed) runs in B, while that gradient is still in cache;
    the kernel gradient (``x^T . dy``) stays W."""
    _pipeline(2, 2, 2, lowering="stage_functions", steps=1)
    library = tf.get_default_graph().as_graph_def().library.function
    kinds = dict((f.signature.name, set(n.op for n in f.node_def)) for f in library
                 if f.signature.name.startswith("EPL_stage1_"))
    backward = [ops for name, ops in kinds.items() if "backward" in name]
    weights = [ops for name, ops in kinds.items() if "weights" in name]
    assert backward and weights
    assert any("BiasAddGrad" in ops for ops in backward)
    assert not any("BiasAddGrad" in ops for ops in weights)
    assert any("MatMul" in ops for ops in weights)


class _Ctx(object):
    def __init__(self, view):
        self.view, self.tf_graph = view, tf.get_default_graph()


def _gradients(view):
    return [pair for call in view.apply_calls for pair in call.grads_and_vars]


def test_stage_function_calls_follow_the_schedule():
    _, _, sess, _ = _pipeline(2, 2, 4, lowering="stage_functions", steps=1)
    program = epl.Graph.get().parallel
    entrances, exits = program.boundaries[0]
    start, end = trace_times(sess, "Momentum")
    checked, kinds = 0, set()
    for stage in range(2):
        actions = [a for a in program.schedule.stage(stage)
                   if (a.stage, a.kind, a.micro_batch) in exits]
        for before, after in zip(actions, actions[1:]):
            first = exits[(before.stage, before.kind, before.micro_batch)]
            second = entrances[(after.stage, after.kind, after.micro_batch)]
            for call in first + second:
                name = call.get_attr("f").name
                assert name.startswith("EPL_stage%d_" % stage), name
                kinds.add(name.split("_")[2])
            assert max(end[c.name] for c in first) <= min(start[c.name] for c in second), (
                str(before), str(after))
            checked += 1
    # stage 0: 4 F and 4 W (its B is empty); stage 1: 4 F, 4 B and 4 W
    assert checked == (8 - 1) + (12 - 1)
    assert {"forward", "backward0", "weights0"} <= kinds


def _same_device(a, b):
    return tf.DeviceSpec.from_string(a).to_string() == tf.DeviceSpec.from_string(b).to_string()


@pytest.mark.parametrize("strategy", ["ZeroBubble", "PreferBackward"])
def test_what_an_action_sends_another_stage_leaves_before_the_next_action(strategy):
    """Every tensor an action hands to another stage's action is read there through
    an Identity on the action's device that waits for the barrier before the stage's
    next action: TF's one inter-op thread then runs it (and the _Send TF adds for
    it) before that action, not after whatever the stage has ready (a structural
    check; see docs/pipeline_schedules.md). The session turns grappler's dependency
    optimizer off, which would remove the barrier and the Identity."""
    _, _, sess, _ = _pipeline(2, 2, 4, strategy=strategy, lowering="stage_functions",
                              steps=1)
    program = epl.Graph.get().parallel
    entrances, exits = program.boundaries[0]
    entering = set(op for ops in entrances.values() for op in ops)
    sent = set()
    for stage in range(2):
        actions = [a for a in program.schedule.stage(stage)
                   if (a.stage, a.kind, a.micro_batch) in entrances or
                   (a.stage, a.kind, a.micro_batch) in exits]
        for before, after in zip(actions, actions[1:]):
            first = exits.get((before.stage, before.kind, before.micro_batch), [])
            second = entrances.get((after.stage, after.kind, after.micro_batch), [])
            barriers = [op for op in second[0].control_inputs
                        if op.name.endswith("after_%s_copy0" % (before,))] if second else []
            for op in first:
                for reader in [c for t in op.outputs for c in t.consumers()]:
                    away = [c for t in reader.outputs for c in t.consumers()
                            if c in entering and not _same_device(c.device, op.device)]
                    assert reader not in entering or _same_device(reader.device, op.device), (
                        "%s reads %s's output directly" % (reader.name, str(before)))
                    if reader.type != "Identity" or not away:
                        continue
                    assert barriers and barriers[0] in reader.control_inputs, (
                        str(before), reader.name)
                    sent.add(str(before))
    # stage 0 sends each forward's activations, stage 1 each input gradient (B) that
    # has an action after it on its stage
    last = str(program.schedule.stage(1)[-1])
    assert sent == set(["0F%d" % m for m in range(4)] +
                       ["1B%d" % m for m in range(4) if "1B%d" % m != last]), sorted(sent)
    toggle = sess._config.graph_options.rewrite_options.dependency_optimization  # noqa
    assert toggle == rewriter_config_pb2.RewriterConfig.OFF


@pytest.mark.parametrize("lowering", ["stage_functions", "unrolled"])
def test_back_to_back_b_and_w_lower_as_the_fused_backward(lowering):
    """"stage" runs every W right after its B: each stage's backward is lowered fused,
    as PreferBackward's (no W action, no weight-gradient function, the gradient gates
    kept), so it holds 1F1B's memory and makes one call where a split makes two."""
    _, _, sess, _ = _pipeline(3, 3, 3, lowering=lowering, steps=1,
                              extra={"pipeline.zero_bubble_memory": "stage"})
    program = epl.Graph.get().parallel
    assert program.schedule.splits_backward
    entrances, exits = program.boundaries[0]
    keys = set(entrances) | set(exits)
    assert not [key for key in keys if key[1] == "W"], sorted(keys)
    assert set((s, "B", m) for s in range(3) for m in range(3)) <= keys
    names = [f.signature.name for f in sess.graph.as_graph_def().library.function]
    if lowering == "stage_functions":
        assert [n for n in names if "_backward" in n] and not [n for n in names if "_weights" in n]
    gates = [op for op in sess.graph.get_operations()
             if "/tuple/control_dependency" in op.name and "EPL_" not in op.name]
    # the user's gradient gates all stay (a split B drops its own: it must not wait for W)
    assert gates and all(op.control_inputs for op in gates), [
        op.name for op in gates if not op.control_inputs]


# ---- the corpus and the memory savers ---------------------------------------------------
ZB = {"pipeline.strategy": "ZeroBubble"}
SAVERS = {
    "plain": {},
    "gc": {"gradient_checkpoint.type": "auto"},
    "offload": {"offload.level": "v0"},
    "grouped_apply": {"optimizer.num_apply_group": 2},
}
CASES = ([(model, "plain") for model in CORPUS]
         + [(model, saver) for model in (ResNet, Bert) for saver in ("gc", "offload")]
         + [(Bert, "grouped_apply")])


@pytest.mark.parametrize("model_class,saver", CASES,
                         ids=["%s-%s" % (m.name, s) for m, s in CASES])
def test_corpus_matches_serial_training(model_class, saver):
    model = model_class()
    arrays = model.data(2 * model.batch * corpusutil.STEPS)
    _, reference = corpusutil.serial_reference(model, arrays, 2)
    _, copies = corpusutil.run_pipeline(model, arrays, 2, config=dict(ZB, **SAVERS[saver]))
    assert epl.Graph.get().parallel.schedule.splits_backward
    worst, where = corpusutil.max_difference(reference, copies)
    _record(worst)
    assert worst < CORPUS_TOL, "%s differs from serial training by %.3g" % (where, worst)


def test_amp_pipeline_matches_float32():
    from test_amp import _corpus_run, _weights_match
    stage = lambda index: epl.replicate(1, name="stage_%d" % index)
    reference, copies = _corpus_run(Bert, stage, pipeline__num_micro_batch=2,
                                    amp__loss_scale=1024, pipeline__strategy="ZeroBubble")
    assert epl.Graph.get().parallel.schedule.name == "ZeroBubble"
    _weights_match(reference, copies)


def test_gradient_accumulation_ignores_the_schedule():
    """One TaskGraph: no pipeline, no schedule; accumulation trains like serial."""
    model = Bert()
    arrays = model.data(2 * model.batch * corpusutil.STEPS)
    _, reference = corpusutil.serial_reference(model, arrays, 2)
    _, copies = corpusutil.run_ga(model, arrays, micro_batches=2, config=ZB)
    assert epl.Graph.get().parallel.schedule is None
    worst, where = corpusutil.max_difference(reference, copies)
    assert worst < CORPUS_TOL, "%s differs by %.3g" % (where, worst)


# ---- memory ------------------------------------------------------------------------------
def stage_peaks(schedules, lowering, sessions):
    """{(strategy, memory): peak bytes of each stage's device in a step} (3 layers of
    256 x 256 per stage: ``eplutil.stage_peak_bytes``, m = 8): the least over 3 traced
    steps of ``sessions`` sessions of each, the schedules' sessions taking turns. One
    step's peak moves by up to 15% with the order the executor runs ready ops in (the
    same graph measured 2.9 and 3.4 MB), and whole sessions (of the same process) run
    high or low together; the least, measured in turns, is the schedule's own."""
    found = dict((key, []) for key in schedules)
    for _ in range(sessions):
        for strategy, memory in schedules:
            found[(strategy, memory)].append(stage_peak_bytes(
                {"pipeline.num_micro_batch": 8, "pipeline.strategy": strategy,
                 "pipeline.micro_batching": lowering, "pipeline.zero_bubble_memory": memory},
                traced=3))
    return dict((key, [min(peaks[stage] for peaks in runs) for stage in range(2)])
                for key, runs in found.items())


# One micro-batch's activations on a stage of stage_peaks' model: 3 layers of 256 x 256
# float32 (the output gradients B hands to W have the same size).
ACTIVATIONS = 3 * 256 * 256 * 4


@pytest.mark.parametrize("lowering", ["stage_functions", "unrolled"])
def test_peak_memory_per_stage_against_prefer_backward(lowering):
    """Bytes, per stage (m = 8). "stage" runs each W right after its B, which the
    lowering fuses: every stage within 1.1x of 1F1B's peak (split, B and W kept the
    output gradients and the activations W reads alive until B ended: the later stage
    held 1.4-1.5x). ZB-H1 ("pipeline") fuses stage 0's backward too (it defers no W)
    and holds 1F1B's pipeline peak there; stage 1 holds one more micro-batch between F
    and W and the output gradients of two (measured 1.8-2.3x 1F1B's)."""
    peaks = stage_peaks([("PreferBackward", "pipeline"), ("ZeroBubble", "stage")], lowering, 4)
    one_f_one_b, per_stage = peaks[("PreferBackward", "pipeline")], peaks[("ZeroBubble", "stage")]
    zb_h1 = stage_peaks([("ZeroBubble", "pipeline")], lowering, 1)[("ZeroBubble", "pipeline")]
    print("peak bytes per stage: 1F1B %s, ZB-H1 %s, ZB per-stage %s"
          % (one_f_one_b, zb_h1, per_stage))
    for stage in range(2):
        assert per_stage[stage] <= 1.1 * one_f_one_b[stage], (stage, per_stage, one_f_one_b)
    assert zb_h1[0] <= one_f_one_b[0] + 1.1 * ACTIVATIONS, (zb_h1, one_f_one_b)
    assert zb_h1[1] <= one_f_one_b[1] + 3.3 * ACTIVATIONS, (zb_h1, one_f_one_b)
    assert zb_h1[1] > per_stage[1] + 0.5 * ACTIVATIONS  # what "stage" saves is real


def test_memory_option_without_zero_bubble_warns(caplog):
    _pipeline(2, 2, 2, "PreferBackward", steps=1,
              extra={"pipeline.zero_bubble_memory": "stage"})
    assert "pipeline.zero_bubble_memory='stage' has no effect" in caplog.text
    assert "PreferBackward" in caplog.text
