"""Automatic pipeline stages (``auto.auto_parallel=True``, ``pipeline.num_stages=k``).

The user writes no strategy scope. Before planning, :func:`partition_stages`
cuts the single-copy forward graph into k stages (the math is pure, in
:mod:`epl.parallel.partition`), creates one ``replicate(1)`` TaskGraph per stage
(named ``stage_0`` ..) and moves every op into one of them:

* forward ops: the partition (repeated blocks, else static-shape costs);
* backward ops: the stage of the forward op they differentiate (the IR records
  it while ``tf.gradients`` runs: ``Graph.gradient_sources``);
* apply, session and other ops: the stage of the op they are colocated with
  (optimizer updates and slots colocate with their variable), else the latest
  stage among their inputs, else the last stage; the rules the IR uses when the
  user defines stages.

The plan then nests data parallelism over the stages like any pipeline: with D
devices in all, D/k pipeline replicas, so no device idles. The partition is
logged at INFO and kept as ``epl.Graph.get().auto_partition``.

Planning happens before the passes run, so the partition is called from
``rewriter.plan_for``; the :class:`AutoStages` pass (model phase) then checks
that the plan was made from the stages and that no forward edge goes from a
later stage to an earlier one (ops the user created after the partition).

With ``num_stages`` unset or 1, the model stays one implicit ``replicate(1)``
TaskGraph: plain data parallelism over every device (gradient accumulation
when ``pipeline.num_micro_batch > 1``).
"""
import logging

from epl import tf_adapter
from epl.ir.features import FeatureSlot
from epl.ir.phase import Phase
from epl.ir.traverse import ancestor_ops
from epl.parallel import partition as partition_lib
from epl.parallel.passes import MODEL, Pass
from epl.parallel.plan import PlanError
from epl.ir.roles import GET_NEXT_TYPES, PLACEHOLDER_TYPES
from epl.strategies.base import Replicate
from epl.strategies.context import StrategyError

LOG = logging.getLogger("epl")

_LOOP_ENTRY, _LOOP_EXIT = ("Enter", "RefEnter"), ("Exit", "RefExit")
_SWITCH, _MERGE = ("Switch", "RefSwitch"), ("Merge", "RefMerge")
_NEXT_ITERATION = ("NextIteration", "RefNextIteration")
_RANDOM = frozenset(["RandomUniform", "RandomUniformInt", "RandomStandardNormal",
                     "TruncatedNormal", "RandomShuffle", "Multinomial", "RandomGamma",
                     "RandomPoisson", "RandomPoissonV2"])
_COST_ATTRS = {"MatMul": ("transpose_a",), "BatchMatMul": ("adj_x",),
               "BatchMatMulV2": ("adj_x",)}
# the Partition made for a view (public as epl.Graph.get().auto_partition)
_PARTITION = FeatureSlot("auto_partition", None)
_LOGGED = FeatureSlot("auto_partition_logged", None)  # the "no stages" decision was logged


class AutoStage(Replicate):
    """The strategy of a stage EPL made (a ``replicate(1)`` named ``stage_i``); the
    type tells EPL's stages apart from the user's scopes."""


class AutoParallelError(StrategyError):
    """auto.auto_parallel combined with strategy scopes."""


def partition_stages(view, config, cluster):
    """Create the stages of ``auto.auto_parallel`` in ``view`` (before planning).

    Returns the :class:`~epl.parallel.partition.Partition`, or None when no stages
    are made (auto parallel off, or ``num_stages`` unset or 1). Idempotent: the
    partition is made once per graph. Raises ConfigError for ``num_stages``
    without auto parallel, AutoParallelError when the graph also has strategy
    scopes, and PlanError when the stages do not fit the devices or the model.
    """
    partition_lib.check_config(config)
    if not config.auto.auto_parallel:
        return None
    _refuse_scopes(view)
    num_stages = partition_lib.stage_count(config)
    if num_stages <= 1:
        _log_once(view, "EPL auto parallel: pipeline.num_stages is %s, so the model is not "
                        "cut into stages: data parallelism over all %d device(s)"
                  % (config.pipeline.num_stages, cluster.worker_num * cluster.gpu_num_per_worker))
        return None
    if _PARTITION.get(view) is not None:
        return _PARTITION.get(view)
    try:
        replicas = partition_lib.check_devices(num_stages, cluster.worker_num,
                                               cluster.gpu_num_per_worker)
        nodes = forward_nodes(view)
        result = partition_lib.partition(nodes, num_stages)
    except partition_lib.PartitionError as err:
        raise PlanError(str(err))
    _apply(view, result.stage_of, num_stages)
    _PARTITION.set(view, result)
    LOG.info("EPL %s\n  %d pipeline replica(s) of %d stages, %d micro-batch(es)",
             result, replicas, num_stages, config.pipeline.num_micro_batch)
    if config.pipeline.num_micro_batch == 1:
        LOG.warning("auto.auto_parallel: pipeline.num_micro_batch=1, so the %d stages run one "
                    "after another; use at least %d micro-batches to pipeline them",
                    num_stages, num_stages)
    return result


