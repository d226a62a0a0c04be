"""ZeRO at rewrite time: owners from the plan, per copy; the exchange of updated values.

:class:`ZeroPartition` decides, per copy, which variables it updates: the owner
table is a pure function of the plan's data-parallel groups
(:func:`epl.runtime.zero.owner_devices`), so every worker and every copy agree.
A copy keeps the optimizer's part of the variables it owns and drops the rest
(their ops stay in the graph but nothing runs them); its slots of owned
variables get an initializer (run with EPL's set-up op), the others are never
initialized, so they take no memory.

:class:`ZeroSync`: every member gets the updated variables. Under v0 and v1 the new
values travel as one sum over the data-parallel group: each member contributes its
own variables' updated values and zeros elsewhere (fused in buckets like
gradients), so a step needs one kind of collective and no member can miss
another's broadcast. Under v2 they are all-gathered in ZeRO's buckets, each member
sending its own variables plus padding. A member's zeros wait for its own updates, so on a step
that applies nothing (gradient accumulation, an AMP overflow) no member takes
part, and every gradient collective joins the barrier the train op waits for,
because a member whose own variables do not need a bucket must still run it.
"""
import collections
import logging

from epl import tf_adapter
from epl.buckets import owner_chunks
from epl.communicators.reducer import GradientReducer
from epl.ir.phase import Phase
from epl.protocols.passes import GRADIENTS, LOWER, SYNC, Pass
from epl.runtime.zero import (build_record, bucket_owner_devices, check_static_sizes,
                              owner_devices)
from epl.runtime.zero_error import ZeroError
from epl.tf_adapter import tf

LOG = logging.getLogger("epl")

ZeroPlan = collections.namedtuple("ZeroPlan", ["level", "owner", "slots", "owned", "bucket"])
ZeroPlan.__doc__ = """ZeRO's decisions for this worker: ``owner`` {variable: device} (absent:
every holder updates it), ``slots`` {slot op name: variable name}, ``owned[copy]``, the
variables local copy ``copy`` updates, and ``bucket`` (v2; else empty) {variable: bucket
number within its group}, shared by the gradients' reduce-scatter and the all-gather."""


def _device_key(device):
    return tf.DeviceSpec.from_string(device or "").to_string()


class ZeroPartition(Pass):
    """Each copy updates only the variables it owns; slots initialized on owners only."""

    name = "zero_partition"
    phase = LOWER
    reads = ("view", "config", "plan", "copies", "repetition")
    writes = ("graph", "zero", "state_initializers")

    def applies(self, ctx):
        return build_record(ctx.view) is not None

    def run(self, ctx):
        record = build_record(ctx.view)
        refuse_what_cannot_combine(record.level, ctx.config.communication)
        graph = ctx.tf_graph
        var_ops = dict((n, graph.get_operation_by_name(n)) for n in record.variables)

        def group_of(name):
            if name in ctx.sharded_variables:
                return None  # a shard: every holder updates its own
            return ctx.dp_group(var_ops[name], 0).devices

        check_static_sizes(record, ctx.sharded_variables)
        sizes = [(n, record.nbytes[n] or 0) for n in record.variables]
        bucket = {}
        if record.level == "v2":
            owner, bucket = bucket_owner_devices(
                sizes, group_of, lambda n: tf_adapter.variable_dtype(var_ops[n]).name,
                ctx.config.communication.max_splits)
        else:
            owner = owner_devices(sizes, group_of)
        _check_every_member_owns(owner, record, group_of)
        owned = []
        for copy in range(len(ctx.copies)):
            mine = set(n for n in record.variables if n not in owner or _device_key(
                owner[n]) == _device_key(ctx.device(ctx.taskgraph_of(var_ops[n]), copy)))
            owned.append(frozenset(mine))
            for name in record.variables:
                if name not in mine:
                    _drop_part(ctx, record.parts.get(name, ()), copy)
            for slot_name, (var_name, var) in record.slots.items():
                if var_name in mine:
                    ctx.state_initializers.append(_initializer(ctx, var, copy, var_ops[var_name]))
        ctx.zero = ZeroPlan(record.level, owner,
                            dict((s, v) for s, (v, _) in record.slots.items()), tuple(owned),
                            bucket)


