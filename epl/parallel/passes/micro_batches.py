"""Pipeline micro-batches: clone forward and backward ops of copy 0 per micro-batch."""
from epl import tf_adapter
from epl.ir.phase import Phase
from epl.ir.traverse import CONTROL_FLOW_TYPES, control_flow_interior
from epl.parallel.clone import Cloner
from epl.parallel.gates import gradient_gates
from epl.parallel.passes import REPLICATE, Pass
from epl.parallel.plan import UNROLLED
from epl.ir.roles import is_variable

MICRO_BATCH_PREFIX = "EPL_MICRO_BATCH_%d"


class MicroBatchClone(Pass):
    """Micro-batch m > 0 is a copy of every forward/backward op of micro-batch 0.

    Variables are shared (not copied): every micro-batch reads the same
    weights and the gradients of all micro-batches are summed before one
    update. Each copy of a get-next op is an extra pull from the input
    pipeline, so a step consumes ``num_micro_batch`` batches per replica.
    Copies stay on the device of their original op (their stage's device).
    """

    name = "micro_batch_clone"
    phase = REPLICATE
    reads = ("view", "num_micro_batch", "roles")
    writes = ("graph", "instances", "aliases", "gates", "dropped", "shared_constants")

    def applies(self, ctx):
        return ctx.num_micro_batch > 1 and ctx.plan.micro_batching[0] == UNROLLED

    def run(self, ctx):
        sources, ctx.shared_constants = micro_batch_sources(ctx)
        specialized = dict((op.name, ctx.view.specialized[op.name]) for op in sources
                           if op.name in ctx.view.specialized)
        gates = gradient_gates(sources)
        cloner = Cloner(ctx.tf_graph, sources, dict(
            (name, (lambda tag, inputs, build=spec.builder: build(tag[0], tag[1], inputs),
                    spec.inputs))
            for name, spec in specialized.items()), gates)
        for micro_batch in range(1, ctx.num_micro_batch):
            result = cloner.clone(MICRO_BATCH_PREFIX % micro_batch,
                                  device_of=lambda src: src.device, tag=(0, micro_batch))
            table = ctx.instances.setdefault((0, micro_batch), {})
            ctx.record_gates((0, micro_batch), result.aliases, result.gates,
                             gates.dropped if gates is not None else ())
            for source in sources:
                if gates is not None and gates.skipped(source.name):
                    continue
                new_op = result.ops[source.name]
                table[source.name] = new_op
                ctx.view.record_clone(new_op, ctx.view.info(source), 0, micro_batch,
                                      source.name)
        _order_shared_writes(ctx, sources)


def micro_batch_candidates(ctx):
    """The forward and backward ops of the training step that micro-batches repeat
    (not variables, not what only initializes them), in creation order."""
    phases = (Phase.FORWARD, Phase.BACKWARD)
    return [op for op in ctx.roles.cloned
            if ctx.view.info(op).phase in phases and not is_variable(op)
            and op.name in ctx.roles.step]


def micro_batch_sources(ctx):
    """(ops each micro-batch needs a copy of, names of the ops they share).

    Copies are made of the candidates (:func:`micro_batch_candidates`), except
    constant expressions, which every micro-batch shares (see
    :func:`constant_expressions`)."""
    candidates = micro_batch_candidates(ctx)
    shared = constant_expressions(candidates)
    return [op for op in candidates if op.name not in shared], shared


def constant_expressions(ops):
    """Names of the ops in ``ops`` whose value is the same in every micro-batch:
    constants and stateless ops computed from constants only (no control inputs).

    They are a quarter of a typical model's ops (shapes, permutations and their
    inverses, broadcast arguments in the backward pass); sharing them keeps them
    on their stage's device as before and saves TensorFlow folding the same
    expression once per micro-batch when the session starts.
    """
    names = set(op.name for op in ops)
    shared = set()
    pending = [op for op in ops if _may_be_constant(op)]
    while pending:  # a fixed point: each round adds the ops whose inputs are now known
        later = []
        for op in pending:
            if all(t.op.name in shared for t in op.inputs):
                shared.add(op.name)
            elif all(t.op.name in names and _may_be_constant(t.op) for t in op.inputs):
                later.append(op)
        if len(later) == len(pending):
            break
        pending = later
    return shared


def _may_be_constant(op):
    return (not op.control_inputs and op.type not in _NEVER_CONSTANT
            and not tf_adapter.touches_state(op) and (op.type == "Const" or bool(op.inputs)))


# Control flow, and placeholders, whose value a feed can change per run.
_NEVER_CONSTANT = CONTROL_FLOW_TYPES | frozenset(["Placeholder", "PlaceholderWithDefault"])


def _order_shared_writes(ctx, sources):
    """Micro-batch m touches a variable that micro-batches write only after
    micro-batch m-1's writes of it.

    Micro-batches share variables; forward-phase writes such as batch norm's
    moving statistics (``moving_mean -= (moving_mean - mean) * (1 - decay)``)
    must read and write in micro-batch order, like serial runs, or updates are
    lost and the result depends on thread timing. Every schedule runs a stage's
    forwards (and backwards) in micro-batch order, so this adds no wait the
    schedule does not already imply. Ops inside while loops cannot take
    control inputs and are left alone.
    """
    no_entrance, _ = control_flow_interior(ctx.tf_graph)
    writers, users = {}, {}
    for source in sources:
        if source.name in no_entrance:
            continue
        for variable in _variables_read(source):
            users.setdefault(variable, []).append(source)
            if tf_adapter.writes_variable(source):
                writers.setdefault(variable, []).append(source)
    for variable, written_by in writers.items():
        for micro_batch in range(1, ctx.num_micro_batch):
            before = [ctx.instance(w, 0, micro_batch - 1) for w in written_by]
            for user in users[variable]:
                tf_adapter.add_control_inputs(ctx.instance(user, 0, micro_batch), before)


def _variables_read(op):
    """Names of the variables whose ref or handle ``op`` takes as an input."""
    return [t.op.name for t in op.inputs if is_variable(t.op)]
