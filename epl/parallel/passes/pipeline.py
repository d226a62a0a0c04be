"""Lower the pipeline schedule into control dependencies on stage boundaries.

An *action* is (stage, "F"|"B", micro_batch). For each local pipeline copy, the
repetition (:mod:`epl.parallel.repeat`) says where each action starts (its
entrance ops) and ends (its exit ops): the calls of its functions with stage
functions, the ops where tensors cross actions with unrolled copies. For
consecutive actions a, b of a stage's schedule, a no-op barrier on the stage's
device waits for every exit op of a, and every entrance op of b waits for the
barrier. Schedules that split the backward (ZeroBubble) have B and W actions; the
repetition finds the ops of each (:mod:`epl.parallel.repeat.backward_split`).

What an action hands to another stage leaves before the stage's next action starts:
each such tensor is read on the other device through an Identity on the stage's device
that waits for the barrier (:func:`_send_before_next`). Why: with one inter-op thread TF
runs the ops a finished op makes ready in an order set by heap addresses (its out-edge
set) and its thread queue is last in, first out, so the _Send TF adds for the tensor
could wait behind every action the stage has ready (a ZeroBubble stage 1 always has a
W); the other stage then idles. The Identity is cheap, so the executor runs it inline
right after the barrier, before the next action's expensive call, and its _Send with it.

The collectives a stage's actions run (a split layer's, built per copy and
micro-batch) are chained per member in build order by backends that need one order
on every member; those chains are re-ordered to the stage's schedule
(:mod:`epl.communicators.chains`), or a schedule that runs a later micro-batch's
forward before an earlier one's backward (PreferForward) would close a cycle.
"""
from epl import tf_adapter
from epl.ir.phase import Phase
from epl.parallel.passes import LOWER, Pass
from epl.parallel.repeat.backward_split import kind_of
from epl.strategies.schedule import validate
from epl.tf_adapter import tf


class ScheduleLowering(Pass):
    """Impose ``pipeline.strategy`` on every stage of every local pipeline copy."""

    name = "schedule_lowering"
    phase = LOWER
    reads = ("view", "plan", "copies", "repetition", "communicators")
    writes = ("graph", "program.schedule", "program.boundaries", "communicators")

    def applies(self, ctx):
        return ctx.plan.pipeline

    def run(self, ctx):
        schedule = ctx.plan.schedule
        validate(schedule)
        ctx.program.schedule = schedule
        for copy in range(len(ctx.copies)):
            entrances, exits = ctx.repetition.boundaries(ctx, copy)
            ctx.program.boundaries.append((entrances, exits))
            entering = set(op for ops in entrances.values() for op in ops)
            # One row per device: a stage's own, or with interleaved stages every chunk
            # the device holds (actions of virtual stages d, d + S, ...), in one order.
            for row in range(schedule.num_stages):
                # An action with no ops (stage 0's B when its backward is split: no
                # stage before it waits for input gradients) orders nothing; the
                # actions on either side of it are chained directly.
                actions = [a for a in schedule.stage(row)
                           if _key(a) in entrances or _key(a) in exits]
                for before, after in zip(actions, actions[1:]):
                    barrier = _order(ctx, copy, before, after, entrances, exits)
                    if barrier is not None and ctx.plan.calls_functions:
                        _send_before_next(exits[_key(before)], barrier, entering)
        rank = _action_rank(ctx, schedule)
        for communicator in ctx.communicators.all():
            communicator.reorder_chains(ctx.tf_graph, rank)


def _key(action):
    return (action.stage, action.kind, action.micro_batch)


def _action_rank(ctx, schedule):
    """``rank(op)``: ((row, copy), position of the op's action in its row of the
    schedule) for the forward and backward ops of a stage, else None. A row is a
    stage's device (with interleaved stages, every chunk on it)."""
    stages = list(ctx.plan.stages)
    positions = dict((_key(action), (row, index)) for row in range(schedule.num_stages)
                     for index, action in enumerate(schedule.stage(row)))
    weights = ctx.repetition.weight_parts(ctx)
    kinds = {Phase.FORWARD: "F", Phase.BACKWARD: "B"}

    def rank(op):
        info = ctx.view.info(op)
        if info is None or info.taskgraph not in stages or info.phase not in kinds:
            return None
        stage = stages.index(info.taskgraph)
        kind = kind_of(kinds[info.phase], info.origin or op.name, weights)
        place = positions.get((stage, kind, info.micro_batch))
        return None if place is None else ((place[0], info.copy), place[1])
    return rank


def _order(ctx, copy, before, after, entrances, exits):
    """Make ``after``'s entrances wait for a barrier after ``before``'s exits; returns
    the barrier (None when either action has no ops)."""
    first, second = exits.get(_key(before), []), entrances.get(_key(after), [])
    if not first or not second:
        return None
    device = ctx.device(before.stage, copy)
    with tf.device(device), tf.name_scope("EPL_SCHEDULE"), tf.control_dependencies(first):
        barrier = tf.no_op(name="after_%s_copy%d" % (before, copy))
    for op in second:
        tf_adapter.add_control_inputs(op, [barrier])
    return barrier


def _send_before_next(exits, barrier, entering):
    """Point every action entrance (``entering``) on another device that reads an
    output of ``exits`` at an Identity on the barrier's device that runs after
    ``barrier``: the tensor leaves ahead of the stage's next action, whatever order
    TF picks among the ops ``barrier`` makes ready. Other readers (the apply, a
    clipping norm) are left alone, and so is an entrance that does not already wait
    for every exit (the barrier would add a wait, which may close a cycle)."""
    device = barrier.device
    here = _canonical(device)
    for op in exits:
        for tensor in op.outputs:
            away = [c for c in tensor.consumers()
                    if c in entering and c.device and _canonical(c.device) != here
                    and _waits_for_all(c, exits)]
            if not away:
                continue
            with tf.device(device), tf.name_scope("EPL_SCHEDULE"), \
                    tf.control_dependencies([barrier]):
                sent = tf.identity(tensor, name="send_%s" % op.name.replace("/", "_"))
            for consumer in away:
                for index, value in enumerate(consumer.inputs):
                    if value is tensor:
                        tf_adapter.update_input(consumer, index, sent)


def _waits_for_all(op, exits, limit=4096):
    """Whether every op of ``exits`` is an ancestor of ``op`` (False when that is not
    found within ``limit`` ops: then ``op`` is left as it is)."""
    missing = set(exits)
    seen, todo = set(), [op]
    while missing and todo and len(seen) < limit:
        current = todo.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent not in seen:
                seen.add(parent)
                missing.discard(parent)
                todo.append(parent)
    return not missing


def _canonical(device):
    return tf.DeviceSpec.from_string(device).to_string()
