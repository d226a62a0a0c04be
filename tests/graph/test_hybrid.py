"""Hybrid parallelism: TaskGraphs of different strategies on their own devices.

The seeds' default placement (no ``cluster.colocate_split_and_replicate``): a
``replicate(k)`` TaskGraph and a ``split(k)`` (or second ``replicate(k)``) TaskGraph
each get k devices of their own; a replica is k copies, copy j running position j
of both, activations and gradients sent between the devices. With
``pipeline.num_micro_batch`` > 1 the TaskGraphs are pipeline stages k devices wide
(each micro-batch split over a stage's devices); with more devices than one replica
needs, data parallelism runs over the replicas. Every layout trains like serial
training on the global batch (docs/hybrid.md).
"""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import corpusutil
import epl
from epl.cluster import Cluster
from eplutil import MEASURED
from realmodels import CORPUS, OddSplitHead
from test_split import STEPS, _data, _dataset, _model, _serial, _train_and_save, _train_copies

TOL = 2e-5
# layout: (width k, head kind, micro-batches, devices on the worker)
LAYOUTS = {
    "default_r2+s2": (2, "split", 1, 4),
    "default_r2+r2": (2, "replicate", 1, 4),
    "pipeline_r2+s2_m2": (2, "split", 2, 4),
    "pipeline_r2+r2_m2": (2, "replicate", 2, 4),
    "pipeline_r1+s1_m2_dp2": (1, "split", 2, 4),
    "pipeline_r2+s2_m2_dp2": (2, "split", 2, 8),
}


def _record(value):
    import os
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], value))


