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
from epl.ir.traverse import control_flow_interior
from epl.parallel.passes import Pass
from epl.runtime import gradient_accumulation as ga
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
        gate = None
        if ctx.plan.gradient_accumulation:
            gate = ga.accumulation_gate(ctx.host, ctx.plan.num_micro_batch, ctx.epl_variables)
        dense = collections.OrderedDict()
        for item in _items(ctx):
            taskgraph = ctx.view.info(item.var.op).taskgraph
            if isinstance(item.grad, tf.IndexedSlices):
                for copy in range(len(ctx.copies)):
                    _sparse(ctx, item, taskgraph, copy, mean, gate)
            else:
                dense.setdefault(taskgraph, []).append(item)
        for taskgraph, items in dense.items():
            _reduce_taskgraph(ctx, taskgraph, _production_order(ctx, items), mean, gate)
        if gate is not None:
            skip, _ = control_flow_interior(ctx.tf_graph)
            ga.gate_apply_ops(ctx.view, ga.release_token(ctx.host, gate), skip)


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
        total, store = ga.accumulate_dense(item.var, total, device, gate, ctx.epl_variables)
        if mean:
            with tf.device(device), tf.name_scope("EPL_GA"):
                total = total / ctx.plan.num_micro_batch
    return total, store


def _rows_unknown(tensor):
    """``tensor`` with dim 0 statically unknown (identity at run time).

    Aggregated sparse gradients have more rows than one copy's gradient
    (gathered from replicas, concatenated over micro-batches, or the touched
    rows of an accumulator); the optimizer's ops that read them were built
    for the local row count, and TF refuses to rewire an input to a tensor
    whose static shape conflicts with the old one.
    """
    shape = tensor.shape
    if shape.ndims is None or shape.ndims == 0 or shape.dims[0].value is None:
        return tensor
    return tf.placeholder_with_default(tensor, [None] + shape.as_list()[1:])


def _sparse(ctx, item, taskgraph, copy, mean, gate):
    """Aggregate one IndexedSlices gradient of ``copy``: concatenate micro-batches,
    accumulate (GA) or all-gather rows over the group, and rewire its consumers."""
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
    if gate is not None:
        new_values, new_indices, store = _sparse_accumulated(
            ctx, item, comm, device, new_values, new_indices, mean, gate)
        for op in consumers_v + consumers_i:
            tf_adapter.add_control_inputs(op, [store])
    else:
        new_values, new_indices = _sparse_gathered(
            ctx, item, comm, device, new_values, new_indices, mean)
    with tf.device(device), tf.name_scope("EPL_SPARSE"):
        ctx.rewire(values[0], _rows_unknown(new_values), consumers_v)
        ctx.rewire(indices[0], _rows_unknown(new_indices), consumers_i)


def _sparse_gathered(ctx, item, comm, device, values, indices, mean):
    """All-gather rows from every member; mean divides by micro-batches x members."""
    scale = ctx.num_micro_batch if mean else 1
    name = item.var.op.name
    if comm.group_size > 1:
        values = comm.all_gather(values, device, "grad_values/" + name)
        indices = comm.all_gather(indices, device, "grad_indices/" + name)
        scale *= comm.group_size if mean else 1
    if scale > 1:
        with tf.device(device):
            values = values / tf.cast(scale, values.dtype)
    return values, indices


def _sparse_accumulated(ctx, item, comm, device, values, indices, mean, gate):
    """Accumulate into a dense buffer; on apply runs all-reduce it (replicas touch
    different rows, so their row lists cannot be gathered as equal shapes) and
    release the touched rows. Returns (values, indices, store op)."""
    released = ga.accumulate_sparse(item.var, values, indices, device, gate,
                                    ctx.epl_variables)
    dense, touched = released.dense, released.touched
    name = item.var.op.name
    if comm.group_size > 1:
        dense = comm.all_reduce(dense, device, "grad_dense/" + name, mean=mean)
        touched = comm.all_reduce(touched, device, "grad_rows/" + name, mean=False)
    with tf.device(device), tf.name_scope("EPL_GA"):
        new_values, new_indices = ga.sparse_rows(dense, touched, indices.dtype)
        if mean:
            new_values = new_values / ctx.plan.num_micro_batch
    return new_values, new_indices, released.store
