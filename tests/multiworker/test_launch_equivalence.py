"""A real `epl-launch` job (2 processes x 2 virtual devices) matches serial training."""
import os

import numpy as np
import pytest

from eplutil import make_data, max_diff, run_launcher, serial_train

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS, DEVICES, BATCH, STEPS = 2, 2, 4, 3


@pytest.mark.timeout(240)
def test_epl_launch_matches_serial(tmp_path):
    code, output = run_launcher([
        "--num_workers", str(WORKERS), "--gpu_per_worker", str(DEVICES),
        "--log_dir", str(tmp_path / "logs"), os.path.join(HERE, "scripts", "dp_train.py"),
        str(tmp_path), str(STEPS), str(BATCH)])
    assert code == 0, output[-3000:]
    global_batch = WORKERS * DEVICES * BATCH
    x, y = make_data(global_batch * STEPS)
    _, reference = serial_train(x, y, global_batch, STEPS)
    for worker in range(WORKERS):
        values = np.load(str(tmp_path / ("worker_%d.npz" % worker)))
        for name, ref in reference.items():
            if name == "global_step" or "Momentum" in name:
                continue
            copies = values[name.replace("/", "__")]
            assert copies.shape[0] == DEVICES
            assert max_diff(ref, list(copies)) < 1e-5, (worker, name)
