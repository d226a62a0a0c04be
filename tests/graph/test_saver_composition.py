"""Memory savers composed with each other and with every local layout.

The matrix: savers {offload v0, grouped apply, AMP O1, and their pairs and the
triple} x layouts {data parallelism 1 worker x 2 devices, a 2-stage pipeline
with 2 micro-batches, gradient accumulation over 2 runs}, on the corpus model
whose variables all have odd sizes (tests/realmodels.py ``OddSizes``). Each cell
trains ``corpusutil.STEPS`` steps and is compared with serial training of the
same rows (tests/corpusutil.py):

* float32 savers end within ``TOL`` of the serial weights (every variable,
  optimizer slots included, on every local copy), with the same loss curve;
* AMP cells match float32 serial training within 1e-2: relative on the loss
  curve, absolute on the model weights (Adam's slots are left out, see
  tests/graph/test_amp.py), and data-parallel copies stay identical.

Each cell also checks that its savers really acted on the graph (offload's
just-in-time reads, grouped apply's chained groups, AMP's float16 ops), so a
saver silently dropped by a combination fails the cell.

Skipped steps: tests/graph/test_amp.py's
``test_overflow_skips_the_step_on_every_replica_and_the_scale_adapts`` injects an
overflow into one replica of DP 1x2 (AMP alone); here the same is checked with
other savers on DP, a pipeline (overflow in one micro-batch) and gradient
accumulation (overflow in the second run of a step). Across workers:
tests/multiworker/test_saver_composition_workers.py.

ZeRO on several local devices, with pipelines or accumulation, with AMP (v1) and
with grouped apply on several devices per worker, once refused naming both keys,
are cells of the matrix (ZeRO's remaining refusals: tests/multiworker/test_zero.py,
tests/graph/test_saver_seam.py). Keys of
gradient checkpointing without its type are accepted with a warning.
"""
import logging
import os

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import corpusutil
import epl
from epl.cluster import Cluster
from epl.runtime import amp
from epl.runtime.offload import OFFLOAD_SCOPE
from eplutil import MEASURED, dataset_input, initial_weights, make_data, mlp, staged_mlp
from realmodels import OddSizes

TOL = 2e-5
AMP_RTOL = 1e-2
OFFLOAD = {"offload.level": "v0"}
GROUPED = {"optimizer.num_apply_group": 3}
AMP = {"amp.level": "O1"}
GC = {"gradient_checkpoint.type": "auto"}


def _merge(*parts):
    merged = {}
    for part in parts:
        merged.update(part)
    return merged


FP32_SAVERS = {
    "offload": OFFLOAD,
    "grouped": GROUPED,
    "offload+grouped": _merge(OFFLOAD, GROUPED),
    "gc": GC,
    "gc+offload+grouped": _merge(GC, OFFLOAD, GROUPED),
    # refused before ZeRO worked on every layout ("2 devices per worker", "2 TaskGraphs",
    # "pipeline.num_micro_batch=2")
    "zero_v1": {"zero.level": "v1"},
    "zero_v0+offload": _merge({"zero.level": "v0"}, OFFLOAD),
    # refused on several devices per worker before grouped apply's chaining stopped
    # making later groups' updates shared ("optimizer.num_apply_group=3 is not supported")
    "zero_v1+grouped": _merge({"zero.level": "v1"}, GROUPED),
    "zero_v2": {"zero.level": "v2"},  # EPL extension: bucketed reduce-scatter, all-gather
}
AMP_SAVERS = {
    "amp": AMP,
    "amp+grouped": _merge(AMP, GROUPED),
    "amp+offload": _merge(AMP, OFFLOAD),
    "amp+offload+grouped": _merge(AMP, OFFLOAD, GROUPED),
    "amp+gc": _merge(AMP, GC),
    "amp+zero_v0": _merge(AMP, {"zero.level": "v0"}),
    # refused before members agreed on skipping a step ("zero.level='v1' with amp.level")
    "amp+zero_v1": _merge(AMP, {"zero.level": "v1"}),
    "amp+zero_v2": _merge(AMP, {"zero.level": "v2"}),
}
LAYOUTS = {
    # layout: (runner, slices per step of the serial reference, moving statistics compared)
    "dp_1x2": (lambda m, a, c: corpusutil.run_dp(m, a, devices=2, config=c), 2, "first"),
    "pipeline_2x2": (lambda m, a, c: corpusutil.run_pipeline(m, a, micro_batches=2, config=c),
                     2, "all"),
    "ga_2": (lambda m, a, c: corpusutil.run_ga(m, a, micro_batches=2, config=c), 2, "all"),
}


