"""Operator split: a replicated backbone and a split classifier train like the unsplit model.

The documentation's large-scale classification layout: ``epl.replicate(N)`` for the
backbone and ``epl.split(N)`` for the classifier, colocated on the same N devices. Each
device holds 1/N of the classifier (balanced shards; odd and prime class counts too).
"""
import contextlib

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from eplutil import MEASURED, copy_values

FEATURES, HIDDEN, STEPS = 5, 8, 3


def _data(rows, classes, seed=0):
    rng = np.random.RandomState(seed)
    return rng.rand(rows, FEATURES).astype(np.float32), rng.randint(0, classes, rows)


def _weights(classes, seed=1):
    rng = np.random.RandomState(seed)
    return (rng.rand(FEATURES, HIDDEN).astype(np.float32) - 0.5,
            rng.rand(HIDDEN, classes).astype(np.float32) - 0.5,
            rng.rand(classes).astype(np.float32) - 0.5)


def _model(x, y, classes, backbone=None, head=None, metrics=False):
    hidden_w, head_w, head_b = _weights(classes)
    scope = backbone or _nothing()
    with scope:
        h = tf.layers.dense(x, HIDDEN, activation=tf.nn.relu, name="backbone",
                            kernel_initializer=tf.constant_initializer(hidden_w))
    with head or _nothing():
        logits = tf.layers.dense(h, classes, name="classifier",
                                 kernel_initializer=tf.constant_initializer(head_w),
                                 bias_initializer=tf.constant_initializer(head_b))
        loss = tf.losses.sparse_softmax_cross_entropy(y, logits)
        accuracy = None
        if metrics:
            accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
    return loss, accuracy


class _nothing(object):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _dataset(x, y, batch):
    data = tf.data.Dataset.from_tensor_slices((x, y.astype(np.int64))).batch(batch)
    return tf.data.make_one_shot_iterator(data).get_next()


def _serial(classes, batch):
    x, y = _data(batch * STEPS, classes)
    with epl.paused(), tf.Graph().as_default():
        loss, accuracy = _model(*_dataset(x, y, batch), classes, metrics=True)
        train = tf.train.MomentumOptimizer(0.1, 0.9).minimize(loss)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            curve = [sess.run([loss, accuracy, train])[:2] for _ in range(STEPS)]
            names = ("backbone/kernel", "classifier/kernel", "classifier/bias")
            graph = tf.get_default_graph()
            values = sess.run([graph.get_tensor_by_name(n + ":0") for n in names])
            return curve, dict(zip(names, values))


def _train_copies(loss, *metrics):
    """Momentum on ``loss`` for STEPS steps in a plain session; returns the curve (loss and
    ``metrics`` per step) and {name: values of every copy} of the model's three variables."""
    train = tf.train.MomentumOptimizer(0.1, 0.9).minimize(loss)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        curve = [sess.run([loss] + list(metrics) + [train])[:-1] for _ in range(STEPS)]
        values = dict((n, copy_values(sess, n)) for n in
                      ("backbone/kernel", "classifier/kernel", "classifier/bias"))
    return curve, values


def _split(classes, devices, batch, lowering="auto"):
    x, y = _data(batch * STEPS, classes)
    epl.init(epl.Config({"cluster.colocate_split_and_replicate": True,
                         "pipeline.micro_batching": lowering}),
             cluster=Cluster(devices_per_worker=devices))
    loss, accuracy = _model(*_dataset(x, y, batch), classes, epl.replicate(devices),
                            epl.split(devices), metrics=True)
    curve, values = _train_copies(loss, accuracy)
    choice = epl.Graph.get().parallel.plan.micro_batching
    if devices > 1:  # the local copies repeat the step as the key asks (auto: functions)
        assert choice[0] == ("unrolled copies" if lowering == "unrolled" else "stage functions")
    return curve, values


def _record(value):
    import os
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], value))


@pytest.mark.parametrize("devices,classes,lowering", [
    (1, 10, "auto"), (2, 10, "auto"), (2, 7, "auto"), (4, 13, "auto"), (4, 1000, "auto"),
    (2, 1001, "auto"), (2, 7, "unrolled"), (4, 1000, "unrolled")])
