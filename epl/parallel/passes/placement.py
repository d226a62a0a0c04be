"""Place the user's ops (copy 0) on the plan's devices; shared ops on the host."""
from epl import tf_adapter
from epl.parallel.passes import REPLICATE, Pass


class Placement(Pass):
    """Every cloned op goes to its TaskGraph's device in copy 0.

    Shared ops (input pipeline, placeholders, global step, summaries) and ops
    the user pinned to a CPU go to this worker's host CPU. Gradient and update
    ops are colocated with their forward op/variable, so they follow. Ops that
    only compute initial values go where their variable is (copy 0's device).
    """

    name = "placement"
    phase = REPLICATE
    reads = ("view", "cluster", "copies", "roles")
    writes = ("graph",)

    def run(self, ctx):
        for op in ctx.roles.cloned:
            tf_adapter.set_device(op, ctx.device_for(op, 0))
        for name in ctx.roles.shared:
            tf_adapter.set_device(ctx.tf_graph.get_operation_by_name(name), ctx.host)
        for name in ctx.roles.init_only:
            op = ctx.tf_graph.get_operation_by_name(name)
            info = ctx.view.info(op)
            if info is not None and info.taskgraph is not None and name not in ctx.roles.shared:
                tf_adapter.set_device(op, ctx.device(info.taskgraph, 0))
