"""A real `epl-launch` job (2 processes x 2 virtual devices, and 1 x 2) matches serial
training."""
import os

import numpy as np
import pytest

from eplutil import make_data, max_diff, run_launcher, serial_train

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS, DEVICES, BATCH, STEPS = 2, 2, 4, 3


def _launch_and_compare(tmp_path, workers):
    code, output = run_launcher([
        "--num_workers", str(workers), "--gpu_per_worker", str(DEVICES),
        "--log_dir", str(tmp_path / "logs"), os.path.join(HERE, "scripts", "dp_train.py"),
        str(tmp_path), str(STEPS), str(BATCH)])
    assert code == 0, output[-3000:]
    global_batch = workers * DEVICES * BATCH
    x, y = make_data(global_batch * STEPS)
    _, reference = serial_train(x, y, global_batch, STEPS)
    for worker in range(workers):
        values = np.load(str(tmp_path / ("worker_%d.npz" % worker)))
        for name, ref in reference.items():
            if name == "global_step" or "Momentum" in name:
                continue
            copies = values[name.replace("/", "__")]
            assert copies.shape[0] == DEVICES
            assert max_diff(ref, list(copies)) < 1e-5, (worker, name)
    return output


@pytest.mark.timeout(240)
def test_epl_launch_matches_serial(tmp_path):
    output = _launch_and_compare(tmp_path, WORKERS)
    assert "worker 0 session target 'grpc://" in output and "server True" in output


@pytest.mark.timeout(240)
def test_a_one_worker_launch_trains_in_process(tmp_path):
    """epl-launch --num_workers 1 writes a TF_CONFIG of one worker; the job has no one
    to talk to, so it starts no server and its sessions are local (they place each
    run's pruned graph), as when the script runs without the launcher."""
    output = _launch_and_compare(tmp_path, 1)
    assert "worker 0 session target '', server False" in output
