"""Sparse (IndexedSlices) gradient reduction over one communicator.

Rows of an embedding gradient are gathered, not summed: every member's values
and indices are concatenated in group order, so the optimizer's sparse update
(which sums duplicate rows) sees exactly the rows of the global batch. With
gradient accumulation every member holds a dense sum and a per-row touch count
instead (members touched different rows, so their row lists cannot be gathered
as equal shapes); both are all-reduced and the touched rows are released.

Example (one member, on ``device``)::

    reducer = SparseReducer(comm, mean=True)
    values, indices = reducer.gather(values, indices, device, "embedding")
"""
from epl.tf_adapter import tf


class SparseReducer(object):
    """Reduces IndexedSlices-shaped gradients (values, indices) over ``communicator``."""

    def __init__(self, communicator, mean):
        self.communicator = communicator
        self.mean = mean

    def gather(self, values, indices, device, name):
        """Every member's rows, concatenated in group order; mean divides the values."""
        comm = self.communicator
        values = comm.all_gather(values, device, "grad_values/" + name)
        indices = comm.all_gather(indices, device, "grad_indices/" + name)
        if self.mean:
            with tf.device(device):
                values = values / tf.cast(comm.group_size, values.dtype)
        return values, indices

    def reduce_accumulated(self, dense, touched, device, name):
        """(dense sum or mean over members, per-row touch counts summed over members)."""
        comm = self.communicator
        dense = comm.all_reduce(dense, device, "grad_dense/" + name, mean=self.mean)
        touched = comm.all_reduce(touched, device, "grad_rows/" + name, mean=False)
        return dense, touched
