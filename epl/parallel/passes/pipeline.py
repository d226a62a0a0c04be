"""Lower the pipeline schedule into control dependencies on stage boundaries.

An *action* is (stage, "F"|"B", micro_batch). For each local pipeline copy,
every op that a training step runs (the ancestors of the gradients) belongs
to one action. Boundaries come from the tensors that cross actions:
  * entrance ops read a tensor produced outside their action (another stage,
    the other phase, another micro-batch's shared state, or the input pipeline);
  * exit ops produce a tensor read outside their action (the next stage, the
    backward pass, or gradient aggregation).
For consecutive actions a, b of a stage's schedule, a no-op barrier on the
stage's device waits for every exit op of a, and every entrance op of b
waits for the barrier. Ops inside while loops (except Enter/Exit) and inside
cond branches (as exits) are skipped: control edges into a loop frame are
invalid and an untaken branch would kill the barrier.
"""
from epl import tf_adapter
from epl.ir.phase import Phase
from epl.ir.traverse import ancestor_ops, control_flow_interior
from epl.parallel.passes import LOWER, Pass
from epl.strategies.schedule import validate
from epl.tf_adapter import tf

_KINDS = {Phase.FORWARD: "F", Phase.BACKWARD: "B"}


class ScheduleLowering(Pass):
    """Impose ``pipeline.strategy`` on every stage of every local pipeline copy."""

    name = "schedule_lowering"
    phase = LOWER
    reads = ("view", "plan", "copies", "num_micro_batch", "aliases", "shared_constants",
             "micro_batching")
    writes = ("graph", "program.schedule", "program.boundaries")

    def applies(self, ctx):
        return ctx.plan.pipeline

    def run(self, ctx):
        stages = len(ctx.plan.stages)
        schedule = ctx.plan.schedule
        validate(schedule)
        no_entrance, no_exit = control_flow_interior(ctx.tf_graph)
        ctx.program.schedule = schedule
        for copy in range(len(ctx.copies)):
            if ctx.micro_batching is not None:  # stage functions: an action is a call
                entrances, exits = ctx.micro_batching.boundaries(copy, ctx.num_micro_batch)
            else:
                keys = _action_keys(ctx, copy)
                entrances, exits = _boundaries(ctx, keys, no_entrance, no_exit)
            ctx.program.boundaries.append((entrances, exits))
            for stage in range(stages):
                actions = schedule.stage(stage)
                for before, after in zip(actions, actions[1:]):
                    _order(ctx, copy, before, after, entrances, exits)


def _key(action):
    return (action.stage, action.kind, action.micro_batch)


def _order(ctx, copy, before, after, entrances, exits):
    first, second = exits.get(_key(before), []), entrances.get(_key(after), [])
    if not first or not second:
        return
    device = ctx.device(before.stage, copy)
    with tf.device(device), tf.name_scope("EPL_SCHEDULE"), tf.control_dependencies(first):
        barrier = tf.no_op(name="after_%s_copy%d" % (before, copy))
    for op in second:
        tf_adapter.add_control_inputs(op, [barrier])


def _action_keys(ctx, copy):
    """{id(op): (op, action key)} for the ops a step of ``copy`` runs."""
    roots = []
    for call in ctx.view.apply_calls:
        for grad, _ in call.grads_and_vars:
            tensors = [grad.values, grad.indices] if isinstance(grad, tf.IndexedSlices) \
                else [grad]
            for tensor in tensors:
                roots += [ctx.tensor_instance(tensor, copy, m).op
                          for m in range(ctx.num_micro_batch)]
    keys = {}
    for op in ancestor_ops(roots):
        info = ctx.view.info(op)
        if info is not None and info.copy == copy and info.phase in _KINDS \
                and not _free(op, ctx.shared_constants):
            keys[id(op)] = (op, (info.taskgraph, _KINDS[info.phase], info.micro_batch))
    return keys


def _free(op, shared):
    """Constants and the constant expressions micro-batches share (``shared``)
    belong to no action: reading one orders nothing (counting their readers as
    entrances would put a control edge on a quarter of the model's ops)."""
    return (op.type == "Const" and not op.control_inputs) or op.name in shared


def _key_of(keys, op):
    entry = keys.get(id(op))
    return None if entry is None else entry[1]


def _boundaries(ctx, keys, no_entrance, no_exit):
    """({action: entrance ops}, {action: exit ops}) from crossing tensors.

    One walk over the inputs of the step's ops (and of EPL's and the apply
    phase's ops, which read gradients) finds both sides of every crossing;
    asking each op for its consumers instead costs a C call per tensor.

    An op that reads from another action is an entrance only if nothing of its
    own action that already waits for the barrier feeds it: such an op waits
    through that input. Walking in creation order (a topological order of data
    edges) finds those; on a BERT-base pipeline this keeps the barriers' edges
    to the few ops where an action starts instead of every backward op reading a
    forward activation (thousands of edges TensorFlow's optimizer walks at
    session start).
    """
    entrances, leaving, waiting = {}, set(), set()
    for op, key in sorted(keys.values(), key=lambda item: tf_adapter.op_id(item[0])):
        crosses, fed = False, False
        for tensor in op.inputs:
            producer = tensor.op
            other = _key_of(keys, producer)
            if other != key:
                if other is not None:
                    leaving.add(id(producer))
                crosses = crosses or not _free(producer, ctx.shared_constants)
            elif id(producer) in waiting:
                fed = True
        fed = fed or any(id(c) in waiting and _key_of(keys, c) == key
                         for c in op.control_inputs)
        if fed:
            waiting.add(id(op))
        elif crosses and op.name not in no_entrance:
            entrances.setdefault(key, []).append(op)
            waiting.add(id(op))
    for op in _readers_outside_actions(ctx):
        leaving.update(id(t.op) for t in op.inputs)
    exits = {}
    for op, key in keys.values():
        if id(op) in leaving and op.name not in no_exit:
            exits.setdefault(key, []).append(op)
    return entrances, exits


def _readers_outside_actions(ctx):
    """EPL's ops (gradient sums, collectives) and apply ops: what they read leaves
    its action."""
    graph = ctx.tf_graph
    for name, info in list(ctx.view.op_info.items()):
        if info.phase in (Phase.EPL, Phase.APPLY):
            yield graph.get_operation_by_name(name)
