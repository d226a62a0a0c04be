"""ZeRO: optimizer states (v0) and gradient reduction (v1) partitioned over data parallelism.

Every variable gets one *owner* among the data-parallel members (balanced by
bytes, the same on every member). Only the owner runs the optimizer for it,
so its slots (Adam's m and v) exist on the owner alone; after the update the
members exchange the new values.

* ``v0``: gradients are all-reduced as usual; states are partitioned.
* ``v1``: each member also receives only its own variables' reduced gradients
  (a reduce-scatter of one buffer laid out by owner) instead of all of them.

Where it applies: one copy per worker process (N workers x 1 device, a single
data-parallel TaskGraph), as in the original EPL. Several devices per worker
(copies sharing one graph), pipelines and gradient accumulation are refused
at ``apply_gradients`` with the reason. Checkpoints hold every worker's slots
(:mod:`epl.runtime.zero_checkpoint`): worker 0 learns what the others create
while the step is built, saves them, and restores them after a restore.

Build time (``wrap_apply``): the optimizer is called for the owned pairs only,
and the returned op also waits for a barrier that the rewrite connects to the
broadcasts. Rewrite time (:class:`ZeroSync`): broadcasts, and every gradient
collective joins the barrier, because a member whose own variables do not need
a bucket must still take part in it.
"""
import collections

from epl import tf_adapter
from epl.communicators.reducer import GradientReducer
from epl.ir.phase import Phase
from epl.protocols.passes import LOWER, SYNC, Pass
from epl.ir.roles import VARIABLE_TYPES
from epl.runtime.zero_checkpoint import checkpoint_refusal, describe_remote_slots  # noqa: F401
from epl.runtime.zero_error import ZeroError  # noqa: F401  (raised here, caught by users)
from epl.session import roles
from epl.tf_adapter import tf

ZeroRecord = collections.namedtuple("ZeroRecord", [
    "level", "members", "rank", "owner_of", "barrier", "local_variables", "remote_slots",
    "remote_problem"])
ZeroRecord.__doc__ = """What ZeRO decided while the step was built: level, member count,
this worker's rank, {variable name: owner rank}, the barrier op, the names of
variables that exist on this worker only (slots of owned variables), and on worker 0
the other workers' slots (``zero_checkpoint.RemoteSlot``) or why they are unknown."""


def applies(config):
    return bool(config.zero.level)


def owners(sizes, members):
    """Owner rank of each variable: largest first, each to the least loaded member."""
    load = [0] * members
    owner = [None] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(members), key=lambda r: (load[r], r))
        owner[index] = rank
        load[rank] += sizes[index]
    return owner


def _check(view, config, cluster):
    reasons = []
    if cluster.gpu_num_per_worker != 1:
        reasons.append("%d devices per worker (its copies share one graph, whose optimizer "
                       "states cannot be split yet; run N workers x 1 device)"
                       % cluster.gpu_num_per_worker)
    if len(view.taskgraphs) != 1 or view.taskgraphs[0].device_count != 1:
        reasons.append("%d TaskGraphs (ZeRO partitions one data-parallel TaskGraph of "
                       "replicate(1))" % len(view.taskgraphs))
    if config.pipeline.num_micro_batch > 1:
        reasons.append("pipeline.num_micro_batch=%d (gradient accumulation or pipelines)"
                       % config.pipeline.num_micro_batch)
    if config.amp.level:
        reasons.append("amp.level=%r (a step AMP skips on overflow would leave ZeRO's exchange "
                       "of updated values half-built on the owners, and the workers' "
                       "collectives would disagree)" % config.amp.level)
    if reasons:
        raise ZeroError("zero.level=%r is not supported here: %s. Remove zero.level or change "
                        "the layout." % (config.zero.level, "; ".join(reasons)))


def _nbytes(var):
    shape = var.shape
    if not shape.is_fully_defined():
        raise ZeroError("ZeRO needs static variable shapes to balance owners; %s has %s"
                        % (var.op.name, shape))
    return shape.num_elements() * var.dtype.base_dtype.size