def test_split_classifier_matches_unsplit(devices, classes, lowering):
    """Stage functions (the default) call the step's functions around the split layer's
    collectives, which stay ops of each copy; unrolled copies clone everything."""
    batch = 4 * devices
    ref_curve, ref = _serial(classes, batch)
    curve, copies = _split(classes, devices, batch, lowering)
    np.testing.assert_allclose(curve, ref_curve, rtol=1e-5, atol=1e-6)
    worst = max(float(np.abs(c - ref["backbone/kernel"]).max())
                for c in copies["backbone/kernel"])
    kernel = np.concatenate(copies["classifier/kernel"], axis=1)
    bias = np.concatenate(copies["classifier/bias"], axis=0)
    worst = max(worst, float(np.abs(kernel - ref["classifier/kernel"]).max()),
                float(np.abs(bias - ref["classifier/bias"]).max()))
    _record(worst)
    assert worst < 2e-5
    widths = [c.shape[1] for c in copies["classifier/kernel"]]
    assert max(widths) - min(widths) <= 1 and sum(widths) == classes


def _assemble(copies, replicas, devices):
    """{name: full value} from copies (replica-major): shards of replica 0 concatenated;
    every replica's shards must agree."""
    width = devices // replicas
    kernels = copies["classifier/kernel"]
    biases = copies["classifier/bias"]
    full = [np.concatenate(kernels[r * width:(r + 1) * width], axis=1) for r in range(replicas)]
    full_b = [np.concatenate(biases[r * width:(r + 1) * width], axis=0) for r in range(replicas)]
    for other, other_b in zip(full[1:], full_b[1:]):
        np.testing.assert_allclose(other, full[0], atol=1e-6)
        np.testing.assert_allclose(other_b, full_b[0], atol=1e-6)
    return full[0], full_b[0]


