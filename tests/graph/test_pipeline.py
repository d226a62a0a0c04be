"""Pipeline parallelism and gradient accumulation on one worker's virtual devices."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from epl.ir.phase import Phase
from epl.parallel.plan import PlanError
from eplutil import (copy_values, dataset_input, initial_weights, make_data, max_diff, mlp,
                     serial_train, stage_peak_bytes, staged_mlp, trace_times,
                     train_step)

TOL = 1e-5
B, K = 4, 3


def _pipeline(devices, depth, micro_batches, strategy="PreferBackward", steps=K,
              collect=False, scopes=None, config=None, lowering="auto"):
    replicas = devices // depth
    x, y = make_data(micro_batches * B * replicas * (steps + 1))  # one spare step
    epl.init(epl.Config({"pipeline.num_micro_batch": micro_batches,
                         "pipeline.strategy": strategy,
                         "pipeline.micro_batching": lowering}),
             cluster=Cluster(devices_per_worker=devices))
    xb, yb = dataset_input(x, y, B)
    loss = staged_mlp(xb, yb, initial_weights(), depth, scopes=scopes)
    if collect:
        epl.add_to_collection(loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    train = train_step(loss)
    sess = tf.Session(config=config)
    sess.run(tf.global_variables_initializer())
    losses = [sess.run([loss, train])[0] for _ in range(steps)]
    return x, y, sess, losses


@pytest.mark.parametrize("lowering", ["stage_functions", "unrolled"])
@pytest.mark.parametrize("strategy", ["PreferBackward", "PreferForward"])
@pytest.mark.parametrize("depth", [2, 3])
def test_pipeline_matches_serial(strategy, depth, lowering):
    x, y, sess, _ = _pipeline(depth, depth, 4, strategy, lowering=lowering)
    _, ref = serial_train(x, y, 4 * B, K, depth=depth)
    names = ["d1/kernel", "d2/kernel", "d1/bias"] + (["mid/kernel"] if depth == 3 else [])
    for name in names:
        assert max_diff(ref[name], copy_values(sess, name)) < TOL, name
    assert sess.run(tf.train.get_global_step()) == K
    program = epl.Graph.get().parallel
    assert program.schedule.name == strategy
    assert program.plan.micro_batching[0] == lowering.replace("_", " ").replace(
        "unrolled", "unrolled copies")


@pytest.mark.parametrize("lowering", ["stage_functions", "unrolled"])
@pytest.mark.parametrize("strategy", ["PreferBackward", "PreferForward"])
def test_data_parallel_over_pipelines(strategy, lowering):
    x, y, sess, _ = _pipeline(4, 2, 4, strategy, lowering=lowering)
    plan = epl.Graph.get().parallel.plan
    assert plan.num_replicas == 2 and len(plan.stages) == 2
    _, ref = serial_train(x, y, 2 * 4 * B, K)
    for name in ("d1/kernel", "d2/kernel", "d2/bias"):
        copies = copy_values(sess, name)
        assert len(copies) == 2 and max_diff(ref[name], copies) < TOL, name


def test_repeated_default_strategy_defines_stages():
    scopes = lambda i: _DefaultStage()
    x, y, sess, _ = _pipeline(2, 2, 2, scopes=scopes)
    assert [tg.name for tg in epl.Graph.get().taskgraphs] == ["taskgraph_0", "taskgraph_1"]
    _, ref = serial_train(x, y, 2 * B, K)
    assert max_diff(ref["d1/kernel"], copy_values(sess, "d1/kernel")) < TOL


class _DefaultStage(object):
    """The BERT tutorial's pattern: set_default_strategy before each stage."""

    def __enter__(self):
        epl.set_default_strategy(epl.replicate(1))

    def __exit__(self, *args):
        return False


def test_fetched_loss_is_micro_batch_zero_and_global_mean_averages():
    x, y, _, losses = _pipeline(2, 2, 4, steps=1)
    first, _ = serial_train(x, y, B, 1)
    np.testing.assert_allclose(losses[0], first[0], atol=TOL)
    x, y, _, losses = _pipeline(2, 2, 4, steps=1, collect=True)
    whole, _ = serial_train(x, y, 4 * B, 1)
    np.testing.assert_allclose(losses[0], whole[0], atol=TOL)


