"""Aggregate gradients: sum over micro-batches or accumulation steps, all-reduce.

Pipeline: the gradients of the ``num_micro_batch`` micro-batches of one
step are summed. Gradient accumulation (one TaskGraph, ``num_micro_batch =
m > 1``): each run adds its gradients to an accumulator; every m-th run the
accumulated sum is released through a Switch, all-reduced and applied, and
on the other runs the update (and the collective) is dead and does not run.
Dense gradients of a TaskGraph are all-reduced in fused buckets
(``communication.max_splits``) spread over ``num_communicators`` groups,
optionally as fp16; IndexedSlices are all-gathered (values and indices).
``gradients_reduce_method=mean`` divides by micro-batches and replicas.
With ``clip_after_allreduce`` the gradients straight out of ``tf.gradients``
are reduced and the user's clipping reads the reduced values.
"""
import collections

from epl import tf_adapter
from epl.communicators.reducer import GradientReducer
from epl.ir.phase import Phase
from epl.parallel.passes import Pass
from epl.tf_adapter import tf

Item = collections.namedtuple("Item", ["var", "grad"])


class GradientAggregation(Pass):
    """Rewire every consumer of a gradient to its aggregated value, per copy."""

    name = "gradient_aggregation"

    def applies(self, ctx):
        return any(ctx.view.apply_calls)

    def run(self, ctx):
        comm_config = ctx.config.communication
        mean = comm_config.gradients_reduce_method == "mean"
        gate = _accumulation_gate(ctx) if ctx.plan.gradient_accumulation else None
        dense = collections.OrderedDict()
        for item in _items(ctx):
            taskgraph = ctx.view.info(item.var.op).taskgraph
            if isinstance(item.grad, tf.IndexedSlices):
                if gate is not None:
                    raise NotImplementedError(
                        "gradient accumulation with sparse (IndexedSlices) gradient of %s is "
                        "not supported; set communication.sparse_as_dense=True"
                        % item.var.op.name)
                for copy in range(len(ctx.copies)):
                    _sparse(ctx, item, taskgraph, copy, mean)
            else:
                dense.setdefault(taskgraph, []).append(item)
        for taskgraph, items in dense.items():
            _reduce_taskgraph(ctx, taskgraph, _production_order(ctx, items), mean, gate)


def _items(ctx):
    """(variable, gradient to aggregate) pairs, in apply order."""
    after_clip = ctx.config.communication.clip_after_allreduce
    for call in ctx.view.apply_calls:
        for grad, var in call:
            raw = ctx.view.raw_grads.get(var.op.name) if after_clip else None
            yield Item(var, raw if raw is not None else grad)


def _production_order(ctx, items):
    """Sort by when backprop created the gradient, so early buckets are ready first."""
    def key(item):
        raw = ctx.view.raw_grads.get(item.var.op.name, item.grad)
        op = raw.values.op if isinstance(raw, tf.IndexedSlices) else raw.op
        return (tf_adapter.op_id(op), item.var.op.name)
    return sorted(items, key=key)


def _consumers(ctx, tensor, copy):
    """Ops of ``copy`` (micro-batch 0) that read a gradient: user clipping and updates."""
    result = []
    for op in tensor.consumers():
        info = ctx.view.info(op)
        if info is not None and info.phase in (Phase.BACKWARD, Phase.APPLY) \
                and info.replica == copy and info.micro_batch == 0:
            result.append(op)
    return result


def _reduce_taskgraph(ctx, taskgraph, items, mean, gate):
    comm_config = ctx.config.communication
    comm = ctx.communicator("grads", taskgraph)
    communicators = [comm]
    if comm_config.num_communicators > 1 and comm.group_size > 1:
        communicators = [ctx.group("grads/%s/communicator_%d"
                                   % (ctx.plan.taskgraphs[taskgraph].name, i), comm.devices)
                         for i in range(comm_config.num_communicators)]
    reducer = GradientReducer(communicators, comm_config.max_splits, comm_config.fp16,
                              comm_config.fp16_scale, mean)
    buckets = reducer.plan([item.grad for item in items])
    for copy in range(len(ctx.copies)):
        device = ctx.device(taskgraph, copy)
        locals_, consumers, stores = [], [], []
        for item in items:
            local = ctx.tensor_instance(item.grad, copy)
            consumers.append(_consumers(ctx, local, copy))
            total, store = _local_total(ctx, item, copy, device, mean, gate)
            locals_.append((local, total))
            stores.append(store)
        totals = [total for _, total in locals_]
        if comm.group_size > 1:
            totals = reducer.reduce(totals, device, buckets)
        for (local, _), total, users, store in zip(locals_, totals, consumers, stores):
            if total is not local:
                ctx.rewire(local, total, users)
            if store is not None:
                for op in users:
                    tf_adapter.add_control_inputs(op, [store])


def _local_total(ctx, item, copy, device, mean, gate):
    """This copy's gradient summed over micro-batches / accumulation steps."""
    total, store = ctx.tensor_instance(item.grad, copy), None
    if ctx.num_micro_batch > 1:
        # A running sum in micro-batch order (not add_n, which waits for all of
        # them): each micro-batch's gradient is freed as soon as it is added, so
        # peak memory does not grow with num_micro_batch.
        with tf.device(device), tf.name_scope("EPL_MICRO_BATCH_SUM"):
            for m in range(1, ctx.num_micro_batch):
                total = total + ctx.tensor_instance(item.grad, copy, m)
            if mean:
                total = total / ctx.num_micro_batch
    if gate is not None:
        total, store = _accumulate(ctx, item.var, total, device, gate, mean)
    return total, store


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


def _sparse(ctx, item, taskgraph, copy, mean):
    comm = ctx.communicator("grads", taskgraph)
    device = ctx.device(taskgraph, copy)
    grad = item.grad
    values = [ctx.tensor_instance(grad.values, copy, m) for m in range(ctx.num_micro_batch)]
    indices = [ctx.tensor_instance(grad.indices, copy, m) for m in range(ctx.num_micro_batch)]
    consumers_v = _consumers(ctx, values[0], copy)
    consumers_i = _consumers(ctx, indices[0], copy)
    with tf.device(device):
        new_values = tf.concat(values, 0) if len(values) > 1 else values[0]
        new_indices = tf.concat(indices, 0) if len(indices) > 1 else indices[0]
    scale = ctx.num_micro_batch if mean else 1
    name = item.var.op.name
    if comm.group_size > 1:
        new_values = comm.all_gather(new_values, device, "grad_values/" + name)
        new_indices = comm.all_gather(new_indices, device, "grad_indices/" + name)
        scale *= comm.group_size if mean else 1
    if scale > 1:
        with tf.device(device):
            new_values = new_values / tf.cast(scale, new_values.dtype)
    ctx.rewire(values[0], new_values, consumers_v)
    ctx.rewire(indices[0], new_indices, consumers_i)
