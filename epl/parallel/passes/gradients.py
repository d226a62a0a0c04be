"""Aggregate gradients: lower the gradient plan of every local copy into ops.

The plan (:mod:`epl.parallel.gradient_plan`) decides, per variable, the group,
bucket, collective, accumulation and divisor; this pass only builds what it
says, in small steps:

1. ``local_sum``: sum the micro-batches of a pipeline (a running sum, so each
   micro-batch's gradient is freed once added), or concatenate their rows;
2. ``accumulate``: gradient accumulation (:mod:`epl.runtime.gradient_accumulation`);
3. ``divide``: by micro-batches x accumulation steps for "mean";
4. ``reduce``: fused buckets (:class:`GradientReducer`) or sparse rows
   (:class:`SparseReducer`: gathered, whatever each member's row count, or
   all-reduced as a dense buffer) over the plan's group;
5. ``rewire``: the copy's consumers of the gradient (clipping, the optimizer)
   read the aggregated value.

With ``communication.clip_after_allreduce`` the gradients straight out of
``tf.gradients`` are reduced and the user's clipping reads the reduced values.
Reads: apply and gradient records, ``copies``, the repetition, plan groups.
Writes: collectives, EPL accumulators, rewired gradient consumers,
``program.gradient_plans``.
"""
import collections

from epl import tf_adapter
from epl.buckets import owner_chunks
from epl.communicators.reducer import GradientReducer
from epl.communicators.sparse import SparseReducer, scatter_rows, touched_rows
from epl.ir.phase import Phase
from epl.ir.traverse import control_flow_interior
from epl.ops.shards import shard_shape
from epl.parallel import gradient_plan as gp
from epl.parallel.context import GRADIENTS
from epl.parallel.mesh import sharing_copies
from epl.parallel.passes import LOWER, Pass
from epl.parallel.repeat.step_ops import training_items as _training_items
from epl.runtime import gradient_accumulation as ga
from epl.tf_adapter import tf

Local = collections.namedtuple("Local", ["value", "indices", "store"])  # indices: sparse only


class GradientAggregation(Pass):
    """Rewire every consumer of a gradient to its aggregated value, per copy."""

    name = "gradient_aggregation"
    phase = LOWER
    reads = ("view", "config", "cluster", "plan", "copies", "repetition", "zero")
    writes = ("graph", "communicators", "epl_variables", "accumulator_stores", "per_run_writes",
              "program.gradient_plans")

    def applies(self, ctx):
        return ctx.view.has_training_step

    def run(self, ctx):
        items = training_items(ctx)
        gate = None
        if ctx.plan.gradient_accumulation:
            gate = ga.accumulation_gate(ctx.host, ctx.plan.num_micro_batch, ctx.epl_variables,
                                        ctx.per_run_writes)
        plans = [copy_plan(ctx, items, copy) for copy in range(len(ctx.copies))]
        leaders = _leaders(ctx, items)
        ctx.program.gradient_plans.extend(_listed(plans, leaders))
        locals_ = [_local_results(ctx, items, plan, copy, gate)
                   for copy, plan in enumerate(plans)]
        for copy, plan in enumerate(plans):
            _lower(ctx, items, plan, copy, locals_, leaders)
        if gate is not None:
            skip, _ = control_flow_interior(ctx.tf_graph)
            ga.gate_apply_ops(ctx.view, ga.release_token(ctx.host, gate), skip)


def training_items(ctx):
    """{variable op name: Item} of every trained variable, in apply order."""
    return _training_items(ctx.view, ctx.config.communication.clip_after_allreduce)


