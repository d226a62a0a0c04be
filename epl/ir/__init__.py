"""EPL's intermediate representation: TaskGraphs, phases and the op side table.

Names are loaded lazily: the kinds and phases (``epl.ir.taskgraph``,
``epl.ir.phase``) are plain Python that the planner and the strategy scopes
use without importing TensorFlow; the graph view needs TensorFlow.
"""
import importlib

_EXPORTS = {
    "Graph": "epl.ir.graph",
    "GraphKeys": "epl.ir.collections",
    "Phase": "epl.ir.phase",
    "OpInfo": "epl.ir.taskgraph",
    "TaskGraph": "epl.ir.taskgraph",
    "add_to_collection": "epl.ir.outputs",
    "get_collection": "epl.ir.outputs",
    "get_all_collections": "epl.ir.outputs",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError("module 'epl.ir' has no attribute %r" % name)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
