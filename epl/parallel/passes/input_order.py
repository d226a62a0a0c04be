"""Deterministic input: pulls from a shared iterator happen in a fixed order."""
from epl import tf_adapter
from epl.parallel.passes import REPLICATE, Pass
from epl.ir.roles import GET_NEXT_TYPES


class InputOrder(Pass):
    """Chain the copies' get-next ops so that pull k always feeds the same copy.

    Without this, copies race for the shared iterator and which replica sees
    which batch changes from run to run. Pulls are ordered micro-batch-major
    ((copy 0, mb 0), (copy 1, mb 0), ..., (copy 0, mb 1), ...), so copy 1
    waits only for copy 0's pull of the same micro-batch, never for its
    whole pipeline. Copies that read a slice of a reader's batch
    (``replicate(device_count>1)``, see BatchSplit) do not pull and are skipped.
    """

    name = "input_order"
    phase = REPLICATE
    reads = ("copies", "repetition", "roles", "split_inputs")
    writes = ("graph",)

    def applies(self, ctx):
        return len(ctx.copies) > 1 or ctx.num_micro_batch > 1

    def run(self, ctx):
        readers = [reader for reader, _ in ctx.readers()]
        everyone = list(range(len(ctx.copies)))
        for op in ctx.roles.cloned:
            if op.type not in GET_NEXT_TYPES:
                continue
            pulling = readers if op.name in ctx.split_inputs else everyone
            pulls = [ctx.instance(op, copy, m) for m in range(ctx.num_micro_batch)
                     for copy in pulling]
            for before, after in zip(pulls, pulls[1:]):
                tf_adapter.add_control_inputs(after, [before])
