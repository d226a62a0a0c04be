"""EPL's view of a ``tf.Graph``: TaskGraphs and a side table of every op.

The table maps op name -> :class:`OpInfo` (TaskGraph, phase, replica,
micro-batch, origin). Nothing is ever parsed back out of op names.

How ops get their TaskGraph:
  * forward ops: the strategy segment active when they are created; ops
    outside every scope join the most recent replicate TaskGraph (or, before
    any exists, the first TaskGraph created later). Ops that existed before
    EPL first saw the graph (a dataset built before ``epl.init``) are treated
    the same way;
  * backward and apply ops (created inside ``tf.gradients`` /
    ``apply_gradients``): the TaskGraph of the op they are colocated with
    (EPL turns on ``colocate_gradients_with_ops``, and optimizers colocate
    updates with their variable), else the highest TaskGraph among their inputs;
  * user ops that consume gradients (clipping) become backward ops of the
    highest TaskGraph among those inputs; ops consuming apply outputs, apply ops.

Example::

    >>> g = Graph.get()          # the default tf.Graph's EPL view
    >>> print(g)                 # TaskGraphs with op counts per phase
    >>> g.num_stages, g.taskgraphs[0].num_replicas

Empty TaskGraphs (a ``set_default_strategy`` whose strategy got no ops) are
dropped before planning (:meth:`Graph.ensure_taskgraph`), so they never take
devices or pipeline stages. Introspection uses the original EPL's names
(``num_stages``, ``pipeline_enabled``, ``gradients``, ``operations``; per
TaskGraph ``num_replicas``, ``local_num_replicas``, ``virtual_device``,
``get_variables()``, ``is_first_stage``); values that need the plan are
computed from the Env's config and cluster when asked.
"""
import collections
import contextlib
import logging
import types
import weakref

from epl import tf_adapter
from epl.cluster import VirtualDevice
from epl.ir.collections import GraphKeys
from epl.ir.phase import Phase
from epl.ir.taskgraph import REPLICATE, OpInfo, TaskGraph, implicit_strategy

LOG = logging.getLogger("epl")
_REGISTRY = weakref.WeakKeyDictionary()

Specialization = collections.namedtuple("Specialization", ["builder", "inputs", "helpers"])