def refuse_what_cannot_combine(level, communication):
    """What ZeRO's reduce-scatter cannot combine with, named with both keys.

    ``clip_after_allreduce`` (v1 and v2): a member holds only its own variables'
    reduced gradients, so a global-norm clip would see a different norm on each
    member and the copies would leave serial training. ``fp16``: the reduce-scatter
    sends the gradients as they are (no float16 wire). v2, an EPL extension, refuses
    it; v1 (the seeds' level, which programs written for the original EPL may combine
    with ``communication.fp16``) warns once and reduces in the gradients' own type."""
    if level not in ("v1", "v2"):
        return
    keys = ("fp16", "clip_after_allreduce") if level == "v2" else ("clip_after_allreduce",)
    for key in keys:
        if getattr(communication, key):
            raise ZeroError("zero.level=%r with communication.%s=True is not supported: %s"
                            "; set communication.%s=False or use zero.level='v0'"
                            % (level, key, _WHY_NOT[key], key))
    if communication.fp16 and not _FP16_WARNED:
        _FP16_WARNED.append(True)
        LOG.warning("EPL: zero.level='v1' with communication.fp16=True: %s, so ZeRO's "
                    "gradients are reduced in their own type (float32), not float16",
                    _WHY_NOT["fp16"])


_FP16_WARNED = []  # the v1 + communication.fp16 warning is given once per process


_WHY_NOT = {
    "fp16": "the gradients' reduce-scatter has no float16 wire",
    "clip_after_allreduce": "each device holds only its own variables' reduced gradients, "
                            "so a clip by their global norm would differ between devices"}


def _check_every_member_owns(owner, record, group_of):
    """A member without a variable of its group would have nothing to wait for in the
    exchange (see ZeroSync): refuse, naming the counts."""
    for name in record.variables:
        devices = group_of(name)
        if devices is None or len(devices) < 2:
            continue
        mine = [n for n in record.variables if group_of(n) == devices]
        holders = set(_device_key(owner[n]) for n in mine)
        if len(holders) < len(devices):
            raise ZeroError("zero.level=%r: %d variables cannot give each of the %d devices "
                            "of their data-parallel group one; use fewer devices or run "
                            "without zero.level" % (record.level, len(mine), len(devices)))


def _drop_part(ctx, part, copy):
    """Nothing of ``copy`` waits for its instance of ``part`` (a variable's update that
    another copy owns): its ops are never run. What waited for them still waits for
    what they waited for: grouped apply orders Adam's beta-power update after the last
    group, whose updates wait for the group before; a copy that owns nothing in the last
    group must not update the beta powers while its earlier groups still read them."""
    ops = set(ctx.instance(op, copy) for op in part)
    for op in ops:
        for consumer in tf_adapter.control_outputs(op):
            if consumer not in ops:
                kept = [c for c in consumer.control_inputs if c is not op]
                kept += [c for c in _control_ancestors_outside(op, ops) if c not in kept]
                tf_adapter.remove_control_inputs(consumer)
                tf_adapter.add_control_inputs(consumer, kept)
        for tensor in op.outputs:
            for consumer in tensor.consumers():
                if consumer not in ops and consumer.type not in ("Identity", "NoOp"):
                    raise ZeroError(
                        "zero.level: %s reads %s, the update of a variable another device "
                        "owns; ZeRO cannot drop it. Run without zero.level"
                        % (consumer.name, tensor.name))


def _control_ancestors_outside(op, ops):
    """The nearest control inputs of ``op`` outside ``ops``, through control inputs in it."""
    found, stack, seen = [], [op], set([op])
    while stack:
        for source in stack.pop().control_inputs:
            if source in ops:
                if source not in seen:
                    seen.add(source)
                    stack.append(source)
            elif source not in found:
                found.append(source)
    return found


def _initializer(ctx, var, copy, primary):
    """Initialize ``copy``'s instance of slot ``var`` from the slot's initial value."""
    value = var.initializer.inputs[1]
    target = ctx.instance(var.op, copy)
    with tf.device(ctx.device(ctx.taskgraph_of(primary), copy)), tf.name_scope("EPL_ZERO/init"):
        return tf_adapter.assign_variable(target, value)


