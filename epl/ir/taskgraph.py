"""TaskGraph: the ops of one strategy segment, the unit EPL places and clones."""
import collections
import weakref

# The two kinds of strategy; epl.strategies builds its scope classes on them.
REPLICATE = "replicate"
SPLIT = "split"


class ImplicitStrategy(collections.namedtuple("ImplicitStrategy", ["kind", "device_count",
                                                                   "name"])):
    """The strategy of the TaskGraph EPL creates when the user annotated nothing:
    ``replicate(device_count=1)`` as data (the IR does not import scope classes)."""

    __slots__ = ()

    def __repr__(self):
        return "replicate(device_count=1)"


class OpInfo(object):
    """Side-table record of one op: where it belongs in the parallel program.

    ``taskgraph`` is an index (None while unresolved); ``copy`` is the local
    copy of the model the op belongs to (see :class:`epl.parallel.mesh.Copy`)
    and ``micro_batch`` its micro-batch, both 0 for the user's own ops;
    ``origin`` names the user op a clone was made from (None for user ops).
    """

    __slots__ = ("taskgraph", "phase", "copy", "micro_batch", "origin")

    def __init__(self, taskgraph, phase, copy=0, micro_batch=0, origin=None):
        self.taskgraph = taskgraph
        self.phase = phase
        self.copy = copy
        self.micro_batch = micro_batch
        self.origin = origin

    def __repr__(self):
        return "OpInfo(tg=%s, %s, copy=%d, micro_batch=%d%s)" % (
            self.taskgraph, self.phase, self.copy, self.micro_batch,
            ", origin=%s" % self.origin if self.origin else "")


class TaskGraph(object):
    """One parallel sub-graph: a strategy plus the ops created under it.

    Introspection in the original EPL's names (read-only; values that need the
    plan are computed from the Env's config and cluster when asked):
    ``num_replicas``, ``local_num_replicas``, ``virtual_device``,
    ``get_variables()``, ``is_first_stage``, ``is_last_stage``.

    Example::

        >>> tg = TaskGraph(0, epl.replicate(name="stage_0"))
        >>> tg.name, tg.kind, tg.device_count
        ('stage_0', 'replicate', 1)
    """

    def __init__(self, index, strategy, implicit=False, graph=None):
        self.index = index
        self.strategy = strategy
        self.implicit = implicit
        self.op_names = []
        self._graph = weakref.ref(graph) if graph is not None else None

    @property
    def name(self):
        return self.strategy.name or "taskgraph_%d" % self.index

    @property
    def kind(self):
        return self.strategy.kind

    @property
    def device_count(self):
        """Devices one model replica of this TaskGraph uses (None means 1)."""
        return self.strategy.device_count or 1

    @property
    def is_replicate(self):
        return self.kind == REPLICATE

    # ---- introspection -------------------------------------------------------------
    def _view(self):
        graph = self._graph() if self._graph is not None else None
        if graph is None:
            raise RuntimeError("TaskGraph %d belongs to no epl.Graph" % self.index)
        return graph

    def _placement(self):
        """(plan, index in the plan) or (plan or None, None) when it takes no devices."""
        placed = self._view().placement()
        if placed is None:
            return None, None
        plan, plan_index = placed
        return plan, plan_index.get(self.index)

    @property
    def virtual_device(self):
        """Its devices in the plan (:class:`epl.cluster.VirtualDevice`), None while it
        has no ops (an empty TaskGraph takes no devices)."""
        for device in self._view().virtual_devices():
            if device.taskgraph == self.index:
                return device
        return None

    @property
    def num_replicas(self):
        """Model replicas of this TaskGraph in the whole job (0 while it has no ops)."""
        plan, index = self._placement()
        return 0 if index is None else len(plan.taskgraphs[index].devices)

    @property
    def local_num_replicas(self):
        """Model replicas with a device of this TaskGraph on this worker."""
        device = self.virtual_device
        if device is None:
            return 0
        local = set(device.local_devices)
        return sum(1 for replica in device.devices if local.intersection(replica))

    def get_variables(self):
        """The global variables of this TaskGraph (optimizer slots included; the
        user's model, not EPL's copies of it)."""
        return self._view().variables_of(self.index)

    @property
    def stage(self):
        """Position among the pipeline stages; 0 when the model is not a pipeline."""
        plan, index = self._placement()
        if index is None or index not in plan.stages:
            return 0
        return plan.stages.index(index)

    @property
    def is_first_stage(self):
        return self.stage == 0

    @property
    def is_last_stage(self):
        plan, index = self._placement()
        if index is None or not plan.stages:
            return True
        return self.stage == len(plan.stages) - 1

    def __repr__(self):
        return "TaskGraph(%d, %r%s, %d ops)" % (
            self.index, self.strategy, ", implicit" if self.implicit else "",
            len(self.op_names))


def implicit_strategy():
    """Strategy of the TaskGraph EPL creates when the user annotated nothing."""
    return ImplicitStrategy(REPLICATE, 1, None)
