"""The operator-split examples run under a real `epl-launch` (1 x 1, 1 x 2 and 2 x 2 devices).

Each example prints ``step N loss X ...`` lines; the loss must be finite, fall over the
run, and be the same on every worker (both examples print a replica-wide value: the split
loss covers the replica's batch, the MoE loss is a GLOBAL_MEAN_OBJECTS fetch).
"""
import math
import os
import re

import pytest

from eplutil import run_launcher, user_examples

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Under examples/ (on TF 2.x: the tf.compat.v1 switch of the seeds' TF 1 programs).
EXAMPLES = {"classification": os.path.join("large_scale_classification", "train.py"),
            "moe": os.path.join("moe", "train.py")}
STEP_LINE = re.compile(r"^\[worker (\d+)\] step (\d+) loss (\S+)")


def _losses(output):
    """{worker: [(step, loss)]} from the launcher's prefixed output."""
    found = {}
    for line in output.splitlines():
        match = STEP_LINE.match(line)
        if match:
            found.setdefault(int(match.group(1)), []).append(
                (int(match.group(2)), float(match.group(3))))
    return found


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    return user_examples(tmp_path_factory)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("workers,devices", [(1, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_split_example_trains(example, workers, devices, tmp_path, examples):
    code, output = run_launcher(["--num_workers", str(workers), "--gpu_per_worker",
                                 str(devices), "--log_dir", str(tmp_path / "logs"),
                                 os.path.join(examples, EXAMPLES[example])], timeout=180)
    assert code == 0, output[-3000:]
    losses = _losses(output)
    assert sorted(losses) == list(range(workers)), output[-3000:]
    for worker, curve in losses.items():
        values = [loss for _, loss in curve]
        assert len(values) >= 3 and all(math.isfinite(v) for v in values), (worker, curve)
        assert values[-1] < 0.8 * values[0], (worker, curve)
        assert output.count("[worker %d] Train Finished." % worker) == 1
    for worker in range(1, workers):
        for (step, mine), (step0, first) in zip(losses[worker], losses[0]):
            assert step == step0 and mine == pytest.approx(first, rel=1e-3), (worker, step)


SAVE_LINE = re.compile(r"^\[worker (\d+)\] global_step (\d+) shard_sum (\S+)")


@pytest.mark.timeout(300)
def test_replica_spanning_workers_saves_every_shard_and_restores(tmp_path):
    """2 workers x 2 devices, split(4) under MonitoredTrainingSession: worker 0's
    checkpoints (the final one too, written after worker 1 has finished) hold all four
    shards; a second run restores each worker's shards from them."""
    import numpy as np
    import tensorflow.compat.v1 as tf
    script = os.path.join(REPO, "tests", "multiworker", "scripts", "split_save.py")
    ckpt = str(tmp_path / "ckpt")
    runs = []
    for steps in (5, 0):
        code, output = run_launcher(["--num_workers", "2", "--gpu_per_worker", "2",
                                     "--log_dir", str(tmp_path / ("logs%d" % steps)),
                                     script, ckpt, str(steps)], timeout=200)
        assert code == 0, output[-3000:]
        runs.append(dict((int(m.group(1)), (int(m.group(2)), float(m.group(3))))
                         for m in map(SAVE_LINE.match, output.splitlines()) if m))
    trained, restored = runs
    assert sorted(trained) == sorted(restored) == [0, 1]
    assert all(step == 5 for step, _ in trained.values())
    assert all(step == 5 for step, _ in restored.values())       # restored, not initialized
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(ckpt))
    kernel = reader.get_tensor("classifier/kernel")
    assert kernel.shape == (8, 11)
    assert reader.get_tensor("global_step") == 5
    full = sum(value for _, value in trained.values())
    assert np.sum(kernel) == pytest.approx(full, rel=1e-5)
    assert sum(value for _, value in restored.values()) == pytest.approx(full, rel=1e-5)
    for worker in (0, 1):
        assert restored[worker][1] == pytest.approx(trained[worker][1], rel=1e-6)