def _slices(layout):
    width, _, micro_batches, devices = LAYOUTS[layout]
    return (devices // (2 * width)) * width * micro_batches


def _train_classifier(layout, classes, config=None):
    """The documentation's classifier (dense backbone, ``classes``-way head) under
    ``layout`` (and ``config``); returns (curve, {name: values of every copy})."""
    width, head, micro_batches, devices = LAYOUTS[layout]
    batch = 2 * _slices(layout)
    x, y = _data(batch * STEPS, classes)
    settings = {"pipeline.num_micro_batch": micro_batches}
    settings.update(config or {})
    epl.init(epl.Config(settings), cluster=Cluster(devices_per_worker=devices))
    scope = epl.split(width) if head == "split" else epl.replicate(width)
    loss, accuracy = _model(*_dataset(x, y, batch * width // _slices(layout)), classes,
                            epl.replicate(width), scope, metrics=True)
    epl.add_to_collection(loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)  # over the replicas
    curve, values = _train_copies(loss, accuracy)
    plan = epl.Graph.get().parallel.plan
    assert plan.stages == (0, 1) and not plan.colocated
    return curve, values


@pytest.mark.parametrize("classes", [10, 1001])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_classifier_layout_matches_serial(layout, classes):
    _check_classifier(layout, classes)


SAVERS = {
    "gc": {"gradient_checkpoint.type": "auto"},
    "offload": {"offload.level": "v0"},
    "grouped_apply": {"optimizer.num_apply_group": 2},
    "zero_v1": {"zero.level": "v1"},
    "zero_bubble": {"pipeline.strategy": "ZeroBubble"},
    "prefer_forward": {"pipeline.strategy": "PreferForward"},
}


# (saver, head kind, stages wider than one device): the refusal naming both settings
_REFUSED = {
    ("zero_v1", "split", True): r"zero.level=.v1. does not partition the optimizer states "
                                r"of epl.split layers",
    ("zero_v1", "split", False): r"zero.level=.v1. does not partition the optimizer "
                                 r"states of epl.split layers",
    ("offload", "split", True): r"offload.level=.v0. does not support TaskGraphs .*"
                                r"device_count > 1",
    ("offload", "replicate", True): r"offload.level=.v0. does not support TaskGraphs .*"
                                    r"device_count > 1",
}


@pytest.mark.parametrize("saver", sorted(SAVERS))
@pytest.mark.parametrize("layout", ["default_r2+s2", "pipeline_r2+s2_m2",
                                    "pipeline_r2+r2_m2", "pipeline_r1+s1_m2_dp2"])
def test_memory_savers_compose_with_hybrid_layouts(layout, saver):
    refusal = _REFUSED.get((saver, LAYOUTS[layout][1], LAYOUTS[layout][0] > 1))
    if saver == "prefer_forward" and LAYOUTS[layout][2] == 1:
        refusal = None  # no pipeline: the schedule key does not apply
    if refusal is not None:
        with pytest.raises(Exception, match=refusal):
            _train_classifier(layout, 10, SAVERS[saver])
        return
    _check_classifier(layout, 10, SAVERS[saver])


def _check_classifier(layout, classes, config=None, tol=TOL, rtol=1e-5):
    width, head, _, _ = LAYOUTS[layout]
    ref_curve, ref = _serial(classes, 2 * _slices(layout))
    curve, copies = _train_classifier(layout, classes, config)
    np.testing.assert_allclose([c[0] for c in curve], [c[0] for c in ref_curve], rtol=rtol)
    worst = max(float(np.abs(c - ref["backbone/kernel"]).max())
                for c in copies["backbone/kernel"])
    kernels, biases = copies["classifier/kernel"], copies["classifier/bias"]
    step = width if head == "split" else 1
    for start in range(0, len(kernels), step):  # one model replica's shards at a time
        kernel = np.concatenate(kernels[start:start + step], axis=1)
        bias = np.concatenate(biases[start:start + step], axis=0)
        worst = max(worst, float(np.abs(kernel - ref["classifier/kernel"]).max()),
                    float(np.abs(bias - ref["classifier/bias"]).max()))
    if head == "split":  # every device holds 1/k of the classifier
        widths = [k.shape[1] for k in kernels[:width]]
        assert sum(widths) == classes and max(widths) - min(widths) <= 1
    _record(worst)
    assert worst < tol


def test_amp_on_a_pipeline_with_a_split_stage_matches_float32():
    """AMP O1 on replicate(2) + split(2), 2 micro-batches, 1001 classes: float16
    forward ops on both stages, float32 weights, within AMP's tolerance (1e-2)."""
    _check_classifier("pipeline_r2+s2_m2", 1001, {"amp.level": "O1", "amp.loss_scale": 1024},
                      tol=1e-2, rtol=1e-2)
    from epl.runtime import amp
    assert amp.state().converted, "AMP converted no op"


@pytest.mark.parametrize("layout", ["pipeline_r2+s2_m2", "pipeline_r2+s2_m2_dp2"])
def test_corpus_with_a_split_stage_matches_serial(layout):
    """The corpus's odd-sized model with its 1001-class classifier as an epl.split(2)
    pipeline stage after a replicate(2) stage (2 micro-batches; 4 devices, or 8: two
    replicas, data parallel); its weights start as the serial model's
    (realmodels.OddSplitHead)."""
    width, head, micro_batches, devices = LAYOUTS[layout]
    model = OddSplitHead()
    slices = _slices(layout)
    arrays = model.data(slices * model.batch * corpusutil.STEPS)
    ref_curve, reference = corpusutil.serial_reference(model, arrays, slices)
    curve, copies = corpusutil.run_hybrid(model, arrays, width, head, micro_batches, devices)
    sharded = [n for n in copies if n.startswith("model/classes/")]  # weights and slots
    assert len(sharded) == 6, sharded
    for name in sharded:  # per replica: its two shards, 501 and 500 classes
        shards = copies[name]
        assert [v.shape[-1] for v in shards] == [501, 500] * (devices // 4), name
        copies[name] = [np.concatenate(shards[i:i + width], axis=-1)
                        for i in range(0, len(shards), width)]
    worst, where = corpusutil.max_difference(reference, copies)
    _record(worst)
    assert worst < TOL, "%s differs from serial training by %.3g" % (where, worst)
    np.testing.assert_allclose(curve, ref_curve, rtol=1e-5, atol=1e-6)


# A split stage needs layers EPL can split (dense classifiers, MoE experts); the
# corpus's stage 1 holds encoder layers, embeddings and layer norms, so it runs the
# pipeline of two replicate(2) stages.
# (The corpus's variables draw their initial values from their requested shape, so a
# shard would not start as its slice of the serial model's: split is checked on the
# documentation's classifier above, whose initial values are given.)
CORPUS_CASES = [(c, layout) for layout in ("default_r2+r2", "pipeline_r2+r2_m2")
                for c in CORPUS]


@pytest.mark.parametrize("model_class,layout", CORPUS_CASES,
                         ids=["%s-%s" % (c.name, layout) for c, layout in CORPUS_CASES])
def test_corpus_layout_matches_serial(model_class, layout):
    """The real-model corpus (batch norm, an encoder, sparse embedding gradients, odd
    sizes). Batch-norm moving statistics are compared where one copy's slices are the
    serial reference's (copy 0 of a layout without micro-batches: "first"); with
    micro-batches a copy's statistics follow its own slices in another order than the
    serial loop's, so they are left out (the trained weights are compared)."""
    width, head, micro_batches, devices = LAYOUTS[layout]
    model = model_class()
    slices = _slices(layout)
    stats = "first" if micro_batches == 1 else "skip"
    arrays = model.data(slices * model.batch * corpusutil.STEPS)
    ref_curve, reference = corpusutil.serial_reference(model, arrays, slices, stats=stats)
    curve, copies = corpusutil.run_hybrid(model, arrays, width, head, micro_batches, devices)
    worst, where = corpusutil.max_difference(reference, copies, stats)
    _record(worst)
    assert worst < TOL, "%s differs from serial training by %.3g" % (where, worst)
    assert set(reference) - {"global_step"} <= set(copies), "copies missing variables"
    np.testing.assert_allclose(curve, ref_curve, rtol=1e-5, atol=1e-6)


def test_checkpoint_of_the_default_placement_restores_on_another_layout(tmp_path):
    """replicate(2) + split(2) on their own devices saves every shard as a slice of the
    whole variable (slots too); colocated split(4) on the same 4 devices restores it."""
    saved = _train_and_save(11, 4, str(tmp_path / "default"), width=2, colocate=False)
    reader = tf.train.load_checkpoint(str(tmp_path / "default"))
    assert reader.get_variable_to_shape_map()["classifier/kernel"] == [8, 11]
    np.testing.assert_allclose(reader.get_tensor("classifier/kernel"), saved[0], atol=0)
    np.testing.assert_allclose(reader.get_tensor("classifier/kernel/Momentum"), saved[1],
                               atol=0)
    restored = _train_and_save(11, 4, str(tmp_path / "colocated"),
                               restore=str(tmp_path / "default"), steps=0)
    np.testing.assert_allclose(restored[0], saved[0], atol=0)
    np.testing.assert_allclose(restored[1], saved[1], atol=0)
    back = _train_and_save(11, 4, str(tmp_path / "again"), restore=str(tmp_path / "colocated"),
                           steps=0, width=2, colocate=False)
    np.testing.assert_allclose(back[0], saved[0], atol=0)


def test_split_stage_holds_one_kth_of_its_weights_and_slots_per_device():
    """Default placement, replicate(2) + split(2) on 4 devices, 1001 classes: the
    classifier's kernel, bias and their momentum live only on the split stage's two
    devices, 501 and 500 columns each; the backbone's devices hold none of them."""
    _train_classifier("default_r2+s2", 1001)
    # _train_classifier closed its session: read the placement from the program
    program = epl.Graph.get().parallel
    names = [n for n in program.variable_copies if n.startswith("classifier/")]
    assert sorted(names) == ["classifier/bias", "classifier/bias/Momentum",
                             "classifier/kernel", "classifier/kernel/Momentum"]
    plan = program.plan
    split_devices = plan.taskgraphs[1].devices[0]
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for name in names:
            columns = {}
            for var_op in program.variable_copies[name]:
                value = sess.run(var_op.outputs[0]) if var_op.type == "VariableV2" else \
                    sess.run(tf.raw_ops.ReadVariableOp(resource=var_op.outputs[0],
                                                       dtype=tf.float32))
                columns[var_op.device] = value.shape[-1]
            assert set(columns) == set(split_devices), (name, columns)
            assert sorted(columns.values()) == [500, 501], (name, columns)
