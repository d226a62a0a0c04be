"""Aggregate gradients: sum over micro-batches or accumulation steps, all-reduce.

Pipeline: the gradients of the ``num_micro_batch`` micro-batches of one
step are summed. Gradient accumulation (one TaskGraph, ``num_micro_batch =
m > 1``): each run adds its gradients to an accumulator; every m-th run the
accumulated sum is released through a Switch, all-reduced and applied, and
on the other runs the update (and the collective) is dead and does not run.
``gradients_reduce_method=mean`` divides by the number of micro-batches and
of replicas; ``sum`` does not.
"""
from epl import tf_adapter
from epl.ir.phase import Phase
from epl.parallel.passes import Pass
from epl.tf_adapter import tf


class GradientAggregation(Pass):
    """Rewire every update op to the aggregated gradient of its copy.

    The gradients are the ones the user handed to ``apply_gradients`` (after
    any clipping). Dense gradients are all-reduced over every device holding
    the variable's TaskGraph; IndexedSlices (embedding gradients) are
    all-gathered, values and indices, so the optimizer's sparse update stays
    sparse.
    """

    name = "gradient_aggregation"

    def applies(self, ctx):
        return any(ctx.view.apply_calls)

    def run(self, ctx):
        mean = ctx.config.communication.gradients_reduce_method == "mean"
        gate = _accumulation_gate(ctx) if ctx.plan.gradient_accumulation else None
        for call in ctx.view.apply_calls:
            for grad, var in call:
                taskgraph = ctx.view.info(var.op).taskgraph
                comm = ctx.communicator("grads", taskgraph)
                for copy in range(len(ctx.copies)):
                    device = ctx.device(taskgraph, copy)
                    if isinstance(grad, tf.IndexedSlices):
                        if gate is not None:
                            raise NotImplementedError(
                                "gradient accumulation with sparse (IndexedSlices) gradient "
                                "of %s is not supported yet" % var.op.name)
                        _sparse(ctx, comm, grad, var, copy, device, mean)
                    else:
                        _dense(ctx, comm, grad, var, copy, device, mean, gate)


def _apply_consumers(ctx, tensor):
    return [op for op in tensor.consumers()
            if ctx.view.info(op) is not None and ctx.view.info(op).phase == Phase.APPLY]


def _accumulation_gate(ctx):
    """A host counter bumped every run; True on every m-th run."""
    steps = ctx.plan.num_micro_batch
    with tf.device(ctx.host), tf.name_scope("EPL_GA"):
        counter = tf.Variable(0, dtype=tf.int64, trainable=False, collections=[],
                              name="counter")
        ctx.epl_variables.append(counter)
        count = tf.assign_add(counter, 1)
        return tf.equal(tf.floormod(count, steps), 0)


def _accumulate(ctx, var, local, device, pred, mean):
    """(gradient released on apply runs, op that stores the running sum)."""
    steps = ctx.plan.num_micro_batch
    with tf.device(device), tf.name_scope("EPL_GA"):
        acc = tf.Variable(tf.zeros(var.shape, local.dtype), trainable=False, collections=[],
                          name="accumulator")
        ctx.epl_variables.append(acc)
        total = acc + local
        store = tf.assign(acc, total * (1 - tf.cast(pred, total.dtype)))
        released = tf_adapter.switch(total, pred)[1]
        if mean:
            released = released / steps
    return released, store.op


def _dense(ctx, comm, grad, var, copy, device, mean, gate):
    local = ctx.tensor_instance(grad, copy)
    consumers = _apply_consumers(ctx, local)
    total, store = local, None
    if ctx.num_micro_batch > 1:
        parts = [ctx.tensor_instance(grad, copy, m) for m in range(ctx.num_micro_batch)]
        with tf.device(device):
            total = tf.add_n(parts)
            if mean:
                total = total / ctx.num_micro_batch
    if gate is not None:
        total, store = _accumulate(ctx, var, total, device, gate, mean)
    if comm.group_size > 1:
        total = comm.all_reduce(total, device, "grad/" + var.op.name, mean=mean)
    if total is not local:
        ctx.rewire(local, total, consumers)
    if store is not None:
        for op in consumers:
            tf_adapter.add_control_inputs(op, [store])


def _sparse(ctx, comm, grad, var, copy, device, mean):
    values = [ctx.tensor_instance(grad.values, copy, m) for m in range(ctx.num_micro_batch)]
    indices = [ctx.tensor_instance(grad.indices, copy, m) for m in range(ctx.num_micro_batch)]
    consumers_v = _apply_consumers(ctx, values[0])
    consumers_i = _apply_consumers(ctx, indices[0])
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
