"""The rewrite-pass protocol: passes, their phases, communicator purposes.

Each pass has a ``name``, a ``phase``, ``applies(ctx)`` and ``run(ctx)``, and
says in ``reads`` and ``writes`` which parts of the RewriteContext it uses.
The protocol lives on the lowest floor so that units on any floor (savers in
:mod:`epl.runtime`, split layers in :mod:`epl.ops`) define passes without
importing the rewrite core; the core (:mod:`epl.parallel.rewriter`) declares
their order once. Passes run in phase order:

* ``model``: on the single-copy graph, before anything is classified or cloned
  (auto stages, split lowering, recompute, AMP casts, offload);
* ``classify``: which ops are cloned per copy and which are shared, so ops that
  model passes created are classified like the user's;
* ``replicate``: placement, micro-batch and copy clones, input wiring;
* ``lower``: gradient aggregation, schedules, merged outputs, variable sync.
"""

MODEL, CLASSIFY, REPLICATE, LOWER = "model", "classify", "replicate", "lower"
PHASES = (MODEL, CLASSIFY, REPLICATE, LOWER)

# Communicators over one group, one per purpose (``ctx.communicator(group, purpose)``):
# the collectives of one purpose are ordered on a ring member, and a fetch of a merged
# loss must not wait for the gradient all-reduce (or drag it into a loss-only run).
# INPUT: the end-of-input agreement of every step (epl.parallel.passes.end_of_input).
GRADIENTS, OUTPUTS, SYNC, LAYERS, INPUT = "grads", "outputs", "sync", "layers", "input"
# The name scope of the end-of-input agreement's own iterator (an empty dataset whose
# pull raises OutOfRangeError): it holds no position, so snapshots leave it out
# (epl.runtime.snapshot_state), and its first initialization is never in their runs.
END_OF_INPUT_STOP = "EPL_END_OF_INPUT_STOP"


class PassOrderError(ValueError):
    """A pass list whose phases are out of order."""


class Pass(object):
    """Base class: a named, self-contained graph transformation."""

    name = None
    phase = None
    reads = ()
    writes = ()

    def applies(self, ctx):
        del ctx
        return True

    def run(self, ctx):
        raise NotImplementedError

    def __repr__(self):
        return "<pass %s (%s)>" % (self.name, self.phase)


def check_order(passes):
    """Raise PassOrderError unless ``passes`` are in phase order with known phases."""
    last = 0
    for rewrite_pass in passes:
        if rewrite_pass.phase not in PHASES:
            raise PassOrderError("pass %r has phase %r; phases are %s"
                                 % (rewrite_pass.name, rewrite_pass.phase, ", ".join(PHASES)))
        rank = PHASES.index(rewrite_pass.phase)
        if rank < last:
            raise PassOrderError("pass %r (phase %s) comes after a pass of phase %s"
                                 % (rewrite_pass.name, rewrite_pass.phase, PHASES[last]))
        last = rank


def describe(passes):
    """The pass list as text: phase, name, what it reads and writes."""
    lines = []
    for phase in PHASES:
        members = [p for p in passes if p.phase == phase]
        lines.append("%s:%s" % (phase, "" if members else " (none yet)"))
        for rewrite_pass in members:
            lines.append("  %-26s reads: %s" % (rewrite_pass.name,
                                                ", ".join(rewrite_pass.reads) or "-"))
            lines.append("  %-26s writes: %s" % ("", ", ".join(rewrite_pass.writes) or "-"))
    return "\n".join(lines)
