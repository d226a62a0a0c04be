"""``replicate(device_count=k)``: one batch per model replica, split over k devices."""
from epl.parallel.passes import Pass
from epl.parallel.roles import GET_NEXT_TYPES
from epl.tf_adapter import tf


class BatchSplit(Pass):
    """Copies (r, 1..k-1) read slices of copy (r, 0)'s batch instead of pulling.

    The clone get-next ops of the non-leading copies are left without
    consumers, so they never run and the iterator advances once per replica.
    """

    name = "batch_split"

    def applies(self, ctx):
        return any(j > 0 for _, j in ctx.copies)

    def run(self, ctx):
        width = ctx.plan.taskgraphs[0].device_count
        get_next = [op for op in ctx.roles.cloned if op.type in GET_NEXT_TYPES]
        for leader, (replica, j) in enumerate(ctx.copies):
            if j:
                continue
            members = [ctx.copies.index((replica, i)) for i in range(width)]
            for user_op in get_next:
                self._split_outputs(ctx, user_op, members, width)

    @staticmethod
    def _split_outputs(ctx, user_op, members, width):
        leader_op = ctx.instance(user_op, members[0])
        for index, output in enumerate(leader_op.outputs):
            if output.shape.ndims == 0:
                continue
            targets = []
            for copy in members:
                tensor = ctx.instance(user_op, copy).outputs[index]
                targets.append((tensor, list(tensor.consumers())))
            with tf.device(ctx.host), tf.name_scope("EPL_BATCH_SPLIT"):
                check = tf.debugging.assert_equal(
                    tf.shape(output)[0] % width, 0, message=(
                        "replicate(device_count=%d) splits each batch across %d devices, but "
                        "the batch from %s is not divisible by %d" % (
                            width, width, user_op.name, width)))
                with tf.control_dependencies([check]):
                    parts = tf.split(output, width, axis=0)
            for (tensor, consumers), part in zip(targets, parts):
                ctx.rewire(tensor, part, consumers)
