"""Pipelines across workers: in-process DP x pipeline and real epl-launch jobs."""
import os

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from eplutil import (copy_values, dataset_input, initial_weights, make_data, max_diff,
                     run_launcher, run_workers, serial_train, staged_mlp, train_step,
                     worker_rows)

HERE = os.path.dirname(os.path.abspath(__file__))
TOL = 1e-5
B, M, STEPS = 4, 4, 2


@pytest.mark.timeout(180)
@pytest.mark.parametrize("strategy", ["PreferBackward", "ZeroBubble"])
def test_dp_over_pipelines_on_two_workers_with_two_devices(strategy):
    workers, global_batch = 2, 2 * M * B
    x, y = make_data(global_batch * STEPS)
    _, reference = serial_train(x, y, global_batch, STEPS)
    config = epl.Config({"pipeline.num_micro_batch": M, "pipeline.strategy": strategy})

    def worker(index):
        wx = worker_rows(x, STEPS, workers, M * B, index)
        wy = worker_rows(y, STEPS, workers, M * B, index)
        loss = staged_mlp(*dataset_input(wx, wy, B), weights=initial_weights())
        train = train_step(loss)
        with tf.train.MonitoredTrainingSession() as sess:
            for _ in range(STEPS):
                sess.run(train)
            raw = sess._tf_sess()  # pylint: disable=protected-access
            return dict((n, copy_values(raw, n)) for n in ("d1/kernel", "d2/kernel"))

    results = run_workers(worker, workers, 2, config=config)
    for name in ("d1/kernel", "d2/kernel"):
        assert max_diff(reference[name], [c for r in results for c in r[name]]) < TOL, name


def _launch(tmp_path, workers, devices, strategy, copies, intra):
    code, output = run_launcher([
        "--num_workers", str(workers), "--gpu_per_worker", str(devices),
        "--log_dir", str(tmp_path / "logs"), os.path.join(HERE, "scripts", "pipeline_train.py"),
        str(tmp_path), str(STEPS), str(B), str(M), strategy, ",".join(map(str, copies)),
        "1" if intra else "0"])
    assert code == 0, output[-3000:]
    return output


@pytest.mark.timeout(240)
@pytest.mark.parametrize("workers,devices,copies,intra,strategy", [
    (2, 1, (1, 0), True, "PreferBackward"),
    (2, 2, (2, 0), False, "PreferForward"),
    (2, 1, (1, 0), True, "ZeroBubble"),
])
def test_pipeline_spanning_workers(tmp_path, workers, devices, copies, intra, strategy):
    output = _launch(tmp_path, workers, devices, strategy, copies, intra)
    assert "builds no model replica" in output
    global_batch = sum(copies) * M * B
    x, y = make_data(global_batch * STEPS)
    _, reference = serial_train(x, y, global_batch, STEPS)
    values = np.load(str(tmp_path / "worker_0.npz"))
    assert not os.path.exists(str(tmp_path / "worker_1.npz"))
    for name in ("d1/kernel", "d2/kernel", "d2/bias"):
        copies_of = values[name.replace("/", "__")]
        assert copies_of.shape[0] == copies[0]
        assert max_diff(reference[name], list(copies_of)) < TOL, name
