"""The peak-memory rule of benchmarks/pipeline.py and rewrite_cost.py
(benchmarks/common.py): the highest running sum of a traced step's allocation
records per device, frees first at equal times. (memory.py uses the profiler's
rule, epl.profiler.run_metadata.bytes_in_use_timeline, as for its step peaks.)"""
import importlib.util
import os
from types import SimpleNamespace as NS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SPEC = importlib.util.spec_from_file_location(
    "bench_common", os.path.join(ROOT, "benchmarks", "common.py"))
common = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(common)


def _device(name, *nodes):
    """A DeviceStepStats look-alike: each node a list of (micros, bytes) records."""
    return NS(device=name, node_stats=[
        NS(memory=[NS(allocation_records=[NS(alloc_micros=t, alloc_bytes=b) for t, b in node])])
        for node in nodes])


def test_running_peak_follows_time_and_counts_frees_first_at_equal_times():
    assert common.running_peak([(3, -100), (1, 100), (2, 50)]) == 150
    # at time 2 one buffer is freed and another allocated: the peak is 100, not 150
    assert common.running_peak([(1, 100), (2, 50), (2, -100), (3, -50)]) == 100
    assert common.running_peak([]) == 0


def test_device_peaks_per_device_from_records_across_nodes():
    meta = NS(step_stats=NS(dev_stats=[
        _device("/device:CPU:0", [(1, 10), (4, -10)], [(2, 30), (3, -30)]),
        _device("/device:CPU:1", [(1, 5)]),
        _device("/device:CPU:0", [(1, 7)]),  # a second entry for a device: the larger peak
        _device("/device:CPU:2")]))  # nothing recorded: not reported
    assert common.device_peaks(meta) == {"/device:CPU:0": 40, "/device:CPU:1": 5}
