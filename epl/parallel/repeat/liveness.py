"""Which of copy 0's ops another local copy needs a clone of.

With stage functions the user's forward and backward ops stay in the graph but no
longer run (calls compute them), and what a function body needs from outside is
either an input of its calls or copied into the body (constant expressions). So
some of the ops every copy used to clone are read only by ops that no longer run:
the constants, shape and permutation expressions of the cores, and the reads
(``var/read``) of weights and optimizer slots that only the cores read. On a
BERT-base encoder with 2 local replicas they were more than half of the second
replica's ops (1.8k of 3.2k), built by the rewrite and carried by every session
run's graph, for nothing (issue 41). A copy therefore clones only the *live* ops:
those that something still running needs.

An op is a root of liveness (kept whatever reads it) when it may change state
(stateful ops, variable writes), when something outside the cloned set reads it
(the global step's update waits for each copy's instance of the optimizer's
``update`` NoOp, which drives that copy's updates), when its
tensor is merged across copies (``GLOBAL_*`` collections: the merge reads every
copy's), when a call reads it, when a model pass builds it per copy, or when
nothing reads it (a fetch of a user op runs every copy's instance: a train op's NoOp drives the
copy's updates, an unread ``zeros_like`` pulls the copy's batch), unless it is a
constant or a variable's read (``var/read`` of an optimizer slot) that waits for
nothing: running those reaches no other op, so they are live only where a live op
reads them. Everything a live op reads (through gradient gates, as the clones read
them) is live. What is left is read only by ops that no longer run, so no copy's
running op can reach it, and leaving its clone out changes no value any step computes.
"""
from epl import tf_adapter
from epl.ir.roles import is_variable


def live_sources(ctx, rep, sources, user_of, gates):
    """The names of ``sources`` (copy 0's ops to clone, each the instance of
    ``user_of[name] = (user op, micro-batch)``) that other copies need clones of.
    ``gates``: the sources' :class:`epl.parallel.repeat.gates.GradientGates` or None."""
    names = set(op.name for op in sources)
    by_name = dict((op.name, op) for op in sources)
    if not rep.replaced or ctx.config.zero.level:
        return names  # nothing stops running; ZeRO asks for copies' instances itself
    wanted = rep.call_inputs() | _merged_tensors(ctx)  # user tensor and op names
    live, pending = set(), [op for op in sources
                            if _is_root(ctx, rep, op, user_of[op.name][0], names, wanted)]
    while pending:
        op = pending.pop()
        if op.name in live:
            continue
        live.add(op.name)
        pending.extend(by_name[read.name] for read in _reads(op, gates)
                       if read.name in by_name and read.name not in live)
    return live


def _is_root(ctx, rep, op, user_op, names, wanted):
    """True if ``op`` is live whatever reads it (see the module docstring)."""
    if op.op_def.is_stateful or tf_adapter.writes_variable(op):
        return True
    if user_op.name in ctx.view.specialized or user_op.name in wanted:
        return True
    if any(t.name in wanted for t in user_op.outputs):
        return True
    if rep.micro_batches > 1 and any(is_variable(t.op) for t in op.inputs):
        return True  # order_shared_writes orders each micro-batch's readers of a variable
    if _pure_leaf(op):
        return False  # live only if a live clone reads it
    readers = [c for t in op.outputs for c in t.consumers()] + tf_adapter.control_outputs(op)
    return not readers or any(r.name not in names and r.name not in rep.replaced
                              for r in readers)


def _pure_leaf(op):
    """A constant or a read of a variable, waiting for nothing: running it reaches no
    other op, so a copy's instance that nothing reads has no effect."""
    if op.control_inputs:
        return False
    return op.type == "Const" or (op.type == "Identity" and is_variable(op.inputs[0].op))


def _merged_tensors(ctx):
    return set(t.name for tensors in ctx.view.collections.values() for t in tensors)


def _reads(op, gates):
    """The ops ``op``'s clone reads or waits for, as :class:`epl.parallel.repeat.clone.
    Cloner` wires it: through a forwarded gradient gate, its source and its members."""
    found = list(op.control_inputs)
    for tensor in op.inputs:
        if gates is not None and tensor.op.name in gates.forwarded:
            found.extend(gates.waits(tensor.op.name))
            tensor = gates.source(tensor)
        found.append(tensor.op)
    if gates is None:
        return found
    return [c for op_ in found for c in gates.resolve_control(op_)]
