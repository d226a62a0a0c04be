"""Merge tensors in ``epl.GraphKeys`` collections over micro-batches and replicas."""
from epl.communicators import as_rank1
from epl.ir.collections import GraphKeys
from epl.parallel.context import OUTPUTS
from epl.parallel.mesh import sharing_copies
from epl.parallel.passes import LOWER, Pass
from epl.ir.roles import is_summary
from epl.tf_adapter import tf


def reduce_parts(parts, reduction):
    """mean / sum / concat (axis 0) of equally shaped tensors."""
    if len(parts) == 1:
        return parts[0]
    if reduction == "concat":
        return tf.concat([as_rank1(p) for p in parts], 0)
    total = tf.add_n(parts)
    return total / len(parts) if reduction == "mean" else total


class MergedOutputs(Pass):
    """Fetching a collected tensor returns its merged value.

    ``LOCAL_*``: over the micro-batches of replica 0. ``GLOBAL_*``: over every
    micro-batch of every replica on every worker (a collective over the
    TaskGraph's devices, so every worker must fetch it in the same step).
    Summaries of a collected tensor are rewired to a merge over this worker's
    replicas, which needs no collective and so cannot hang a summary step.
    """

    name = "merged_outputs"
    phase = LOWER
    reads = ("view", "config", "cluster", "plan", "copies", "repetition")
    writes = ("graph", "communicators", "program.fetches")

    def applies(self, ctx):
        return any(ctx.view.collections.values())

    def run(self, ctx):
        for key, tensors in ctx.view.collections.items():
            scope, reduction = GraphKeys.describe(key)
            for tensor in tensors:
                self._merge(ctx, tensor, scope, reduction)

    def _merge(self, ctx, tensor, scope, reduction):
        taskgraph = ctx.view.info(tensor.op).taskgraph
        name = tensor.name.replace(":", "_")
        local = []
        with tf.name_scope("EPL_MERGE"):
            for copy in range(len(ctx.copies)):
                parts = [ctx.tensor_instance(tensor, copy, m) for m in range(ctx.num_micro_batch)]
                with tf.device(ctx.device(taskgraph, copy)):
                    local.append(reduce_parts(parts, reduction))
            merged = local
            comm = ctx.communicator(ctx.plan.taskgraphs[taskgraph].all_group, OUTPUTS)
            shared = sharing_copies(ctx.copies, taskgraph)
            if scope == "global" and (comm.group_size > 1 or shared):
                merged = self._global(ctx, comm, shared, local, (taskgraph, name), reduction)
            if merged[0] is not tensor:
                ctx.program.fetches.add_merged(tensor.name, merged)
            self._rewire_summaries(ctx, tensor, local, reduction, scope)

    def _global(self, ctx, comm, shared, local, where, reduction):
        """Every copy's value merged over the job. Copies running the TaskGraph on one
        device (``shared``: a TaskGraph narrower than its replica) merge there first, and
        the first of them joins the collective for all (one member per device)."""
        taskgraph, name = where
        first_of = dict((copy, members[0]) for members in shared for copy in members)
        merged = []
        for copy, value in enumerate(local):
            leader = first_of.get(copy, copy)
            if leader != copy:
                merged.append(merged[leader])
                continue
            members = [c for c, first in sorted(first_of.items()) if first == copy] or [copy]
            with tf.device(ctx.device(taskgraph, copy)):
                value = reduce_parts([local[c] for c in members], reduction)
            merged.append(value if comm.group_size == 1 else self._collective(
                comm, value, ctx.device(taskgraph, copy), name, reduction))
        return merged

    @staticmethod
    def _collective(comm, value, device, name, reduction):
        if reduction == "concat":
            return comm.all_gather(value, device, "merge/" + name)
        return comm.all_reduce(value, device, "merge/" + name, mean=(reduction == "mean"))

    @staticmethod
    def _rewire_summaries(ctx, tensor, local, reduction, scope):
        summaries = [op for op in tensor.consumers() if is_summary(op)]
        if not summaries:
            return
        values = local if scope == "global" else local[:1]
        with tf.device(ctx.host):
            value = reduce_parts(values, reduction)
        if value is not tensor:
            ctx.rewire(tensor, value, summaries)
