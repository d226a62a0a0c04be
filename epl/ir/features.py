"""Per-graph state of EPL's features, in one table on the IR view, one access pattern.

A feature (AMP, gradient checkpointing, split layers, automatic stages, ZeRO) keeps
what it decided while the user built the step in a record of its own, stored on the
graph's :class:`epl.ir.Graph` under the feature's key. The IR knows no feature: the
key and the record's class belong to the unit that declares the slot::

    _STATES = FeatureSlot("amp", AmpState)
    _STATES.of(view)          # the view's AmpState, created on first use
    _STATES.get(view)         # or None
    _STATES.for_graph(graph)  # the record of a tf.Graph (default graph), or None

Records live and die with their view (so with their tf.Graph). A record whose
class defines ``renumber(mapping)`` is told when the IR compacts TaskGraph indices
(empty TaskGraphs are dropped before planning).
"""
from epl.ir.graph import Graph


class FeatureSlot(object):
    """The per-graph record of one feature: ``key`` names it, ``factory`` makes it."""

    def __init__(self, key, factory):
        self.key = key
        self._factory = factory

    def of(self, view):
        """The view's record, created if missing."""
        return view.feature_state(self.key, self._factory)

    def get(self, view):
        """The view's record, or None."""
        return view.feature_state(self.key) if view is not None else None

    def set(self, view, record):
        """Replace the view's record (a feature whose record is a value, not a table)."""
        view.set_feature_state(self.key, record)

    def for_graph(self, graph=None):
        """The record of a ``tf.Graph`` (default graph), or None."""
        return self.get(Graph.get(graph, create=False))

    def __repr__(self):
        return "FeatureSlot(%r)" % self.key
