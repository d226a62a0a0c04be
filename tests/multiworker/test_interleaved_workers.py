"""Interleaved stages across workers: each of two workers drives one interleaved
pipeline (four TaskGraphs on its two devices), their gradients all-reduced per TaskGraph,
two of which share each device; and one interleaved pipeline spanning two workers
(device 0 of worker 0 holds chunks 0 and 2, worker 1's device chunks 1 and 3)."""
import os

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from eplutil import (copy_values, dataset_input, make_data, max_diff, run_launcher,
                     run_workers, train_step, worker_rows)
from interleavedutil import NAMES, TOL, model, serial

B, M, STEPS = 4, 4, 2
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "pipeline_train.py")


@pytest.mark.timeout(180)
def test_dp_over_interleaved_pipelines_on_two_workers():
    workers, global_batch = 2, 2 * M * B
    x, y = make_data(global_batch * STEPS)
    reference = serial(x, y, global_batch, STEPS)
    config = epl.Config({"pipeline.num_micro_batch": M, "pipeline.num_virtual_stages": 2})

    def worker(index):
        wx = worker_rows(x, STEPS, workers, M * B, index)
        wy = worker_rows(y, STEPS, workers, M * B, index)
        train = train_step(model(*dataset_input(wx, wy, B), staged=True))
        with tf.train.MonitoredTrainingSession() as sess:
            assert epl.Graph.get().parallel.plan.schedule.num_virtual_stages == 2
            for _ in range(STEPS):
                sess.run(train)
            raw = sess._tf_sess()  # pylint: disable=protected-access
            return dict((n, copy_values(raw, n)) for n in NAMES)

    results = run_workers(worker, workers, 2, config=config)
    for name in NAMES:
        assert max_diff(reference[name], [c for r in results for c in r[name]]) < TOL, name


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
