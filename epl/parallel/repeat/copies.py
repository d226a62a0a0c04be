"""Clones of the step: per micro-batch of copy 0, then per extra local copy.

Both lowerings repeat ops this way; they differ in which ops. Unrolled copies
clone every forward and backward op per micro-batch; stage functions clone only
the ops that cannot live in a function (residual ops), and replace the rest by
calls. Then every local copy 1..k-1 gets a clone of everything copy 0 has (all
its micro-batches), except what calls replace.

Ops that a model pass registered in ``view.specialized`` (collectives of split
layers, built per copy) are built by their builder for each clone instead of
being copied from copy 0. Names get ``EPL_MICRO_BATCH_<m>/`` and
``EPL_REPLICA_<c>/`` prefixes for TensorBoard only.
"""
from epl import tf_adapter
from epl.ir.traverse import control_flow_interior
from epl.ir.roles import is_variable
from epl.parallel.repeat.clone import Cloner
from epl.parallel.repeat.gates import gradient_gates
from epl.parallel.repeat.liveness import live_sources

MICRO_BATCH_PREFIX = "EPL_MICRO_BATCH_%d"
REPLICA_PREFIX = "EPL_REPLICA_%d"


def clone_micro_batches(ctx, rep, sources):
    """Micro-batch m > 0 of copy 0 is a clone of ``sources`` (user ops, creation order).

    Variables are not among them: every micro-batch reads the same weights, and
    their gradients are summed before one update. Each clone of a get-next op is
    one more pull from the input pipeline. Clones stay on their source's device.
    """
    if rep.micro_batches < 2 or not sources:
        return
    specialized = dict(
        (op.name, (lambda tag, inputs, build=ctx.view.specialized[op.name].builder:
                   build(tag[0], tag[1], inputs), ctx.view.specialized[op.name].inputs))
        for op in sources if op.name in ctx.view.specialized)
    gates = gradient_gates(sources)
    cloner = Cloner(ctx.tf_graph, sources, specialized, gates)
    for micro_batch in range(1, rep.micro_batches):
        result = cloner.clone(MICRO_BATCH_PREFIX % micro_batch,
                              device_of=lambda src: src.device, tag=(0, micro_batch))
        rep.record_gates(0, micro_batch, result.aliases, result.gates,
                         gates.dropped if gates is not None else ())
        ops = rep.at(0, micro_batch).ops
        for source in sources:
            if gates is not None and gates.skipped(source.name):
                continue
            new_op = result.ops[source.name]
            ops[source.name] = new_op
            ctx.view.record_clone(new_op, ctx.view.info(source), 0, micro_batch, source.name)


def clone_copies(ctx, rep):
    """Copy every cloned op of copy 0 (all its micro-batches, except the user ops
    ``rep.replaced``) to each other local copy's devices.

    Variables are copied too; the sync pass makes the copies equal to replica 0
    before the first step. Shared inputs (iterators, placeholders, global step)
    are read by every copy; each copy's get-next op pulls its own batch. Ops that
    only ops which no longer run read (calls replace them) are not copied
    (:mod:`epl.parallel.repeat.liveness`): a name a copy has no op for stands for
    copy 0's op (:meth:`Repetition.op`).
    """
    if rep.copies < 2:
        return
    sources, user_of = _copy_sources(ctx, rep)
    # the gates of every source: the clones read through them as liveness does
    gates = gradient_gates(sources)
    live = live_sources(ctx, rep, sources, user_of, gates)
    sources = [op for op in sources if op.name in live]
    specialized = {}
    for source in sources:
        user_op, micro_batch = user_of[source.name]
        spec = ctx.view.specialized.get(user_op.name)
        if spec is not None:
            inputs = [rep.tensor(t, 0, micro_batch) for t in spec.inputs]
            specialized[source.name] = (
                lambda tag, inputs, build=spec.builder, m=micro_batch: build(tag, m, inputs),
                inputs)
    cloner = Cloner(ctx.tf_graph, sources, specialized, gates)
    for copy in range(1, rep.copies):
        result = cloner.clone(
            REPLICA_PREFIX % copy, tag=copy,
            device_of=lambda src, c=copy: ctx.device_for(user_of[src.name][0], c))
        _record_aliases(rep, copy, result, gates)
        for source in sources:
            if gates is not None and gates.skipped(source.name):
                _gate_extras(ctx, source, result, gates)
                continue
            user_op, micro_batch = user_of[source.name]
            new_op = result.ops[source.name]
            rep.at(copy, micro_batch).ops[user_op.name] = new_op
            ctx.view.record_clone(new_op, ctx.view.info(source), copy, micro_batch,
                                  user_op.name)
            if micro_batch == 0:
                ctx.program.fetches.add_extras(user_op.name, [new_op])


