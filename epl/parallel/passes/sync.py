"""Make every copy's variables equal to replica 0's before the first step."""
from epl import tf_adapter
from epl.parallel.passes import Pass
from epl.tf_adapter import tf


class VariableSync(Pass):
    """Build ``sync_op`` (broadcast from worker 0's replica 0) and ``init_check``.

    The session layer runs ``sync_op`` once, after the user's variables are
    initialized or restored and before the first training step; the copies'
    variables need no initializer of their own because assignment initializes
    them. Across workers the global step is broadcast too, so a restore on the
    chief reaches everyone. EPL's own state (gradient accumulators) is
    (re)initialized by the same op.
    """

    name = "variable_sync"

    def run(self, ctx):
        ops = []
        for var_op in ctx.roles.variables:
            ops.extend(self._broadcast_variable(ctx, var_op))
        ops.extend(self._broadcast_step(ctx))
        for comm in ctx.communicators():
            ops.extend(comm.setup_ops())
        with tf.device(ctx.host), tf.name_scope("EPL_SYNC"):
            if ctx.epl_variables:
                ops.append(tf.variables_initializer(ctx.epl_variables, name="init_epl_state"))
            if not ops:
                return
            ctx.program.sync_op = tf.group(*ops, name="sync")
            user_vars = list(ctx.roles.variables)
            step = tf_adapter.global_step_tensor(ctx.tf_graph)
            if step is not None:
                user_vars.append(step.op)
            checks = [tf_adapter.is_variable_initialized(v) for v in user_vars]
            ctx.program.init_check = tf.reduce_all(tf.stack(checks)) if checks else None

    @staticmethod
    def _broadcast_variable(ctx, var_op):
        """Worker 0's copy 0 -> every driver's copy 0 (collective) -> local copies (assign).

        Copies built in the same graph are plain assignments; only one device
        per driver worker takes part in the collective broadcast.
        """
        taskgraph = ctx.view.info(var_op).taskgraph
        drivers = ctx.driver_devices(taskgraph)
        shape = tf_adapter.variable_shape(var_op)
        dtype = tf_adapter.variable_dtype(var_op)
        ops, local = [], ctx.device(taskgraph, 0)
        with tf.device(local), tf.name_scope("EPL_SYNC"):
            source = tf_adapter.read_variable(var_op)
            if len(drivers) > 1:
                if not shape.is_fully_defined():
                    raise ValueError("EPL needs a fully defined shape to broadcast variable "
                                     "%s, got %s" % (var_op.name, shape))
                comm = ctx.group("broadcast/%s" % ctx.plan.taskgraphs[taskgraph].name, drivers)
                if local == drivers[0]:
                    ops.append(comm.broadcast_send(source, local, "var/" + var_op.name).op)
                else:
                    source = comm.broadcast_recv(shape, dtype, local, "var/" + var_op.name)
                    ops.append(tf_adapter.assign_variable(var_op, source))
        for copy in range(1, len(ctx.copies)):
            with tf.device(ctx.device(taskgraph, copy)), tf.name_scope("EPL_SYNC"):
                ops.append(tf_adapter.assign_variable(ctx.instance(var_op, copy), source))
        return ops

    @staticmethod
    def _broadcast_step(ctx):
        step = tf_adapter.global_step_tensor(ctx.tf_graph)
        if step is None or len(ctx.drivers) == 1:
            return []
        comm = ctx.host_communicator("broadcast/global_step")
        root = ctx.cluster.worker_cpu(ctx.drivers[0])
        with tf.device(ctx.host), tf.name_scope("EPL_SYNC"):
            if ctx.host == root:
                return [comm.broadcast_send(tf_adapter.read_variable(step.op), ctx.host,
                                            "global_step").op]
            value = comm.broadcast_recv(tf.TensorShape([]), step.dtype.base_dtype, ctx.host,
                                        "global_step")
            return [tf_adapter.assign_variable(step.op, value)]
