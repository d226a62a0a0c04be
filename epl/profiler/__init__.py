"""EPL profilers: memory and float operations of TF 1.x graphs (EPL or plain TF).

* ``profile_memory(graph=None, batch_size=None)``, ``profile_flops(graph=None, batch_size=None)``:
  static estimates from shapes (``epl.profiler.profiler``).
* ``MemoryProfilerHook`` (``epl.profiler.memory_profiler_hook``): per-device peak
  memory of traced steps, from RunMetadata.
* ``FlopsProfilerHook`` (``epl.profiler.flops``): float operations per step and
  the achieved FLOP/s.
* ``device_memory_stats(run_metadata)`` (``epl.profiler.run_metadata``): the pure
  peak computation behind the memory hook; ``alive_at_peak(run_metadata, device)``: which
  nodes' tensors fill a device's peak.

* ``estimate(profile, plan, config)`` and the profiles of
  :mod:`epl.profiler.memory_estimate`: memory per device before running, pure
  arithmetic (``epl.estimate_memory`` is its public entry).

Importing this package never imports matplotlib; only ``visualize=True`` does.
Names are loaded lazily, so the pure memory estimate (and the plan printer,
``python -m epl.plan_cli``) do not import TensorFlow. See docs/profiler.md.
"""
from epl.lazy import lazy_exports

_EXPORTS = {
    "DeviceMemory": "epl.profiler.run_metadata",
    "FlopsProfilerHook": "epl.profiler.flops",
    "MemoryProfilerHook": "epl.profiler.memory_profiler_hook",
    "ProfileResult": "epl.profiler.profiler",
    "alive_at_peak": "epl.profiler.run_metadata",
    "device_memory_stats": "epl.profiler.run_metadata",
    "graph_flops": "epl.profiler.profiler",
    "profile_flops": "epl.profiler.profiler",
    "profile_memory": "epl.profiler.profiler",
}

__getattr__, __dir__, __all__ = lazy_exports('epl.profiler', _EXPORTS, globals())
