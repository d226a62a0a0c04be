"""GPU suite settings where a GPU is visible, set before TensorFlow uses it (inherited by
launched workers).

* ``TF_FORCE_GPU_ALLOW_GROWTH``: this process runs many sessions and then launches worker
  processes on the same GPUs; TensorFlow would otherwise take all of each GPU's memory.
* ``NVIDIA_TF32_OVERRIDE=0``: NVIDIA's TF1 builds use TF32 matmuls on Ampere and newer,
  whose rounding would swamp the equivalence tolerance.
* ``TF_DETERMINISTIC_OPS=1``: deterministic cuDNN convolutions and bias-add gradients, so
  differences from single-GPU training come from EPL, not from atomics.
"""
import os

import pytest

from gpuutil import GPUS, ON_CPU

if GPUS:
    # Only where a GPU is visible: `make test` and `make test-tf2` collect this file with the
    # whole suite, so these settings reach every test of the process and the workers it
    # launches. On TF 2.x, TF_DETERMINISTIC_OPS=1 also turns on op determinism, which
    # refuses every random op without a seed (an unseeded dataset shuffle, a dropout): on a
    # CPU host, where every test of this suite skips, it broke the rest of the suite.
    # Listing the GPUs (gpuutil) creates no allocator and runs no kernel, so these still
    # come before TensorFlow uses a GPU.
    os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")
    os.environ.setdefault("TF_DETERMINISTIC_OPS", "1")


@pytest.fixture(autouse=True)
def _tf_collectives_stand_in_for_nccl(monkeypatch):
    """Under GPU_SUITE_ON_CPU, TF's collectives play NCCL's part: like NCCL's ops they run
    every step (the ring backend's setup gathers run once)."""
    if ON_CPU:
        monkeypatch.setenv("EPL_COLLECTIVE_BACKEND", "tf")
