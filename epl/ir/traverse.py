"""Graph traversal: the one walk over data and control edges every pass uses."""
from epl import tf_adapter

_LOOP_ENTRY, _LOOP_EXIT = ("Enter", "RefEnter"), ("Exit", "RefExit")
_MERGE, _SWITCH = ("Merge", "RefMerge"), ("Switch", "RefSwitch")
# The op types of TF1 (non-functional) control flow.
CONTROL_FLOW_TYPES = frozenset(_LOOP_ENTRY + _LOOP_EXIT + _SWITCH + _MERGE + (
    "NextIteration", "RefNextIteration", "LoopCond", "ControlTrigger"))


def unique_ops(ops):
    """``ops`` without repeats, in first-seen order."""
    seen, result = set(), []
    for op in ops:
        if id(op) not in seen:
            seen.add(id(op))
            result.append(op)
    return result


def ancestors(roots, stop=None):
    """Names of ``roots`` and every op they reach backwards (data and control edges).

    ``stop(op)`` (optional) returns True for ops whose inputs are not followed;
    such ops are still included.
    """
    return set(op.name for op in ancestor_ops(roots, stop))


def ancestor_ops(roots, stop=None):
    """Like :func:`ancestors`, but the ops themselves (TF op names are C calls;
    a walk over a big model that compares names spends its time there)."""
    seen, found, stack = set(), [], list(roots)
    while stack:
        op = stack.pop()
        if id(op) in seen:
            continue
        seen.add(id(op))
        found.append(op)
        if stop is not None and stop(op):
            continue
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return found


def successor_map(ops):
    """{op: [ops among ``ops`` that read it or wait for it]} (data and control edges)."""
    members = set(ops)
    found = dict((op, []) for op in ops)
    for op in ops:
        for producer in [t.op for t in op.inputs] + list(op.control_inputs):
            if producer in members:
                found[producer].append(op)
    return found


def descendants(starts, stop=None, include_stop=True):
    """Names of ``starts`` and every op they reach forwards (data and control edges:
    an op without inputs inside a loop body or a cond branch, a constant say, hangs
    on the loop's or branch's pivot by a control edge).

    The walk does not continue past ops for which ``stop(op)`` is True; those
    are included only when ``include_stop``.
    """
    seen, visited, stack = set(), set(), list(starts)
    while stack:
        op = stack.pop()
        if op.name in visited:
            continue
        visited.add(op.name)
        if stop is not None and stop(op):
            if include_stop:
                seen.add(op.name)
            continue
        seen.add(op.name)
        stack.extend(c for t in op.outputs for c in t.consumers())
        stack.extend(tf_adapter.control_outputs(op))
    return seen


def control_flow_interior(tf_graph):
    """(ops that cannot take control inputs, ops that cannot be barrier inputs).

    Found structurally (cloned ops carry no Python control-flow context):
    loop bodies are what is reachable from Enter ops before Exit ops; cond
    branches are what is reachable from Switch outputs before Merge ops.
    """
    ops = tf_graph.get_operations()
    loop = descendants([op for op in ops if op.type in _LOOP_ENTRY],
                       stop=lambda op: op.type in _LOOP_EXIT)
    branch = descendants([c for op in ops if op.type in _SWITCH for t in op.outputs
                          for c in t.consumers()],
                         stop=lambda op: op.type in _MERGE + _LOOP_EXIT, include_stop=False)
    entry = set(op.name for op in ops if op.type in _LOOP_ENTRY)
    exit_ = set(op.name for op in ops if op.type in _LOOP_EXIT)
    return loop - entry, (loop - exit_) | branch