def _info(ctx, item):
    """Static facts the plan needs: sparse or not, bytes, dtype, production order."""
    raw = ctx.view.raw_gradient(item.var.op.name)
    raw = raw if raw is not None else item.grad
    producer = raw.values.op if isinstance(raw, tf.IndexedSlices) else raw.op
    sparse = isinstance(item.grad, tf.IndexedSlices)
    nbytes, shape, rows, index_bytes = 0, None, None, 8
    if sparse:
        shape = tf_adapter.variable_shape(item.var.op)
        shape = tuple(shape.as_list()) if shape.ndims is not None else None
        rows, index_bytes = item.grad.values.shape[:1].num_elements(), \
            item.grad.indices.dtype.size
    if not sparse and item.var.op.name in ctx.sharded_variables:
        nbytes = None  # a shard's width is known per copy only: reduced unfused
    elif not sparse:
        shape = _dense_shape(item)
        nbytes = shape.num_elements() * item.grad.dtype.size
    return gp.GradientInfo(item.var.op.name, ctx.taskgraph_of(item.var.op), sparse, nbytes,
                           item.grad.dtype.base_dtype.name, tf_adapter.op_id(producer), shape,
                           rows, index_bytes)


def _dense_shape(item):
    """A dense gradient has its variable's shape, even where TF lost it (while loops, cond)."""
    shape = item.grad.shape.merge_with(item.var.shape)
    if not shape.is_fully_defined():
        raise ValueError("gradient fusion needs static shapes; the gradient of %s has shape "
                         "%s and its variable %s" % (item.var.op.name, item.grad.shape,
                                                     item.var.shape))
    return shape


def copy_plan(ctx, items, copy):
    """The gradient plan of local copy ``copy``."""
    infos = [_info(ctx, item) for item in items.values()]
    steps = ctx.plan.num_micro_batch if ctx.plan.gradient_accumulation else 1

    def group_of(info):
        var_op = ctx.tf_graph.get_operation_by_name(info.name)
        group = ctx.dp_group(var_op, copy)
        shard = ctx.sharded_variables.get(info.name)
        return group if shard is None else (group, shard.width)

    owner_of, bucket_of = None, None
    if ctx.zero is not None and ctx.zero.level in ("v1", "v2"):  # owners, as group ranks
        owner_of = {}
        for name, device in ctx.zero.owner.items():
            group = ctx.dp_group(ctx.tf_graph.get_operation_by_name(name), copy)
            owner_of[name] = group.devices.index(device)
        bucket_of = ctx.zero.bucket or None
    return gp.plan_gradients(infos, group_of, ctx.config.communication, ctx.num_micro_batch,
                             steps, owner_of, bucket_of)


def _local_results(ctx, items, plan, copy, gate):
    """{variable name: (Local, device)}: steps 1 to 3 for every entry of ``copy``."""
    results, nodes = {}, {}   # nodes: {device: NodeOps}, sharing each device's constants
    for entry in plan.entries:
        item = items[entry.name]
        device = ctx.device(ctx.taskgraph_of(item.var.op), copy)
        local = _divide(_accumulate(_local_sum(ctx, item, copy, device), item, entry, device,
                                    gate, ctx, copy), entry, device,
                        nodes.setdefault(device, tf_adapter.NodeOps(device)))
        results[entry.name] = (local, device)
    return results


def _leaders(ctx, items):
    """{(copy, variable name): [the copies it combines with, itself first]} for the
    variables of a TaskGraph narrower than its replica: the copies running it on one
    device (:func:`epl.parallel.mesh.sharing_copies`)."""
    leaders, taskgraphs = {}, {}
    for name, item in items.items():
        taskgraphs.setdefault(ctx.taskgraph_of(item.var.op), []).append(name)
    for taskgraph, names in taskgraphs.items():
        for members in sharing_copies(ctx.copies, taskgraph):
            for copy in members:
                for name in names:
                    leaders[(copy, name)] = members
    return leaders


def _listed(plans, leaders):
    """The plans as they run: an entry of a copy that takes another copy's result
    (``leaders``) says so instead of listing a collective it does not build."""
    listed = []
    for copy, plan in enumerate(plans):
        entries = []
        for entry in plan.entries:
            members = leaders.get((copy, entry.name))
            if members is not None and members[0] != copy:
                entry = gp.shared_device_entry(entry, members[0])
            entries.append(entry)
        listed.append(plan._replace(entries=tuple(entries)))
    return listed


