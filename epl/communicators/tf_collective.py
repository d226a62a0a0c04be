"""Collective backend on TensorFlow's collective ops (CPU and GPU, local and gRPC).

TF ranks group members by sorting their device names (TF 1.15 sorts them as
strings, so ``CPU:10`` comes before ``CPU:2``; TF 2.x by task and device index:
``tf_adapter.collective_rank_order``); this backend maps results back to the
group's own device order, and builds reduce_scatter and alltoall, which TF
1.15 lacks, from all-reduce and all-gather.
"""
from epl import tf_adapter
from epl.tf_adapter import collective_ops, tf


def as_rank1(tensor):
    """Collectives that concatenate need rank >= 1."""
    if tensor.shape.ndims == 0:
        return tf.reshape(tensor, [1])
    return tensor


def _group_order(tensor, group, per_member_rows):
    """Reorder an all-gather result from TF's rank order to ``group.devices`` order.

    ``per_member_rows`` is None when the row count is only known at run time."""
    tf_order = tf_adapter.collective_rank_order(group.devices)
    perm = [tf_order.index(d) for d in group.devices]
    if perm == list(range(group.size)):
        return tensor
    if per_member_rows is None:
        per_member_rows = tf.shape(tensor)[0] // group.size
    chunks = tf.reshape(tensor, tf.concat([[group.size, per_member_rows],
                                           tf.shape(tensor)[1:]], 0))
    return tf.reshape(tf.gather(chunks, perm), tf.shape(tensor))


def _chunk(tensor, group, rank):
    """Member ``rank``'s slice of dim 0, split evenly over the group."""
    rows = tensor.shape[0].value
    if rows is None or rows % group.size:
        raise ValueError("reduce_scatter/alltoall need dim 0 (%s) divisible by the group size "
                         "%d" % (rows, group.size))
    size = rows // group.size
    return tensor[rank * size:(rank + 1) * size], size


class TFCollectiveBackend(object):
    """Builds one member's collective op; all members share keys and group size."""

    name = "tf_collective"
    # TF 1.15's CPU collectives reject DT_HALF ("does not support datatype 19").
    native_fp16 = False
    needs_context = False
    # A collective instance keeps the shape of its first run (epl/communicators/gather_v.py).
    static_shapes = True

    @staticmethod
    def available(devices, context=None):
        del devices, context
        return True

    def all_reduce(self, tensor, group, device, instance_key, mean):
        del device
        return collective_ops.all_reduce(tensor, group.size, group.key, instance_key,
                                         "Add", "Div" if mean else "Id")

    def all_gather(self, tensor, group, device, instance_key):
        del device
        tensor = as_rank1(tensor)
        rows = tensor.shape[0].value
        gathered = collective_ops.all_gather(tensor, group.size, group.key, instance_key)
        return _group_order(gathered, group, rows)

    def broadcast_send(self, tensor, group, device, instance_key):
        del device
        return collective_ops.broadcast_send(tensor, tensor.shape, tensor.dtype, group.size,
                                             group.key, instance_key)

    def broadcast_recv(self, shape, dtype, group, device, instance_key):
        del device
        return collective_ops.broadcast_recv(shape, dtype, group.size, group.key,
                                             instance_key)

    def reduce_scatter(self, tensor, group, device, instance_key, mean):
        reduced = self.all_reduce(tensor, group, device, instance_key, mean)
        return _chunk(reduced, group, group.rank(device))[0]

    def alltoall(self, tensor, group, device, instance_key):
        _, size = _chunk(tensor, group, 0)
        everything = self.all_gather(tensor, group, device, instance_key)
        rank = group.rank(device)
        pieces = [everything[(j * group.size + rank) * size:(j * group.size + rank + 1) * size]
                  for j in range(group.size)]
        return tf.concat(pieces, 0)
