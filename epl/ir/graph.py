"""EPL's view of a ``tf.Graph``: TaskGraphs and a side table of every op.

The table maps op name -> :class:`OpInfo` (TaskGraph, phase, replica,
micro-batch, origin). Nothing is ever parsed back out of op names.

How ops get their TaskGraph:
  * forward ops: the strategy segment active when they are created; ops
    outside every scope join the most recent replicate TaskGraph (or, before
    any exists, the first TaskGraph created later);
  * backward and apply ops (created inside ``tf.gradients`` /
    ``apply_gradients``): the TaskGraph of the op they are colocated with
    (EPL turns on ``colocate_gradients_with_ops``, and optimizers colocate
    updates with their variable), else the highest TaskGraph among their inputs;
  * user ops that consume gradients (clipping) become backward ops of the
    highest TaskGraph among those inputs; ops consuming apply outputs, apply ops.

Example::

    >>> g = Graph.get()          # the default tf.Graph's EPL view
    >>> print(g)                 # TaskGraphs with op counts per phase
"""
import contextlib
import weakref

from epl import tf_adapter
from epl.ir.collections import GraphKeys
from epl.ir.phase import Phase
from epl.ir.taskgraph import REPLICATE, OpInfo, TaskGraph, implicit_strategy

_REGISTRY = weakref.WeakKeyDictionary()


class Graph(object):
    """Per-``tf.Graph`` EPL state; get it with :meth:`Graph.get`."""

    def __init__(self, tf_graph):
        self._tf_graph = weakref.ref(tf_graph)
        self.taskgraphs = []
        self.op_info = {}
        self.owner = None               # the epl.Env that created this view
        self.gradient_calls = []        # GradientCall per tf.gradients call
        self.apply_calls = []           # ApplyCall per optimizer.apply_gradients call
        self.collections = dict((key, []) for key in GraphKeys.ALL)
        self.specialized = {}           # op name -> builder(copy, micro_batch, inputs) -> op
        self.sharded_variables = {}     # variable op name -> ShardInfo (epl.ops)
        self.layer_collectives = []     # collectives split layers asked for (epl.ops)
        self.parallel = None            # the rewrite's result, once it has run
        self.rewrite_error = None       # why the rewrite failed, if it did
        self._segment_taskgraph = {}
        self._unassigned = []
        self._phases = [Phase.FORWARD]
        self._resolving = []
        self._forced = []               # (taskgraph, phase) while a model pass builds ops
        self._gradient_of = []          # forward ops whose gradient ops are being built

    # ---- lookup --------------------------------------------------------------
    @classmethod
    def get(cls, tf_graph=None, create=True):
        """The EPL view of ``tf_graph`` (default: the current default graph)."""
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

    def specialize(self, op, builder):
        """Mark ``op`` (built for copy 0, micro-batch 0) as one that every other copy and
        micro-batch builds with ``builder(copy, micro_batch, inputs) -> op`` instead of
        cloning it: collectives whose rank and group depend on the copy."""
        self.specialized[op.name] = builder

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

    def register_op(self, op, segment):
        """Record a newly created op (called by the op-creation hook)."""
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
        taskgraph = TaskGraph(len(self.taskgraphs), strategy, implicit)
        self.taskgraphs.append(taskgraph)
        pending, self._unassigned = self._unassigned, []
        for name in pending:
            self.op_info[name].taskgraph = taskgraph.index
        taskgraph.op_names.extend(pending)
        return taskgraph.index

    def ensure_taskgraph(self):
        """Give unannotated models one implicit ``replicate(1)`` TaskGraph.

        Also places ops still waiting for a TaskGraph (created outside every
        scope) in the most recent replicate TaskGraph.
        """
        if not self.taskgraphs:
            self._new_taskgraph(implicit_strategy(), implicit=True)
        elif self._unassigned:
            pending, self._unassigned = self._unassigned, []
            index = self._default_taskgraph()
            for name in pending:
                self.op_info[name].taskgraph = index
            self.taskgraphs[index].op_names.extend(pending)

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
