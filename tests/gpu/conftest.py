"""GPU suite settings, set before TensorFlow touches a GPU (inherited by launched workers).

* ``TF_FORCE_GPU_ALLOW_GROWTH``: this process runs many sessions and then launches worker
  processes on the same GPUs; TensorFlow would otherwise take all of each GPU's memory.
* ``NVIDIA_TF32_OVERRIDE=0``: NVIDIA's TF1 builds use TF32 matmuls on Ampere and newer,
  whose rounding would swamp the equivalence tolerance.
* ``TF_DETERMINISTIC_OPS=1``: deterministic cuDNN convolutions and bias-add gradients, so
  differences from single-GPU training come from EPL, not from atomics.
"""
import os

os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")
os.environ.setdefault("TF_DETERMINISTIC_OPS", "1")

import pytest  # noqa: E402

from gpuutil import ON_CPU  # noqa: E402


@pytest.fixture(autouse=True)
def _tf_collectives_stand_in_for_nccl(monkeypatch):
    """Under GPU_SUITE_ON_CPU, TF's collectives play NCCL's part: like NCCL's ops they run
    every step (the ring backend's setup gathers run once)."""
    if ON_CPU:
        monkeypatch.setenv("EPL_COLLECTIVE_BACKEND", "tf")
