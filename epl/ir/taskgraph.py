"""TaskGraph: the ops of one strategy-scope entry, the unit EPL places and clones."""
import collections

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

    Example::

        >>> tg = TaskGraph(0, epl.replicate(name="stage_0"))
        >>> tg.name, tg.kind, tg.device_count
        ('stage_0', 'replicate', 1)
    """

    def __init__(self, index, strategy, implicit=False):
        self.index = index
        self.strategy = strategy
        self.implicit = implicit
        self.op_names = []

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

    def __repr__(self):
        return "TaskGraph(%d, %r%s, %d ops)" % (
            self.index, self.strategy, ", implicit" if self.implicit else "",
            len(self.op_names))


def implicit_strategy():
    """Strategy of the TaskGraph EPL creates when the user annotated nothing."""
    return ImplicitStrategy(REPLICATE, 1, None)