def test_unrolled_execution_order_follows_the_schedule():
    # Grappler may fold boundary Identity ops away (keeping the ordering they
    # carry); turn it off so the trace shows every boundary op.
    config = tf.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    _, _, sess, _ = _pipeline(2, 2, 4, steps=1, config=config, lowering="unrolled")
    program = epl.Graph.get().parallel
    entrances, exits = program.boundaries[0]
    start, end = trace_times(sess, "Momentum", end="op_end_rel_micros")
    crossing = _ops_reading_other_actions(epl.Graph.get())
    checked = 0
    for stage in range(2):
        actions = program.schedule.stage(stage)
        for before, after in zip(actions, actions[1:]):
            key_b = (before.stage, before.kind, before.micro_batch)
            key_a = (after.stage, after.kind, after.micro_batch)
            done = max(end[op.name] for op in exits[key_b] if op.name in end)
            # not only the ops the barrier gates: every op of the next action that
            # reads another action's output starts after this one's exits
            begun = min(start[op.name] for op in crossing[key_a] if op.name in start)
            assert done <= begun, (str(before), str(after))
            assert set(op.name for op in entrances[key_a]) <= set(
                op.name for op in crossing[key_a])
            checked += 1
    assert checked == 2 * (2 * 4 - 1)


@pytest.mark.parametrize("strategy", ["PreferBackward", "PreferForward"])
def test_stage_function_calls_follow_the_schedule(strategy):
    _, _, sess, _ = _pipeline(2, 2, 4, strategy, steps=1)
    program = epl.Graph.get().parallel
    entrances, exits = program.boundaries[0]
    start, end = trace_times(sess, "Momentum")
    checked = 0
    for stage in range(2):
        actions = program.schedule.stage(stage)
        for before, after in zip(actions, actions[1:]):
            first = exits[(before.stage, before.kind, before.micro_batch)]
            second = entrances[(after.stage, after.kind, after.micro_batch)]
            for call in first + second:  # an action is its calls (a backward may have several)
                assert call.get_attr("f").name.startswith("EPL_stage%d_" % stage)
            assert max(end[c.name] for c in first) <= min(start[c.name] for c in second), (
                str(before), str(after))
            checked += 1
    assert checked == 2 * (2 * 4 - 1)


def test_stage_functions_keep_the_graph_size_flat():
    """Graph size does not grow with micro-batches beyond a few ops per micro-batch."""
    sizes = {}
    for micro_batches in (2, 8):
        tf.reset_default_graph()
        _pipeline(2, 2, micro_batches, steps=1)
        sizes[micro_batches] = len(tf.get_default_graph().get_operations())
        assert "micro-batches: stage functions" in str(epl.Graph.get().parallel.plan)
    per_micro_batch = (sizes[8] - sizes[2]) / 6.0
    # calls, input pulls, labels, a saved-activation array per stage, the Identity
    # through which each tensor one stage hands the other leaves after the barrier
    # (passes/pipeline.py _send_before_next): not the model
    assert per_micro_batch <= 16, sizes


def test_first_micro_batch_starts_the_gradient_sums_without_adds():
    """Micro-batch 0's backward calls a variant that returns its gradients as the
    sums (no accumulator arguments, no add to zero); later calls take the sums."""
    _pipeline(2, 2, 4, steps=1)
    calls = [op for op in tf.get_default_graph().get_operations()
             if op.type == "StatefulPartitionedCall" and "_backward" in op.get_attr("f").name]
    library = dict((f.signature.name, f) for f in
                   tf.get_default_graph().as_graph_def().library.function)
    firsts = [c for c in calls if c.get_attr("f").name.endswith("_first")]
    assert firsts and all(c.name.startswith("EPL_MICRO_BATCH_0/") for c in firsts)
    for call in calls:
        body = library[call.get_attr("f").name]
        adds = [n for n in body.node_def if n.name.startswith("EPL_ACCUMULATE_")]
        first = call in firsts
        assert (len(adds) == 0) == first, call.name
        assert len(call.inputs) == len(body.signature.input_arg)
    assert not [op for op in tf.get_default_graph().get_operations()
                if op.name.startswith("EPL_STAGE_FUNCTIONS/zero")]


def test_fetching_an_inner_tensor_warns_and_recomputes(caplog):
    x, y, sess, losses = _pipeline(2, 2, 4, steps=1)
    hidden = tf.get_default_graph().get_tensor_by_name("d1/MatMul:0")
    value = sess.run(hidden)
    assert value.shape == (B, hidden.shape[1])
    assert "fetching d1/MatMul:0 runs the pipeline stage's forward" in caplog.text


def _ops_reading_other_actions(view):
    """{(stage, kind, micro-batch): ops of that action with an input from outside it}."""
    kinds = {Phase.FORWARD: "F", Phase.BACKWARD: "B"}

    def key(op):
        info = view.info(op)
        if info is None or info.copy != 0 or info.phase not in kinds:
            return None
        return (info.taskgraph, kinds[info.phase], info.micro_batch)

    found = {}
    for op in tf.get_default_graph().get_operations():
        own = key(op)
        if own is not None and any(key(t.op) != own and t.op.type != "Const"
                                   for t in op.inputs):
            found.setdefault(own, []).append(op)
    return found


