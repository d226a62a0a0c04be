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
from epl.parallel.passes import Pass
from epl.strategies.schedule import get_schedule, validate
from epl.tf_adapter import tf

_KINDS = {Phase.FORWARD: "F", Phase.BACKWARD: "B"}
_LOOP_ENTRY, _LOOP_EXIT = ("Enter", "RefEnter"), ("Exit", "RefExit")
_MERGE, _SWITCH = ("Merge", "RefMerge"), ("Switch", "RefSwitch")


class ScheduleLowering(Pass):
    """Impose ``pipeline.strategy`` on every stage of every local pipeline copy."""

    name = "schedule_lowering"

    def applies(self, ctx):
        return ctx.plan.pipeline

    def run(self, ctx):
        stages = len(ctx.plan.stages)
        schedule = get_schedule(ctx.config.pipeline.strategy, stages, ctx.num_micro_batch)
        validate(schedule)
        no_entrance, no_exit = control_flow_interior(ctx.tf_graph)
        ctx.program.schedule = schedule
        for copy in range(len(ctx.copies)):
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
    """op name -> action key for the ops a step of ``copy`` runs."""
    roots = []
    for call in ctx.view.apply_calls:
        for grad, _ in call:
            tensors = [grad.values, grad.indices] if isinstance(grad, tf.IndexedSlices) \
                else [grad]
            for tensor in tensors:
                roots += [ctx.tensor_instance(tensor, copy, m).op
                          for m in range(ctx.num_micro_batch)]
    keys, seen, stack = {}, set(), roots
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        info = ctx.view.info(op)
        if info is not None and info.replica == copy and info.phase in _KINDS:
            keys[op.name] = (info.taskgraph, _KINDS[info.phase], info.micro_batch)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return keys


def _boundaries(ctx, keys, no_entrance, no_exit):
    """({action: entrance ops}, {action: exit ops}) from crossing tensors."""
    entrances, exits = {}, {}
    graph = ctx.tf_graph
    for name, key in keys.items():
        op = graph.get_operation_by_name(name)
        if name not in no_entrance and any(keys.get(t.op.name) != key for t in op.inputs):
            entrances.setdefault(key, []).append(op)
        if name not in no_exit and _leaves_action(ctx, op, key, keys):
            exits.setdefault(key, []).append(op)
    return entrances, exits


def _leaves_action(ctx, op, key, keys):
    for tensor in op.outputs:
        for consumer in tensor.consumers():
            other = keys.get(consumer.name)
            if other is not None and other != key:
                return True
            info = ctx.view.info(consumer)
            if other is None and info is not None and info.phase in (Phase.EPL, Phase.APPLY):
                return True
    return False


def control_flow_interior(tf_graph):
    """(ops that cannot take control inputs, ops that cannot be barrier inputs).

    Found structurally (cloned ops carry no Python control-flow context):
    loop bodies are what is reachable from Enter ops before Exit ops; cond
    branches are what is reachable from Switch outputs before Merge ops.
    """
    ops = tf_graph.get_operations()
    loop = _reach([op for op in ops if op.type in _LOOP_ENTRY], stop=_LOOP_EXIT)
    branch = _reach([c for op in ops if op.type in _SWITCH for t in op.outputs
                     for c in t.consumers()], stop=_MERGE + _LOOP_EXIT, include_stop=False)
    entry = set(op.name for op in ops if op.type in _LOOP_ENTRY)
    exit_ = set(op.name for op in ops if op.type in _LOOP_EXIT)
    return loop - entry, (loop - exit_) | branch


def _reach(starts, stop, include_stop=True):
    seen, stack = set(), list(starts)
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        if op.type in stop:
            if include_stop:
                seen.add(op.name)
            continue
        seen.add(op.name)
        stack.extend(c for t in op.outputs for c in t.consumers())
    return seen
