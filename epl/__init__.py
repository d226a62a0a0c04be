"""EPL (Easy Parallel Library): distributed training for TensorFlow 1.15 graphs.

Quick start::

    import epl
    epl.init()
    epl.set_default_strategy(epl.replicate(1))
    ...  # unchanged TF1 model and training loop

Names are loaded lazily so that ``epl-launch`` starts without importing
TensorFlow.
"""
from epl.lazy import lazy_exports

from epl.version import VERSION  # noqa: F401 (public, listed in __all__)

_EXPORTS = {
    "Config": "epl.config",
    "ConfigError": "epl.config",
    "Env": "epl.env",
    "init": "epl.env",
    "reset": "epl.env",
    "paused": "epl.env",
    # Cluster and Graph come through epl.env, which wires their Env-dependent
    # parts (cluster scopes, introspection) when it loads.
    "Cluster": "epl.env",
    "ClusterError": "epl.cluster",
    "Graph": "epl.env",
    "GraphKeys": "epl.ir",
    "add_to_collection": "epl.ir.outputs",
    "get_collection": "epl.ir.outputs",
    "get_all_collections": "epl.ir.outputs",
    "replicate": "epl.strategies",
    "split": "epl.strategies",
    "set_default_strategy": "epl.strategies",
    "StrategyError": "epl.strategies",
    "estimate_memory": "epl.env",
    "MemoryEstimateError": "epl.profiler.memory_estimate",
}

__getattr__, __dir__, __all__ = lazy_exports('epl', _EXPORTS, globals(), extra=("VERSION",))