def _copy_sources(ctx, rep):
    """(copy 0's ops to clone, {their name: (user op, micro-batch)})."""
    sources, user_of = [], {}
    for micro_batch in range(rep.micro_batches):
        skipped = rep.skipped(0, micro_batch)
        for op in ctx.roles.cloned:
            if op.name in skipped or op.name in rep.replaced:
                continue  # the micro-batch copy has no op of its own here
            source = rep.op(op, 0, micro_batch)
            if micro_batch == 0 or source is not op:
                sources.append(source)
                user_of[source.name] = (op, micro_batch)
    return sources, user_of


def _record_aliases(rep, copy, result, gates):
    """Gradient gates that copy ``copy`` does without: copy 0's (skipped by this
    clone) and each micro-batch's (skipped by the micro-batch clone)."""
    rep.record_gates(copy, 0, result.aliases, result.gates,
                     gates.dropped if gates is not None else ())
    for micro_batch in range(1, rep.micro_batches):
        source = rep.at(0, micro_batch)
        rep.record_gates(
            copy, micro_batch,
            dict((name, _cloned_or_shared(result, tensor))
                 for name, tensor in source.aliases.items()),
            dict((name, [result.ops.get(g.name, g) for g in ops])
                 for name, ops in source.gates.items()),
            source.dropped)


def _gate_extras(ctx, source, result, gates):
    """Fetching a gate op of copy 0 runs what each copy has instead of it."""
    if source.name in gates.forwarded:
        extras = [result.ops[source.name]] + result.gates[source.name]
    else:
        extras = [result.ops.get(c.name, c) for member in source.control_inputs
                  for c in gates.resolve_control(member)]
    ctx.program.fetches.add_extras(source.name, extras)


def _cloned_or_shared(result, tensor):
    copy = result.tensor(tensor)
    return tensor if copy is None else copy


def order_shared_writes(ctx, rep, ops, calls_reading=None):
    """In every copy, micro-batch m touches a variable that micro-batches write only
    after micro-batch m-1's writes of it.

    Micro-batches share variables; forward-phase writes such as batch norm's moving
    statistics (``moving_mean -= (moving_mean - mean) * (1 - decay)``) must read and
    write in micro-batch order, like serial runs, or updates are lost and the result
    depends on thread timing. Every schedule runs a stage's forwards (and backwards)
    in micro-batch order, so this adds no wait the schedule does not already imply.
    ``ops`` are the user ops each micro-batch repeats; ``calls_reading(variable
    name)`` (stage functions) gives the actions whose calls read a variable. Ops
    inside while loops cannot take control inputs and are left alone.
    """
    if rep.micro_batches < 2:
        return
    no_entrance, _ = control_flow_interior(ctx.tf_graph)
    writers, users = {}, {}
    for op in ops:
        if op.name in no_entrance:
            continue
        for variable in [t.op.name for t in op.inputs if is_variable(t.op)]:
            users.setdefault(variable, []).append(op)
            if tf_adapter.writes_variable(op):
                writers.setdefault(variable, []).append(op)
    for copy in range(rep.copies):
        for variable, written_by in writers.items():
            actions = calls_reading(variable) if calls_reading is not None else ()
            for micro_batch in range(1, rep.micro_batches):
                before = [rep.op(w, copy, micro_batch - 1) for w in written_by]
                calls = rep.at(copy, micro_batch).calls
                targets = [rep.op(u, copy, micro_batch) for u in users[variable]]
                targets += [calls[action] for action in actions]
                for target in targets:
                    tf_adapter.add_control_inputs(target, before)
