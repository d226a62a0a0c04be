"""examples/wide_deep trains and evaluates a canned wide & deep Estimator under epl-launch.

On 2 workers x 2 devices every worker evaluates the final checkpoint, so every
worker prints the same metrics, and the model has learnt (AUC well above 0.5).
"""
import json
import os
import re

import pytest

from eplutil import run_launcher, user_examples

EVAL_LINE = re.compile(r"^\[worker (\d+)\] eval (\{.*\})$", re.M)
LAUNCH_BUDGET = 420


@pytest.mark.timeout(LAUNCH_BUDGET + 60)
def test_wide_deep_trains_and_evaluates_on_two_workers(tmp_path, tmp_path_factory):
    examples = user_examples(tmp_path_factory)
    code, output = run_launcher([
        "--num_workers", "2", "--gpu_per_worker", "2", "--log_dir", str(tmp_path / "logs"),
        os.path.join(examples, "wide_deep", "train.py"), "--model_dir", str(tmp_path / "model"),
        "--steps", "120"], timeout=LAUNCH_BUDGET)
    assert code == 0, output[-3000:]
    metrics = dict((int(w), json.loads(m)) for w, m in EVAL_LINE.findall(output))
    assert sorted(metrics) == [0, 1], output[-3000:]
    assert metrics[0] == metrics[1]
    assert metrics[0]["global_step"] == 120
    assert metrics[0]["auc"] > 0.7, metrics[0]
    assert "[worker 0] global batch 256" in output
    assert output.count("Train Finished.") == 2
