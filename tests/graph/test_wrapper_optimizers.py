"""Optimizers that wrap or delegate train data-parallel like serial training, or are
refused with a message that says why and what to use instead; never an
AttributeError from EPL's internals.

Horovod cannot be installed in the test path: ``FakeHorovodOptimizer`` has the shape
of ``horovod.tensorflow._DistributedOptimizer`` (a ``tf.compat.v1.train.Optimizer``
from a ``horovod`` module that keeps the wrapped optimizer in ``_optimizer`` and
all-reduces in ``compute_gradients``), with an identity in place of the all-reduce.
"""
import numpy as np
import pytest
import tensorflow as tf_root
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from epl.runtime import optimizers
from eplutil import copy_values, dataset_input, initial_weights, make_data, max_diff, mlp

STEPS = 4
TOL = 1e-5
# tf.contrib exists only in TF 1.15. Its optimizers are TF-1-only tests (on TF 2.x, users
# switch to MixedPrecisionLossScaleOptimizer, tested here on both legs; docs/tf2.md).
contrib = getattr(tf_root, "contrib", None)
needs_contrib = pytest.mark.skipif(contrib is None, reason="tf.contrib exists only in TF 1.15")


def _params(names):
    """Parameters, the tf.contrib ones marked TF-1-only."""
    return [pytest.param(name, marks=needs_contrib) if "contrib" in name or "MovingAverage" in name
            else name for name in sorted(names)]


class ConditionalLike(tf.train.Optimizer):
    """tensor2tensor's ConditionalOptimizer shape: no Optimizer.__init__, every call
    delegated to ``self._opt`` (gradients cast to the variable's dtype)."""

    def __init__(self, inner):  # pylint: disable=super-init-not-called
        self._opt = inner

    def compute_gradients(self, loss, var_list=None, **kwargs):
        pairs = self._opt.compute_gradients(loss, var_list, **kwargs)
        return [(tf.cast(g, v.dtype.base_dtype) if g is not None else g, v) for g, v in pairs]

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        return self._opt.apply_gradients(grads_and_vars, global_step=global_step, name=name)


class MultiLike(tf.train.Optimizer):
    """A multi-optimizer wrapper: no Optimizer.__init__; the variables of each layer
    are updated by their own optimizer, the global step advances once."""

    def __init__(self, by_prefix):  # pylint: disable=super-init-not-called
        self._by_prefix = by_prefix

    def compute_gradients(self, loss, var_list=None, **kwargs):
        return list(self._by_prefix.values())[0].compute_gradients(loss, var_list, **kwargs)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        updates = []
        pairs = list(grads_and_vars)
        for prefix, opt in sorted(self._by_prefix.items()):
            mine = [(g, v) for g, v in pairs if v.op.name.startswith(prefix)]
            updates.append(opt.apply_gradients(mine))
        with tf.control_dependencies(updates):
            return global_step.assign_add(1).op if global_step is not None else tf.group()


class FakeHorovodOptimizer(tf.train.Optimizer):
    """horovod.tensorflow._DistributedOptimizer's structure (see the module doc)."""

    def __init__(self, optimizer, name=None, use_locking=False):
        super(FakeHorovodOptimizer, self).__init__(name=name or "DistributedAdam",
                                                   use_locking=use_locking)
        self._optimizer = optimizer

    def compute_gradients(self, *args, **kwargs):
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        return [(tf.identity(g, name="HorovodAllreduce") if g is not None else g, v)
                for g, v in pairs]

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)


FakeHorovodOptimizer.__module__ = "horovod.tensorflow"
FakeHorovodOptimizer.__name__ = "_DistributedOptimizer"


def _adam():
    return tf.train.AdamOptimizer(0.01)


def _dynamic_contrib(initial, decrease=0.8):
    manager = contrib.mixed_precision.ExponentialUpdateLossScaleManager(
        initial, 2, decr_every_n_nan_or_inf=1, decr_ratio=decrease)
    return contrib.mixed_precision.LossScaleOptimizer(_adam(), manager)