def _log_once(view, message):
    if not _LOGGED.get(view):
        _LOGGED.set(view, True)
        LOG.info(message)


def _refuse_scopes(view):
    """auto.auto_parallel makes the TaskGraphs itself; user scopes would conflict."""
    user = [tg for tg in view.taskgraphs if not tg.implicit
            and not isinstance(tg.strategy, AutoStage)]
    if user:
        raise AutoParallelError(
            "auto.auto_parallel=True cannot be combined with strategy scopes: this graph has "
            "%d TaskGraph(s) from epl.replicate/epl.split/set_default_strategy (%s). Either "
            "remove the scopes and let EPL cut the model into pipeline.num_stages stages, or "
            "set auto.auto_parallel=False to use your scopes"
            % (len(user), ", ".join("%r %r" % (tg.name, tg.strategy) for tg in user)))


# ---- describing the forward graph ------------------------------------------------------
def forward_nodes(view):
    """The user's forward ops as :class:`~epl.parallel.partition.Node` records, in
    graph order."""
    ops = view.ops(phases=(Phase.FORWARD,))
    index = dict((id(op), i) for i, op in enumerate(ops))
    groups = _groups(ops, index)
    sources = _sources(view, ops, index)
    nodes = []
    for i, op in enumerate(ops):
        inputs = []
        for producer in [t.op for t in op.inputs] + list(op.control_inputs):
            j = index.get(id(producer))
            if j is None or (op.type in _MERGE and producer.type in _NEXT_ITERATION):
                continue
            inputs.append(j)
        nodes.append(partition_lib.Node(op.name, op.type, tuple(inputs), _cost(op),
                                        i in sources, groups.get(i)))
    return nodes


def _shape(tensor):
    shape = tensor.shape
    return None if shape.ndims is None else tuple(shape.as_list())


def _cost(op):
    attrs = {}
    for name in _COST_ATTRS.get(op.type, ()):
        try:
            attrs[name] = op.get_attr(name)
        except ValueError:
            pass
    return partition_lib.op_cost(op.type, [_shape(t) for t in op.inputs],
                                 [_shape(t) for t in op.outputs], attrs)


def _sources(view, ops, index):
    """Indices of the ops that bring a batch in: get-next ops and placeholders; when
    the loss reaches none, the random ops it reaches (a model fed by tf.random)."""
    found = set(i for i, op in enumerate(ops) if op.type in GET_NEXT_TYPES | PLACEHOLDER_TYPES)
    losses = [getattr(y, "op", y) for call in view.gradient_calls for y in call.ys]
    feeding = [index[id(op)] for op in ancestor_ops(losses) if id(op) in index]
    if not any(i in found for i in feeding):
        found |= set(i for i in feeding if ops[i].type in _RANDOM)
    return found


class _Union(object):
    def __init__(self):
        self.parent = {}

    def find(self, item):
        root = item
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        while item != root:
            self.parent[item], item = root, self.parent.get(item, item)
        return root

    def union(self, a, b):
        a, b = self.find(a), self.find(b)
        if a != b:
            self.parent[max(a, b)] = min(a, b)