def wrap_apply(call, view, config, cluster):
    """Run the optimizer for this worker's variables only, behind a barrier."""
    def apply(bound):
        _check(view, config, cluster)
        pairs_arg = list(bound.arguments)[1]
        pairs = [(g, v) for g, v in bound.arguments[pairs_arg] if g is not None]
        members, rank = cluster.total_gpu_num, cluster.worker_index
        ranks = owners([_nbytes(v) for _, v in pairs], members)
        if len(set(ranks)) < members:
            raise ZeroError("zero.level=%r: %d variables cannot give each of %d members one; "
                            "use fewer workers" % (config.zero.level, len(pairs), members))
        owned = [p for p, r in zip(pairs, ranks) if r == rank]
        before = set(v.op.name for v in tf_adapter.tf.global_variables())
        bound.arguments[pairs_arg] = owned
        result = call(bound)
        slots = set(v.op.name for v in tf.global_variables()) - before
        remote, problem = (), None
        if roles.writes_checkpoints(cluster):
            remote, problem = describe_remote_slots(call, bound, pairs_arg, pairs, ranks,
                                                    view, VARIABLE_TYPES)
        with tf.device(cluster.worker_cpu()), tf.name_scope("EPL_ZERO"):
            barrier = tf.no_op(name="barrier")
            done = tf.group(result, barrier, name="apply")
        view.zero = ZeroRecord(config.zero.level, members, rank,
                               dict((v.op.name, r) for (_, v), r in zip(pairs, ranks)),
                               barrier, frozenset(slots), remote, problem)
        return done
    return apply


class ZeroSync(Pass):
    """Every member gets the updated variables; every gradient collective joins the barrier.

    The new values travel as one sum over the data-parallel group: each member
    contributes its own variables' updated values and zeros elsewhere (fused in
    buckets like gradients), so a step needs one kind of collective, on the fast
    ring, and no member can miss another's broadcast."""

    name = "zero_sync"
    phase = LOWER
    reads = ("view", "config", "cluster", "plan", "copies")
    writes = ("graph", "communicators")

    def applies(self, ctx):
        return getattr(ctx.view, "zero", None) is not None

    def run(self, ctx):
        record = ctx.view.zero
        reductions = [ctx.tf_graph.get_operation_by_name(name)
                      for comm in ctx.communicators() if comm.name.startswith("grads/")
                      for name in comm.op_names]
        names = sorted(record.owner_of)
        var_ops = [ctx.tf_graph.get_operation_by_name(n) for n in names]
        taskgraph = ctx.taskgraph_of(var_ops[0])
        device = ctx.device(taskgraph, 0)
        contributions = [_contribution(var_op, record.owner_of[var_op.name] == record.rank,
                                       device, ctx.view) for var_op in var_ops]
        reducer = GradientReducer(
            [ctx.communicator(ctx.plan.taskgraphs[taskgraph].dp_group(), SYNC)],
            ctx.config.communication.max_splits, False, 1, mean=False)
        summed = reducer.reduce(contributions, device, reducer.plan(contributions), tag="zero")
        assigns = []
        with tf.device(device), tf.name_scope("EPL_ZERO"), tf.control_dependencies(reductions):
            for var_op, value in zip(var_ops, summed):
                if record.owner_of[var_op.name] != record.rank:
                    assigns.append(tf_adapter.assign_variable(var_op, value))
        tf_adapter.add_control_inputs(record.barrier, reductions + assigns + [
            v.op for v in summed])


def _contribution(var_op, owned, device, view):
    """This member's share of the sum: its updated value, or zeros."""
    with tf.device(device), tf.name_scope("EPL_ZERO"):
        if not owned:
            return tf.zeros(tf_adapter.variable_shape(var_op), tf_adapter.variable_dtype(var_op))
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
