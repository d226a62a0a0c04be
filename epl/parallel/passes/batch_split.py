"""``replicate(device_count=k)``: one batch per model replica, split over its devices.

Each worker reads its own batches: when a replica spans workers, every worker
holding part of it pulls one batch per step and splits it over its own
devices of that replica, so no host funnels another host's input.

A batch can only be split when its size is not fixed in the graph: TF bakes a
static batch size into the model's gradient ops (``tf.reduce_mean``'s gradient
tiles to a constant shape), so a slice of such a batch would fail at run time.
For an input whose batch dimension is static (``drop_remainder=True``, a
placeholder of shape ``[64, ...]``), every copy pulls a whole batch of its own,
as the original EPL did, and EPL says so once, loudly.
"""
import logging

from epl.parallel.passes import REPLICATE, Pass
from epl.ir.roles import GET_NEXT_TYPES
from epl.tf_adapter import tf

LOG = logging.getLogger("epl")


class BatchSplit(Pass):
    """The local copies of one replica read slices of its reader's batch.

    The clone get-next ops of the other copies are left without consumers, so
    they never run and the iterator advances once per replica and worker.
    Records the split inputs in ``ctx.split_inputs`` (InputOrder reads it).
    """

    name = "batch_split"
    phase = REPLICATE
    reads = ("cluster", "copies", "roles", "repetition")
    writes = ("graph", "split_inputs")

    def applies(self, ctx):
        return any(len(members) > 1 for _, members in ctx.readers())

    def run(self, ctx):
        get_next = [op for op in ctx.roles.cloned if op.type in GET_NEXT_TYPES]
        for user_op in get_next:
            if not splittable(user_op):
                _warn_not_split(ctx, user_op)
                continue
            ctx.split_inputs.add(user_op.name)
            for _, members in ctx.readers():
                if len(members) > 1:
                    for micro_batch in range(ctx.num_micro_batch):
                        _split_outputs(ctx, user_op, members, len(members), micro_batch)


def splittable(get_next):
    """True when every batched output of ``get_next`` has a dynamic batch size."""
    return all(t.shape.ndims == 0 or t.shape.ndims is None or t.shape.dims[0].value is None
               for t in get_next.outputs)


def _warn_not_split(ctx, user_op):
    shapes = ", ".join(str(t.shape) for t in user_op.outputs)
    LOG.warning(
        "EPL: replicate(device_count>1) cannot split the batch of %s (output shapes %s): "
        "its batch size is fixed in the graph, and TF builds the model's gradients for "
        "that size. Each of this worker's %d copies pulls a whole batch of its own instead "
        "(as the original EPL did), so a replica trains on device_count batches per step. "
        "To split the batch, give the input a dynamic batch dimension "
        "(Dataset.batch(..., drop_remainder=False), or a placeholder of shape [None, ...]).",
        user_op.name, shapes, len(ctx.copies))


def _split_outputs(ctx, user_op, members, width, micro_batch=0):
    """Micro-batch ``micro_batch`` of the reader copy is split over ``members`` (the
    copies of one replica: positions of stages k devices wide, in a pipeline too)."""
    leader_op = ctx.instance(user_op, members[0], micro_batch)
    for index, output in enumerate(leader_op.outputs):
        if output.shape.ndims == 0:
            continue
        targets = []
        for copy in members:
            tensor = ctx.instance(user_op, copy, micro_batch).outputs[index]
            targets.append((tensor, list(tensor.consumers())))
        with tf.device(ctx.host), tf.name_scope("EPL_BATCH_SPLIT"):
            check = tf.debugging.assert_equal(
                tf.shape(output)[0] % width, 0, message=(
                    "replicate(device_count=k) splits each batch across the %d devices "
                    "of a replica on this worker, but the batch from %s is not divisible "
                    "by %d" % (width, user_op.name, width)))
            with tf.control_dependencies([check]):
                parts = tf.split(output, width, axis=0)
        for (tensor, consumers), part in zip(targets, parts):
            ctx.rewire(tensor, part, consumers)
