"""Pipeline micro-batches: clone forward and backward ops of copy 0 per micro-batch."""
from epl.ir.phase import Phase
from epl.parallel.clone import clone_ops
from epl.parallel.passes import Pass
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

    def applies(self, ctx):
        return ctx.num_micro_batch > 1

    def run(self, ctx):
        phases = (Phase.FORWARD, Phase.BACKWARD)
        sources = [op for op in ctx.roles.cloned
                   if ctx.view.info(op).phase in phases and not is_variable(op)]
        for micro_batch in range(1, ctx.num_micro_batch):
            result = clone_ops(ctx.tf_graph, sources, MICRO_BATCH_PREFIX % micro_batch,
                               device_of=lambda src: src.device)
            table = ctx.instances.setdefault((0, micro_batch), {})
            for source in sources:
                new_op = result.ops[source.name]
                table[source.name] = new_op
                ctx.view.record_clone(new_op, ctx.view.info(source), 0, micro_batch,
                                      source.name)
