"""Uneven input across workers: every worker stops at the same step, at once, cleanly.

Worker 0 holds data for 4 runs, worker 1 for 3 runs and (with 2 copies per worker)
one batch more. Every worker must end after 3 runs, raise OutOfRangeError in the
same run (so MonitoredTrainingSession stops, hooks' end() runs and worker 0 writes
the final checkpoint), with the weights of serial training on the completed global
batches on every replica. Before, worker 1 left and worker 0's next all-reduce failed
("rank 1 ... closed the connection"), or waited for communication.timeout.
The time from the first worker's OutOfRangeError to the last worker's exit is
printed in the test summary (eplutil.TIMINGS).
"""
import os
import time

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from eplutil import (TIMINGS, initial_weights, make_data, max_diff, mlp, run_launcher,
                     run_workers, serial_train, staged_mlp, train_step, train_to_the_end,
                     worker_rows)

HERE = os.path.dirname(os.path.abspath(__file__))
B, TOL, FULL_RUNS = 4, 1e-5, 3
NAMES = ("d1/kernel", "d2/kernel")
MODES = {  # mode -> (config, runs per update, copies per worker that pull)
    "dp": ({}, 1),
    "ga": ({"pipeline.num_micro_batch": 2}, 2),
    "pipeline": ({"pipeline.num_micro_batch": 2}, 1),
}


def _worker_data(x, y, workers, per_run, index):
    """Rows of 4 runs for worker 0; 3 runs and one more batch for worker 1."""
    rows = [worker_rows(a, FULL_RUNS + 1, workers, per_run, index) for a in (x, y)]
    if index == 1:
        keep = FULL_RUNS * per_run + (B if per_run > B else 0)
        rows = [a[:keep] for a in rows]
    return rows


def _train(mode, checkpoint_dir):
    """One worker's training loop (eplutil.train_to_the_end's results)."""
    def worker(index, wx, wy):
        if mode != "pipeline":
            epl.set_default_strategy(epl.replicate(1))
        data = tf.data.Dataset.from_tensor_slices((wx, wy)).batch(B)
        features, labels = tf.data.make_one_shot_iterator(data).get_next()
        build = staged_mlp if mode == "pipeline" else mlp
        train = train_step(build(features, labels, weights=initial_weights()))
        return train_to_the_end(train, NAMES, checkpoint_dir)
    return worker


@pytest.mark.timeout(150)
@pytest.mark.parametrize("workers,devices,mode", [
    (2, 1, "dp"), (2, 2, "dp"), (2, 1, "ga"), (2, 2, "ga"), (2, 2, "pipeline")])
def test_uneven_input_stops_every_worker_at_the_same_step(workers, devices, mode, tmp_path):
    config, runs_per_update = MODES[mode]
    pullers = 1 if mode == "pipeline" else devices
    per_run = pullers * B * (2 if mode == "pipeline" else 1)
    x, y = make_data(workers * per_run * (FULL_RUNS + 1))
    train = _train(mode, str(tmp_path))
    data = [_worker_data(x, y, workers, per_run, i) for i in range(workers)]
    results = run_workers(lambda i: train(i, *data[i]), workers, devices,
                          config=epl.Config(config))
    updates = FULL_RUNS // runs_per_update
    _, reference = serial_train(x, y, workers * per_run * runs_per_update, updates)
    for found in results:
        assert (found["runs"], found["step"]) == (FULL_RUNS, updates)
        for name in NAMES:
            assert max_diff(reference[name], found["weights"][name]) < TOL, name
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-%d" % updates)
    seconds = max(r["ended"] for r in results) - min(r["stopped"] for r in results)
    TIMINGS.append(("%dx%d %s: first OutOfRangeError to the last worker's exit" % (
        workers, devices, mode), seconds))


@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode,counts,runs", [("dp", "5,3", 3), ("pipeline", "5,0", 2)])
def test_epl_launch_reports_success_when_a_worker_runs_out_first(tmp_path, mode, counts, runs):
    """2 workers x 1 device through epl-launch. dp: worker 1 has 3 batches, worker 0
    has 5 (before: worker 1 exited after 3 steps, worker 0's all-reduce failed and the
    launcher reported the job failed). pipeline: the stages span the workers (worker 1
    serves stage 1) and the data ends at micro-batch 1 of step 3. Every process exits
    0, the launcher reports success, and worker 0's final checkpoint holds the
    completed steps."""
    code, output = run_launcher([
        "--num_workers", "2", "--gpu_per_worker", "1", "--log_dir", str(tmp_path / "logs"),
        os.path.join(HERE, "scripts", "uneven_train.py"), str(tmp_path), mode, counts])
    ended = time.time()
    assert code == 0, output[-3000:]
    found = [np.load(str(path)) for path in sorted(tmp_path.glob("worker_*.npz"))]
    assert len(found) == (2 if mode == "dp" else 1)
    TIMINGS.append(("2x1 %s (epl-launch): first OutOfRangeError to the launcher's exit" % mode,
                    ended - min(float(values["stopped"]) for values in found)))
    x, y = make_data(2 * B * 5)
    _, reference = serial_train(x, y, 2 * B, runs)
    for values in found:
        assert int(values["runs"]) == runs and int(values["step"]) == runs
        for name in NAMES:
            assert max_diff(reference[name], list(values[name])) < TOL, name
    assert tf.train.latest_checkpoint(str(tmp_path / "ckpt")).endswith("model.ckpt-%d" % runs)
