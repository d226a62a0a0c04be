"""Which allocator TensorFlow uses for the tensors of a CPU job.

TensorFlow's default CPU allocator hands every tensor to glibc's malloc. A training
step frees and allocates the same large buffers over and over, from many threads,
and glibc's per-thread arenas answer by creating and dropping 64 MB heaps, whose
every page the kernel faults in again the next time: tens of thousands of page
faults per step. TensorFlow's own best-fit allocator (BFC, ``TF_CPU_ALLOCATOR_USE_BFC=1``)
keeps the memory it took and reuses it, with no faults. Measured on the
12-layer encoder of ``benchmarks/rewrite_cost.py`` (paired steps, same process
pair; ``benchmarks/cpu_allocator.py``): every mode takes less time per step under
BFC (plain TF on one device -4%, data parallelism on 2 devices -11%, with offload
-16%, gradient accumulation -10%, pipelines -5% to -9%) and its process less peak
memory (docs/design.md, "TensorFlow's CPU allocator").

So when EPL starts on a CPU job, it asks TensorFlow for BFC, unless the user
chose an allocator (any value of ``TF_CPU_ALLOCATOR_USE_BFC``, ``0`` keeping
malloc). TF's BFC stops at 64 GB unless told otherwise, where malloc stops at
the machine's memory, so EPL also sets ``TF_CPU_BFC_MEM_LIMIT_IN_MB`` to the
machine's physical memory unless the user set it. TensorFlow reads both when it
creates its first CPU device, so they count only when set before the process's
first session (``epl.init`` comes first in EPL programs). GPU jobs keep
TensorFlow's default: their tensors live in GPU memory, and BFC for their host
memory has not been measured here.

>>> choose({}, "CPU", 24000)
{'TF_CPU_ALLOCATOR_USE_BFC': '1', 'TF_CPU_BFC_MEM_LIMIT_IN_MB': '24000'}
>>> choose({"TF_CPU_ALLOCATOR_USE_BFC": "0"}, "CPU", 24000)
{}
"""
import os

BFC_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"
LIMIT_VARIABLE = "TF_CPU_BFC_MEM_LIMIT_IN_MB"


def choose(environ, device_type, physical_mb):
    """The variables EPL sets for a job on ``device_type`` devices, given the
    environment ``environ`` and the machine's memory in MB; empty when the user
    chose an allocator or the job runs on GPUs. Pure."""
    if device_type != "CPU" or BFC_VARIABLE in environ:
        return {}
    settings = {BFC_VARIABLE: "1"}
    if LIMIT_VARIABLE not in environ and physical_mb:
        settings[LIMIT_VARIABLE] = str(int(physical_mb))
    return settings


def physical_memory_mb():
    """The machine's physical memory in MB, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1 << 20)
    except (AttributeError, OSError, ValueError):
        return None


def prefer_bfc(device_type, environ=None):
    """Set :func:`choose`'s variables in ``environ`` (default: the process's);
    returns what was set, for the caller to log."""
    environ = os.environ if environ is None else environ
    settings = choose(environ, device_type, physical_memory_mb())
    environ.update(settings)
    return settings
