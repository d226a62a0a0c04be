"""The shared global step advances once per step, after every copy's update."""
from epl import tf_adapter
from epl.ir.phase import Phase
from epl.parallel.passes import LOWER, Pass


class SharedStepDependencies(Pass):
    """Make each shared update op (``global_step += 1``) wait for all copies.

    ``optimizer.minimize(loss, global_step)`` returns the step increment,
    which depends on replica 0's updates only; adding the other copies'
    counterparts as control inputs means fetching it runs every replica.
    """

    name = "shared_step_dependencies"
    phase = LOWER
    reads = ("view", "copies", "roles", "repetition")
    writes = ("graph",)

    def applies(self, ctx):
        return len(ctx.copies) > 1 and bool(ctx.roles.global_step)

    def run(self, ctx):
        for name in sorted(ctx.roles.global_step):
            op = ctx.tf_graph.get_operation_by_name(name)
            info = ctx.view.info(op)
            if info is None or info.phase != Phase.APPLY:
                continue
            inputs = [t.op for t in op.inputs] + list(op.control_inputs)
            cloned = [i for i in inputs if ctx.is_cloned(i) and ctx.view.info(i) is not None]
            extra = [ctx.instance(i, copy) for i in cloned for copy in range(1, len(ctx.copies))]
            tf_adapter.add_control_inputs(op, extra)
