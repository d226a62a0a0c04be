"""Helpers of the GPU suite: which GPUs exist, GPU clusters, and proof that NCCL ran.

Every test of tests/gpu trains on real GPU devices and compares with the same model
trained on one GPU (a plain session: TensorFlow places it on GPU:0), and checks that
EPL's collectives between GPUs are its NCCL ops and that their kernels ran on GPUs
(RunMetadata of a traced step). Without a visible GPU every test is skipped, saying so.

``GPU_SUITE_ON_CPU=1`` (a developer's switch, never set in CI) runs the same test bodies
on virtual CPU devices instead, where EPL picks TensorFlow's collectives: it checks the
tests themselves (plumbing, references, tolerances on CPU), and proves nothing about
GPUs or NCCL.
"""
import os

import pytest
import tensorflow.compat.v1 as tf

from epl.cluster import Cluster
from epl.communicators import library

ON_CPU = os.environ.get("GPU_SUITE_ON_CPU", "") == "1"
DEVICE_TYPE = "CPU" if ON_CPU else "GPU"
NCCL_TYPES = frozenset(["EplNcclAllReduce", "EplNcclAllGather", "EplNcclBroadcast",
                        "EplNcclBroadcastRecv", "EplNcclReduceScatter", "EplNcclAllToAll"])
# fp32 on GPUs: kernels sum in another order than on one GPU, and per-replica batch shapes
# pick other cuBLAS/cuDNN algorithms; a real error (a wrong scale, a missed update) moves
# weights by a learning-rate-sized step, 100x more than this.
TOL = 1e-4
FP16_TOL = 1e-3


def visible_gpus():
    """GPUs TensorFlow sees in this process (0 on CPU machines and CI)."""
    return len(tf.config.experimental.list_physical_devices("GPU"))


GPUS = visible_gpus()


def needs_gpus(count):
    """Skip marker: the test needs ``count`` GPUs."""
    if ON_CPU:
        return pytest.mark.skipif(False, reason="GPU_SUITE_ON_CPU=1: virtual CPU devices")
    if GPUS == 0:
        return pytest.mark.skip(reason="no GPU visible (tf.config.experimental."
                                "list_physical_devices('GPU') is empty): the GPU suite runs "
                                "on GPU hosts, `make test-gpu`")
    return pytest.mark.skipif(GPUS < count, reason="needs %d GPUs, %d visible" % (count, GPUS))


def require_nccl():
    """On a GPU host EPL's NCCL kernels must be loaded: a failure, not a skip."""
    if ON_CPU:
        return
    assert library.nccl_kernels_loaded(), (
        "EPL's NCCL kernels are not loaded (epl/lib/libepl_nccl_ops.so): run `make setup` "
        "where CUDA and NCCL are found (docs/gpu.md); `python tools/check_nccl.py --load` "
        "says why a built library does not load")


def gpu_cluster(devices, hosts=None, index=0):
    """``devices`` GPUs on this worker (virtual CPUs under GPU_SUITE_ON_CPU)."""
    return Cluster(hosts, index, devices, device_type=DEVICE_TYPE)


def collectives(program, graph, group_prefix=""):
    """EPL's collective ops (of groups starting with ``group_prefix``), as graph ops."""
    return [graph.get_operation_by_name(name) for name, group in program.collective_ops.items()
            if group.startswith(group_prefix)]


def assert_over_nccl(ops):
    """The collectives are EPL's NCCL ops on GPUs (TF's collectives on CPU under ON_CPU)."""
    assert ops, "no collective found"
    for op in ops:
        device = tf.DeviceSpec.from_string(op.device)
        assert (device.device_type or "").upper() == DEVICE_TYPE, (op.name, op.device)
        assert (op.type in NCCL_TYPES) != ON_CPU, (op.name, op.type)


def traced_run(sess, fetches):
    """Run ``fetches`` once with a full trace; returns (values, {node name: device})."""
    meta = tf.RunMetadata()
    values = sess.run(fetches, options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
                      run_metadata=meta)
    ran = {}
    for dev_stats in meta.step_stats.dev_stats:
        if "/device:" not in dev_stats.device.lower():  # "/host:CPU": the profiler's records
            continue
        for node in dev_stats.node_stats:
            ran.setdefault(node.node_name, dev_stats.device)
    return values, ran


def _on_device_type(device):
    return "/DEVICE:%s:" % DEVICE_TYPE in device.upper()


def assert_ran_on_devices(ran, ops):
    """Every op in ``ops`` ran in the traced step, on a device of DEVICE_TYPE."""
    for op in ops:
        assert op.name in ran, "%s (%s) did not run in the traced step" % (op.name, op.type)
        assert _on_device_type(ran[op.name]), (op.name, ran[op.name])


def _is_kernel_of(name, kind):
    """``d1/MatMul``, ``.../MatMul_1`` or a fused one, which grappler renames
    (``d1/Relu:_FusedMatMul``); not ``.../MatMul_grad/Shape``."""
    base = name.split(":")[0].rsplit("/", 1)[-1]
    numbered = base.startswith(kind + "_") and base[len(kind) + 1:].isdigit()
    return base == kind or numbered or ("_Fused" + kind) in name


def assert_compute_ran_on_devices(ran, kind="MatMul"):
    """The model's ``kind`` kernels ran on DEVICE_TYPE devices."""
    nodes = [name for name in ran if _is_kernel_of(name, kind)]
    assert nodes, "no %s ran in the traced step" % kind
    assert all(_on_device_type(ran[name]) for name in nodes), dict(
        (name, ran[name]) for name in nodes if not _on_device_type(ran[name]))
