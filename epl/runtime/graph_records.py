"""Records a build-time saver keeps per EPL graph view.

AMP and gradient checkpointing record what they did while the user builds the
step (conversions, loss scales, checkpoints) so that later hooks, passes and
tests can read it. The table holds views weakly: records die with their graph.
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
