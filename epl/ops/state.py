"""Per-graph bookkeeping of split layers: sharded tensors, replica-level tensors, own ops.

* a *sharded* tensor holds this copy's columns of a layer's output (logits of a
  split dense layer): only split-aware ops may read it;
* a *replica-level* tensor covers the whole replica's batch (gathered rows), as
  the outputs of split losses and metrics do;
* ``own_ops`` are the ops split implementations built, which may read sharded
  tensors; :mod:`epl.ops.lowering` refuses any other reader, naming it.
"""
import collections
import contextlib
import weakref

from epl.ir.graph import Graph
from epl.ir.taskgraph import SPLIT
from epl.strategies.context import get_context

ShardInfo = collections.namedtuple("ShardInfo", ["layer", "full_shape", "axis", "width"])
ShardInfo.__doc__ = """A sharded variable or tensor: the layer that made it, the unsplit
shape, the sharded axis and the number of shards."""

_STATES = weakref.WeakKeyDictionary()


class SplitState(object):
    """What the split layers of one graph built."""

    def __init__(self):
        self.sharded = {}          # tensor name -> ShardInfo
        self.replica_level = {}    # tensor name -> split width, for tensors covering the
        #                            replica's whole batch (gathered rows)
        self.own_ops = set()       # op names built by split implementations
        self.experts = {}          # expert variable op name -> split width
        self.expert_local = {}     # tensor name -> split width (computed from own experts)
        self.creating = False      # a split layer is making its own sharded variable
        self._depth = 0

    @contextlib.contextmanager
    def implementing(self, view):
        """Ops created inside are split implementation ops (readers of sharded tensors)."""
        before = len(view.op_info)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            self.own_ops.update(list(view.op_info)[before:])

    @property
    def active(self):
        """True while a split implementation is building (do not intercept again)."""
        return self._depth > 0


def state(graph):
    """The SplitState of ``graph`` (created on first use)."""
    found = _STATES.get(graph)
    if found is None:
        found = _STATES[graph] = SplitState()
    return found


def split_width():
    """Device count of the active ``epl.split`` scope, or None outside one."""
    segment = get_context().current
    if segment is None or segment.strategy.kind != SPLIT:
        return None
    return segment.strategy.device_count or 1


def is_sharded(tensor):
    return getattr(tensor, "name", None) in state(tensor.graph).sharded


def shard_info(tensor):
    return state(tensor.graph).sharded.get(tensor.name)


def is_replica_level(tensor):
    return getattr(tensor, "name", None) in state(tensor.graph).replica_level


def view_of(graph):
    return Graph.get(graph)