# name -> builder of the optimizer; each trains data-parallel like serial training.
# ConditionalLike and MultiLike skip Optimizer.__init__.
TRAINED = {
    "MovingAverageOptimizer(Adam)": lambda: contrib.opt.MovingAverageOptimizer(_adam()),
    "ConditionalLike(Adam)": lambda: ConditionalLike(_adam()),
    "MultiLike(d1=Adam,d2=Momentum)": lambda: MultiLike(
        {"d1": _adam(), "d2": tf.train.MomentumOptimizer(0.1, 0.9)}),
    "contrib.LossScaleOptimizer(Adam,fixed=128)": lambda: contrib.mixed_precision.
    LossScaleOptimizer(_adam(), contrib.mixed_precision.FixedLossScaleManager(128.0)),
    "contrib.LossScaleOptimizer(Adam,dynamic)": lambda: _dynamic_contrib(2.0 ** 15),
    "MixedPrecisionLossScaleOptimizer(Adam,128)": lambda: tf.train.experimental.
    MixedPrecisionLossScaleOptimizer(_adam(), 128.0),
    "ConditionalLike(MovingAverageOptimizer(Adam))": lambda: ConditionalLike(
        contrib.opt.MovingAverageOptimizer(_adam())),
}

# name -> (builder, words the refusal must contain)
REFUSED = {
    "SyncReplicasOptimizer(Adam)": (
        lambda: tf.train.SyncReplicasOptimizer(_adam(), replicas_to_aggregate=1),
        ["SyncReplicasOptimizer", "parameter-server", "AdamOptimizer", "directly"]),
    "horovod._DistributedOptimizer(Adam)": (
        lambda: FakeHorovodOptimizer(_adam()),
        ["Horovod", "_DistributedOptimizer", "averaged twice", "AdamOptimizer",
         "epl-launch"]),
    "ConditionalLike(SyncReplicasOptimizer(Adam))": (
        lambda: ConditionalLike(tf.train.SyncReplicasOptimizer(_adam(), 1)),
        ["SyncReplicasOptimizer", "wrapped in ConditionalLike"]),
}


def _train_op(build, loss):
    return build().minimize(loss, global_step=tf.train.get_or_create_global_step())


def _state(sess):
    variables = sorted(tf.global_variables(), key=lambda v: v.op.name)
    return dict(zip([v.op.name for v in variables], sess.run(variables)))


def _serial(x, y, build):
    with epl.paused(), tf.Graph().as_default():
        loss = mlp(*dataset_input(x, y, 16), weights=initial_weights())
        train = _train_op(build, loss)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            for _ in range(STEPS):
                sess.run(train)
            return _state(sess)


def _data_parallel(x, y, build):
    epl.init(cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1))
    loss = mlp(*dataset_input(x, y, 8), weights=initial_weights())
    train = _train_op(build, loss)
    sess = tf.Session()
    sess.run(tf.global_variables_initializer())
    for _ in range(STEPS):
        sess.run(train)
    return sess


def wrapper_difference(build, input_scale=1.0):
    """max |w - w_serial| over every float variable (weights, slots, moving averages,
    loss scales) and every local copy; also checks that the copies trained.
    Returns (difference, serial global step, data-parallel global step)."""
    x, y = make_data(64)
    x = x * input_scale
    reference = _serial(x, y, build)
    sess = _data_parallel(x, y, build)
    program = epl.Graph.get().parallel
    assert program is not None
    worst = 0.0
    compared = 0
    for name, value in sorted(reference.items()):
        if name not in program.variable_copies or not np.issubdtype(
                np.asarray(value).dtype, np.floating):
            continue
        copies = copy_values(sess, name)
        assert len(copies) == 2, name
        worst = max(worst, max_diff(value, copies))
        compared += 1
    assert compared >= 4
    assert not np.allclose(reference["d1/kernel"], initial_weights()["d1/kernel"])
    return worst, reference["global_step"], sess.run(tf.train.get_global_step())


@pytest.mark.parametrize("name", _params(TRAINED))
def test_wrapper_optimizer_data_parallel_matches_serial(name):
    difference, serial_step, step = wrapper_difference(TRAINED[name])
    assert difference < TOL
    assert serial_step == step == STEPS


@needs_contrib
def test_dynamic_contrib_loss_scale_skips_the_same_steps_on_every_replica():
    """A 2^127 scale on inputs x100 overflows: the first step is skipped (global_step
    stays) on both replicas alike, then the scale 2^123 trains. (Each replica's
    backward pass sees twice the serial per-row values, the mean being over half the
    rows, so the scales are chosen with a margin of more than 2x on either side.)"""
    difference, serial_step, step = wrapper_difference(
        lambda: _dynamic_contrib(2.0 ** 127, decrease=1.0 / 16), input_scale=100.0)
    assert difference < TOL
    assert 0 < step == serial_step < STEPS


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_optimizer_with_its_own_data_parallelism_is_refused(name):
    build, words = REFUSED[name]
    x, y = make_data(16)
    epl.init(cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1))
    loss = mlp(*dataset_input(x, y, 8), weights=initial_weights())
    with pytest.raises(optimizers.UnsupportedOptimizerError) as caught:
        _train_op(build, loss)
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