class ZeroSync(Pass):
    """Every member gets the updated variables; every gradient collective joins the barrier."""

    name = "zero_sync"
    phase = LOWER
    reads = ("view", "config", "cluster", "plan", "copies", "repetition", "zero",
             "accumulator_stores")
    writes = ("graph", "communicators")

    def applies(self, ctx):
        return getattr(ctx, "zero", None) is not None

    def run(self, ctx):
        record, plan = build_record(ctx.view), ctx.zero
        if plan.level in ("v1", "v2"):
            _agree_on_finite_steps(ctx)
        exchange = _gather if plan.level == "v2" else _exchange
        collectives = [ctx.tf_graph.get_operation_by_name(name)
                       for comm in ctx.communicators.all() if comm.name.startswith("grads/")
                       for name in comm.step_op_names()]
        by_taskgraph = collections.OrderedDict()
        for name in sorted(plan.owner):
            var_op = ctx.tf_graph.get_operation_by_name(name)
            by_taskgraph.setdefault(ctx.taskgraph_of(var_op), []).append(var_op)
        for copy in range(len(ctx.copies)):
            devices = set(_device_key(d) for d in ctx.copies[copy].devices)
            reductions = [op for op in collectives if _device_key(op.device) in devices]
            # a copy that does not update a variable still accumulates its gradient,
            # which the others' sums need
            done = list(reductions) + list(ctx.accumulator_stores.get(copy, ()))
            for taskgraph, var_ops in by_taskgraph.items():
                done += exchange(ctx, taskgraph, var_ops, copy, reductions)
            tf_adapter.add_control_inputs(ctx.instance(record.barrier, copy), done)


def _agree_on_finite_steps(ctx):
    """ZeRO v1/v2 with AMP: a member holds the reduced gradients of its own variables only
    (and its local ones of the others), so its "all finite" check sees other values than
    another member's. Each copy's check becomes a sum of "not finite" over its
    data-parallel group: every member skips a step some member found non-finite. That
    is the decision training without ZeRO takes: a gradient whose reduction is not
    finite is checked by its owner, and a local inf or nan makes its reduction inf or
    nan (the sum propagates it)."""
    from epl.runtime import amp
    for flag in amp.finite_flags(ctx.view):
        for copy in range(len(ctx.copies)):
            mine = ctx.tensor_instance(flag, copy)
            readers = list(mine.consumers())
            device = ctx.device(ctx.taskgraph_of(flag.op), copy)
            with tf.device(device), tf.name_scope("EPL_ZERO/finite"):
                bad = tf.cast(tf.logical_not(mine), tf.float32)
            comm = ctx.communicator(ctx.dp_group(flag.op, copy), GRADIENTS)
            total = comm.all_reduce(bad, device, "zero_finite/" + flag.op.name, mean=False)
            with tf.device(device), tf.name_scope("EPL_ZERO/finite"):
                agreed = tf.equal(total, 0.0)
            ctx.rewire(mine, agreed, readers)


def _exchange(ctx, taskgraph, var_ops, copy, reductions):
    """Sum over the TaskGraph's group of owners' new values; non-owners assign them."""
    owned = ctx.zero.owned[copy]
    device = ctx.device(taskgraph, copy)
    instances = [ctx.instance(var_op, copy) for var_op in var_ops]
    updates = [op for var_op, inst in zip(var_ops, instances) if var_op.name in owned
               for op in _owner_update(inst, ctx.view)]
    contributions = [_contribution(inst, var_op.name in owned, device, ctx.view, updates)
                     for var_op, inst in zip(var_ops, instances)]
    group = ctx.dp_group(var_ops[0], copy)
    reducer = GradientReducer([ctx.communicator(group, SYNC)],
                              ctx.config.communication.max_splits, False, 1, mean=False)
    summed = reducer.reduce(contributions, device, reducer.plan(contributions), tag="zero")
    assigns = []
    with tf.device(device), tf.name_scope("EPL_ZERO"), tf.control_dependencies(reductions):
        for var_op, inst, value in zip(var_ops, instances, summed):
            if var_op.name not in owned:
                assigns.append(tf_adapter.assign_variable(inst, value))
    return assigns + [v.op for v in summed]


