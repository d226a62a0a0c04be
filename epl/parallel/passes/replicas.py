"""Clone the user's model once per extra local copy (replicas 1..k-1)."""
from epl.parallel.clone import Cloner
from epl.parallel.gates import gradient_gates
from epl.parallel.passes import REPLICATE, Pass

REPLICA_PREFIX = "EPL_REPLICA_%d"


class ReplicaClone(Pass):
    """Copy every cloned op (all micro-batches) to each other local device.

    Variables are copied too; the sync pass makes the copies equal to
    replica 0 before the first step. Ops a model pass registered in
    ``view.specialized`` (collectives of split layers) are built for each copy
    by their builder instead of being copied from copy 0. Shared inputs (iterators, placeholders,
    global step) are read by every copy; each copy's get-next op pulls its
    own batch. Names get an ``EPL_REPLICA_<i>/`` prefix for TensorBoard only.
    """

    name = "replica_clone"
    phase = REPLICATE
    reads = ("view", "cluster", "plan", "copies", "num_micro_batch", "roles", "micro_batching",
             "communicators")
    writes = ("graph", "instances", "aliases", "gates", "dropped", "program.extras")

    def applies(self, ctx):
        return len(ctx.copies) > 1

    def run(self, ctx):
        sources, user_of = [], {}
        # ops that stage functions hold: each copy calls the functions instead
        replaced = getattr(ctx.micro_batching, "replaced", ())
        for micro_batch in range(ctx.num_micro_batch):
            skipped = ctx.skipped_ops(0, micro_batch)
            for op in ctx.roles.cloned:
                if op.name in skipped or op.name in replaced:
                    continue  # the micro-batch copy has no op of its own here
                source = ctx.instance(op, 0, micro_batch)
                if micro_batch == 0 or source is not op:
                    sources.append(source)
                    user_of[source.name] = (op, micro_batch)
        specialized = {}
        for source in sources:
            user_op, micro_batch = user_of[source.name]
            spec = ctx.view.specialized.get(user_op.name)
            if spec is not None:
                inputs = [ctx.tensor_instance(t, 0, micro_batch) for t in spec.inputs]
                specialized[source.name] = (
                    lambda tag, inputs, build=spec.builder, m=micro_batch: build(tag, m, inputs),
                    inputs)
        gates = gradient_gates(sources)
        cloner = Cloner(ctx.tf_graph, sources, specialized, gates)
        for copy in range(1, len(ctx.copies)):
            result = cloner.clone(
                REPLICA_PREFIX % copy, tag=copy,
                device_of=lambda src, c=copy: ctx.device_for(user_of[src.name][0], c))
            _record_aliases(ctx, copy, result, gates)
            for source in sources:
                if gates is not None and gates.skipped(source.name):
                    _gate_extras(ctx, source, result, gates)
                    continue
                user_op, micro_batch = user_of[source.name]
                new_op = result.ops[source.name]
                ctx.instances.setdefault((copy, micro_batch), {})[user_op.name] = new_op
                ctx.view.record_clone(new_op, ctx.view.info(source), copy, micro_batch,
                                      user_op.name)
                if micro_batch == 0:
                    ctx.program.add_extras(user_op.name, [new_op])


def _record_aliases(ctx, copy, result, gates):
    """Gradient gates that copy ``copy`` does without: copy 0's (skipped by this
    clone) and each micro-batch's (skipped by the micro-batch clone)."""
    ctx.record_gates((copy, 0), result.aliases, result.gates,
                     gates.dropped if gates is not None else ())
    for micro_batch in range(1, ctx.num_micro_batch):
        source = (0, micro_batch)
        ctx.record_gates(
            (copy, micro_batch),
            dict((name, _cloned_or_shared(result, tensor))
                 for name, tensor in ctx.aliases.get(source, {}).items()),
            dict((name, [result.ops.get(g.name, g) for g in ops])
                 for name, ops in ctx.gates.get(source, {}).items()),
            ctx.dropped.get(source, ()))


def _gate_extras(ctx, source, result, gates):
    """Fetching a gate op of copy 0 runs what each copy has instead of it."""
    if source.name in gates.forwarded:
        extras = [result.ops[source.name]] + result.gates[source.name]
    else:
        extras = [result.ops.get(c.name, c) for member in source.control_inputs
                  for c in gates.resolve_control(member)]
    ctx.program.add_extras(source.name, extras)


def _cloned_or_shared(result, tensor):
    copy = result.tensor(tensor)
    return tensor if copy is None else copy