@needs_contrib
def test_slot_variables_walk_the_wrapper_chain():
    """Slots of a wrapped optimizer are found through wrappers that have no slot
    table of their own (what split layers need for their optimizer slots)."""
    epl.init()
    var = tf.get_variable("v", initializer=tf.ones([3]))
    adam = _adam()
    outer = ConditionalLike(contrib.opt.MovingAverageOptimizer(adam))
    outer.minimize(tf.reduce_sum(var * var))
    assert [type(o).__name__ for o in optimizers.chain(outer)] == [
        "ConditionalLike", "MovingAverageOptimizer", "AdamOptimizer"]
    assert optimizers.slot_names(outer) == []
    slots = optimizers.slot_variables(outer, var)
    assert sorted(s.op.name for s in slots) == ["v/Adam", "v/Adam_1"]


def _split_classifier(x, y, scopes):
    """A dense backbone and a 10-class classifier (split when ``scopes`` are given)."""
    rng = np.random.RandomState(1)
    backbone = tf.constant_initializer(rng.rand(6, 8).astype(np.float32) - 0.5)
    head = tf.constant_initializer(rng.rand(8, 10).astype(np.float32) - 0.5)
    replicate, split = scopes if scopes else (None, None)
    with replicate or tf.name_scope(None):
        h = tf.layers.dense(x, 8, tf.nn.relu, kernel_initializer=backbone, name="backbone")
    with split or tf.name_scope(None):
        logits = tf.layers.dense(h, 10, kernel_initializer=head, name="classifier")
        return tf.losses.sparse_softmax_cross_entropy(y, logits)


@needs_contrib
def test_moving_average_optimizer_under_split_keeps_sharded_averages():
    """The moving averages of a split layer's shards are sharded like it (found by
    colocation and shard shape: MovingAverageOptimizer reports no slots)."""
    x, y = make_data(24)
    y = np.random.RandomState(2).randint(0, 10, 24).astype(np.int64)
    build = lambda: contrib.opt.MovingAverageOptimizer(_adam(), average_decay=0.5)
    with epl.paused(), tf.Graph().as_default():
        train = build().minimize(_split_classifier(*dataset_input(x, y, 8), None))
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            for _ in range(3):
                sess.run(train)
            reference = _state(sess)
    epl.init(epl.Config({"cluster.colocate_split_and_replicate": True}),
             cluster=Cluster(devices_per_worker=2))
    loss = _split_classifier(*dataset_input(x, y, 8), (epl.replicate(2), epl.split(2)))
    train = build().minimize(loss)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(3):
            sess.run(train)
        for name in ("classifier/kernel", "classifier/kernel/ExponentialMovingAverage",
                     "classifier/bias/ExponentialMovingAverage", "classifier/kernel/Adam"):
            full = np.concatenate(copy_values(sess, name), axis=-1)
            assert max_diff(reference[name], [full]) < TOL, name
        average = reference["classifier/kernel/ExponentialMovingAverage"]
        assert not np.allclose(average, reference["classifier/kernel"])


@pytest.mark.parametrize("name", _params(["contrib.LossScaleOptimizer(Adam,fixed=128)",
                                          "MixedPrecisionLossScaleOptimizer(Adam,128)"]))
def test_loss_scale_optimizer_with_epl_amp_is_refused(name):
    """Two loss scales multiply (EPL's AMP and the optimizer's): one of them must go."""
    epl.init(epl.Config({"amp.level": "O1"}), cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1))
    loss = mlp(*dataset_input(*make_data(16), 8), weights=initial_weights())
    with pytest.raises(optimizers.UnsupportedOptimizerError,
                       match=r"while amp.level='O1': EPL's AMP scales the loss .* pass the "
                             r"optimizer it wraps \(AdamOptimizer\)"):
        _train_op(TRAINED[name], loss)


@needs_contrib
@pytest.mark.parametrize("name", ["ElasticAverageOptimizer", "ModelAverageOptimizer",
                                  "AGNOptimizer"])
def test_contrib_parameter_server_optimizers_are_refused(name):
    """tf.contrib's model- and gradient-averaging optimizers (their constructors need
    parameter-server custom getters, so the instance is made without one) are refused
    by class, naming it and the optimizer to pass instead."""
    cls = getattr(contrib.opt, name)
    optimizer = cls.__new__(cls)
    optimizer._opt = _adam()  # pylint: disable=protected-access
    message = optimizers.refusal(optimizer)
    assert message is not None and name in message and "parameter-server" in message, message
    with pytest.raises(optimizers.UnsupportedOptimizerError):
        optimizers.check_supported(ConditionalLike(optimizer))
