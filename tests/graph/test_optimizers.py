"""EPL sees every optimizer's training step, or refuses to train serially.

* optimizers that override ``apply_gradients`` without calling the base class
  (BERT's AdamWeightDecayOptimizer does) and Keras optimizers are parallelized
  like tf.train ones, and train like serial training;
* subclasses defined before or after ``epl.init`` are seen, nested calls are
  recorded once, and ``epl.reset``/``epl.paused`` restore every class;
* a graph with strategy scopes whose step EPL cannot see raises a clear error.
"""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from eplutil import (AdamWeightDecay, adamw_step, copy_values, dataset_input, initial_weights,
                     make_data, max_diff, mlp)

STEPS = 4
TOL = 1e-5
TRAINED = ("d1/kernel", "d1/bias", "d2/kernel", "d2/bias")


class DefinedBeforeInit(tf.train.GradientDescentOptimizer):
    """A subclass that exists before epl.init and overrides apply_gradients."""

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        grads_and_vars = [(g * 0.5, v) for g, v in grads_and_vars]
        return super(DefinedBeforeInit, self).apply_gradients(grads_and_vars, global_step, name)


def _keras_step(loss):
    tvars = tf.trainable_variables()
    grads = tf.gradients(loss, tvars)
    return tf.keras.optimizers.Adam(0.01).apply_gradients(zip(grads, tvars))


def _keras_subclass_step(loss):
    class HalfAdam(tf.keras.optimizers.Adam):
        def apply_gradients(self, grads_and_vars, name=None):
            return super(HalfAdam, self).apply_gradients(
                [(g * 0.5, v) for g, v in grads_and_vars], name)
    tvars = tf.trainable_variables()
    return HalfAdam(0.01).apply_gradients(zip(tf.gradients(loss, tvars), tvars))


def _before_init_step(loss):
    return DefinedBeforeInit(0.2).minimize(loss, tf.train.get_or_create_global_step())


STEP_BUILDERS = {"adamw": adamw_step, "keras_adam": _keras_step,
                 "keras_subclass": _keras_subclass_step, "defined_before_init": _before_init_step}


def _values(sess):
    """{name: value} of every global variable (ref or resource)."""
    variables = sorted(tf.global_variables(), key=lambda v: v.op.name)
    return dict(zip([v.op.name for v in variables], sess.run([v.value() for v in variables])))


def _model(x, y, batch, build):
    """(loss, train op); Keras optimizers need resource variables in graph mode."""
    resource = build in (_keras_step, _keras_subclass_step)
    with tf.variable_scope(tf.get_variable_scope(), use_resource=resource):
        loss = mlp(*dataset_input(x, y, batch), weights=initial_weights())
    return loss, build(loss)


def _serial(x, y, batch, build):
    with epl.paused(), tf.Graph().as_default():
        _, train = _model(x, y, batch, build)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            for _ in range(STEPS):
                sess.run(train)
            return _values(sess)


def _data_parallel(x, y, batch, build, devices=2):
    epl.init(cluster=Cluster(devices_per_worker=devices))
    epl.set_default_strategy(epl.replicate(1))
    _, train = _model(x, y, batch, build)
    sess = tf.Session()
    sess.run(tf.global_variables_initializer())
    for _ in range(STEPS):
        sess.run(train)
    return sess


@pytest.mark.parametrize("kind", sorted(STEP_BUILDERS))
def test_optimizer_data_parallel_matches_serial(kind):
    x, y = make_data(64)
    reference = _serial(x, y, 16, STEP_BUILDERS[kind])
    sess = _data_parallel(x, y, 8, STEP_BUILDERS[kind])
    view = epl.Graph.get()
    assert view.parallel is not None and len(view.apply_calls) == 1
    assert sorted(v.op.name for v in view.apply_calls[0].variables) == sorted(TRAINED)
    for name in TRAINED:
        copies = copy_values(sess, name)
        assert len(copies) == 2
        assert max_diff(reference[name], copies) < TOL, name
    assert not np.allclose(reference["d1/kernel"], initial_weights()["d1/kernel"])
    if kind == "adamw":
        assert sess.run(tf.train.get_global_step()) == STEPS


def test_subclass_defined_after_init_is_seen_and_nested_calls_recorded_once():
    epl.init(cluster=Cluster(devices_per_worker=2))

    class Outer(tf.train.MomentumOptimizer):
        def apply_gradients(self, grads_and_vars, global_step=None, name=None):
            return super(Outer, self).apply_gradients(grads_and_vars, global_step, name)

    class Wrapper(tf.train.Optimizer):   # holds another optimizer, like LossScaleOptimizer
        def __init__(self, inner):
            super(Wrapper, self).__init__(False, "Wrapper")
            self._inner = inner

        def apply_gradients(self, grads_and_vars, global_step=None, name=None):
            return self._inner.apply_gradients(grads_and_vars, global_step, name)

    x, y = make_data(16)
    with epl.replicate(1):
        loss = mlp(*dataset_input(x, y, 8), weights=initial_weights())
    Outer(0.1, 0.9).minimize(loss)
    view = epl.Graph.get()
    assert len(view.apply_calls) == 1 and view.apply_calls[0].optimizer.__class__ is Outer
    tvars = tf.trainable_variables()
    Wrapper(Outer(0.1, 0.9)).apply_gradients(zip(tf.gradients(loss, tvars), tvars))
    assert len(view.apply_calls) == 2
    assert view.apply_calls[1].optimizer.__class__ is Wrapper


