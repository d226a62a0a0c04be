"""Hybrid layouts on two workers (in-process servers): each worker runs one model
replica in the seeds' default placement (a replicate(2) TaskGraph and a split(2)
TaskGraph on devices of their own), with and without a pipeline; data parallelism
averages the two replicas, and the result is serial training on the global batch."""
import os
import sys

import numpy as np
import pytest

import corpusutil
import epl
from eplutil import MEASURED, run_workers, worker_rows
from realmodels import CORPUS

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "graph"))
from test_split import STEPS, _data, _dataset, _model, _serial, _train_copies  # noqa: E402

WORKERS, DEVICES, WIDTH = 2, 4, 2


@pytest.mark.timeout(300)
@pytest.mark.parametrize("micro_batches,classes,head,backbone", [
    (1, 10, "split", WIDTH), (2, 1001, "split", WIDTH), (2, 7, "replicate", WIDTH),
    (2, 10, "split", 1)])
def test_default_placement_on_two_workers_matches_serial(micro_batches, classes, head,
                                                         backbone):
    """``backbone`` 1: a replicate(1) stage before the split(2) stage (different widths),
    both of the replica's copies running the backbone on its one device (3 devices per
    worker)."""
    per_worker = 2 * WIDTH * micro_batches   # rows per worker and step
    ref_curve, ref = _serial(classes, WORKERS * per_worker)
    x, y = _data(WORKERS * per_worker * STEPS, classes)

    def worker(index):
        rows_x = worker_rows(x, STEPS, WORKERS, per_worker, index)
        rows_y = worker_rows(y, STEPS, WORKERS, per_worker, index)
        scope = epl.split(WIDTH) if head == "split" else epl.replicate(WIDTH)
        loss, _ = _model(*_dataset(rows_x, rows_y, per_worker // micro_batches), classes,
                         epl.replicate(backbone), scope)
        epl.add_to_collection(loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
        curve, values = _train_copies(loss)
        curve = [step[0] for step in curve]
        plan = epl.Graph.get().parallel.plan
        assert plan.num_replicas == WORKERS and plan.stages == (0, 1)
        return curve, values

    config = epl.Config({"pipeline.num_micro_batch": micro_batches})
    results = run_workers(worker, WORKERS, backbone + WIDTH, config, timeout=240)
    worst = 0.0
    step = WIDTH if head == "split" else 1
    for curve, values in results:
        np.testing.assert_allclose(curve, [c[0] for c in ref_curve], rtol=1e-5)
        worst = max([worst] + [float(np.abs(k - ref["backbone/kernel"]).max())
                               for k in values["backbone/kernel"]])
        kernels, biases = values["classifier/kernel"], values["classifier/bias"]
        for start in range(0, len(kernels), step):
            worst = max(worst, float(np.abs(np.concatenate(kernels[start:start + step], axis=1)
                                            - ref["classifier/kernel"]).max()),
                        float(np.abs(np.concatenate(biases[start:start + step], axis=0)
                                     - ref["classifier/bias"]).max()))
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], worst))
    assert worst < 2e-5


@pytest.mark.timeout(300)
@pytest.mark.parametrize("model_class", CORPUS, ids=[c.name for c in CORPUS])
def test_corpus_pipeline_of_wide_stages_on_two_workers(model_class):
    """The corpus in a pipeline of two replicate(2) stages (2 micro-batches), one replica
    per worker (2 workers x 4 devices). Moving statistics follow each copy's own slices
    (not the serial loop's order) and are left out; the trained weights are compared."""
    model = model_class()
    slices = WORKERS * WIDTH * 2
    arrays = model.data(slices * model.batch * corpusutil.STEPS)
    _, reference = corpusutil.serial_reference(model, arrays, slices, stats="skip")
    results = corpusutil.run_workers_hybrid(model, arrays, WORKERS, DEVICES, WIDTH, 2)
    for worker, (_, copies) in enumerate(results):
        worst, where = corpusutil.max_difference(reference, copies, "skip")
        MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], worst))
        assert worst < 2e-5, "worker %d: %s differs from serial training by %.3g" % (
            worker, where, worst)
