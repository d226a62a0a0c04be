"""EPL's intermediate representation: TaskGraphs, phases and the op side table.

Names are loaded lazily: the kinds and phases (``epl.ir.taskgraph``,
``epl.ir.phase``) are plain Python that the planner and the strategy scopes
use without importing TensorFlow; the graph view needs TensorFlow.
"""
from epl.lazy import lazy_exports

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

__getattr__, __dir__, __all__ = lazy_exports('epl.ir', _EXPORTS, globals())
