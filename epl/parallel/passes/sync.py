"""Make every copy's variables equal to replica 0's before the first step."""
import functools

from epl import tf_adapter
from epl.parallel.context import SYNC
from epl.ops.shards import shard_shape
from epl.parallel.passes import LOWER, Pass
from epl.ir.phase import Phase
from epl.ir.roles import initializers_of
from epl.tf_adapter import tf


class VariableSync(Pass):
    """Build ``sync_op`` (broadcast from worker 0's replica 0) and ``init_check``.

    The session layer runs ``sync_op`` once, after the user's variables are
    initialized or restored and before the first training step; the copies'
    variables need no initializer of their own because assignment initializes
    them. Across workers the global step is broadcast too, so a restore on the
    chief reaches everyone. EPL's own state (gradient accumulators) is
    (re)initialized by the same op.

    On one worker, the user's initializers also initialize the local copies
    (:func:`link_copy_initializers`): after an initialization the session layer
    runs only ``setup_op`` (EPL's state and the collectives' set-up), not the
    broadcast, whose separate run (its own graph optimization and a full copy
    of every weight and slot) cost seconds before the first step. There the
    broadcast and ``init_check`` serve only restores (or variables set some other
    way), so they are built when the session layer first needs them
    (``program.defer_sync``): two ops per variable and copy, about 40% of the
    rewrite of a BERT-shaped encoder on 2 local replicas.
    """

    name = "variable_sync"
    phase = LOWER
    reads = ("view", "config", "cluster", "plan", "copies", "roles", "repetition", "epl_variables",
             "state_initializers", "zero")
    writes = ("graph", "communicators", "program.sync_op", "program.setup_op",
              "program.linked_init", "program.init_check")

    def run(self, ctx):
        chain_shard_initializers(ctx)
        ctx.program.linked_init = link_copy_initializers(ctx)
        setup = []
        for comm in ctx.communicators.all():
            setup.extend(comm.setup_ops())
        with tf.device(ctx.host), tf.name_scope("EPL_SYNC"):
            if ctx.epl_variables:
                setup.append(tf.variables_initializer(ctx.epl_variables, name="init_epl_state"))
            setup.extend(ctx.state_initializers)
            if setup:
                ctx.program.setup_op = tf.group(*setup, name="setup")
        if ctx.program.linked_init and not ctx.cluster.distributed:
            # The broadcast serves only restores: built when one happens.
            ctx.program.defer_sync(functools.partial(_in_rewrite_scope, ctx, build_broadcast))
        else:
            build_broadcast(ctx)


def build_broadcast(ctx):
    """``program.sync_op`` (every copy's variables from worker 0's replica 0, the
    global step, EPL's set-up) and ``program.init_check``."""
    ops = []
    for var_op in _user_variables(ctx):  # ZeRO: slots live on their owner only
        ops.extend(_broadcast_variable(ctx, var_op))
    ops.extend(_broadcast_step(ctx))
    if ctx.program.setup_op is not None:
        ops.append(ctx.program.setup_op)
    with tf.device(ctx.host), tf.name_scope("EPL_SYNC"):
        if not ops:
            return
        ctx.program.sync_op = tf.group(*ops, name="sync")
        user_vars = _user_variables(ctx)
        step = tf_adapter.global_step_tensor(ctx.tf_graph)
        if step is not None:
            user_vars.append(step.op)
        checks = [tf_adapter.is_variable_initialized(v) for v in user_vars]
        ctx.program.init_check = tf.reduce_all(tf.stack(checks)) if checks else None


def _in_rewrite_scope(ctx, build):
    """Run ``build(ctx)`` after the rewrite, as the rewrite ran: on the (possibly
    finalized) graph as default, EPL's phase, no user scopes or dependencies."""
    graph = ctx.tf_graph
    with tf_adapter.unfinalized(graph), graph.as_default(), \
            ctx.view.phase_scope(Phase.EPL), tf.name_scope(None), \
            tf.control_dependencies(None), tf.device(None):
        build(ctx)


def _broadcast_variable(ctx, var_op):
    """Root's copy -> one copy per worker (collective) -> other local copies (assign).

    Copies are grouped by the weights they hold (a split TaskGraph's shard,
    else all of them). Per group, only the first local holder takes part in
    the collective broadcast over the plan's sync group (one device per
    worker); copies built in the same graph are plain assignments.
    """
    taskgraph = ctx.taskgraph_of(var_op)
    tg_plan = ctx.plan.taskgraphs[taskgraph]
    holders = {}
    for copy in range(len(ctx.copies)):
        holders.setdefault(ctx.weight_position(var_op, copy), []).append(copy)
    ops = []
    for position, copies in sorted(holders.items(), key=lambda item: (item[0] is not None,
                                                                      item[0])):
        group = tg_plan.sync_group(position)
        if group.size == 1 and len(copies) == 1:
            continue  # the only holder: nothing to send or assign
        leader = copies[0]
        source, leader_ops = _leader_value(ctx, var_op, taskgraph, leader, group, position)
        ops += leader_ops
        for copy in copies[1:]:
            with tf.device(ctx.device(taskgraph, copy)), tf.name_scope("EPL_SYNC"):
                ops.append(tf_adapter.assign_variable(ctx.instance(var_op, copy), source))
    return ops