def _lower(ctx, items, plan, copy, locals_, leaders):
    """Steps 4 and 5 for ``copy``. A copy that shares its device with others for a
    variable (``leaders``) takes the first one's result; the first one reduces the
    combination of theirs (one collective member per device)."""
    results = locals_[copy]
    entries = []
    for entry in plan.entries:
        members = leaders.get((copy, entry.name))
        if members is None:
            entries.append(entry)
        elif members[0] == copy:
            results[entry.name] = _combined(entry, [locals_[c][entry.name] for c in members])
            entries.append(entry)
        else:  # reduced by the first copy on this device (built before this one)
            results[entry.name] = (results[entry.name][0]._replace(
                value=locals_[members[0]][entry.name][0].value,
                indices=locals_[members[0]][entry.name][0].indices), results[entry.name][1])
    _reduce(ctx, items, plan._replace(entries=tuple(entries)), results)
    for entry in plan.entries:
        _rewire(ctx, items[entry.name], copy, results[entry.name][0])


def _combined(entry, parts):
    """(Local, device) of copies on one device combined like a collective would: their
    sum, or for "mean" their mean (the collective then averages over the devices)."""
    (first, device), scale = parts[0], (1.0 / len(parts) if entry.mean else 1.0)
    if any(isinstance(local.value, tuple) or local.store is not None for local, _ in parts):
        raise RuntimeError("EPL internal error: accumulated gradient of %s on copies "
                           "sharing %s" % (entry.name, device))
    with tf.device(device), tf.name_scope("EPL_SHARED_DEVICE"):
        if first.indices is not None:
            values = tf.concat([local.value for local, _ in parts], 0) * scale
            return first._replace(value=values, indices=tf.concat(
                [local.indices for local, _ in parts], 0)), device
        total = tf_adapter.running_sum([local.value for local, _ in parts],
                                       [[] for _ in parts])
        return first._replace(value=total * scale if scale != 1.0 else total), device


def _reduce(ctx, items, plan, results):
    """Step 4 for the entries of ``plan``: ``results`` get the reduced values."""
    for entries in _by_group(plan).values():
        _reduce_dense(ctx, [e for e in entries if e.reduction == gp.ALL_REDUCE], results)
        _reduce_scatter(ctx, [e for e in entries if e.reduction == gp.REDUCE_SCATTER], results)
    for entry in plan.entries:
        if entry.reduction in (gp.ALL_GATHER, gp.ROWS_ALL_REDUCE):
            results[entry.name] = (_reduce_sparse(ctx, entry, items[entry.name],
                                                  *results[entry.name]),
                                   results[entry.name][1])
        elif entry.reduction == gp.LOCAL and results[entry.name][0].indices is not None \
                and entry.accumulate:
            results[entry.name] = (_released_rows(*results[entry.name]), results[entry.name][1])


def _by_group(plan):
    groups = collections.OrderedDict()
    for entry in plan.entries:
        groups.setdefault(entry.group, []).append(entry)
    return groups


# ---- step 1: micro-batches ---------------------------------------------------------
def _local_sum(ctx, item, copy, device):
    """This copy's gradient over the micro-batches of a pipeline step (the repetition
    sums or concatenates them; a dense sum gets its variable's static shape)."""
    shape = None
    if not isinstance(item.grad, tf.IndexedSlices):
        shape = _copy_shape(ctx, item.var.op, copy) or item.var.shape.as_list()
    value, indices = ctx.repetition.gradient_sum(item.grad, copy, device, shape)
    return Local(value, indices, None)


# ---- step 2: gradient accumulation -------------------------------------------------
def _accumulate(local, item, entry, device, gate, ctx, copy):
    """Released (alive) only on apply runs; ``store`` keeps the running sum."""
    if not entry.accumulate:
        return local
    if local.indices is None:
        released = ga.accumulate_dense(item.var, local.value, device, gate,
                                       _copy_shape(ctx, item.var.op, copy))
        return Local(released.value, None, released.store)
    released = ga.accumulate_sparse(item.var, local.value, local.indices, device, gate,
                                    ctx.epl_variables)
    # A dense sum plus touch counts; the indices dtype rides along in ``indices``.
    return Local((released.dense, released.touched), local.indices, released.store)


