"""Interleaved stages across workers: one interleaved pipeline spanning two workers
(worker 0's device holds chunks 0 and 2, worker 1's chunks 1 and 3; worker 1 only
serves). Data parallelism over interleaved pipelines: tests/graph/test_interleaved.py."""
import os

import numpy as np
import pytest

from eplutil import make_data, max_diff, run_launcher
from interleavedutil import NAMES, TOL, serial

B, M, STEPS = 4, 4, 2
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "pipeline_train.py")


@pytest.mark.timeout(240)
def test_interleaved_pipeline_spanning_two_workers(tmp_path):
    code, output = run_launcher([
        "--num_workers", "2", "--gpu_per_worker", "1", "--log_dir", str(tmp_path / "logs"),
        SCRIPT, str(tmp_path), str(STEPS), str(B), str(M), "PreferBackward", "1,0", "1", "2"])
    assert code == 0, output[-3000:]
    assert "builds no model replica" in output
    x, y = make_data(M * B * STEPS)
    reference = serial(x, y, M * B, STEPS)
    values = np.load(str(tmp_path / "worker_0.npz"))
    for name in NAMES:
        assert max_diff(reference[name], list(values[name.replace("/", "__")])) < TOL, name
