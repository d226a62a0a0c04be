"""tf.estimator across two workers: in-process servers and a real epl-launch job.

The training graph is data parallel over every worker's devices and ends with
the weights of serial training on the global batches; worker 0 writes the
checkpoints; every worker's evaluate/predict restores the final checkpoint;
in train_and_evaluate worker 0 evaluates and the other workers only train.
"""
import json
import os
import sys

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from eplutil import make_data, run_launcher, run_workers, worker_rows

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "scripts"))
from estimator_model import (checkpoint_weights, features_fn, input_fn, make_model_fn,  # noqa
                             max_weight_diff, run_config, serial_estimator_train)

WORKERS, DEVICES, BATCH, STEPS = 2, 2, 4, 3
TOL = 1e-5


def _data():
    global_batch = WORKERS * DEVICES * BATCH
    return make_data(global_batch * STEPS), global_batch


def _plain_evaluation(model_dir, x, y):
    with epl.paused():
        estimator = tf.estimator.Estimator(make_model_fn(), config=run_config(model_dir))
        metrics = estimator.evaluate(input_fn(x, y, 8), steps=2)
        logits = [p["logits"] for p in estimator.predict(features_fn(x[:8], 8))]
    return metrics, np.array(logits)


@pytest.mark.timeout(240)
def test_train_evaluate_predict_on_two_workers(tmp_path):
    (x, y), global_batch = _data()
    reference = serial_estimator_train(x, y, global_batch, STEPS, tmp_path / "serial")
    model_dir = tmp_path / "epl"

    def worker(index):
        wx = worker_rows(x, STEPS, WORKERS, DEVICES * BATCH, index)
        wy = worker_rows(y, STEPS, WORKERS, DEVICES * BATCH, index)
        epl.set_default_strategy(epl.replicate(1))
        estimator = tf.estimator.Estimator(make_model_fn(), config=run_config(model_dir))
        estimator.train(input_fn(wx, wy, BATCH, repeat=True), steps=STEPS)
        metrics = estimator.evaluate(input_fn(x, y, 8), steps=2)
        logits = [p["logits"] for p in estimator.predict(features_fn(x[:8], 8))]
        return metrics, np.array(logits)

    results = run_workers(worker, WORKERS, DEVICES)
    trained = checkpoint_weights(model_dir)
    assert trained["global_step"] == STEPS
    assert max_weight_diff(reference, trained) < TOL
    expected, expected_logits = _plain_evaluation(model_dir, x, y)
    for metrics, logits in results:   # every worker evaluated the final checkpoint
        assert metrics["global_step"] == STEPS
        assert metrics["loss"] == pytest.approx(expected["loss"], abs=1e-6)
        np.testing.assert_allclose(logits, expected_logits, atol=1e-6)
    assert not os.path.exists(str(model_dir / "eval")) or len(
        os.listdir(str(model_dir / "eval"))) == 1   # eval summaries: worker 0 only


@pytest.mark.timeout(240)
def test_second_estimator_in_one_process_starts_fresh(tmp_path):
    """Variables outlive sessions on a tf.train.Server: the second training graph's
    copies must be synchronized after its initializer, not before (regression)."""
    (x, y), global_batch = _data()
    reference = serial_estimator_train(x, y, global_batch, STEPS, tmp_path / "serial")

    def worker(index):
        wx = worker_rows(x, STEPS, WORKERS, DEVICES * BATCH, index)
        wy = worker_rows(y, STEPS, WORKERS, DEVICES * BATCH, index)
        epl.set_default_strategy(epl.replicate(1))
        for name in ("first", "second"):
            estimator = tf.estimator.Estimator(make_model_fn(),
                                               config=run_config(tmp_path / name))
            estimator.train(input_fn(wx, wy, BATCH, repeat=True), steps=STEPS)

    run_workers(worker, WORKERS, DEVICES)
    for name in ("first", "second"):
        assert max_weight_diff(reference, checkpoint_weights(tmp_path / name)) < TOL, name


@pytest.mark.timeout(240)
def test_train_and_evaluate_on_two_workers(tmp_path):
    (x, y), global_batch = _data()
    reference = serial_estimator_train(x, y, global_batch, STEPS, tmp_path / "serial")
    model_dir = tmp_path / "epl"

    def worker(index):
        wx = worker_rows(x, STEPS, WORKERS, DEVICES * BATCH, index)
        wy = worker_rows(y, STEPS, WORKERS, DEVICES * BATCH, index)
        epl.set_default_strategy(epl.replicate(1))
        estimator = tf.estimator.Estimator(make_model_fn(), config=run_config(model_dir))
        return tf.estimator.train_and_evaluate(
            estimator,
            tf.estimator.TrainSpec(input_fn(wx, wy, BATCH, repeat=True), max_steps=STEPS),
            tf.estimator.EvalSpec(input_fn(x, y, 8), steps=2, throttle_secs=0))

    (metrics0, _), (metrics1, _) = run_workers(worker, WORKERS, DEVICES)
    assert metrics0["global_step"] == STEPS and metrics1 is None   # worker 0 evaluates
    assert max_weight_diff(reference, checkpoint_weights(model_dir)) < TOL
    expected, _ = _plain_evaluation(model_dir, x, y)
    assert metrics0["loss"] == pytest.approx(expected["loss"], abs=1e-6)


@pytest.mark.timeout(300)
def test_epl_launch_estimator_matches_serial(tmp_path):
    code, output = run_launcher([
        "--num_workers", str(WORKERS), "--gpu_per_worker", str(DEVICES),
        "--log_dir", str(tmp_path / "logs"), os.path.join(HERE, "scripts", "estimator_train.py"),
        str(tmp_path), str(STEPS), str(BATCH)], timeout=280)
    assert code == 0, output[-3000:]
    (x, y), global_batch = _data()
    reference = serial_estimator_train(x, y, global_batch, STEPS, tmp_path / "serial")
    for name in ("model", "tae"):
        trained = checkpoint_weights(tmp_path / name)
        assert trained["global_step"] == STEPS, name
        assert max_weight_diff(reference, trained) < TOL, name
    expected, expected_logits = _plain_evaluation(tmp_path / "model", x, y)
    results = [json.load(open(str(tmp_path / ("worker_%d.json" % w)))) for w in range(WORKERS)]
    for worker, result in enumerate(results):
        assert set(result["tf_config"]["cluster"]) == {"worker"}   # no chief job
        assert result["tf_config"]["task"] == {"type": "worker", "index": worker}
        assert result["metrics"]["loss"] == pytest.approx(expected["loss"], abs=1e-6)
        np.testing.assert_allclose(result["logits"], expected_logits, atol=1e-6)
    assert results[0]["tae_metrics"]["global_step"] == STEPS
    assert results[1]["tae_metrics"] is None
