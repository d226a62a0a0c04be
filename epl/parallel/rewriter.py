"""Turn a user's training graph into this worker's part of the parallel program.

The passes run in the order declared in ``PASSES``, grouped in phases (model,
classify, replicate, lower; see :mod:`epl.parallel.passes`); each one is small
and owns one transformation. ``parallelize`` is idempotent: a graph is
rewritten once, when it is finalized (MonitoredTrainingSession, Estimator) or
at its first ``session.run`` (plain ``tf.Session``), whichever comes first.
``python -m epl.parallel.rewriter`` prints the pass list; ``--markdown`` prints the
pass table of docs/design.md (a test checks that the docs show the current one).
"""
import contextlib
import gc
import logging
import sys

from epl import tf_adapter
from epl.ir.phase import Phase
from epl.parallel import step_check
from epl.parallel.context import FIELDS, RewriteContext
from epl.parallel.gradient_plan import describe_sparse
from epl.parallel.passes import check_order, describe
from epl.parallel.passes.auto_stages import AutoStages, partition_stages
from epl.parallel.passes.batch_split import BatchSplit
from epl.ops.checkpoint import ShardedCheckpoints
from epl.ops.lowering import SplitLowering
from epl.runtime.gc_select import UnusedCheckpoints
from epl.runtime.offload import Offload
from epl.runtime.zero_partition import ZeroPartition, ZeroSync
from epl.runtime.zero_checkpoint import ZeroCheckpoints
from epl.runtime.snapshot_state import SnapshotState
from epl.parallel.passes.io_slicing import IOSlicing
from epl.parallel.passes.classify import ClassifyRoles
from epl.parallel.passes.end_of_input import EndOfInput
from epl.parallel.passes.gradients import GradientAggregation
from epl.parallel.passes.input_order import InputOrder
from epl.parallel.passes.outputs import MergedOutputs
from epl.parallel.passes.pipeline import ScheduleLowering
from epl.parallel.passes.placement import Placement
from epl.parallel.passes.steps import SharedStepDependencies
from epl.parallel.passes.sync import VariableSync
from epl.parallel.plan import make_plan, specs_from_graph
from epl.parallel.repeat import RepeatStep
from epl.parallel.repeat.executors import CallExecutors

LOG = logging.getLogger("epl")

PASSES = (
    AutoStages(),
    UnusedCheckpoints(),
    IOSlicing(),
    SplitLowering(),
    ClassifyRoles(),
    Placement(),
    Offload(),
    RepeatStep(),
    BatchSplit(),
    InputOrder(),
    ZeroPartition(),
    GradientAggregation(),
    ZeroSync(),
    SharedStepDependencies(),
    ScheduleLowering(),
    MergedOutputs(),
    ShardedCheckpoints(),
    ZeroCheckpoints(),
    EndOfInput(),
    VariableSync(),
    SnapshotState(),
    CallExecutors(),
)


def needs_rewrite(view):
    """A graph is parallelized once it has a training step and was not yet.

    Graphs EPL leaves alone (Estimator evaluation/prediction, a tf.distribute
    strategy's step) are never rewritten; a graph with strategy scopes whose
    training step EPL cannot see raises (see :mod:`epl.parallel.step_check`)
    instead of training every worker serially.
    """
    if view is None or view.parallel is not None:
        return False
    if step_check.left_alone(view):
        return False
    if not view.has_training_step:
        step_check.check_missing_step(view)
        return False
    if view.rewrite_error is not None:
        raise RuntimeError("EPL could not parallelize this graph earlier: %s"
                           % view.rewrite_error)
    return True


def plan_for(view, config, cluster):
    """The plan of a graph view (gives unannotated graphs their implicit TaskGraph)."""
    view.ensure_taskgraph()
    partition_stages(view, config, cluster)
    return make_plan(config, cluster, specs_from_graph(view))


def parallelize(view, config, cluster, plan=None, passes=PASSES):
    """Run every applicable pass of ``passes`` on ``view``'s graph; return the
    ParallelProgram. Tests pass a shorter list to run one pass on a tiny graph."""
    if view.parallel is not None:
        return view.parallel
    check_order(passes)
    plan = plan if plan is not None else plan_for(view, config, cluster)
    _check_supported(plan, cluster)
    ctx = RewriteContext(view, config, cluster, plan)
    with tf_adapter.unfinalized(view.tf_graph), tf_adapter.undecorated_op_creation(), \
            _collector_paused():
        try:
            with view.phase_scope(Phase.EPL):
                for rewrite_pass in passes:
                    if rewrite_pass.applies(ctx):
                        rewrite_pass.run(ctx)
        except Exception as err:
            view.rewrite_error = "%s: %s" % (type(err).__name__, err)
            raise
        ctx.finish_program()
    view.parallel = ctx.program
    LOG.info("EPL parallelized the graph on worker %d:\n%s", cluster.worker_index,
             "\n".join([str(plan)] + describe_sparse(ctx.program.gradient_plans)))
    return ctx.program


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector paused while the rewrite runs.

    The rewrite makes tens of thousands of Python objects (ops, tensors, NodeDefs)
    in a process that already holds about 200k (the user's graph): they push the
    collector into a full collection, about 0.1 s CPU each on ResNet-style and MoE,
    a seventh of EPL's rewrite there, and finding no cycle to free. Paused, the
    next collections see the rewrite's objects once. The collector is enabled again
    afterwards unless it was off before (a program's own ``gc.disable()`` stays)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _check_supported(plan, cluster):
    """Fail clearly on what the passes cannot build (TaskGraphs of different widths
    in one replica are refused by the plan itself)."""
    if not plan.copies_of(cluster.worker_index):
        raise ValueError("worker %d builds no model replica; it should only serve its "
                         "devices (see epl.session.serving)" % cluster.worker_index)


def markdown_table(passes=PASSES):
    """The pass table of docs/design.md: phase, pass, what it reads and writes of the
    rewrite context (:data:`epl.parallel.context.FIELDS`), from the passes' declarations."""
    code = lambda names: ", ".join("`%s`" % n for n in names) or "-"
    rows = ["| Phase | Pass | Reads | Writes |", "|---|---|---|---|"]
    for rewrite_pass in passes:
        rows.append("| %s | `%s` | %s | %s |" % (rewrite_pass.phase, rewrite_pass.name,
                                                 code(rewrite_pass.reads),
                                                 code(rewrite_pass.writes)))
    rows += ["", "| Field | What |", "|---|---|"]
    rows += ["| `%s` | %s |" % (name, doc.replace("|", "\\|")) for name, doc in FIELDS.items()]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table() if sys.argv[1:] == ["--markdown"] else describe(PASSES))
