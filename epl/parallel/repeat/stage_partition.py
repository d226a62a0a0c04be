"""Which ops of a pipeline become stage functions, and which stay ops of their own.

An *action* is (stage, kind, chunk): kind "F" (forward) or "B" (backward); a
stage's forward or backward may take several functions, its chunks (see
:func:`partition`). The ops of a training step that a chunk runs for one
micro-batch become one function, its *core*, called once per micro-batch. Some
ops cannot live in a function or must stay visible to other passes; they are
*residual*: copied per micro-batch like the unrolled lowering does (input pulls,
ops on ref variables such as batch norm's moving averages, ops the user pinned to
the CPU, collectives built per copy, ops downstream of the gradients that gradient
aggregation rewires).

A function runs as a whole: all its inputs first, all its results at the end.
So the calls must form no cycle, even where the ops did not: a backward op that
reads another stage's gradient (global-norm clipping, say) cannot sit in the
function that feeds the other stage's backward, and an op after a residual op
(a collective of a split layer) cannot sit in the function that feeds it.
:func:`partition` cuts each stage's forward and backward into *segments*: the
first holds the ops not reachable from the action through an op outside it,
the next the same among the rest, and so on. No path leaves a segment and comes
back, so the calls form no cycle; the actions come out in a topological order.
"""
import collections

from epl.ir.traverse import successor_map

FORWARD, BACKWARD = "F", "B"


class StagePartition(object):
    """Result of :func:`partition`.

    Attributes:
      cores: {action: [ops]} in creation order.
      residual: [ops] copied per micro-batch, in creation order.
      order: actions in an order in which each one's inputs from other actions exist.
      action_of: {op: action} of every core op.
    """

    def __init__(self, cores, residual, order):
        self.cores = cores
        self.residual = residual
        self.order = order
        self.action_of = dict((op, action) for action, ops in cores.items() for op in ops)

    def __repr__(self):
        return "StagePartition(%s; %d residual)" % (
            ", ".join("%d%s%d: %d ops" % (a[0], a[1], a[2], len(self.cores[a]))
                      for a in self.order),
            len(self.residual))


def partition(ops, action_of, movable, chunk_ends=None):
    """Split ``ops`` (a step's forward and backward ops, in creation order) into
    action cores and residual ops.

    ``action_of(op)`` gives an op's (stage, kind); ``movable(op)`` says whether it
    may live in a function at all. ``chunk_ends((stage, kind), ops)`` (optional)
    cuts a segment's ops (creation order) into consecutive chunks, returning the
    index after each chunk's last op: a function returns all its results when it
    ends, so a long backward in one function keeps every activation it reads, and
    every gradient, until its last op; chunks free them (and hand gradients to their
    all-reduce) as they go. Creation order is topological, so chunks never form a
    cycle.
    """
    successors = successor_map(ops)
    owner = dict((op, action_of(op) if movable(op) else None) for op in ops)
    actions = collections.OrderedDict()
    for op in ops:
        if owner[op] is not None:
            actions.setdefault(owner[op], []).append(op)
    residual = [op for op in ops if owner[op] is None]
    cores = collections.OrderedDict()
    for (stage, kind), members in actions.items():
        chunk = 0
        for segment in _segments(members, successors):
            ends = chunk_ends((stage, kind), segment) if chunk_ends is not None else []
            start = 0
            for end in sorted(set(ends) | {len(segment)}):
                if start < end <= len(segment):
                    cores[(stage, kind, chunk)] = segment[start:end]
                    start, chunk = end, chunk + 1
    owner = dict((op, None) for op in residual)
    owner.update((op, action) for action, members in cores.items() for op in members)
    return StagePartition(cores, residual, _order(cores, owner, successors))


def _segments(members, successors):
    """``members`` (an action's ops, creation order) cut where a path leaves them and
    comes back: each segment holds the remaining ops that no op outside the
    remaining ones reaches. The first op of what remains is never reached (creation
    order is topological), so every segment has an op."""
    segments, remaining = [], list(members)
    while remaining:
        inside = set(remaining)
        outside = [s for op in remaining for s in successors[op] if s not in inside]
        late = _reachable(outside, successors)
        segments.append([op for op in remaining if op not in late])
        remaining = [op for op in remaining if op in late]
    return segments


def _reachable(starts, successors):
    seen, stack = set(), list(starts)
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(successors[op])
    return seen


def _order(cores, owner, successors):
    """Actions in topological order of the paths between their cores (forward
    stages first, then backward ones, where paths leave a choice)."""
    edges = dict((action, set()) for action in cores)
    for action, members in cores.items():
        outside = [s for op in members for s in successors[op] if owner[s] != action]
        for op in _reachable(outside, successors):
            if owner[op] is not None and owner[op] != action:
                edges[action].add(owner[op])
    waiting = dict((action, 0) for action in cores)
    for targets in edges.values():
        for target in targets:
            waiting[target] += 1
    rank = lambda a: (a[1] != FORWARD, a[0] if a[1] == FORWARD else -a[0], a[2])
    ready = sorted((a for a, n in waiting.items() if n == 0), key=rank)
    order = []
    while ready:
        action = ready.pop(0)
        order.append(action)
        for target in edges[action]:
            waiting[target] -= 1
            if waiting[target] == 0:
                ready.append(target)
        ready.sort(key=rank)
    if len(order) != len(cores):
        raise RuntimeError("EPL internal error: stage functions form a cycle: %s"
                           % sorted(set(cores) - set(order)))
    return order
