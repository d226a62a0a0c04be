"""Recommendation models across two in-process workers (2 x 1 and 2 x 2).

Every replica's sparse gradients have their own row count (SparseTensor ids,
``embedding_lookup_sparse``, partitioned tables; canned Estimators on hashed and
vocabulary columns): gathered across workers by the variable-size all-gather,
or all-reduced as a dense buffer, they train to the weights of serial training
on the same global batches; a partitioned checkpoint written on 2 x 1 continues
on 1 x 2 with another partitioning.
"""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
import recestimators as rec
import recmodels
from epl.cluster import Cluster
from eplutil import MEASURED, copy_values, max_diff, run_workers, worker_rows

BATCH, STEPS = 4, 3
TOL = 1e-5


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers,devices,config", [
    (2, 1, {}), (2, 2, {}), (2, 2, {"communication.sparse_reduction": "all_reduce"}),
    (2, 2, {"pipeline.num_micro_batch": 2})])
def test_sparse_rows_of_every_size_match_serial(workers, devices, config):
    runs = config.get("pipeline.num_micro_batch", 1)     # gradient accumulation
    global_batch = workers * devices * BATCH * runs
    data = recmodels.make_data(global_batch * STEPS)
    reference = recmodels.serial_weights(data, global_batch, STEPS, "momentum")

    def worker(index):
        # per worker, runs x devices batches of BATCH rows per global step
        rows = tuple(worker_rows(a, STEPS, workers, devices * BATCH * runs, index)
                     for a in data)
        epl.set_default_strategy(epl.replicate(1))
        loss = recmodels.build(recmodels.dataset_input(rows, BATCH))
        train = recmodels.train_op(loss, "momentum")
        with tf.train.MonitoredTrainingSession() as sess:
            for _ in range(STEPS * runs):
                sess.run(train)
            raw = sess._tf_sess()  # pylint: disable=protected-access
            return dict((v.op.name, copy_values(raw, v.op.name))
                        for v in tf.trainable_variables())

    results = run_workers(worker, workers, devices, config=epl.Config(config), timeout=240)
    for copies in results:
        for name, value in reference.items():
            assert max_diff(value, copies[name]) < TOL, name


def _estimator_worker(kind, model_dir, x, labels, workers, devices, steps):
    def worker(index):
        wx = dict((k, worker_rows(v, steps, workers, devices * BATCH, index))
                  for k, v in x.items())
        wy = worker_rows(labels, steps, workers, devices * BATCH, index)
        epl.set_default_strategy(epl.replicate(1))
        rec.make_estimator(kind, model_dir).train(rec.input_fn(wx, wy, BATCH), steps=steps)
    return worker


@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind,devices", [("wide_deep_classifier", 1),
                                          ("wide_deep_classifier", 2),
                                          ("linear_regressor", 2)])
def test_canned_estimator_on_two_workers_matches_serial(kind, devices, tmp_path):
    workers = 2
    global_batch = workers * devices * BATCH
    x, y = rec.make_data(global_batch * STEPS)
    labels = y[kind.endswith("regressor")]
    reference = rec.serial_train(kind, x, labels, global_batch, STEPS, tmp_path / "serial")
    run_workers(_estimator_worker(kind, tmp_path / "epl", x, labels, workers, devices, STEPS),
                workers, devices, config=epl.Config(rec.EPL_CONFIG), timeout=360)
    trained = rec.checkpoint_values(tmp_path / "epl")
    assert trained["global_step"] == STEPS
    worst = rec.max_difference(reference, trained)
    MEASURED.append(("%s[%s-2x%d]" % (__name__, kind, devices), worst[0]))
    assert worst[0] < TOL, worst


@pytest.mark.timeout(400)
def test_partitioned_checkpoint_from_two_workers_continues_on_one_with_other_parts(tmp_path):
    """2 x 1 with tables in 2 parts writes the checkpoint; 1 x 2 with 3 parts restores
    it and trains on: the weights of serial training with 2 parts all along."""
    kind, global_batch = "wide_deep_classifier", 2 * BATCH
    x, y = rec.make_data(global_batch * 2 * STEPS)
    labels = y[False]
    reference = rec.serial_train(kind, x, labels, global_batch, 2 * STEPS, tmp_path / "serial")
    model_dir = tmp_path / "epl"
    first = global_batch * STEPS
    head = dict((k, v[:first]) for k, v in x.items())
    run_workers(_estimator_worker(kind, model_dir, head, labels[:first], 2, 1, STEPS), 2, 1,
                config=epl.Config(rec.EPL_CONFIG), timeout=360)
    epl.init(epl.Config(rec.EPL_CONFIG), cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1))
    estimator = rec.make_estimator(kind, model_dir, partitions=3)
    rest = dict((k, v[first:]) for k, v in x.items())
    estimator.train(rec.input_fn(rest, labels[first:], BATCH), steps=STEPS)
    trained = rec.checkpoint_values(model_dir)
    assert trained["global_step"] == 2 * STEPS
    parts = [n for n in trained if "user_embedding/embedding_weights/part_" in n]
    assert parts == [] and np.shape(
        trained["dnn/input_from_feature_columns/input_layer/user_embedding/"
                "embedding_weights"]) == (64, 6)   # saved whole, however partitioned
    worst = rec.max_difference(reference, trained)
    MEASURED.append((__name__ + "[restore 2x1 -> 1x2]", worst[0]))
    assert worst[0] < TOL, worst
