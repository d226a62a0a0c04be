"""Collective backend on TensorFlow's collective ops (CPU and GPU, local and gRPC)."""
from epl.tf_adapter import collective_ops, tf


class TFCollectiveBackend(object):
    """Builds one member's collective op; all members share keys and group size."""

    name = "tf_collective"

    @staticmethod
    def available(devices):
        del devices
        return True

    def all_reduce(self, tensor, group_size, group_key, instance_key, mean):
        return collective_ops.all_reduce(tensor, group_size, group_key, instance_key,
                                         "Add", "Div" if mean else "Id")

    def all_gather(self, tensor, group_size, group_key, instance_key):
        return collective_ops.all_gather(tensor, group_size, group_key, instance_key)

    def broadcast_send(self, tensor, group_size, group_key, instance_key):
        return collective_ops.broadcast_send(tensor, tensor.shape, tensor.dtype, group_size,
                                             group_key, instance_key)

    def broadcast_recv(self, shape, dtype, group_size, group_key, instance_key):
        return collective_ops.broadcast_recv(shape, dtype, group_size, group_key, instance_key)


def as_rank1(tensor):
    """Collectives that concatenate need rank >= 1."""
    if tensor.shape.ndims == 0:
        return tf.reshape(tensor, [1])
    return tensor
