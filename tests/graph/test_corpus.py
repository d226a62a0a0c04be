"""Every parallel mode trains the real-model corpus like serial training.

Models (tests/realmodels.py): slim ResNet with batch norm, a BERT-style
encoder, a wide-and-deep embedding model with sparse gradients, and a model
whose variables all have odd sizes; always with the op library when it is
built. Each ends within TOL of the serial reference, on every local copy, and
its globally averaged loss matches the serial loss step by step.
"""
import numpy as np
import pytest

import corpusutil
import tensorflow.compat.v1 as tf
from eplutil import MEASURED
from realmodels import CORPUS, Bert, ResNet
from test_call_executors import single_threaded_calls

TOL = 2e-5
MODES = {
    # mode: (runner, slices per step in the serial reference, moving statistics)
    "dp_1x2": (lambda m, a: corpusutil.run_dp(m, a, devices=2), 2, "first"),
    "pipeline_2x2": (lambda m, a: corpusutil.run_pipeline(m, a, micro_batches=2), 2, "all"),
    "ga_2": (lambda m, a: corpusutil.run_ga(m, a, micro_batches=2), 2, "all"),
}


def _record(value):
    import os
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], value))


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("model_class", CORPUS, ids=[c.name for c in CORPUS])
def test_corpus_mode_matches_serial(model_class, mode, corpus_reference):
    runner, slices, stats = MODES[mode]
    model = model_class()
    arrays = model.data(slices * model.batch * corpusutil.STEPS)
    ref_curve, reference = corpus_reference(model, arrays, slices, stats)
    curve, copies = runner(model, arrays)
    worst, where = corpusutil.max_difference(reference, copies, stats)
    _record(worst)
    assert worst < TOL, "%s differs from serial training by %.3g" % (where, worst)
    assert set(reference) - {"global_step"} <= set(copies), "copies missing variables"
    if mode != "ga_2":
        np.testing.assert_allclose(curve, ref_curve, rtol=1e-5, atol=1e-6)


def test_single_threaded_stage_bodies_match_serial(corpus_reference):
    """pipeline.call_executor: auto on the batch-norm CNN (the shape it was built for):
    the corpus rows above keep TF's default executor, the default."""
    model = ResNet()
    arrays = model.data(2 * model.batch * corpusutil.STEPS)
    ref_curve, reference = corpus_reference(model, arrays, 2, "all")
    curve, copies = corpusutil.run_pipeline(
        model, arrays, micro_batches=2, config={"pipeline.call_executor": "auto"})
    assert single_threaded_calls(tf.get_default_graph())
    worst, where = corpusutil.max_difference(reference, copies, "all")
    assert worst < TOL, "%s differs from serial training by %.3g" % (where, worst)
    np.testing.assert_allclose(curve, ref_curve, rtol=1e-5, atol=1e-6)


SAVER_MODES = {
    # case: (layout of MODES, memory savers)
    "dp_1x2+offload+grouped": ("dp_1x2", {"offload.level": "v0",
                                          "optimizer.num_apply_group": 3}),
    "pipeline_2x2+gc+offload+grouped": ("pipeline_2x2", {
        "gradient_checkpoint.type": "auto", "offload.level": "v0",
        "optimizer.num_apply_group": 3}),
}
SAVER_RUNNERS = {
    "dp_1x2": lambda m, a, c: corpusutil.run_dp(m, a, devices=2, config=c),
    "pipeline_2x2": lambda m, a, c: corpusutil.run_pipeline(m, a, micro_batches=2, config=c),
}


@pytest.mark.parametrize("model_class,case", [
    (ResNet, "dp_1x2+offload+grouped"), (ResNet, "pipeline_2x2+gc+offload+grouped"),
    (Bert, "dp_1x2+offload+grouped"),
    (Bert, "pipeline_2x2+gc+offload+grouped")],
    ids=["resnet-dp_1x2+offload+grouped", "resnet-pipeline_2x2+gc+offload+grouped",
         "bert-dp_1x2+offload+grouped", "bert-pipeline_2x2+gc+offload+grouped"])
def test_corpus_with_memory_savers_matches_serial(model_class, case, corpus_reference):
    """Memory savers composed on the batch-norm ResNet and the BERT-style encoder
    (tests/graph/test_saver_composition.py has the full matrix on a small model)."""
    layout, savers = SAVER_MODES[case]
    _, slices, stats = MODES[layout]
    model = model_class()
    arrays = model.data(slices * model.batch * corpusutil.STEPS)
    ref_curve, reference = corpus_reference(model, arrays, slices, stats)
    curve, copies = SAVER_RUNNERS[layout](model, arrays, dict(savers))
    worst, where = corpusutil.max_difference(reference, copies, stats)
    _record(worst)
    assert worst < TOL, "%s differs from serial training by %.3g" % (where, worst)
    assert set(reference) - {"global_step"} <= set(copies), "copies missing variables"
    np.testing.assert_allclose(curve, ref_curve, rtol=1e-5, atol=1e-6)


def test_bert_with_dropout_keeps_replicas_in_sync():
    """Dropout masks are random, so there is no serial twin; replicas must still
    end identical (gradients are all-reduced) and training must make progress."""
    model = Bert(dropout=0.1)
    arrays = model.data(2 * model.batch * 6)
    curve, copies = corpusutil.run_dp(model, arrays, devices=2, steps=6)
    assert np.all(np.isfinite(curve))
    for name, values in copies.items():
        np.testing.assert_array_equal(values[0], values[1], err_msg=name)
