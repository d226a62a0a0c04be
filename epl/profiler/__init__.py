"""EPL profilers: memory and float operations of TF 1.x graphs (EPL or plain TF).

* ``profile_memory(graph=None, batch_size=None)``, ``profile_flops(graph=None, batch_size=None)``:
  static estimates from shapes (``epl.profiler.profiler``).
* ``MemoryProfilerHook`` (``epl.profiler.memory_profiler_hook``): per-device peak
  memory of traced steps, from RunMetadata.
* ``FlopsProfilerHook`` (``epl.profiler.flops``): float operations per step and
  the achieved FLOP/s.
* ``device_memory_stats(run_metadata)`` (``epl.profiler.run_metadata``): the pure
  peak computation behind the memory hook.

Importing this package never imports matplotlib; only ``visualize=True`` does.
See docs/profiler.md.
"""
from epl.profiler.flops import FlopsProfilerHook
from epl.profiler.memory_profiler_hook import MemoryProfilerHook
from epl.profiler.profiler import ProfileResult, graph_flops, profile_flops, profile_memory
from epl.profiler.run_metadata import DeviceMemory, device_memory_stats

__all__ = ["DeviceMemory", "FlopsProfilerHook", "MemoryProfilerHook", "ProfileResult",
           "device_memory_stats", "graph_flops", "profile_flops", "profile_memory"]
