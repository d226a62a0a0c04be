"""Pipeline micro-batches: clone forward and backward ops of copy 0 per micro-batch."""
from epl import tf_adapter
from epl.ir.phase import Phase
from epl.ir.traverse import control_flow_interior
from epl.parallel.clone import Cloner
from epl.parallel.passes import REPLICATE, Pass
from epl.parallel.roles import is_variable

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
    reads = ("roles", "num_micro_batch")
    writes = ("instances[(0, m)]", "IR clones")

    def applies(self, ctx):
        return ctx.num_micro_batch > 1

    def run(self, ctx):
        sources = micro_batch_sources(ctx)
        specialized = dict((op.name, ctx.view.specialized[op.name]) for op in sources
                           if op.name in ctx.view.specialized)
        cloner = Cloner(ctx.tf_graph, sources, dict(
            (name, (lambda tag, inputs, build=spec.builder: build(tag[0], tag[1], inputs),
                    spec.inputs))
            for name, spec in specialized.items()))
        for micro_batch in range(1, ctx.num_micro_batch):
            result = cloner.clone(MICRO_BATCH_PREFIX % micro_batch,
                                  device_of=lambda src: src.device, tag=(0, micro_batch))
            table = ctx.instances.setdefault((0, micro_batch), {})
            for source in sources:
                new_op = result.ops[source.name]
                table[source.name] = new_op
                ctx.view.record_clone(new_op, ctx.view.info(source), 0, micro_batch,
                                      source.name)
        _order_shared_writes(ctx, sources)


def micro_batch_sources(ctx):
    """The ops each micro-batch needs a copy of: the forward and backward ops of the
    training step (not variables, not what only initializes them), except
    constants without control inputs, which every micro-batch shares (they sit
    on the stage's device already and are a quarter of a typical model's ops)."""
    phases = (Phase.FORWARD, Phase.BACKWARD)
    sources = []
    for op in ctx.roles.cloned:
        if ctx.view.info(op).phase not in phases or is_variable(op):
            continue
        if op.name not in ctx.roles.step or _shareable_constant(op):
            continue
        sources.append(op)
    return sources


def _shareable_constant(op):
    return op.type == "Const" and not op.control_inputs


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
