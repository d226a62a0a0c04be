"""Canned recommendation Estimators on one worker's virtual devices (1 x 2).

DNN, linear and wide & deep classifiers and regressors over hashed, vocabulary,
crossed, embedding, shared embedding and numeric feature columns, with
partitioned tables (fixed-size, min-max and axis-size partitioners), FTRL and
Adagrad: each replica's sparse gradients have their own row count. Trained
under EPL they end with the weights (and optimizer slots) of serial training on
the same global batches; a checkpoint restores into another partitioning.
Two workers: tests/multiworker/test_estimator_recommendation_workers.py.
"""
import pytest

import epl
import recestimators as rec
from epl.cluster import Cluster
from eplutil import MEASURED

BATCH, STEPS = 8, 3
TOL = 1e-5


def _epl_train(kind, model_dir, x, labels, shuffle=0):
    epl.init(epl.Config(rec.EPL_CONFIG), cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1))
    rec.make_estimator(kind, model_dir).train(
        rec.input_fn(x, labels, BATCH, shuffle=shuffle), steps=STEPS)
    return rec.checkpoint_values(model_dir)


def _record(worst):
    import os
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], worst[0]))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", rec.KINDS)
def test_canned_estimator_matches_serial(kind, tmp_path):
    x, y = rec.make_data(2 * BATCH * STEPS)
    labels = y[kind.endswith("regressor")]
    reference = rec.serial_train(kind, x, labels, 2 * BATCH, STEPS, tmp_path / "serial")
    trained = _epl_train(kind, tmp_path / "epl", x, labels)
    assert trained["global_step"] == STEPS
    worst = rec.max_difference(reference, trained)
    _record(worst)
    assert worst[0] < TOL, worst


@pytest.mark.timeout(300)
def test_shuffled_input_matches_serial_on_the_same_stream(tmp_path):
    """A seeded shuffle gives one stream; the replicas pull consecutive batches of it,
    which together are the serial global batch."""
    x, y = rec.make_data(2 * BATCH * STEPS)
    reference = rec.serial_train("wide_deep_classifier", x, y[False], 2 * BATCH, STEPS,
                                 tmp_path / "serial", shuffle=32)
    trained = _epl_train("wide_deep_classifier", tmp_path / "epl", x, y[False], shuffle=32)
    worst = rec.max_difference(reference, trained)
    _record(worst)
    assert worst[0] < TOL, worst


@pytest.mark.timeout(300)
def test_partitioned_checkpoint_restores_into_another_partitioning(tmp_path):
    """Trained on 1 x 2 with tables in 2 parts, continued serially with 3 parts: the
    same weights as serial training with 2 parts all along."""
    x, y = rec.make_data(4 * BATCH * STEPS)
    labels = y[False]
    reference = rec.serial_train("wide_deep_classifier", x, labels, 2 * BATCH, 2 * STEPS,
                                 tmp_path / "serial")
    model_dir = tmp_path / "epl"
    _epl_train("wide_deep_classifier", model_dir, x, labels)
    with epl.paused():
        estimator = rec.make_estimator("wide_deep_classifier", model_dir, partitions=3)
        rest = dict((k, v[2 * BATCH * STEPS:]) for k, v in x.items())
        estimator.train(rec.input_fn(rest, labels[2 * BATCH * STEPS:], 2 * BATCH),
                        steps=STEPS)
        metrics = estimator.evaluate(rec.input_fn(x, labels, 2 * BATCH), steps=2)
    trained = rec.checkpoint_values(model_dir)
    assert trained["global_step"] == 2 * STEPS and metrics["global_step"] == 2 * STEPS
    worst = rec.max_difference(reference, trained)
    _record(worst)
    assert worst[0] < TOL, worst
