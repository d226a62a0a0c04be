"""Recommendation models on one worker's virtual devices equal serial training.

The model (tests/recmodels.py) gives every replica a different number of sparse
gradient rows in every step (SparseTensor ids, ``embedding_lookup_sparse``, a
partitioned table). Trained under data parallelism, gradient accumulation,
pipelines, ZeRO, fp16 and each ``communication.sparse_reduction``, it ends with
the weights of serial training on the same global batches.
"""
import pytest
import tensorflow.compat.v1 as tf

import epl
import recmodels
from epl.cluster import Cluster
from epl.communicators import library
from eplutil import all_copy_values, max_diff

STEPS, BATCH = 4, 6
TOL = 1e-5


def _epl_weights(config, devices, batch, runs, optimizer, combiner="mean", stages=False):
    data = recmodels.make_data(devices * batch * runs * 2)
    epl.init(epl.Config(config), cluster=Cluster(devices_per_worker=devices))
    stage = recmodels.no_stage
    if stages:
        stage = lambda i: epl.replicate(1, name="stage_%d" % i)
    else:
        epl.set_default_strategy(epl.replicate(1))
    loss = recmodels.build(recmodels.dataset_input(data, batch), combiner, stage=stage)
    train = recmodels.train_op(loss, optimizer)
    names = [v.op.name for v in tf.trainable_variables()]
    with tf.train.MonitoredTrainingSession() as sess:
        for _ in range(runs):
            sess.run(train)
        return all_copy_values(sess._tf_sess(), names), data  # pylint: disable=W0212


def _check(reference, copies, tol=TOL):
    assert sorted(reference) == sorted(copies)
    for name, value in reference.items():
        assert max_diff(value, copies[name]) < tol, name


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["ring", "tf"])
def test_every_backend_matches_serial(backend, monkeypatch):
    """EPL's ring (all-reduces; gathers through TF's collectives) and TF's collectives."""
    monkeypatch.setenv("EPL_COLLECTIVE_BACKEND", backend)
    if backend == "ring" and library.load() is None:
        pytest.skip("EPL op library not built")
    copies, data = _epl_weights({}, 2, BATCH, STEPS, "wide_deep")
    reference = recmodels.serial_weights(data, 2 * BATCH, STEPS, "wide_deep")
    _check(reference, copies)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("optimizer,combiner,config", [
    ("adagrad", "mean", {}),
    ("ftrl", "sum", {}),
    ("momentum", "sqrtn", {}),
    ("wide_deep", "mean", {"communication.sparse_reduction": "all_reduce"}),
    ("momentum", "mean", {"communication.sparse_reduction": "auto"}),
    ("adagrad", "mean", {"zero.level": "v1"}),
    ("momentum", "sum", {"zero.level": "v2"}),
])
def test_data_parallel_matches_serial(optimizer, combiner, config):
    copies, data = _epl_weights(config, 2, BATCH, STEPS, optimizer, combiner)
    reference = recmodels.serial_weights(data, 2 * BATCH, STEPS, optimizer, combiner)
    _check(reference, copies)


@pytest.mark.timeout(300)
def test_fp16_rows_on_the_wire_stay_close_to_serial():
    copies, data = _epl_weights({"communication.fp16": True}, 2, BATCH, STEPS, "adagrad")
    reference = recmodels.serial_weights(data, 2 * BATCH, STEPS, "adagrad")
    _check(reference, copies, 1e-3)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("reduction", ["gather", "all_reduce"])
def test_gradient_accumulation_matches_serial(reduction):
    """Two runs per apply: each replica accumulates its rows; the touched rows of the
    sums are gathered (or the sums all-reduced) once per apply."""
    config = {"pipeline.num_micro_batch": 2, "communication.sparse_reduction": reduction}
    copies, data = _epl_weights(config, 2, BATCH, 2 * STEPS, "momentum")
    reference = recmodels.serial_weights(data, 2 * 2 * BATCH, STEPS, "momentum")
    _check(reference, copies)


@pytest.mark.timeout(300)
def test_pipeline_with_data_parallel_stages_matches_serial():
    """Two stages x two replicas, two micro-batches: each replica concatenates its
    micro-batches' rows, then gathers them."""
    config = {"pipeline.num_micro_batch": 2}
    copies, data = _epl_weights(config, 4, BATCH, STEPS, "adagrad", stages=True)
    reference = recmodels.serial_weights(data, 2 * 2 * BATCH, STEPS, "adagrad")
    _check(reference, copies)