def _record(value):
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], value))


def _step_curve(curve, layout):
    """Loss per step: gradient accumulation runs (and reports) each micro-batch alone."""
    if layout != "ga_2":
        return np.asarray(curve)
    return np.asarray(curve).reshape(-1, 2).mean(axis=1)


def _check_savers_acted(config):
    graph = tf.get_default_graph()
    names = [op.name for op in graph.get_operations()]
    if config.get("offload.level"):
        assert any(n.startswith(OFFLOAD_SCOPE) for n in names), "offload did not act"
        program = epl.Graph.get(graph).parallel
        host = epl.Env.get().cluster.worker_cpu()
        for name, instances in program.variable_copies.items():
            assert all(op.device == host for op in instances), name
    if config.get("optimizer.num_apply_group", 1) > 1:
        assert any("_group_" in n and "/" not in n for n in names), "grouped apply did not act"
    if config.get("amp.level"):
        assert amp.state().converted, "AMP converted nothing to float16"
    if config.get("gradient_checkpoint.type"):
        from epl.runtime.gradient_checkpoint import RECOMPUTE_SCOPE
        assert any(RECOMPUTE_SCOPE in n for n in names), "gradient checkpointing did not act"


def _run_cell(config, layout, corpus_reference):
    """``corpus_reference``: conftest's fixture, one serial run per layout's slices for
    the whole matrix (tests read it, never change it)."""
    runner, slices, stats = LAYOUTS[layout]
    model = OddSizes()
    arrays = model.data(slices * model.batch * corpusutil.STEPS)
    with tf.Graph().as_default():
        ref_curve, reference = corpus_reference(model, arrays, slices, stats)
    curve, copies = runner(model, arrays, dict(config))
    _check_savers_acted(config)
    return ref_curve, reference, _step_curve(curve, layout), copies, stats


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("saver", sorted(FP32_SAVERS))
def test_float32_savers_match_serial(saver, layout, corpus_reference):
    ref_curve, reference, curve, copies, stats = _run_cell(FP32_SAVERS[saver], layout,
                                                           corpus_reference)
    if "zero.level" in FP32_SAVERS[saver]:  # slots live on their owners only (compared in
        reference = dict((n, v) for n, v in reference.items()  # test_zero_checkpoint_layouts)
                         if not _is_slot(n) or "_power" in n)
    assert set(reference) - {"global_step"} <= set(copies), "copies missing variables"
    worst, where = corpusutil.max_difference(reference, copies, stats)
    _record(worst)
    assert worst < TOL, "%s x %s: %s differs from serial training by %.3g" % (
        saver, layout, where, worst)
    np.testing.assert_allclose(curve, ref_curve, rtol=1e-5, atol=1e-6)


def _is_slot(name):
    return name.endswith(("/Adam", "/Adam_1", "/Momentum")) or "_power" in name


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("saver", sorted(AMP_SAVERS))
def test_amp_savers_match_float32_serial(saver, layout, corpus_reference):
    ref_curve, reference, curve, copies, _ = _run_cell(AMP_SAVERS[saver], layout,
                                                       corpus_reference)
    np.testing.assert_allclose(curve, ref_curve, rtol=AMP_RTOL)
    weights = dict((n, v) for n, v in copies.items()
                   if n in reference and corpusutil.compared(n) and not _is_slot(n))
    assert weights, "no model weights compared"
    worst, where = corpusutil.max_difference(reference, weights, "all")
    _record(worst)
    assert worst < AMP_RTOL, "%s x %s: %s differs from float32 serial training by %.3g" % (
        saver, layout, where, worst)
    for name, values in copies.items():  # same decisions and updates on every copy
        for value in values[1:]:
            np.testing.assert_array_equal(value, values[0], err_msg=name)


# ---- skipped steps with other savers ------------------------------------------------
def _all_copies(sess):
    program = epl.Graph.get(sess.graph).parallel
    fetch = {}
    for name, ops in program.variable_copies.items():
        fetch[name] = [op.outputs[0] for op in ops]
    return sess.run(fetch)


