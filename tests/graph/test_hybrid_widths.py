"""TaskGraphs of different widths in one model replica (docs/hybrid.md).

A replica is as many copies as its widest TaskGraph's device_count; a narrower
``replicate(a)`` TaskGraph runs consecutive copies on each of its devices (its weights
once per copy there, their gradients combined on the device before the all-reduce).
Each layout trains like serial training on the global batch: every copy of every
variable ends equal to the serial run's (the split stage's shards, concatenated).
"""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import corpusutil
import epl
from epl.cluster import Cluster
from realmodels import CORPUS
from test_hybrid import TOL, _record
from eplutil import copy_values
from test_split import STEPS, _data, _dataset, _model, _serial, _train_copies, saved_session

# layout: ((backbone kind, width), (head kind, width), micro-batches, devices)
LAYOUTS = {
    "r1+s2_m2": (("replicate", 1), ("split", 2), 2, 3),
    "r1+r2_m2": (("replicate", 1), ("replicate", 2), 2, 3),
    "r2+r1_m2": (("replicate", 2), ("replicate", 1), 2, 3),
    "r2+s2_m2": (("replicate", 2), ("split", 2), 2, 4),  # equal widths
}
ROWS = 2  # rows per copy and micro-batch


def _scope(kind, width):
    return epl.split(width) if kind == "split" else epl.replicate(width)


def _shape(layout):
    """(copies per replica, replicas, micro-batches, devices)."""
    backbone, head, micro_batches, devices = LAYOUTS[layout]
    width = max(backbone[1], head[1])
    return width, devices // (backbone[1] + head[1]), micro_batches, devices


