"""TF1 control flow in a stage: the ops that stay ops of each repetition.

A function can neither return a dead tensor (the value of an untaken cond branch:
TF fails the call, "Retval does not have value") nor take one (a dead argument kills
the whole call and everything after it), and a loop's frame cannot be split between
a function and the graph or between two functions. So the stage-function lowering
keeps TF1 control flow where unrolled copies keep everything: as ops cloned per
micro-batch and copy (the cloner gives every copied loop its own frame), and calls
functions for the rest of the stage, which is live again after a cond's Merge or a
loop's Exit.

Which ops: every op of a while loop's frame (what its Enter ops reach until its Exit
ops, both included, nested frames too), and every op that reads or produces a
tensor that may be dead. A Switch makes its outputs one cond level deeper than its
input, a cond's Merge one level shallower than its deepest input, a loop's Exit
as deep as what enters its frame; any other op is as deep as its deepest input or
control input. Found from the ops' types and edges (clones carry no Python
control-flow context).
"""
from epl.ir.traverse import successor_map

_ENTER, _EXIT = ("Enter", "RefEnter"), ("Exit", "RefExit")
_SWITCH, _MERGE = ("Switch", "RefSwitch"), ("Merge", "RefMerge")
_ROUNDS = 8  # depth propagation passes before giving up (rewired graphs are not in order)


def control_flow(ops):
    """Names of the ops among ``ops`` (a step's ops, creation order) that stay ops of
    each repetition: loop frames, and ops that read or produce a tensor that may be
    dead. Empty, at no cost, for graphs without TF1 control flow."""
    if not any(op.type in _ENTER or op.type in _SWITCH for op in ops):
        return set()
    successors = successor_map(ops)
    frames, exits = _frames(ops, successors)
    depth = _depths(ops, frames, exits)
    kept = set(op for frame in frames.values() for op in frame)
    for op in ops:
        inputs = [t.op for t in op.inputs] + list(op.control_inputs)
        if depth.get(op, 0) > 0 or any(depth.get(i, 0) > 0 for i in inputs) \
                or op.type in _SWITCH:
            kept.add(op)
    return set(op.name for op in kept)


def _frames(ops, successors):
    """({frame name: ops of the frame, nested frames included}, {Exit op: its frame})."""
    frames, exits = {}, {}
    for enter in [op for op in ops if op.type in _ENTER]:
        name = enter.get_attr("frame_name")
        frame = frames.setdefault(name, set())
        stack = [enter]
        while stack:
            op = stack.pop()
            if op in frame:
                continue
            frame.add(op)
            if op.type in _EXIT:
                exits.setdefault(op, name)
                continue
            stack.extend(successors.get(op, ()))
    return frames, exits


def _depths(ops, frames, exits):
    """{op: cond depth of its outputs} (ops at depth 0 left out); for a Switch, the
    depth of its outputs."""
    entering = {}
    for name, frame in frames.items():
        entering[name] = [t.op for op in frame if op.type in _ENTER for t in op.inputs]
    in_frame = set(op for frame in frames.values() for op in frame)
    depth = {}
    for _ in range(_ROUNDS):
        changed = False
        for op in ops:
            if op in exits:
                value = max([depth.get(i, 0) for i in entering[exits[op]]] or [0])
            elif op in in_frame:
                continue  # kept whole; its depth shows at its Exit
            else:
                inputs = [t.op for t in op.inputs] + list(op.control_inputs)
                deepest = max([depth.get(i, 0) for i in inputs] or [0])
                if op.type in _SWITCH:
                    value = deepest + 1
                elif op.type in _MERGE:
                    value = max(deepest - 1, 0)
                else:
                    value = deepest
            if value != depth.get(op, 0):
                depth[op] = value
                changed = True
        if not changed:
            return depth
    raise RuntimeError("EPL internal error: the cond depths of the step's ops do not settle")