def _copy_shape(ctx, var_op, copy):
    """The static shape of ``copy``'s instance of ``var_op`` (a shard's own width)."""
    info = ctx.sharded_variables.get(var_op.name)
    position = ctx.weight_position(var_op, copy)
    if info is None or position is None:
        return None
    return shard_shape(info.full_shape, info.axis, info.width, position)


# ---- step 3: divide ----------------------------------------------------------------
def _divide(local, entry, device, nodes):
    """The sum divided by its divisor, made from NodeDefs (``nodes`` on ``device``): one
    op per variable, where TF's ``/`` took 0.6 ms each (a constant and the wrapper's
    argument checks: 0.1 s of BERT-base's rewrite under gradient accumulation)."""
    if entry.divisor == 1:
        return local
    with tf.device(device), tf.name_scope("EPL_GRADIENT_MEAN"):
        if isinstance(local.value, tuple):  # accumulated sparse: (dense sum, touch counts)
            dense, touched = local.value
            return local._replace(value=(nodes.divide(dense, entry.divisor), touched))
        if not local.value.dtype.is_floating:
            return local._replace(value=local.value / entry.divisor)
        return local._replace(value=nodes.divide(local.value, entry.divisor))


# ---- step 4: reduce ----------------------------------------------------------------
def _reducer(ctx, group, mean):
    comm_config = ctx.config.communication
    lanes = group.lanes(comm_config.num_communicators) if group.size > 1 else (group,)
    communicators = [ctx.communicator(lane, GRADIENTS) for lane in lanes]
    return GradientReducer(communicators, comm_config.max_splits, comm_config.fp16,
                           comm_config.fp16_scale, mean)


def _reduce_dense(ctx, entries, results):
    """All-reduce one group's dense gradients in the plan's buckets (unfused ones alone)."""
    for entry in [e for e in entries if e.bucket is None]:
        local, device = results[entry.name]
        comm = ctx.communicator(entry.group, GRADIENTS)
        value = comm.all_reduce(local.value, device, "grad/" + entry.name, mean=entry.mean)
        results[entry.name] = (local._replace(value=value), device)
    entries = [e for e in entries if e.bucket is not None]
    if not entries:
        return
    tensors = [results[e.name][0].value for e in entries]
    device = results[entries[0].name][1]
    buckets = collections.OrderedDict()
    for index, entry in enumerate(entries):
        buckets.setdefault(entry.bucket, []).append(index)
    reducer = _reducer(ctx, entries[0].group, entries[0].mean)
    reduced = reducer.reduce(tensors, device, list(buckets.values()))
    for entry, value in zip(entries, reduced):
        local, _ = results[entry.name]
        results[entry.name] = (local._replace(value=value), device)


def _reduce_scatter(ctx, entries, results):
    """ZeRO v1/v2: one reduce-scatter per bucket of the plan, each buffer laid out by
    owner (:func:`epl.buckets.owner_chunks`); each member keeps its chunk, the reduced
    gradients of the variables it updates. Buckets rotate over the group's
    ``communication.num_communicators`` lanes, as all-reduce buckets do."""
    if not entries:
        return
    group, device = entries[0].group, results[entries[0].name][1]
    comms = _reducer(ctx, group, entries[0].mean).communicators
    buckets = collections.OrderedDict()
    for entry in entries:
        buckets.setdefault(entry.bucket, []).append(entry)
    for number, members in buckets.items():
        _scatter_bucket(comms[number % len(comms)], group, device, members, results,
                        "grads/zero/bucket_%d" % number)