def _overflow_run(layout, config, x, y, runs):
    """Train the MLP (staged for the pipeline) with ``config``; variables of every copy
    after each run."""
    settings = dict(config, **{"amp.level": "O1", "amp.debug_log": True})
    if layout != "dp_1x2":
        settings["pipeline.num_micro_batch"] = 2
    epl.init(epl.Config(settings), cluster=Cluster(devices_per_worker=1 if layout == "ga_2"
                                                   else 2))
    if layout == "pipeline_2x2":
        loss = staged_mlp(*dataset_input(x, y, 4), weights=initial_weights())
    else:
        epl.set_default_strategy(epl.replicate(1))
        loss = mlp(*dataset_input(x, y, 8), weights=initial_weights())
    step = tf.train.get_or_create_global_step()
    train = tf.train.AdamOptimizer(0.01).minimize(loss, global_step=step)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        states = []
        for _ in range(runs):
            sess.run(train)
            states.append(_all_copies(sess))
            states[-1]["global_step"] = [sess.run(step)]
    _check_savers_acted(settings)
    return states


OVERFLOWS = {
    # layout: (rows made to overflow in float16, runs, run ending the step before, skipped run)
    "dp_1x2": (slice(24, 32), 3, 0, 1),        # step 1, replica 1
    "pipeline_2x2": (slice(12, 16), 3, 0, 1),  # step 1, micro-batch 1
    "ga_2": (slice(24, 32), 6, 1, 3),          # step 1, its second run
}


@pytest.mark.parametrize("saver", ["grouped", "offload+grouped", "zero_v0+offload", "zero_v1",
                                   "zero_v2"])
@pytest.mark.parametrize("layout", ["dp_1x2", "pipeline_2x2", "ga_2"])
def test_overflow_skips_the_step_everywhere_with_other_savers(layout, saver, monkeypatch):
    """An overflow in one replica / micro-batch / accumulation run skips the whole step
    on every copy: weights, Adam's slots and beta powers unchanged, the loss scale
    halved everywhere, global_step advanced (a skipped step counts, so step-based
    hooks end); the next step applies again."""
    monkeypatch.setattr(amp, "INITIAL_SCALE", 8.0)
    rows, runs, before, skipped = OVERFLOWS[layout]
    x, y = make_data(64)
    x[rows] = 1e5  # inf once cast to float16
    states = _overflow_run(layout, FP32_SAVERS[saver], x, y, runs)
    old, new, last = states[before], states[skipped], states[-1]
    for name, values in new.items():
        if name.startswith("EPL_AMP/") or name == "global_step":
            continue
        for copy, value in enumerate(values):
            if name.startswith("EPL_GA"):  # accumulators restart after every apply
                continue
            np.testing.assert_array_equal(value, old[name][copy], err_msg=name)
    assert new["EPL_AMP/loss_scale"] == [4.0] * len(new["EPL_AMP/loss_scale"])
    assert new["EPL_AMP/skipped_steps"] == [1] * len(new["EPL_AMP/skipped_steps"])
    assert new["global_step"] == [old["global_step"][0] + 1]
    assert set(last["global_step"]) == {3}  # three steps, one of them skipped
    watched = [n for n in ("d1/kernel", "d2/kernel", "d1/kernel/Adam") if n in last]
    changed = [n for n in watched if not np.array_equal(last[n][0], new[n][0])]
    assert changed == watched and len(watched) >= 2  # ZeRO: slots are not per-copy


def _build_local(settings, devices, staged=False):
    epl.init(epl.Config(settings), cluster=Cluster(devices_per_worker=devices))
    x, y = make_data(16)
    if staged:
        loss = staged_mlp(*dataset_input(x, y, 4), weights=initial_weights())
    else:
        epl.set_default_strategy(epl.replicate(1))
        loss = mlp(*dataset_input(x, y, 4), weights=initial_weights())
    return tf.train.AdamOptimizer(0.01).minimize(loss)


NO_EFFECT_VALUES = {"gradient_checkpoint.end_taskgraph": 0,
                    "gradient_checkpoint.check_gradients": True}


@pytest.mark.parametrize("key", sorted(NO_EFFECT_VALUES))
def test_gc_keys_without_its_type_train_with_a_warning(key, caplog, monkeypatch):
    """With other savers set, a gradient checkpointing key without
    gradient_checkpoint.type (exported for every job, say) is accepted with one warning
    naming both keys and the value, and the job trains (tests/unit/test_availability.py
    covers the warning alone)."""
    monkeypatch.setattr("epl.availability._WARNED", set())
    value = NO_EFFECT_VALUES[key]
    with caplog.at_level(logging.WARNING, logger="epl"):
        train = _build_local(_merge(OFFLOAD, GROUPED, AMP, {key: value}), 1)
    warned = [r.getMessage() for r in caplog.records if "has no effect" in r.getMessage()]
    assert len(warned) == 1
    assert key in warned[0] and repr(value) in warned[0]
    assert "gradient_checkpoint.type" in warned[0]
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(train)
    assert not [op for op in tf.get_default_graph().get_operations()
                if "EPL_GC" in op.name]
