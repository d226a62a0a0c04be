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

from epl.ir.features import FeatureSlot
from epl.ir.graph import Graph
from epl.ir.taskgraph import SPLIT
from epl.strategies.context import get_context

ShardInfo = collections.namedtuple("ShardInfo", ["layer", "full_shape", "axis", "width"])
ShardInfo.__doc__ = """A sharded variable or tensor: the layer that made it, the unsplit
shape, the sharded axis and the number of shards."""


class SplitState(object):
    """What the split layers of one graph built."""

    def __init__(self):
        self.sharded_variables = {}  # variable op name -> ShardInfo
        self.intents = []          # epl.ops.intents.Intent, in creation order
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


_SPLIT = FeatureSlot("split", SplitState)
_NONE = SplitState()   # what a graph without split layers holds (never written)


def state(graph):
    """The SplitState of the tf.Graph ``graph`` (created on first use)."""
    return _SPLIT.of(Graph.get(graph))


def peek(graph):
    """The SplitState of ``graph`` for reading: an empty one when the graph has none
    (function bodies, graphs EPL never saw; no EPL view is made for them)."""
    return _SPLIT.get(Graph.get(graph, create=False)) or _NONE


def sharded_variables(view):
    """{variable op name: ShardInfo} of the variables split layers sharded in ``view``."""
    found = _SPLIT.get(view)
    return found.sharded_variables if found is not None else {}


def split_width():
    """Device count of the active ``epl.split`` scope, or None outside one."""
    segment = get_context().current
    if segment is None or segment.strategy.kind != SPLIT:
        return None
    return segment.strategy.device_count or 1


def is_sharded(tensor):
    return getattr(tensor, "name", None) in peek(tensor.graph).sharded


def shard_info(tensor):
    return peek(tensor.graph).sharded.get(tensor.name)


def is_replica_level(tensor):
    return getattr(tensor, "name", None) in peek(tensor.graph).replica_level


def view_of(graph):
    return Graph.get(graph)
