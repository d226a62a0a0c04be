"""epl-launch jobs of 2 processes x 1 GPU: data parallelism and ZeRO over NCCL equal
single-GPU training.

Runs on GPU hosts only (``make test-gpu``); see gpuutil.py for what every test proves.
"""
import json
import os

import numpy as np
import pytest

from eplutil import make_data, max_diff, run_launcher, serial_train
from gpuutil import DEVICE_TYPE, ON_CPU, TOL, NCCL_TYPES, needs_gpus, require_nccl

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "gpu_train.py")
WORKERS, BATCH, STEPS = 2, 4, 3


def _launch(tmp_path, opt_name):
    code, output = run_launcher([
        "--num_workers", str(WORKERS), "--gpu_per_worker", "1",
        "--log_dir", str(tmp_path / "logs"), SCRIPT, str(tmp_path), str(STEPS), str(BATCH),
        opt_name])
    assert code == 0, output[-3000:]
    x, y = make_data(WORKERS * BATCH * STEPS)
    _, reference = serial_train(x, y, WORKERS * BATCH, STEPS, opt_name)
    return reference


def _check_worker(tmp_path, worker, reference, names):
    values = np.load(str(tmp_path / ("worker_%d.npz" % worker)))
    for name in names:
        copies = values[name.replace("/", "__")]
        assert copies.shape[0] == 1
        assert max_diff(reference[name], list(copies)) < TOL, (worker, name)
    with open(str(tmp_path / ("worker_%d.json" % worker))) as report_file:
        report = json.load(report_file)
    assert report["device_type"] == DEVICE_TYPE
    assert report["collectives"], "worker %d built no gradient collective" % worker
    for name, op_type, device in report["collectives"]:
        assert ("/device:%s:0" % DEVICE_TYPE) in device and "task:%d" % worker in device, device
        assert (op_type in NCCL_TYPES) != ON_CPU, (name, op_type)
        ran = report["ran"][name]
        assert ran is not None and ("/device:%s:" % DEVICE_TYPE) in ran, (name, ran)
    return report


@needs_gpus(2)
@pytest.mark.timeout(300)
def test_two_processes_reduce_over_nccl_and_match_single_gpu_training(tmp_path):
    require_nccl()
    reference = _launch(tmp_path, "momentum")
    names = [n for n in reference if n != "global_step" and "Momentum" not in n]
    for worker in range(WORKERS):
        _check_worker(tmp_path, worker, reference, names)


@needs_gpus(2)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("level", ["v0", "v1"])
def test_zero_over_nccl_matches_single_gpu_training(tmp_path, monkeypatch, level):
    """ZeRO partitions optimizer states (v0) and gradient reduction (v1) over 2 GPUs."""
    require_nccl()
    monkeypatch.setenv("EPL_ZERO_LEVEL", level)
    reference = _launch(tmp_path, "adam_eps")
    names = [n for n in reference if n != "global_step" and "Adam" not in n
             and "power" not in n]
    slots = []
    for worker in range(WORKERS):
        slots.append(_check_worker(tmp_path, worker, reference, names)["slot_elements"])
    # m and v of every variable exist exactly once across the workers
    elements = sum(int(np.prod(reference[name].shape)) for name in names)
    assert sum(slots) == 2 * elements and all(0 < s < 2 * elements for s in slots), slots