def test_devices_must_divide_by_pipeline_width(caplog):
    with pytest.raises(PlanError, match="needs 2 devices.*has 3 devices"):
        _pipeline(3, 2, 2, steps=1)


def test_warns_when_micro_batches_are_fewer_than_stages(caplog):
    _pipeline(3, 3, 2, steps=1)
    assert "smaller than the 3 pipeline stages" in caplog.text


@pytest.mark.parametrize("devices", [1, 2])
def test_gradient_accumulation_matches_serial(devices):
    steps, x_rows = 3, 3 * B * devices * K
    x, y = make_data(x_rows)
    _, ref = serial_train(x, y, 3 * B * devices, K)
    epl.init(epl.Config({"pipeline.num_micro_batch": 3}),
             cluster=Cluster(devices_per_worker=devices))
    epl.set_default_strategy(epl.replicate(1))
    loss = mlp(*dataset_input(x, y, B), weights=initial_weights())
    train = train_step(loss)
    step = tf.train.get_global_step()
    with tf.train.MonitoredTrainingSession() as sess:
        seen = []
        for _ in range(steps * K):
            sess.run(train)
            seen.append(sess.run(step))
        raw = sess._tf_sess()  # pylint: disable=protected-access
        assert seen == [0, 0, 1, 1, 1, 2, 2, 2, 3]
        for name in ("d1/kernel", "d2/kernel", "d1/bias"):
            assert max_diff(ref[name], copy_values(raw, name)) < TOL, name


def _peak_activation_bytes(strategy, lowering, micro_batches=8):
    """Peak bytes allocated on stage 0's device in one traced step."""
    return stage_peak_bytes({"pipeline.num_micro_batch": micro_batches,
                             "pipeline.strategy": strategy,
                             "pipeline.micro_batching": lowering})[0]


@pytest.mark.parametrize("lowering", ["stage_functions", "unrolled"])
def test_prefer_backward_bounds_in_flight_activations(lowering):
    """1F1B keeps at most 2 (the pipeline depth) micro-batches' activations alive on
    stage 0; GPipe keeps all 8. Stage 0's activations: 3 layers x 256 x 256 floats
    (768 KiB) per micro-batch."""
    one_f_one_b = _peak_activation_bytes("PreferBackward", lowering)
    gpipe = _peak_activation_bytes("PreferForward", lowering)
    per_micro_batch = 3 * 256 * 256 * 4
    assert gpipe >= 8 * per_micro_batch
    print("peak bytes on stage 0: 1F1B %d, GPipe %d" % (one_f_one_b, gpipe))
    assert one_f_one_b < 0.5 * gpipe, (one_f_one_b, gpipe)


def _staged_with_cond(x, y, lowering="auto"):
    """The staged MLP with a tf.cond in stage 0 (one scope object per stage)."""
    epl.init(epl.Config({"pipeline.num_micro_batch": 4, "pipeline.micro_batching": lowering}),
             cluster=Cluster(devices_per_worker=2))
    stages = [epl.replicate(1, name="stage_%d" % index) for index in range(2)]
    xb, yb = dataset_input(x, y, B)
    with stages[0]:
        xb = tf.cond(tf.reduce_sum(xb) > -1e9, lambda: xb, lambda: -xb)
    return train_step(staged_mlp(xb, yb, initial_weights(), 2, scopes=lambda i: stages[i]))


@pytest.mark.parametrize("lowering", ["auto", "stage_functions"])
def test_control_flow_in_a_stage_runs_as_ops_of_each_repetition(lowering):
    """A tf.cond in a stage cannot cross a function boundary (its untaken branch's
    tensors are dead): stage functions keep it an op of each micro-batch and call the
    rest of the stage (before, such graphs fell back to unrolled copies, and forcing
    stage functions was refused); training matches serial."""
    x, y = make_data(4 * B * (K + 1))
    train = _staged_with_cond(x, y, lowering)
    sess = tf.Session()
    sess.run(tf.global_variables_initializer())
    for _ in range(K):
        sess.run(train)
    plan = epl.Graph.get().parallel.plan
    assert plan.micro_batching[0] == "stage functions"
    assert "micro-batches: stage functions" in str(plan)
    switches = [op for op in tf.get_default_graph().get_operations()
                if op.type == "Switch" and op.name.startswith("EPL_MICRO_BATCH_3/")]
    assert switches  # micro-batch 3's own cond
    _, ref = serial_train(x, y, 4 * B, K)
    assert max_diff(ref["d1/kernel"], copy_values(sess, "d1/kernel")) < TOL