def _train(layout, classes, config=None):
    """The classifier under ``layout`` (and ``config``): (curve, {name: values of every
    copy}, plan)."""
    backbone, head, micro_batches, devices = LAYOUTS[layout]
    width, replicas, _, _ = _shape(layout)
    batch = ROWS * width * replicas * micro_batches  # the serial run's batch
    x, y = _data(batch * STEPS, classes)
    settings = {"pipeline.num_micro_batch": micro_batches}
    settings.update(config or {})
    epl.init(epl.Config(settings), cluster=Cluster(devices_per_worker=devices))
    loss, accuracy = _model(*_dataset(x, y, ROWS * width), classes, _scope(*backbone),
                            _scope(*head), metrics=True)
    epl.add_to_collection(loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    curve, values = _train_copies(loss, accuracy)
    return curve, values, epl.Graph.get().parallel.plan


def _worst(layout, classes, copies, ref):
    """max |w - w_serial| over every copy of every variable."""
    width, _, _, _ = _shape(layout)
    worst = max(float(np.abs(c - ref["backbone/kernel"]).max())
                for c in copies["backbone/kernel"])
    step = width if LAYOUTS[layout][1][0] == "split" else 1
    kernels, biases = copies["classifier/kernel"], copies["classifier/bias"]
    for start in range(0, len(kernels), step):  # one replica's shards at a time
        kernel = np.concatenate(kernels[start:start + step], axis=1)
        bias = np.concatenate(biases[start:start + step], axis=0)
        worst = max(worst, float(np.abs(kernel - ref["classifier/kernel"]).max()),
                    float(np.abs(bias - ref["classifier/bias"]).max()))
    return worst


# memory savers and schedules on a narrow stage, in one run: recomputed activations,
# grouped updates and the ZeroBubble schedule (B and W apart)
SAVERS = {"gradient_checkpoint.type": "auto", "optimizer.num_apply_group": 2,
          "pipeline.strategy": "ZeroBubble"}


@pytest.mark.parametrize("layout,classes,config", [
    ("r1+s2_m2", 1001, None), ("r2+r1_m2", 10, None), ("r1+s2_m2", 10, SAVERS)],
    ids=["r1+s2_m2-1001", "r2+r1_m2-10", "r1+s2_m2-10-savers"])
def test_stages_of_different_widths_match_serial(layout, classes, config):
    """replicate(1) -> split(2) (the issue's case, 1001 classes; with memory savers),
    replicate(2) -> replicate(1), pipelines of 2 micro-batches on 3 devices
    (replicate(1) -> replicate(2): the corpus test below; data parallelism over
    replicas of replicate(1) -> split(2): on two workers,
    tests/multiworker/test_hybrid_workers.py)."""
    width, replicas, micro_batches, _ = _shape(layout)
    ref_curve, ref = _serial(classes, ROWS * width * replicas * micro_batches)
    curve, copies, plan = _train(layout, classes, config)
    assert plan.pipeline and plan.num_replicas == replicas and not plan.aligned
    assert len(copies["backbone/kernel"]) == width * replicas  # every copy holds weights
    _check_listing(layout, epl.Graph.get().parallel.gradient_plans)
    np.testing.assert_allclose([c[0] for c in curve], [c[0] for c in ref_curve], rtol=1e-5)
    worst = _worst(layout, classes, copies, ref)
    _record(worst)
    assert worst < TOL


@pytest.mark.parametrize("layout", ["r2+s2_m2", "r1+s2_m2"])
def test_prefer_forward_with_a_split_stage_matches_serial(layout):
    """PreferForward (F0 F1 B0 B1) with a split stage 2 devices wide, equal and different
    widths, 1001 classes: the split layer's collectives, chained per member in build
    order (micro-batch 0's forward and backward, then micro-batch 1's), are re-ordered
    to the schedule instead of closing a cycle with its barriers."""
    width, replicas, micro_batches, _ = _shape(layout)
    ref_curve, ref = _serial(1001, ROWS * width * replicas * micro_batches)
    curve, copies, plan = _train(layout, 1001, {"pipeline.strategy": "PreferForward"})
    assert plan.pipeline and plan.strategy == "PreferForward"
    np.testing.assert_allclose([c[0] for c in curve], [c[0] for c in ref_curve], rtol=1e-5)
    worst = _worst(layout, 1001, copies, ref)
    _record(worst)
    assert worst < TOL


def _check_listing(layout, plans):
    """program.gradient_plans says what runs: of the copies sharing the narrow stage's
    device, the first reduces (local or all-reduce), the others read its result."""
    backbone, head, _, _ = LAYOUTS[layout]
    narrow = "backbone/" if backbone[1] < head[1] else "classifier/"
    for copy, plan in enumerate(plans):
        for entry in plan.entries:
            shared = entry.name.startswith(narrow) and copy % 2 == 1
            assert (entry.reduction == "shared_device") == shared, (copy, str(entry))
            if shared:
                assert "reads copy %d's result" % (copy - 1) in str(entry)


def test_a_narrow_split_stage_is_refused_naming_the_widths():
    """A split stage narrower than the replica would need two shards' copies on one
    device: refused at graph rewrite time, naming the widths and what is allowed."""
    x, y = _data(8, 10)
    epl.init(epl.Config({"pipeline.num_micro_batch": 2}), cluster=Cluster(devices_per_worker=3))
    loss, _ = _model(*_dataset(x, y, 4), 10, epl.replicate(2), epl.split(1))
    train = tf.train.MomentumOptimizer(0.1, 0.9).minimize(loss)
    with pytest.raises(Exception, match=r"split\(1\) does not.*Allowed: replicate\(a\) "
                                        r"stages with a dividing"):
        with tf.Session() as sess:
            sess.run(train)


# (model, (stage 0, stage 1) widths) of the corpus's pipeline of two replicate stages:
# sparse embedding gradients in the narrow stage, and the odd sizes with the narrow stage
# last. (Every model in both orders passed when this was written, 96 s in all: resnet
# 13 + 8 s, bert 28 + 30 s; kept to the two cheapest for the suite's budget.)
_CORPUS = dict((c.name, c) for c in CORPUS)
CORPUS_CASES = [(_CORPUS["embedding"], (1, 2)), (_CORPUS["odd"], (2, 1))]


@pytest.mark.parametrize("model_class,widths", CORPUS_CASES, ids=[
    "%s-r%d+r%d" % ((c.name,) + w) for c, w in CORPUS_CASES])
def test_corpus_on_stages_of_different_widths_matches_serial(model_class, widths):
    """The real-model corpus (batch norm, an encoder, sparse embedding gradients, odd
    sizes) as a pipeline of replicate stages of widths 1 and 2 (2 micro-batches, 3
    devices): every copy's trained weights equal serial training's; the copies sharing
    the narrow stage's device combine their sparse gradients' rows there. (Batch-norm
    moving statistics follow each copy's own slices: left out, as for equal widths.)"""
    model = model_class()
    slices = 2 * 2  # copies per replica x micro-batches
    arrays = model.data(slices * model.batch * corpusutil.STEPS)
    ref_curve, reference = corpusutil.serial_reference(model, arrays, slices, stats="skip")
    epl.init(epl.Config({"pipeline.num_micro_batch": 2}), cluster=Cluster(devices_per_worker=3))
    stage = lambda index: epl.replicate(widths[index], name="stage_%d" % index)
    curve, copies = corpusutil._train(model, arrays, corpusutil.STEPS, stage=stage,
                                      batch=2 * model.batch, static=False)
    worst, where = corpusutil.max_difference(reference, copies, "skip")
    _record(worst)
    assert worst < TOL, "%s differs from serial training by %.3g" % (where, worst)
    assert set(reference) - {"global_step"} <= set(copies), "copies missing variables"
    np.testing.assert_allclose(curve, ref_curve, rtol=1e-5, atol=1e-6)


# checkpoint layouts: (backbone scope, head scope, devices); each reads a micro-batch of
# CKPT_ROWS rows, two micro-batches a step, so a step covers the serial run's batch
CKPT_LAYOUTS = {
    "r1->s2": (("replicate", 1), ("split", 2), 3),
    "r2+s2": (("replicate", 2), ("split", 2), 4),
}
CKPT_ROWS, CKPT_CLASSES, CKPT_STEPS = 4, 11, 3
CKPT_NAMES = ("backbone/kernel", "backbone/bias", "classifier/kernel", "classifier/bias")


def _ckpt_serial(steps):
    """Serial training on batches of 2 x CKPT_ROWS rows: {name: value} after each step
    (momentum slots too), and the names a plain Saver writes."""
    x, y = _data(2 * CKPT_ROWS * CKPT_STEPS, CKPT_CLASSES)
    names = CKPT_NAMES + tuple(n + "/Momentum" for n in CKPT_NAMES)
    with epl.paused(), tf.Graph().as_default():
        loss, _ = _model(*_dataset(x, y, 2 * CKPT_ROWS), CKPT_CLASSES)
        train = tf.train.MomentumOptimizer(0.1, 0.9).minimize(loss)
        saved = sorted(v.op.name for v in tf.global_variables())
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            after = []
            for _ in range(steps):
                sess.run(train)
                after.append(dict(zip(names, sess.run([n + ":0" for n in names]))))
    return after, saved


def _ckpt_segment(layout, first, steps, save, restore=None):
    """Under ``layout``: restore ``restore`` (if given), train ``steps`` steps on the
    serial run's batches from step ``first`` on, save to ``save``; returns {name: values
    of every copy} (momentum slots too)."""
    backbone, head, devices = CKPT_LAYOUTS[layout]
    x, y = _data(2 * CKPT_ROWS * CKPT_STEPS, CKPT_CLASSES)  # serial training's rows
    rows = slice(2 * CKPT_ROWS * first, None)
    epl.init(epl.Config({"pipeline.num_micro_batch": 2}),
             cluster=Cluster(devices_per_worker=devices))
    loss, _ = _model(*_dataset(x[rows], y[rows], CKPT_ROWS), CKPT_CLASSES,
                     _scope(*backbone), _scope(*head))
    train = tf.train.MomentumOptimizer(0.1, 0.9).minimize(loss)
    with saved_session(train, steps, save, restore) as sess:
        names = CKPT_NAMES + tuple(n + "/Momentum" for n in CKPT_NAMES)
        return dict((n, copy_values(sess, n)) for n in names)


def _ckpt_worst(layout, copies, ref):
    """max |w - w_serial| over every copy (the split head's shards concatenated)."""
    worst = 0.0
    for name, values in copies.items():
        if name.startswith("classifier"):
            axis = 1 if "kernel" in name else 0
            values = [np.concatenate(values[:2], axis=axis)]  # the one replica's shards
        worst = max([worst] + [float(np.abs(v - ref[name]).max()) for v in values])
    return worst


@pytest.mark.parametrize("first,second", [("r1->s2", "r2+s2"), ("r2+s2", "r1->s2")])
def test_checkpoints_move_between_layouts_of_different_widths(tmp_path, first, second):
    """A checkpoint saved by replicate(1) -> split(2) on 3 devices (the narrow stage's
    weights once per copy) holds serial training's variables, once each, and restores into
    serial training and into replicate(2) + split(2) on 4 devices; and the reverse, every
    copy of the narrow stage restored. Each leg continues like serial training."""
    after, serial_names = _ckpt_serial(CKPT_STEPS)
    copies = _ckpt_segment(first, 0, 1, str(tmp_path / "one"))
    worst = _ckpt_worst(first, copies, after[0])
    reader = tf.train.load_checkpoint(str(tmp_path / "one"))
    assert sorted(reader.get_variable_to_shape_map()) == serial_names
    for name in CKPT_NAMES:
        np.testing.assert_allclose(reader.get_tensor(name), after[0][name], atol=TOL)
    copies = _ckpt_segment(second, 1, 1, str(tmp_path / "two"), restore=str(tmp_path / "one"))
    worst = max(worst, _ckpt_worst(second, copies, after[1]))
    if first == "r2+s2":
        assert len(copies["backbone/kernel"]) == 2  # the narrow stage's two copies
    # and serial training continues from the second layout's checkpoint
    x, y = _data(2 * CKPT_ROWS * CKPT_STEPS, CKPT_CLASSES)
    with epl.paused(), tf.Graph().as_default():
        loss, _ = _model(*_dataset(x[2 * CKPT_ROWS * 2:], y[2 * CKPT_ROWS * 2:],
                                   2 * CKPT_ROWS), CKPT_CLASSES)
        train = tf.train.MomentumOptimizer(0.1, 0.9).minimize(loss)
        with saved_session(train, 1, restore=str(tmp_path / "two")) as sess:
            for name in CKPT_NAMES:
                worst = max(worst, float(np.abs(sess.run(name + ":0") - after[2][name]).max()))
    _record(worst)
    assert worst < TOL