class Graph(object):
    """Per-``tf.Graph`` EPL state; get it with :meth:`Graph.get`."""

    # Set by epl.env (the API layer): config, cluster and plans for introspection, and
    # whether epl.init ran, so that the layers below never import the planner or the Env.
    introspection = None

    def __init__(self, tf_graph):
        self._tf_graph = weakref.ref(tf_graph)
        self.taskgraphs = []
        self.op_info = {}
        self.owner = None               # the epl.Env that created this view
        self.gradient_calls = []        # GradientCall per tf.gradients call
        self.apply_calls = []           # ApplyCall per optimizer.apply_gradients call
        self.collections = dict((key, []) for key in GraphKeys.ALL)
        self.specialized = {}           # op name -> builder(copy, micro_batch, inputs) -> op
        self._features = {}             # feature key -> its record (epl.ir.features)
        self.parallel = None            # the rewrite's result, once it has run
        self.rewrite_error = None       # why the rewrite failed, if it did
        self.gradient_sources = {}      # backward op name -> the forward op it differentiates
        self._segment_taskgraph = {}
        self._unassigned = []
        self._phases = [Phase.FORWARD]
        self._resolving = []
        self._forced = []               # (taskgraph, phase) while a model pass builds ops
        self._gradient_of = []          # forward ops whose gradient ops are being built
        self._adopted = set()           # ops that existed before this view (not yet re-seen)
        self.recorded_ops = 0           # ops registered while EPL's hooks were active
        self.plan_cache = None          # (key, plan) of the last introspection plan
        self._adopt_existing(tf_graph)

    # ---- per-graph feature state (epl.ir.features) --------------------------------
    def feature_state(self, key, factory=None):
        """The record feature ``key`` keeps for this graph; made by ``factory`` when
        missing (None without a factory). Units reach it through a FeatureSlot."""
        record = self._features.get(key)
        if record is None and factory is not None:
            record = self._features[key] = factory()
        return record

    def set_feature_state(self, key, record):
        self._features[key] = record

    @property
    def auto_partition(self):
        """The stage cut of ``auto.auto_parallel`` (a Partition), or None (public API;
        kept by epl.parallel.passes.auto_stages under the feature key below)."""
        return self._features.get("auto_partition")

    # ---- lookup --------------------------------------------------------------
    @classmethod
    def get(cls, tf_graph=None, create=True, may_create=None):
        """The EPL view of ``tf_graph`` (default: the current default graph).

        Without a view yet, one is created unless ``create`` (or the original
        EPL's spelling ``may_create``) is False; then None is returned.
        """
        if may_create is not None:
            create = may_create
        tf_graph = tf_graph if tf_graph is not None else tf_adapter.get_default_graph()
        graph = _REGISTRY.get(tf_graph)
        if graph is None and create:
            graph = _REGISTRY[tf_graph] = cls(tf_graph)
        return graph

    @classmethod
    def forget(cls, tf_graph=None):
        """Drop the EPL view of one graph (default: the current default graph)."""
        tf_graph = tf_graph if tf_graph is not None else tf_adapter.get_default_graph()
        _REGISTRY.pop(tf_graph, None)

    @classmethod
    def reset_all(cls):
        """Forget every EPL view."""
        _REGISTRY.clear()

    @property
    def tf_graph(self):
        return self._tf_graph()

    @property
    def phase(self):
        return self._phases[-1]

    def specialize(self, op, builder, inputs=None, helpers=()):
        """Mark ``op`` (built for copy 0, micro-batch 0) as one that every other copy and
        micro-batch builds with ``builder(copy, micro_batch, inputs) -> op`` instead of
        cloning it: collectives whose rank and group depend on the copy.

        ``inputs`` are the tensors the builder reads (default: ``op``'s inputs); the
        builder gets each copy's version of them. ``helpers`` are other ops the
        builder made for copy 0 on the way to ``op``; they are never copied."""
        self.specialized[op.name] = Specialization(
            builder, list(op.inputs) if inputs is None else list(inputs),
            frozenset(h.name for h in helpers))

    def raw_gradient(self, var_op_name):
        """The gradient ``tf.gradients`` last returned for a variable, or None."""
        for call in reversed(self.gradient_calls):
            grad = call.gradient_of(var_op_name)
            if grad is not None:
                return grad
        return None

    @property
    def has_training_step(self):
        """True once an optimizer applied gradients (there is a step to parallelize)."""
        return any(len(call) for call in self.apply_calls)

    def info(self, op_or_name):
        name = op_or_name if isinstance(op_or_name, str) else op_or_name.name
        return self.op_info.get(name)

    # ---- registration ----------------------------------------------------------
    @contextlib.contextmanager
    def phase_scope(self, phase):
        """Ops created inside get ``phase``; their TaskGraph is resolved on exit.

        Used around ``tf.gradients`` (BACKWARD), ``apply_gradients`` (APPLY),
        savers/scaffolds (SESSION) and EPL's own rewrite (EPL).
        """
        self._phases.append(phase)
        self._resolving.append([])
        try:
            yield
        finally:
            created = self._resolving.pop()
            self._phases.pop()
            if phase != Phase.EPL:
                self._resolve(created)

    @contextlib.contextmanager
    def gradient_of(self, op):
        """Ops created inside are part of ``op``'s gradient: they join its TaskGraph.

        tf.gradients opens this context (through EPL's hook) around the gradient
        ops of every forward op, which attributes backward ops to stages without
        forcing ``colocate_gradients_with_ops`` (which slows graph building)."""
        self._gradient_of.append(op)
        try:
            yield
        finally:
            self._gradient_of.pop()

    @contextlib.contextmanager
    def building(self, taskgraph, phase):
        """Ops created inside belong to ``taskgraph`` and ``phase``, whatever scope is
        active: for model passes that add ops to the user's single-copy model
        (split layers, recomputation, casts), which are then classified and
        copied like the user's own ops."""
        self._forced.append((taskgraph, phase))
        try:
            yield
        finally:
            self._forced.pop()

    def _adopt_existing(self, tf_graph):
        """Ops created before EPL saw the graph join the first TaskGraph, as forward ops."""
        for op in tf_graph.get_operations():
            self.op_info[op.name] = OpInfo(None, Phase.FORWARD)
            self._unassigned.append(op.name)
            self._adopted.add(op.name)

    def open_segment(self, segment):
        """Create the TaskGraph of ``segment`` now (``set_default_strategy``)."""
        return self._taskgraph_for_segment(segment)

    def register_op(self, op, segment):
        """Record a newly created op (called by the op-creation hook)."""
        self.recorded_ops += 1
        if self._adopted and op.name in self._adopted:
            # The op that made the hook create this view: register it properly.
            self._adopted.discard(op.name)
            if op.name in self._unassigned:
                self._unassigned.remove(op.name)
        if self._forced:
            taskgraph, phase = self._forced[-1]
            self.op_info[op.name] = OpInfo(taskgraph, phase)
            self.taskgraphs[taskgraph].op_names.append(op.name)
            return
        phase = self.phase
        taskgraph = None
        if phase == Phase.FORWARD:
            phase, taskgraph = self._phase_from_inputs(op)
            if phase == Phase.FORWARD:
                taskgraph = self._taskgraph_for_segment(segment)
        elif phase == Phase.BACKWARD and self._gradient_of:
            self.gradient_sources[op.name] = self._gradient_of[-1].name
            forward = self.op_info.get(self._gradient_of[-1].name)
            taskgraph = forward.taskgraph if forward is not None else None
        info = OpInfo(taskgraph, phase)
        self.op_info[op.name] = info
        if taskgraph is not None:
            self.taskgraphs[taskgraph].op_names.append(op.name)
        elif phase == Phase.FORWARD or not self._resolving:
            self._unassigned.append(op.name)
        else:
            self._resolving[-1].append(op)

    def record_clone(self, op, source_info, copy, micro_batch, origin):
        """Register an op the rewrite cloned from a user op."""
        info = OpInfo(source_info.taskgraph, source_info.phase, copy, micro_batch, origin)
        self.op_info[op.name] = info
        if info.taskgraph is not None:
            self.taskgraphs[info.taskgraph].op_names.append(op.name)
        return info

    def _phase_from_inputs(self, op):
        """User code fed by gradients is backward; fed by updates, apply."""
        best = None
        for tensor_op in [t.op for t in op.inputs] + list(op.control_inputs):
            info = self.op_info.get(tensor_op.name)
            if info is None or info.phase not in (Phase.BACKWARD, Phase.APPLY):
                continue
            if info.copy or info.micro_batch:
                continue
            rank = (info.phase == Phase.APPLY, info.taskgraph or 0)
            if best is None or rank > best[0]:
                best = (rank, info.phase, info.taskgraph)
        if best is None:
            return Phase.FORWARD, None
        return best[1], best[2]

    def _taskgraph_for_segment(self, segment):
        if segment is None:
            return self._default_taskgraph()
        index = self._segment_taskgraph.get(segment.id)
        if index is None:
            index = self._segment_taskgraph[segment.id] = self._new_taskgraph(segment.strategy)
        return index

    def _default_taskgraph(self):
        """Most recent replicate TaskGraph (any kind if none), or None yet."""
        for taskgraph in reversed(self.taskgraphs):
            if taskgraph.kind == REPLICATE:
                return taskgraph.index
        return self.taskgraphs[-1].index if self.taskgraphs else None

    def _new_taskgraph(self, strategy, implicit=False):
        taskgraph = TaskGraph(len(self.taskgraphs), strategy, implicit, graph=self)
        self.taskgraphs.append(taskgraph)
        pending, self._unassigned = self._unassigned, []
        for name in pending:
            self.op_info[name].taskgraph = taskgraph.index
        taskgraph.op_names.extend(pending)
        return taskgraph.index

    def add_taskgraph(self, strategy):
        """Append an empty TaskGraph for ``strategy`` and return its index.

        For model passes that define TaskGraphs themselves (automatic pipeline
        stages); fill it with :meth:`move_ops`."""
        if self.parallel is not None:
            raise RuntimeError("TaskGraphs cannot be added after the rewrite")
        taskgraph = TaskGraph(len(self.taskgraphs), strategy, graph=self)
        self.taskgraphs.append(taskgraph)
        self.plan_cache = None
        return taskgraph.index

    def move_ops(self, assignment):
        """Move ops to other TaskGraphs before planning.

        ``assignment`` maps op names to TaskGraph indices; the op records and the
        TaskGraphs' op lists change together. TaskGraphs left empty are dropped by
        :meth:`compact`."""
        if self.parallel is not None:
            raise RuntimeError("ops cannot move between TaskGraphs after the rewrite")
        moved = dict((name, index) for name, index in assignment.items()
                     if self.op_info[name].taskgraph != index)
        if not moved:
            return
        for taskgraph in self.taskgraphs:
            taskgraph.op_names = [n for n in taskgraph.op_names if n not in moved]
        self._unassigned = [n for n in self._unassigned if n not in moved]
        for name, index in moved.items():
            self.op_info[name].taskgraph = index
            self.taskgraphs[index].op_names.append(name)
        self.plan_cache = None

    def ensure_taskgraph(self):
        """Prepare the TaskGraphs for planning (called before every plan).

        Gives unannotated models one implicit ``replicate(1)`` TaskGraph, places
        ops still waiting for a TaskGraph (created outside every scope) in the
        most recent replicate TaskGraph, and drops empty TaskGraphs (see
        :meth:`compact`).
        """
        if not self.taskgraphs:
            self._new_taskgraph(implicit_strategy(), implicit=True)
        elif self._unassigned:
            pending, self._unassigned = self._unassigned, []
            index = self._default_taskgraph()
            for name in pending:
                self.op_info[name].taskgraph = index
            self.taskgraphs[index].op_names.extend(pending)
        self._adopted.clear()
        self.compact()

    def live_taskgraphs(self):
        """TaskGraphs with ops (the first one if none has ops yet)."""
        live = [tg for tg in self.taskgraphs if tg.op_names]
        return live or self.taskgraphs[:1]

    def compact(self):
        """Drop TaskGraphs without ops and renumber the rest (and every op's record).

        A ``set_default_strategy`` whose strategy never got an op, for example,
        must not take devices or a pipeline stage. Returns ``{old: new}`` index
        mapping (empty when nothing changed). Never runs after the rewrite.
        """
        live = self.live_taskgraphs()
        if len(live) == len(self.taskgraphs) or self.parallel is not None:
            return {}
        mapping = dict((tg.index, new) for new, tg in enumerate(live))
        dropped = [tg for tg in self.taskgraphs if tg.index not in mapping]
        LOG.info("EPL: dropped %d empty TaskGraph(s) before planning (%s); renumbered %s",
                 len(dropped), ", ".join("%d %r" % (tg.index, tg.strategy) for tg in dropped),
                 ", ".join("%d->%d" % item for item in sorted(mapping.items())))
        for info in self.op_info.values():
            if info.taskgraph is not None:
                info.taskgraph = mapping[info.taskgraph]
        self._segment_taskgraph = dict((seg, mapping[index]) for seg, index
                                       in self._segment_taskgraph.items() if index in mapping)
        for record in self._features.values():
            if hasattr(record, "renumber"):
                record.renumber(mapping)
        for taskgraph in live:
            taskgraph.index = mapping[taskgraph.index]
        self.taskgraphs = live
        self.plan_cache = None
        return mapping

    def _resolve(self, ops):
        """Give backward/apply/session ops the TaskGraph of what they serve."""
        for op in ops:
            info = self.op_info.get(op.name)
            if info is None or info.taskgraph is not None:
                continue
            info.taskgraph = self._taskgraph_from_neighbours(op)
            if info.taskgraph is not None:
                self.taskgraphs[info.taskgraph].op_names.append(op.name)
            else:  # no TaskGraph exists yet: join the first one created
                self._unassigned.append(op.name)

    def _taskgraph_from_neighbours(self, op):
        root = tf_adapter.colocation_root(op)
        if root and root != op.name:
            info = self.op_info.get(root)
            if info is not None and info.taskgraph is not None:
                return info.taskgraph
        known = [self.op_info[o.name].taskgraph
                 for o in [t.op for t in op.inputs] + list(op.control_inputs)
                 if o.name in self.op_info and self.op_info[o.name].taskgraph is not None]
        if known:
            return max(known)
        return self._default_taskgraph()

    # ---- queries ---------------------------------------------------------------
    def ops(self, taskgraph=None, phases=None, copy=0, micro_batch=0):
        """tf.Operations matching the filters, in creation order."""
        graph = self.tf_graph
        result = []
        for op in graph.get_operations():
            info = self.op_info.get(op.name)
            if info is None:
                continue
            if taskgraph is not None and info.taskgraph != taskgraph:
                continue
            if phases is not None and info.phase not in phases:
                continue
            if copy is not None and info.copy != copy:
                continue
            if micro_batch is not None and info.micro_batch != micro_batch:
                continue
            result.append(op)
        return result

    # ---- introspection (read-only, the original EPL's names) -------------------
    def _context(self):
        if Graph.introspection is None:
            raise RuntimeError("EPL introspection needs epl.Env: import epl and call "
                               "epl.init() first")
        return Graph.introspection

    @property
    def num_stages(self):
        """Pipeline stages of the model: 1 without a pipeline, 0 before any TaskGraph.

        TaskGraphs colocated by ``cluster.colocate_split_and_replicate`` form one stage.
        """
        live = self.live_taskgraphs()
        config, _ = self._context().config_and_cluster(self)
        if live and config.cluster.colocate_split_and_replicate:
            return 1
        return len(live)

    @property
    def pipeline_enabled(self):
        """True when micro-batches flow through two or more stages."""
        config, _ = self._context().config_and_cluster(self)
        return self.num_stages >= 2 and config.pipeline.num_micro_batch > 1

    @property
    def gradients(self):
        """Gradient tensors given to ``apply_gradients``, in call order."""
        return [grad for call in self.apply_calls for grad, _ in call]

    @property
    def operations(self):
        """Read-only ``{name: tf.Operation}`` of every op EPL recorded, in creation order."""
        ops = collections.OrderedDict((op.name, op) for op in self.tf_graph.get_operations()
                                      if op.name in self.op_info)
        return types.MappingProxyType(ops)

    def placement(self, cluster=None):
        """``(plan, {TaskGraph index: plan TaskGraph index})`` or None without TaskGraphs.

        After the rewrite this is the plan the rewrite used; before it, the plan
        of the TaskGraphs that have ops, on the Env's config and ``cluster``
        (default: the Env's).
        """
        if self.parallel is not None:
            plan = self.parallel.plan
            return plan, dict((i, i) for i in range(len(plan.taskgraphs)))
        live = self.live_taskgraphs()
        if not live:
            return None
        plan = self._context().plan(self, live, cluster)
        return plan, dict((tg.index, i) for i, tg in enumerate(live))

    def virtual_devices(self, cluster=None):
        """``[VirtualDevice]`` of the TaskGraphs that take devices, in order."""
        placed = self.placement(cluster)
        if placed is None:
            return []
        plan, plan_index = placed
        worker = self._worker(cluster)
        return [_virtual_device(plan, plan_index[tg.index], worker, tg.index)
                for tg in self.taskgraphs if tg.index in plan_index]

    def _worker(self, cluster=None):
        if cluster is None:
            _, cluster = self._context().config_and_cluster(self)
        return cluster.worker_index

    def variables_of(self, taskgraph):
        """The user's global variables (copy 0) whose variable op is in ``taskgraph``."""
        result = []
        graph = self.tf_graph
        for variable in graph.get_collection(tf_adapter.tf.GraphKeys.GLOBAL_VARIABLES):
            info = self.op_info.get(variable.op.name)
            if info is not None and info.taskgraph == taskgraph and info.copy == 0:
                result.append(variable)
        return result

    def phase_counts(self, taskgraph):
        counts = dict((phase, 0) for phase in Phase.ALL)
        for name in taskgraph.op_names:
            info = self.op_info[name]
            if info.copy == 0 and info.micro_batch == 0:
                counts[info.phase] += 1
        return counts

    def __str__(self):
        lines = ["epl.Graph with %d TaskGraph(s)" % len(self.taskgraphs)]
        for taskgraph in self.taskgraphs:
            counts = self.phase_counts(taskgraph)
            summary = ", ".join("%s=%d" % (p, n) for p, n in counts.items() if n)
            lines.append("  [%d] %s %r: %s" % (
                taskgraph.index, taskgraph.name, taskgraph.strategy, summary or "no ops"))
        if self._unassigned:
            lines.append("  (%d op(s) outside any scope, not yet assigned)"
                         % len(self._unassigned))
        return "\n".join(lines)

    __repr__ = __str__


def _virtual_device(plan, plan_index, worker, taskgraph_index):
    tg_plan = plan.taskgraphs[plan_index]
    local = tuple(d for replica in tg_plan.devices for d in replica
                  if plan.worker_of.get(d) == worker)
    return VirtualDevice(taskgraph_index, tg_plan.name, tg_plan.devices, local)
