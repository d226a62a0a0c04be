"""tf.estimator under EPL on one worker's virtual devices.

Training graphs are parallelized (data parallel, pipelines) and end with the
weights of serial Estimator training; evaluation and prediction graphs run
unchanged; TPUEstimator's CPU fallback works; a worker-only TF_CONFIG gives
a local RunConfig; a tf.distribute strategy in RunConfig makes EPL stand aside
(one worker) or refuse (several workers).
"""
import json
import logging
import os
import sys

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from eplutil import make_data

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "multiworker",
                                "scripts"))
from estimator_model import (checkpoint_weights, features_fn, input_fn, make_model_fn,  # noqa
                             max_weight_diff, run_config, serial_estimator_train)

STEPS = 4
TOL = 1e-5
PARALLELIZED = "EPL parallelized the graph"


@pytest.fixture
def epl_log(caplog):
    caplog.set_level(logging.INFO, logger="epl")
    return caplog


def _parallelized(caplog):
    return caplog.text.count(PARALLELIZED)


def _init(devices=2, config=None, default=True):
    epl.init(config, cluster=Cluster(devices_per_worker=devices))
    if default:
        epl.set_default_strategy(epl.replicate(1))


def _plain(model_dir, model_fn):
    """The same Estimator with EPL paused (for evaluate/predict references)."""
    return tf.estimator.Estimator(model_fn, config=run_config(model_dir))


def test_data_parallel_training_matches_serial_and_eval_predict_are_plain(tmp_path, epl_log):
    x, y = make_data(64)
    reference = serial_estimator_train(x, y, 16, STEPS, tmp_path / "serial")
    _init()
    model_dir = tmp_path / "epl"
    estimator = tf.estimator.Estimator(make_model_fn(), config=run_config(model_dir))
    estimator.train(input_fn(x, y, 8, repeat=True), steps=STEPS)
    trained = checkpoint_weights(model_dir)
    assert trained["global_step"] == STEPS
    assert max_weight_diff(reference, trained) < TOL
    assert _parallelized(epl_log) == 1

    metrics = estimator.evaluate(input_fn(x, y, 8), steps=3)
    predictions = list(estimator.predict(features_fn(x[:16], 8)))
    assert _parallelized(epl_log) == 1          # eval and predict graphs stay single-copy
    with epl.paused():
        plain = _plain(model_dir, make_model_fn())
        expected = plain.evaluate(input_fn(x, y, 8), steps=3)
        expected_predictions = list(plain.predict(features_fn(x[:16], 8)))
    assert metrics["global_step"] == STEPS
    for key in ("loss", "accuracy"):
        assert metrics[key] == pytest.approx(expected[key], abs=1e-6), key
    assert len(predictions) == 16
    np.testing.assert_allclose([p["logits"] for p in predictions],
                               [p["logits"] for p in expected_predictions], atol=1e-6)


def test_eval_graph_that_builds_an_optimizer_is_not_parallelized(tmp_path, epl_log):
    """Some model_fns build the training step in every mode; only TRAIN graphs are
    parallel (a parallel eval graph would pull one batch per replica)."""
    x, y = make_data(64)
    _init()
    model_fn = make_model_fn(optimizer_in_every_mode=True)
    estimator = tf.estimator.Estimator(model_fn, config=run_config(tmp_path))
    estimator.train(input_fn(x, y, 8, repeat=True), steps=2)
    metrics = estimator.evaluate(input_fn(x, y, 8), steps=2)
    assert _parallelized(epl_log) == 1
    with epl.paused():
        expected = _plain(tmp_path, model_fn).evaluate(input_fn(x, y, 8), steps=2)
    assert metrics["loss"] == pytest.approx(expected["loss"], abs=1e-6)


def test_pipeline_training_matches_serial_and_staged_eval_works(tmp_path, epl_log):
    x, y = make_data(64)
    reference = serial_estimator_train(x, y, 16, STEPS, tmp_path / "serial")
    _init(config=epl.Config({"pipeline.num_micro_batch": 2}), default=False)
    model_dir = tmp_path / "epl"
    estimator = tf.estimator.Estimator(make_model_fn(stages=True), config=run_config(model_dir))
    estimator.train(input_fn(x, y, 8, repeat=True), steps=STEPS)
    assert "stage_0" in epl_log.text and "stage_1" in epl_log.text
    trained = checkpoint_weights(model_dir)
    assert trained["global_step"] == STEPS
    assert max_weight_diff(reference, trained) < TOL
    # Evaluation graphs have stage scopes but no training step: they run unchanged.
    metrics = estimator.evaluate(input_fn(x, y, 8), steps=2)
    predictions = list(estimator.predict(features_fn(x[:8], 8)))
    assert _parallelized(epl_log) == 1
    with epl.paused():
        expected = _plain(model_dir, make_model_fn()).evaluate(input_fn(x, y, 8), steps=2)
    assert metrics["loss"] == pytest.approx(expected["loss"], abs=1e-6)
    assert len(predictions) == 8


def test_train_and_evaluate_matches_serial(tmp_path, epl_log):
    x, y = make_data(64)
    reference = serial_estimator_train(x, y, 16, STEPS, tmp_path / "serial")
    _init()
    model_dir = tmp_path / "epl"
    estimator = tf.estimator.Estimator(make_model_fn(), config=run_config(model_dir))
    train_spec = tf.estimator.TrainSpec(input_fn(x, y, 8, repeat=True), max_steps=STEPS)
    eval_spec = tf.estimator.EvalSpec(input_fn(x, y, 8), steps=2, throttle_secs=0)
    metrics, _ = tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
    assert metrics["global_step"] == STEPS and "accuracy" in metrics
    assert max_weight_diff(reference, checkpoint_weights(model_dir)) < TOL
    assert _parallelized(epl_log) == 1