def test_reset_and_paused_restore_every_optimizer_class():
    originals = dict((cls, cls.__dict__["apply_gradients"]) for cls in (
        tf.train.Optimizer, tf.keras.optimizers.Optimizer, AdamWeightDecay, DefinedBeforeInit))
    epl.init()

    class Later(tf.train.AdamOptimizer):
        def apply_gradients(self, grads_and_vars, global_step=None, name=None):
            return super(Later, self).apply_gradients(grads_and_vars, global_step, name)
    later = Later.__dict__["apply_gradients"]
    for cls, function in originals.items():
        assert cls.__dict__["apply_gradients"] is not function, cls
        assert cls.__dict__["apply_gradients"].__wrapped__ is function, cls
    with epl.paused():
        for cls, function in originals.items():
            assert cls.__dict__["apply_gradients"] is function, cls
        assert Later.__dict__["apply_gradients"] is later.__wrapped__
        assert "__init_subclass__" not in tf.train.Optimizer.__dict__
    assert Later.__dict__["apply_gradients"] is not later.__wrapped__
    epl.init()   # a second init never double-wraps
    assert AdamWeightDecay.__dict__["apply_gradients"].__wrapped__ is originals[AdamWeightDecay]
    epl.reset()
    for cls, function in originals.items():
        assert cls.__dict__["apply_gradients"] is function, cls
    assert "__init_subclass__" not in tf.train.Optimizer.__dict__


def _unseen_step_graph(with_gradients):
    """A scoped model trained by hand: the update never goes through an optimizer."""
    epl.init(cluster=Cluster(devices_per_worker=2))
    x, y = make_data(32)
    with epl.replicate(1):
        loss = mlp(*dataset_input(x, y, 8), weights=initial_weights())
    tvars = tf.trainable_variables()
    if with_gradients:
        grads = tf.gradients(loss, tvars)
    else:  # what a tf.GradientTape in graph mode gives: no tf.gradients call
        grads = [tf.ones_like(v) * loss for v in tvars]
    return loss, tf.group(*[v.assign_sub(0.1 * g) for g, v in zip(grads, tvars)])


@pytest.mark.parametrize("with_gradients", [True, False])
def test_training_step_epl_cannot_see_raises_at_first_run(with_gradients):
    _, train = _unseen_step_graph(with_gradients)
    found = "tf.gradients call" if with_gradients else "updating trainable variables"
    with tf.Session() as sess:
        with pytest.raises(RuntimeError, match="cannot find this graph's training step.*"
                           "taskgraph_0.*" + found):
            sess.run(tf.global_variables_initializer())
        with pytest.raises(RuntimeError, match="cannot find this graph's training step"):
            sess.run(train)


def test_training_step_epl_cannot_see_raises_at_finalize():
    _unseen_step_graph(True)
    with pytest.raises(RuntimeError, match="no optimizer apply_gradients call was recorded"):
        tf.get_default_graph().finalize()


def test_scoped_graph_without_training_runs_unchanged():
    """Inference, loading weights from a feed and resetting variables are no step."""
    epl.init(cluster=Cluster(devices_per_worker=2))
    x, _ = make_data(8)
    with epl.replicate(1):
        out = tf.layers.dense(tf.constant(x), 3, name="d")
    kernel = [v for v in tf.trainable_variables() if v.op.name == "d/kernel"][0]
    fed = tf.placeholder(tf.float32, kernel.shape)
    load = kernel.assign(fed)
    reset = kernel.assign(tf.zeros_like(kernel))
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(load, {fed: np.ones(kernel.shape.as_list(), np.float32)})
        np.testing.assert_allclose(sess.run(out), np.ones([8, 3]) * x.sum(1, keepdims=True),
                                   rtol=1e-5)
        sess.run(reset)
    assert epl.Graph.get().parallel is None


def test_unannotated_graph_with_hand_written_updates_is_left_alone():
    """Without strategy scopes nothing asked for parallelism: plain TF behaviour."""
    epl.init(cluster=Cluster(devices_per_worker=2))
    var = tf.get_variable("w", initializer=1.0)
    train = var.assign_sub(0.5 * tf.gradients(var * var, var)[0])
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        assert sess.run(train) == pytest.approx(0.0)