def _broadcast_step(ctx):
    step = tf_adapter.global_step_tensor(ctx.tf_graph)
    group = ctx.plan.host_group
    if step is None or group.size == 1:
        return []
    comm = ctx.communicator(group, SYNC)
    root = group.devices[0]
    with tf.device(ctx.host), tf.name_scope("EPL_SYNC"):
        if ctx.host == root:
            return [comm.broadcast_send(tf_adapter.read_variable(step.op), ctx.host,
                                        "global_step").op]
        value = comm.broadcast_recv(tf.TensorShape([]), step.dtype.base_dtype, ctx.host,
                                    "global_step")
        return [tf_adapter.assign_variable(step.op, value)]


def _user_variables(ctx):
    """The copied variables the user initializes: not ZeRO's slots (EPL's state, on their
    owners only)."""
    slots = ctx.zero.slots if ctx.zero is not None else ()
    return [v for v in ctx.roles.variables if v.name not in slots]


def chain_shard_initializers(ctx):
    """Running a sharded variable's initializer (copy 0's, as the user's init op does)
    also runs every local copy's own initializer: each shard's initial value is its
    slice, which no broadcast can provide. Tied to the user's initialization (not to
    EPL's broadcast, which also follows restores), a seeded random initializer is
    drawn exactly once per copy, as in the unsplit model."""
    for name in ctx.sharded_variables:
        first = _instance_initializer(ctx, name, 0)
        if first is None:
            continue
        others = [_instance_initializer(ctx, name, copy) for copy in range(1, len(ctx.copies))]
        tf_adapter.add_control_inputs(first, [op for op in others if op is not None])


def link_copy_initializers(ctx):
    """On one worker, make each user variable's initializer also initialize its local
    copies, from the same initial value in the same run (so seeded or not, every
    copy starts equal). Returns True when every copied variable is linked.

    A copy's assignment is a control input of the user's initializer: running
    ``global_variables_initializer``, an initializer of its own, or ``Variable.load``
    (which feeds the initial value) sets every copy. Restores still need the
    broadcast (the session layer knows which happened)."""
    if ctx.cluster.distributed:  # one copy: nothing to link, the user's init is all
        return False
    names = [v.name for v in _user_variables(ctx) if v.name not in ctx.sharded_variables]
    initializers = initializers_of(ctx.tf_graph, names)
    if len(initializers) != len(names):
        return False
    for name in names:
        var_op = ctx.tf_graph.get_operation_by_name(name)
        init = initializers[name]
        value = init.inputs[1]
        assigns = []
        for copy in range(1, len(ctx.copies)):
            with ctx.tf_graph.as_default(), tf.name_scope(None):
                assigns.append(tf_adapter.assign_variable_on(
                    ctx.instance(var_op, copy), value,
                    ctx.device(ctx.taskgraph_of(var_op), copy), "EPL_SYNC/init/Assign"))
        tf_adapter.add_control_inputs(init, assigns)
    return True


def _instance_initializer(ctx, name, copy):
    init = initializers_of(ctx.tf_graph, [name]).get(name)
    return None if init is None else ctx.instance(init, copy)


def _leader_value(ctx, var_op, taskgraph, leader, group, position):
    """(value the leader copy ends with, ops): the root sends, other workers receive."""
    var = ctx.instance(var_op, leader)
    device = ctx.device(taskgraph, leader)
    with tf.device(device), tf.name_scope("EPL_SYNC"):
        source = tf_adapter.read_variable(var)
        if group.size == 1:
            return source, []
        shape = _shape(ctx, var_op, position)
        if not shape.is_fully_defined():
            raise ValueError("EPL needs a fully defined shape to broadcast variable %s, got %s"
                             % (var_op.name, shape))
        comm = ctx.communicator(group, SYNC)
        if device == group.devices[0]:
            # A shard's clone may read with an unknown static shape; the send declares
            # the shape the receivers allocate, so it is stated here.
            sent = source if source.shape.is_fully_defined() else tf.reshape(source, shape)
            return source, [comm.broadcast_send(sent, device, "var/" + var_op.name).op]
        value = comm.broadcast_recv(shape, tf_adapter.variable_dtype(var_op), device,
                                    "var/" + var_op.name)
        return value, [tf_adapter.assign_variable(var, value)]


def _shape(ctx, var_op, position):
    """Static shape of the leader's instance of ``var_op`` (a shard's own shape)."""
    info = ctx.sharded_variables.get(var_op.name)
    if info is not None and position is not None:
        return tf.TensorShape(shard_shape(info.full_shape, info.axis, info.width, position))
    return tf_adapter.variable_shape(var_op)
