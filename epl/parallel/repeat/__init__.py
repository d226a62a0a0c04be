"""The step repeated per (copy, micro-batch): one unit, one lowering, chosen by the plan.

A worker runs the training step once per local copy (data-parallel replicas on its
devices, or the pipeline replicas it drives) and, in a pipeline, once per micro-batch.
This unit owns that repetition. Two lowerings implement it:

* stage functions (:mod:`.functions`): each stage's forward and backward built once as
  functions and called per repetition; the graph does not grow with the repetitions;
* unrolled copies (:mod:`.unrolled`): a clone of the step's ops per repetition.

The plan chooses one (``Plan.micro_batching``, from ``pipeline.micro_batching``; its
print says which and why); :func:`for_plan` here is the only place that turns that
choice into a lowering. The rewrite context holds the result as
``ctx.repetition`` (a :class:`.record.Repetition`), and every pass asks it instead of
testing which lowering runs:

* ``op(op, c, m)`` / ``tensor(t, c, m)``: what stands for a user op or tensor in copy c,
  micro-batch m (``ctx.instance`` and ``ctx.tensor_instance`` are its spellings);
* ``gradient_sum(grad, c, device, shape)``: copy c's gradient over the micro-batches;
* ``boundaries(ctx, c)``: where each action of the schedule starts and ends in copy c
  (with a schedule that splits the backward, B and W apart:
  :mod:`.backward_split`);
* ``micro_batches``, ``copies``.

:class:`RepeatStep` is the rewrite pass that builds it (phase ``replicate``).
"""
from epl.protocols.passes import REPLICATE, Pass
from epl.parallel.repeat.functions import StageFunctions
from epl.parallel.repeat.unrolled import UnrolledCopies
from epl.strategies.schedule import split_stages


def for_plan(plan, copies):
    """The repetition of ``plan``'s step on a worker that builds ``copies`` (its
    :class:`epl.parallel.mesh.Copy` records)."""
    micro_batches = plan.num_micro_batch if plan.pipeline else 1
    split = frozenset()  # the stages whose backward runs as B and W actions
    if plan.pipeline and plan.schedule is not None:
        split = split_stages(plan.schedule)
    if plan.calls_functions and (micro_batches > 1 or len(copies) > 1):
        return StageFunctions(len(copies), micro_batches, split)
    return UnrolledCopies(len(copies), micro_batches, split)


class RepeatStep(Pass):
    """Repeat the step per local copy and micro-batch, as ``ctx.repetition`` lowers it.

    Micro-batch m > 0 of a pipeline repeats the forward and backward of micro-batch 0;
    variables are shared by the micro-batches (their gradients are summed before one
    update) and copied per copy (the sync pass makes the copies equal to replica 0).
    Each repetition of a get-next op is one more pull from the input pipeline.
    """

    name = "repeat_step"
    phase = REPLICATE
    reads = ("view", "config", "cluster", "plan", "copies", "roles", "communicators",
             "repetition")
    writes = ("graph", "repetition", "program.fetches")

    def applies(self, ctx):
        return ctx.repetition.copies > 1 or ctx.repetition.micro_batches > 1

    def run(self, ctx):
        ctx.repetition.build(ctx)
