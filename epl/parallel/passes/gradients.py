"""Aggregate gradients: sum over micro-batches, then all-reduce over replicas."""
from epl.ir.phase import Phase
from epl.parallel.passes import Pass
from epl.tf_adapter import tf


class GradientAggregation(Pass):
    """Rewire every update op to the aggregated gradient of its copy.

    The gradients are the ones the user handed to ``apply_gradients`` (after
    any clipping). Dense gradients are all-reduced over every device holding
    the variable's TaskGraph; IndexedSlices (embedding gradients) are
    all-gathered, values and indices, so the optimizer's sparse update stays
    sparse. ``gradients_reduce_method=mean`` divides by the number of copies
    (and micro-batches); ``sum`` does not.
    """

    name = "gradient_aggregation"

    def applies(self, ctx):
        return any(ctx.view.apply_calls)

    def run(self, ctx):
        mean = ctx.config.communication.gradients_reduce_method == "mean"
        for call in ctx.view.apply_calls:
            for grad, var in call:
                taskgraph = ctx.view.info(var.op).taskgraph
                comm = ctx.communicator("grads", taskgraph)
                for copy in range(len(ctx.copies)):
                    device = ctx.device(taskgraph, copy)
                    if isinstance(grad, tf.IndexedSlices):
                        self._sparse(ctx, comm, grad, var, copy, device, mean)
                    else:
                        self._dense(ctx, comm, grad, var, copy, device, mean)

    @staticmethod
    def _apply_consumers(ctx, tensor):
        return [op for op in tensor.consumers()
                if ctx.view.info(op) is not None and ctx.view.info(op).phase == Phase.APPLY]

    def _dense(self, ctx, comm, grad, var, copy, device, mean):
        local = ctx.tensor_instance(grad, copy)
        consumers = self._apply_consumers(ctx, local)
        total = local
        if ctx.num_micro_batch > 1:
            parts = [ctx.tensor_instance(grad, copy, m) for m in range(ctx.num_micro_batch)]
            with tf.device(device):
                total = tf.add_n(parts)
                if mean:
                    total = total / ctx.num_micro_batch
        if comm.group_size > 1:
            total = comm.all_reduce(total, device, "grad/" + var.op.name, mean=mean)
        if total is not local:
            ctx.rewire(local, total, consumers)

    def _sparse(self, ctx, comm, grad, var, copy, device, mean):
        values = [ctx.tensor_instance(grad.values, copy, m) for m in range(ctx.num_micro_batch)]
        indices = [ctx.tensor_instance(grad.indices, copy, m)
                   for m in range(ctx.num_micro_batch)]
        consumers_v = self._apply_consumers(ctx, values[0])
        consumers_i = self._apply_consumers(ctx, indices[0])
        with tf.device(device):
            new_values = tf.concat(values, 0) if len(values) > 1 else values[0]
            new_indices = tf.concat(indices, 0) if len(indices) > 1 else indices[0]
            scale = ctx.num_micro_batch if mean else 1
        if comm.group_size > 1:
            new_values = comm.all_gather(new_values, device, "grad_values/" + var.op.name)
            new_indices = comm.all_gather(new_indices, device, "grad_indices/" + var.op.name)
            scale *= comm.group_size if mean else 1
        if scale > 1:
            with tf.device(device):
                new_values = new_values / tf.cast(scale, new_values.dtype)
        ctx.rewire(values[0], new_values, consumers_v)
        ctx.rewire(indices[0], new_indices, consumers_i)