def _groups(ops, index):
    """{op index: group key} for ops that must share a stage: the bodies of while
    loops (Enter to Exit) and conds (Switch to Merge), and ops colocated with another
    forward op. Found structurally."""
    union = _Union()
    in_loop = _walk(ops, index, union, _LOOP_ENTRY, _LOOP_EXIT, set())
    _walk(ops, index, union, _SWITCH, _MERGE, in_loop)
    for i, op in enumerate(ops):
        root = tf_adapter.colocation_root(op)
        if root and root != op.name:
            try:
                j = index.get(id(op.graph.get_operation_by_name(root)))
            except (KeyError, ValueError):
                j = None
            if j is not None:
                union.union(i, j)
    members = {}
    for i in union.parent:
        members.setdefault(union.find(i), []).append(i)
    return dict((i, key) for key, group in members.items() if len(group) > 1 for i in group)


def _walk(ops, index, union, starts, stops, skip):
    """Union every start op with what its outputs reach up to (and including) a stop
    op; returns the indices visited."""
    seen = set()
    for i, op in enumerate(ops):
        if op.type not in starts or i in skip:
            continue
        stack = [op]
        while stack:
            current = stack.pop()
            j = index.get(id(current))
            if j is None:
                continue
            union.union(i, j)
            if j in seen:
                continue
            seen.add(j)
            if current.type in stops and current is not op:
                continue
            stack.extend(c for t in current.outputs for c in t.consumers())
    return seen


# ---- moving ops into the stages ---------------------------------------------------------
def _apply(view, stage_of, num_stages):
    """Give every op of the user's graph its stage, then move the ops into one new
    TaskGraph per stage (the implicit TaskGraph, left empty, is dropped)."""
    stages = dict(stage_of)
    graph = view.tf_graph
    for op in graph.get_operations():
        info = view.info(op)
        if info is None or info.taskgraph is None or op.name in stages:
            continue
        stages[op.name] = _follow(view, op, info, stages, num_stages)
    indices = [view.add_taskgraph(AutoStage(1, name="stage_%d" % s)) for s in range(num_stages)]
    view.move_ops(dict((name, indices[stage]) for name, stage in stages.items()))
    view.compact()


def _follow(view, op, info, stages, num_stages):
    """Stage of a non-forward op, by the IR's own rules."""
    if info.phase == Phase.BACKWARD:
        source = view.gradient_sources.get(op.name)
        if source in stages:
            return stages[source]
    root = tf_adapter.colocation_root(op)
    if root in stages:
        return stages[root]
    known = [stages[p.name] for p in [t.op for t in op.inputs] + list(op.control_inputs)
             if p.name in stages]
    return max(known) if known else num_stages - 1


# ---- the pass ----------------------------------------------------------------------------
class AutoStages(Pass):
    """Check the automatic stages the plan was made from (see the module doc)."""

    name = "auto_stages"
    phase = MODEL
    reads = ("view", "config", "plan")
    writes = ()

    def applies(self, ctx):
        return (ctx.config.auto.auto_parallel
                and partition_lib.stage_count(ctx.config) > 1)

    def run(self, ctx):
        view = ctx.view
        num_stages = partition_lib.stage_count(ctx.config)
        if _PARTITION.get(view) is None or len(ctx.plan.taskgraphs) != num_stages:
            raise RuntimeError(
                "auto.auto_parallel: the plan has %d TaskGraph(s) but pipeline.num_stages=%d; "
                "the stages must be made before planning (rewriter.plan_for calls "
                "epl.parallel.passes.auto_stages.partition_stages)"
                % (len(ctx.plan.taskgraphs), num_stages))
        wrong = backward_edges(view)
        if wrong:
            raise RuntimeError(
                "auto.auto_parallel: %d forward edge(s) go from a later stage to an earlier "
                "one, for example %s; were ops created after the first session.run?"
                % (len(wrong), ", ".join("%s -> %s" % pair for pair in wrong[:3])))


def backward_edges(view):
    """[(producer, consumer)] forward edges from a later TaskGraph to an earlier one."""
    wrong = []
    for op in view.ops(phases=(Phase.FORWARD,)):
        stage = view.info(op).taskgraph
        for producer in [t.op for t in op.inputs] + list(op.control_inputs):
            info = view.info(producer)
            if info is None or info.phase != Phase.FORWARD or info.taskgraph is None:
                continue
            if info.taskgraph > stage and not (op.type in _MERGE
                                               and producer.type in _NEXT_ITERATION):
                wrong.append((producer.name, op.name))
    return wrong
