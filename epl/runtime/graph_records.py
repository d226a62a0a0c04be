"""Records a build-time saver keeps per EPL graph view.

AMP and gradient checkpointing record what they did while the user builds the
step (conversions, loss scales, checkpoints) so that later hooks, passes and
tests can read it. The table holds views weakly: records die with their graph.

One record is shared: which ops a build-time rewrite *replaced* (AMP's float16
twins take over every forward consumer of the float32 op). A tensor the user
holds, such as an entry of the ``checkpoints`` collection, is followed to the op
that now plays its part with :func:`current_tensor`, so savers compose without
importing each other.
"""
import weakref

from epl.ir.graph import Graph


class PerGraph(object):
    """{epl.Graph view: record}, a record made by ``factory`` on first use."""

    def __init__(self, factory):
        self._factory = factory
        self._records = weakref.WeakKeyDictionary()

    def of(self, view):
        """The view's record, created if missing."""
        found = self._records.get(view)
        if found is None:
            found = self._records[view] = self._factory()
        return found

    def get(self, view):
        """The view's record, or None."""
        return self._records.get(view)

    def for_graph(self, graph=None):
        """The record of a ``tf.Graph`` (default graph), or None."""
        view = Graph.get(graph, create=False)
        return self._records.get(view) if view is not None else None


_REPLACED = PerGraph(dict)   # {op name: the op that replaced it for its forward consumers}


def record_replacement(view, original, replacement):
    """``replacement`` (same outputs, in order) now feeds ``original``'s forward consumers."""
    _REPLACED.of(view)[original.name] = replacement


def current_tensor(view, tensor):
    """The tensor that plays ``tensor``'s part after the build-time rewrites so far."""
    table = _REPLACED.get(view)
    seen = set()
    while table and tensor.op.name in table and tensor.op.name not in seen:
        seen.add(tensor.op.name)
        tensor = table[tensor.op.name].outputs[tensor.value_index]
    return tensor
