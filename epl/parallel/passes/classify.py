"""Role classification as a pass: which ops are cloned per copy, which are shared."""
from epl.parallel.passes import CLASSIFY, Pass
from epl.ir.roles import classify


class ClassifyRoles(Pass):
    """Split the step's ops into cloned and shared (input pipeline, placeholders,
    global step, summaries) after the model passes, so that ops they created are
    classified like the user's own."""

    name = "classify_roles"
    phase = CLASSIFY
    reads = ("view",)
    writes = ("roles",)

    def run(self, ctx):
        ctx.roles = classify(ctx.view, keep_init=ctx.sharded_variables)