def _tpu_estimator(model_dir, batch):
    """TPUEstimator on CPU (``tf.estimator.tpu`` is what ``tf.contrib.tpu`` exports)."""
    config = tf.estimator.tpu.RunConfig(
        model_dir=str(model_dir), save_checkpoints_steps=2, log_step_count_steps=None,
        tpu_config=tf.estimator.tpu.TPUConfig(iterations_per_loop=1))
    return tf.estimator.tpu.TPUEstimator(
        model_fn=make_model_fn(tpu=True), config=config, use_tpu=False,
        train_batch_size=batch, eval_batch_size=8, predict_batch_size=8)


def test_tpu_estimator_cpu_fallback(tmp_path, epl_log):
    x, y = make_data(64)
    with epl.paused():
        serial = _tpu_estimator(tmp_path / "serial", 16)
        serial.train(input_fn(x, y, 0, repeat=True), max_steps=STEPS)
    reference = checkpoint_weights(tmp_path / "serial")
    _init()
    estimator = _tpu_estimator(tmp_path / "epl", 8)
    estimator.train(input_fn(x, y, 0, repeat=True), max_steps=STEPS)
    trained = checkpoint_weights(tmp_path / "epl")
    assert trained["global_step"] == STEPS
    assert max_weight_diff(reference, trained) < TOL
    metrics = estimator.evaluate(input_fn(x, y, 0), steps=2)
    predictions = list(estimator.predict(features_fn(x[:8], 0)))
    assert _parallelized(epl_log) == 1
    with epl.paused():
        expected = _tpu_estimator(tmp_path / "epl", 8).evaluate(input_fn(x, y, 0), steps=2)
    assert metrics["loss"] == pytest.approx(expected["loss"], abs=1e-6)
    assert len(predictions) == 8


def test_worker_only_tf_config_gives_a_local_run_config(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["127.0.0.1:2000", "127.0.0.1:2001"]},
        "task": {"type": "worker", "index": 1}}))
    with epl.paused(), pytest.raises(ValueError, match="chief"):
        tf.estimator.RunConfig()
    epl.init()
    assert epl.Env.get().cluster.worker_index == 1
    config = tf.estimator.RunConfig()
    assert config.is_chief and config.master == "" and config.num_worker_replicas == 1
    assert not config.cluster_spec.as_dict()
    tpu_config = tf.estimator.tpu.RunConfig()
    assert tpu_config.is_chief and not tpu_config.cluster_spec.as_dict()
    epl.reset()
    with pytest.raises(ValueError, match="chief"):
        tf.estimator.RunConfig()


def _mirrored():
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def test_mirrored_strategy_makes_epl_stand_aside_on_one_worker(tmp_path, epl_log):
    x, y = make_data(64)
    _init()
    config = run_config(tmp_path, train_distribute=_mirrored())
    estimator = tf.estimator.Estimator(make_model_fn(), config=config)
    estimator.train(input_fn(x, y, 8, repeat=True), steps=2)
    assert "stands aside" in epl_log.text and "MirroredStrategy" in epl_log.text
    assert _parallelized(epl_log) == 0
    assert checkpoint_weights(tmp_path)["global_step"] == 2
    metrics = estimator.evaluate(input_fn(x, y, 8), steps=2)
    assert np.isfinite(metrics["loss"])


def test_distribution_strategy_is_refused_on_several_workers(tmp_path):
    x, y = make_data(64)
    epl.init(cluster=Cluster(["127.0.0.1:1", "127.0.0.1:2"], 0, 2))
    with pytest.raises(ValueError, match="train_distribute.*2 workers"):
        run_config(tmp_path, train_distribute=_mirrored())
    config = run_config(tmp_path).replace(train_distribute=_mirrored())
    estimator = tf.estimator.Estimator(make_model_fn(), config=config)
    with pytest.raises(RuntimeError, match=r"MirroredStrategy\w* training step on 2 workers"):
        estimator.train(input_fn(x, y, 8, repeat=True), steps=2)


def test_a_worker_with_its_own_model_dir_does_not_wait_for_worker_0(tmp_path, caplog):
    """epl-launch gives each worker its own task directory, and only worker 0's holds
    checkpoints: a model_dir without any checkpoint is that worker's own, so the end of
    train must not wait communication.timeout (600 s by default) for worker 0's last one.
    A shared model_dir (it holds worker 0's first checkpoint) is still waited for."""
    import time
    from epl.parallel.estimator import ChiefCheckpointWait
    own, shared = str(tmp_path / "own"), str(tmp_path / "shared")
    with tf.Graph().as_default():
        step = tf.train.get_or_create_global_step()
        with tf.Session() as sess:
            sess.run(step.initializer)
            tf.train.Saver().save(sess, os.path.join(shared, "model.ckpt"), global_step=0)
            sess.run(step.assign(3))
            waits = []
            for model_dir, timeout in ((own, 60), (shared, 1)):
                hook = ChiefCheckpointWait(model_dir, timeout)
                hook.begin()
                start = time.time()
                with caplog.at_level(logging.INFO, logger="epl"):
                    hook.end(sess)
                waits.append(time.time() - start)
    assert waits[0] < 5 and "holds no checkpoint of worker 0" in caplog.text
    assert waits[1] >= 1 and "checkpoint of step 3 did not appear" in caplog.text