def _gather(ctx, taskgraph, var_ops, copy, reductions):
    """ZeRO v2: each owner's new values all-gathered over the TaskGraph's group, bucket
    by bucket (the buckets of the gradients' reduce-scatter, laid out by owner:
    :func:`owner_chunks`), so a member sends only its own variables plus padding
    where an all-reduce would send every variable."""
    owned = ctx.zero.owned[copy]
    device = ctx.device(taskgraph, copy)
    group = ctx.dp_group(var_ops[0], copy)
    instances = [ctx.instance(var_op, copy) for var_op in var_ops]
    updates = [op for var_op, inst in zip(var_ops, instances) if var_op.name in owned
               for op in _owner_update(inst, ctx.view)]
    buckets = collections.OrderedDict()
    for index in sorted(range(len(var_ops)), key=lambda i: ctx.zero.bucket[var_ops[i].name]):
        buckets.setdefault(ctx.zero.bucket[var_ops[index].name], []).append(index)
    done = []
    for number, bucket in buckets.items():
        members = [(var_ops[i].name, instances[i]) for i in bucket]
        owners = [group.devices.index(ctx.zero.owner[name]) for name, _ in members]
        done += _gather_bucket(ctx, members, owners, group, device, updates, reductions,
                               "zero/bucket_%d" % number)
    return done


def _gather_bucket(ctx, members, owners, group, device, updates, reductions, name):
    """All-gather one bucket of (variable name, instance); non-owners assign the new
    values. Returns the ops the barrier waits for."""
    shapes = [tf_adapter.variable_shape(inst) for _, inst in members]
    sizes = [shape.num_elements() for shape in shapes]
    chunk, by_owner = owner_chunks(sizes, owners, group.size)
    rank = group.devices.index(device)
    with tf.device(device), tf.name_scope("EPL_ZERO"), tf.control_dependencies(updates):
        parts = [tf.reshape(_contribution(members[i][1], True, device, ctx.view, updates),
                            [-1]) for i in by_owner[rank]]
        pad = chunk - sum(sizes[i] for i in by_owner[rank])
        if pad:
            parts.append(tf.zeros([pad], tf_adapter.variable_dtype(members[0][1])))
        buffer = tf.concat(parts, 0)
    gathered = ctx.communicator(group, SYNC).all_gather(buffer, device, name)
    done = [gathered.op]
    with tf.device(device), tf.name_scope("EPL_ZERO"), tf.control_dependencies(reductions):
        for owner, indices in enumerate(by_owner):
            offset = owner * chunk
            for i in indices:
                if owner != rank:
                    value = tf.reshape(gathered[offset:offset + sizes[i]], shapes[i])
                    done.append(tf_adapter.assign_variable(members[i][1], value))
                offset += sizes[i]
    return done


def _contribution(var_op, owned, device, view, updates):
    """This member's share of the sum: its updated value, or zeros made after its own
    updates (so a step that updates nothing sends nothing)."""
    with tf.device(device), tf.name_scope("EPL_ZERO"):
        if not owned:
            with tf.control_dependencies(updates):
                return tf.zeros(tf_adapter.variable_shape(var_op),
                                tf_adapter.variable_dtype(var_op))
        with tf.control_dependencies(_owner_update(var_op, view)):
            return tf_adapter.read_variable(var_op) * 1


def _owner_update(var_op, view):
    """The ops that write ``var_op`` in the apply phase: the optimizer's update, be it
    an Apply* kernel or a plain assign (BERT's AdamWeightDecay). Not the initializer
    (forward phase) nor a saver's restore (session phase): a step must never run those."""
    found = []
    for tensor in var_op.outputs:
        for consumer in tensor.consumers():
            info = view.info(consumer)
            if info is not None and info.phase == Phase.APPLY and \
                    tf_adapter.writes_variable(consumer):
                found.append(consumer)
    return found