def test_two_replicas_of_a_split_classifier_average_like_data_parallelism():
    """replicate(2) + split(2) on 4 devices: 2 model replicas, each split over 2 devices;
    shard gradients are averaged over replicas, backbone gradients summed over a
    replica's devices and averaged over replicas."""
    classes, batch = 11, 8
    ref_curve, ref = _serial(classes, 2 * batch)
    x, y = _data(2 * batch * STEPS, classes)
    epl.init(epl.Config({"cluster.colocate_split_and_replicate": True}),
             cluster=Cluster(devices_per_worker=4))
    loss, _ = _model(*_dataset(x, y, batch), classes, epl.replicate(2), epl.split(2))
    epl.add_to_collection(loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    train = tf.train.MomentumOptimizer(0.1, 0.9).minimize(loss)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        curve = [sess.run([loss, train])[0] for _ in range(STEPS)]
        copies = dict((n, copy_values(sess, n)) for n in
                      ("backbone/kernel", "classifier/kernel", "classifier/bias"))
    np.testing.assert_allclose(curve, [c[0] for c in ref_curve], rtol=1e-5)
    kernel, bias = _assemble(copies, 2, 4)
    worst = max(float(np.abs(kernel - ref["classifier/kernel"]).max()),
                float(np.abs(bias - ref["classifier/bias"]).max()),
                max(float(np.abs(c - ref["backbone/kernel"]).max())
                    for c in copies["backbone/kernel"]))
    _record(worst)
    assert worst < 2e-5


def test_split_with_gradient_accumulation():
    classes, batch, micro = 9, 8, 2
    ref_curve, ref = _serial(classes, micro * batch)
    x, y = _data(micro * batch * STEPS, classes)
    epl.init(epl.Config({"cluster.colocate_split_and_replicate": True,
                         "pipeline.num_micro_batch": micro}),
             cluster=Cluster(devices_per_worker=2))
    loss, _ = _model(*_dataset(x, y, batch), classes, epl.replicate(2), epl.split(2))
    train = tf.train.MomentumOptimizer(0.1, 0.9).minimize(loss)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(STEPS * micro):
            sess.run(train)
        copies = dict((n, copy_values(sess, n)) for n in
                      ("backbone/kernel", "classifier/kernel", "classifier/bias"))
    kernel, bias = _assemble(copies, 1, 2)
    worst = max(float(np.abs(kernel - ref["classifier/kernel"]).max()),
                float(np.abs(bias - ref["classifier/bias"]).max()))
    _record(worst)
    assert worst < 2e-5


def test_bad_split_inputs_are_clear_errors():
    epl.init(epl.Config({"cluster.colocate_split_and_replicate": True}),
             cluster=Cluster(devices_per_worker=4))
    x = tf.placeholder(tf.float32, [None, FEATURES])
    with epl.split(4):
        with pytest.raises(ValueError, match="has 3 units, fewer than the 4 shards"):
            tf.layers.dense(x, 3, name="tiny")


def test_unsupported_reader_of_sharded_logits_is_refused():
    epl.init(epl.Config({"cluster.colocate_split_and_replicate": True}),
             cluster=Cluster(devices_per_worker=2))
    x, y = _data(16, 6)
    features, labels = _dataset(x, y, 8)
    with epl.replicate(2):
        h = tf.layers.dense(features, HIDDEN)
    with epl.split(2):
        logits = tf.layers.dense(h, 6, name="head")
        probabilities = tf.nn.softmax(logits)  # needs the full row
        loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
    tf.train.GradientDescentOptimizer(0.1).minimize(loss + 0 * tf.reduce_sum(probabilities))
    with tf.Session() as sess:
        with pytest.raises(ValueError, match="Softmax.*reads the sharded output of layer 'head'"):
            sess.run(tf.global_variables_initializer())


@contextlib.contextmanager
def saved_session(train, steps, save=None, restore=None, sharded=False):
    """A session that initialized the variables, restored ``restore`` (if given), ran
    ``train`` ``steps`` times and saved to ``save`` (if given)."""
    saver = tf.train.Saver(sharded=sharded)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        if restore:
            saver.restore(sess, restore)
        for _ in range(steps):
            sess.run(train)
        if save:
            saver.save(sess, save)
        yield sess


def _train_and_save(classes, devices, path, restore=None, steps=1, sharded=False,
                    width=None, colocate=True):
    """Train ``steps`` (after restoring ``restore``) and save; returns the full classifier
    (of replica 0). ``width``: the TaskGraphs' device_count (default ``devices``);
    ``colocate=False``: each TaskGraph on devices of its own (the default placement)."""
    width = width or devices
    batch = 4 * max(devices, 1)
    x, y = _data(batch * max(steps, 1), classes)
    if devices:
        epl.init(epl.Config({"cluster.colocate_split_and_replicate": colocate}),
                 cluster=Cluster(devices_per_worker=devices))
        scopes = (epl.replicate(width), epl.split(width))
    else:
        scopes = (None, None)
    graph = tf.Graph()
    with (epl.paused() if not devices else _nothing()), graph.as_default():
        loss, _ = _model(*_dataset(x, y, batch), classes, *scopes)
        train = tf.train.MomentumOptimizer(0.1, 0.9).minimize(loss)
        with saved_session(train, steps, path, restore, sharded) as sess:
            if devices:
                kernel = np.concatenate(copy_values(sess, "classifier/kernel")[:width], 1)
                momentum = np.concatenate(
                    copy_values(sess, "classifier/kernel/Momentum")[:width], 1)
            else:
                kernel, momentum = sess.run(["classifier/kernel:0",
                                             "classifier/kernel/Momentum:0"])
    return kernel, momentum


@pytest.mark.parametrize("sharded", [False, True])
def test_checkpoints_reshard_between_unsplit_and_split(tmp_path, sharded):
    """Every shard is saved as a slice of the unsplit variable (slots too): unsplit ->
    split(2) -> split(4) -> unsplit restores exactly what was saved. ``sharded``: the
    per-device Saver that MonitoredTrainingSession makes by default."""
    classes = 11
    saved = _train_and_save(classes, 0, str(tmp_path / "unsplit"), sharded=sharded)
    for devices, source, target in [(2, "unsplit", "two"), (4, "two", "four"),
                                    (0, "four", "back")]:
        reader = tf.train.load_checkpoint(str(tmp_path / source))
        assert reader.get_variable_to_shape_map()["classifier/kernel"] == [HIDDEN, classes]
        expected = reader.get_tensor("classifier/kernel")
        kernel, momentum = _train_and_save(classes, devices, str(tmp_path / target),
                                           restore=str(tmp_path / source), steps=0,
                                           sharded=sharded)
        np.testing.assert_allclose(kernel, expected, atol=0)
        np.testing.assert_allclose(momentum, reader.get_tensor("classifier/kernel/Momentum"),
                                   atol=0)
    assert saved[0].shape == (HIDDEN, classes)