def _scatter_bucket(comm, group, device, entries, results, name):
    """Reduce-scatter one bucket; rewrite ``results`` of this member's own entries."""
    values = [results[e.name][0].value for e in entries]
    sizes = [v.shape.num_elements() for v in values]
    chunk, by_owner = owner_chunks(sizes, [e.owner for e in entries], group.size)
    with tf.device(device), tf.name_scope("EPL_ZERO"):
        parts = []
        for owned in by_owner:
            parts += [tf.reshape(values[i], [-1]) for i in owned]
            pad = chunk - sum(sizes[i] for i in owned)
            if pad:
                parts.append(tf.zeros([pad], values[0].dtype))
        buffer = tf.concat(parts, 0)
    mine = comm.reduce_scatter(buffer, device, name, mean=entries[0].mean)
    own = by_owner[group.devices.index(device)]
    if not own:
        return
    with tf.device(device), tf.name_scope("EPL_ZERO"):
        pieces = tf.split(mine[:sum(sizes[i] for i in own)], [sizes[i] for i in own])
        for i, piece in zip(own, pieces):
            local = results[entries[i].name][0]
            results[entries[i].name] = (local._replace(value=tf.reshape(piece, values[i].shape)),
                                        device)


def _reduce_sparse(ctx, entry, item, local, device):
    """Gather the rows (accumulated ones: the touched rows of the sum), or all-reduce
    them as a dense buffer with touch counts and release the touched rows."""
    comm_config = ctx.config.communication
    reducer = SparseReducer(ctx.communicator(entry.group, GRADIENTS), entry.mean,
                            comm_config.fp16, comm_config.fp16_scale)
    if entry.reduction == gp.ALL_GATHER:
        if entry.accumulate:
            local = _released_rows(local, device)
        values, indices = reducer.gather(local.value, local.indices, device, entry.name)
        return local._replace(value=values, indices=indices)
    if not entry.accumulate:
        with tf.device(device), tf.name_scope("EPL_SPARSE"):
            local = local._replace(value=scatter_rows(
                local.value, local.indices, tf_adapter.variable_shape(item.var.op)))
    dense, touched = reducer.reduce_rows(local.value[0], local.value[1], device, entry.name)
    return _released_rows(local._replace(value=(dense, touched)), device)


def _released_rows(local, device):
    """The touched rows of a sparse gradient held as (dense sum, touch counts)."""
    dense, touched = local.value
    with tf.device(device), tf.name_scope("EPL_SPARSE"):
        values, indices = touched_rows(dense, touched, local.indices.dtype)
    return local._replace(value=values, indices=indices)


# ---- step 5: rewire ----------------------------------------------------------------
def _consumers(ctx, tensor, copy):
    """Ops of ``copy`` (micro-batch 0) that read a gradient: user clipping and updates."""
    result = []
    for op in tensor.consumers():
        info = ctx.view.info(op)
        if info is not None and info.phase in (Phase.BACKWARD, Phase.APPLY) \
                and info.copy == copy and info.micro_batch == 0:
            result.append(op)
    return result


def _rewire(ctx, item, copy, local):
    """Point the copy's consumers of the gradient at the aggregated value."""
    device = ctx.device(ctx.taskgraph_of(item.var.op), copy)
    if isinstance(item.grad, tf.IndexedSlices):
        pairs = [(ctx.tensor_instance(item.grad.values, copy), local.value),
                 (ctx.tensor_instance(item.grad.indices, copy), local.indices)]
        with tf.device(device), tf.name_scope("EPL_SPARSE"):
            pairs = [(old, new if new is old else tf_adapter.with_unknown_rows(new))
                     for old, new in pairs]
    else:
        pairs = [(ctx.tensor_instance(item.grad, copy), local.value)]
    for old, new in pairs:
        users = _consumers(ctx, old, copy)
        if new is not old:
            ctx.rewire(old, new, users)
        if local.store is not None:
            for op in users:
                tf_adapter.add_control_inputs(op, [local.store])
            # a pass that keeps a copy from updating the variable (ZeRO) still runs it
            ctx.accumulator_stores[copy].append(local.store)
