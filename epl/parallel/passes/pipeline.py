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
that waits for the barrier (:class:`_Sends`). Why: with one inter-op thread TF
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
import logging

from epl import tf_adapter
from epl.ir.phase import Phase
from epl.parallel.passes import LOWER, Pass
from epl.parallel.repeat.backward_split import kind_of
from epl.strategies.schedule import validate
from epl.tf_adapter import tf

LOG = logging.getLogger("epl")
MAX_NESTED = 256      # entrances whose ancestors one walk finds first (Python's stack)


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
        sends = _Sends(ctx.tf_graph)
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
                        sends.before_next(exits[_key(before)], barrier, entering)
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


class _Sends(object):
    """Sends each tensor an action hands another stage before the stage's next action
    (:meth:`before_next`), remembering within one run of the pass what it learnt of
    the graph: each device string's canonical form, and the ancestors each entrance
    was found to have (``_known``).

    Why remember: whether an entrance already waits for every exit of an action is a
    walk of its ancestors, and the ancestors of a stage's later actions hold all the
    earlier ones (the barriers chain them), so walking each from scratch made the
    pass grow with the square of the micro-batches (0.74 s CPU at m = 32 on a
    2-stage BERT-style encoder, most of it in these walks; docs/pipeline_schedules.md).
    A walk now takes an earlier entrance's ancestors as they were found instead of
    walking them again. The pass only adds edges (barriers, Identities between a
    tensor and its readers), so what was found stays a subset of the ancestors: a
    "waits for all" it gives is exact, and when it does not find every exit the
    walk is done afresh as before, so the pass builds the same Identities.
    """

    def __init__(self, graph, limit=4096):
        self._graph = graph
        self._limit = limit
        self._devices = {}
        self._known = {}
        self._too_far = set()   # entrances whose ancestors are more than limit ops
        self._warned = False

    def before_next(self, exits, barrier, entering):
        """Point every action entrance (``entering``) on another device that reads an
        output of ``exits`` at an Identity on the barrier's device that runs after
        ``barrier``: the tensor leaves ahead of the stage's next action, whatever
        order TF picks among the ops ``barrier`` makes ready. Other readers (the
        apply, a clipping norm) are left alone, and so is an entrance that does not
        already wait for every exit (the barrier would add a wait, which may close a
        cycle)."""
        device = barrier.device
        here = self._canonical(device)
        for op in exits:
            for tensor in op.outputs:
                away = [c for c in tensor.consumers()
                        if c in entering and c.device and self._canonical(c.device) != here
                        and self._waits_for_all(c, exits, entering)]
                if not away:
                    continue
                with tf.device(device), tf.name_scope("EPL_SCHEDULE"), \
                        tf.control_dependencies([barrier]):
                    sent = tf.identity(tensor, name="send_%s" % op.name.replace("/", "_"))
                for consumer in away:
                    for index, value in enumerate(consumer.inputs):
                        if value is tensor:
                            tf_adapter.update_input(consumer, index, sent)

    def _canonical(self, device):
        canonical = self._devices.get(device)
        if canonical is None:
            canonical = self._devices[device] = tf.DeviceSpec.from_string(device).to_string()
        return canonical

    def _waits_for_all(self, op, exits, entering):
        """Whether every op of ``exits`` is an ancestor of ``op``: from the ancestors
        found for ``op`` before, else a walk that reuses other entrances', else a
        fresh walk (False when that stops at the limit: a logged warning, once)."""
        wanted = set(exits)
        if wanted <= self._known.get(op, frozenset()):
            return True
        found = None if op in self._too_far else self._ancestors(op, entering)
        if found is None:
            self._too_far.add(op)
        else:
            self._known[op] = found
            if wanted <= found:
                return True
        waits, stopped = _waits_for_all(op, exits, self._limit)
        if stopped and not self._warned:
            self._warned = True
            LOG.warning(
                "EPL's schedule lowering stopped after walking %d ops above %s looking "
                "for the outputs it reads from %s (graph %s): what it reads leaves when TF's "
                "executor gets to it, possibly after the sending stage's next action; "
                "this costs speed, never results. Further such cases in this graph are "
                "not reported.", self._limit, op.name, exits[0].name, self._graph)
        return waits

    def _ancestors(self, op, entering, depth=0):
        """Every ancestor of ``op``, taking those of the action entrances (``entering``)
        met on the way from ``_known`` (found first if need be, up to ``MAX_NESTED``
        deep); None past ``limit`` walked ops or at an entrance known to be past it
        (the caller then walks afresh, so None is never wrong, only slower)."""
        seen, todo, walked = set(), [op], 0
        while todo:
            walked += 1
            if walked > self._limit:
                return None
            for parent in _parents(todo.pop()):
                if parent in seen:
                    continue
                seen.add(parent)
                if parent in self._too_far:
                    return None
                known = self._known.get(parent)
                if known is None and parent in entering and depth < MAX_NESTED:
                    known = self._ancestors(parent, entering, depth + 1)
                    if known is None:
                        self._too_far.add(parent)
                        return None
                    self._known[parent] = known
                if known is None:
                    todo.append(parent)
                else:
                    seen.update(known)
        return seen


def _parents(op):
    return [t.op for t in op.inputs] + list(op.control_inputs)


def _waits_for_all(op, exits, limit=4096):
    """(whether every op of ``exits`` is an ancestor of ``op``, whether the walk
    stopped at ``limit`` ops before it knew: then the first is False and ``op`` is
    left as it is)."""
    missing = set(exits)
    seen, todo = set(), [op]
    while missing and todo and len(seen) < limit:
        current = todo.pop()
        for parent in _parents(current):
            if parent not in seen:
                seen.add(parent)
                missing.discard(parent)
                todo.append(parent)
    return not missing, bool(missing and todo)
