"""Estimator helpers shared by graph, multi-worker and epl-launch tests.

(It lives with the worker scripts because epl-launch runs one of them as a
plain script; tests put this directory on sys.path.) One small classifier (the
eplutil MLP, optionally as two pipeline stages), an input_fn over fixed rows,
serial reference training with EPL paused, and the trained weights read back
from a checkpoint.
"""
import os
import sys

import numpy as np
import tensorflow.compat.v1 as tf
tf.disable_v2_behavior()  # TF 2.x: graph mode (docs/tf2.md); nothing on TF 1.15

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import epl  # noqa: E402
from eplutil import CLASSES, HIDDEN, initial_weights  # noqa: E402

TRAINED = ("d1/kernel", "d1/bias", "d2/kernel", "d2/bias")


def _no_scope(_):
    return _NullScope()


class _NullScope(object):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def make_model_fn(stages=False, optimizer_in_every_mode=False, tpu=False, step_fn=None):
    """A model_fn for the MLP. ``stages``: each layer in its own ``epl.replicate``
    scope (pipeline stages). ``optimizer_in_every_mode``: build the training step
    even for evaluation and prediction (some user code does). ``tpu``: return a
    TPUEstimatorSpec. ``step_fn(loss)``: the training op (default: Momentum)."""
    scope = (lambda i: epl.replicate(1, name="stage_%d" % i)) if stages else _no_scope

    def model_fn(features, labels, mode, params=None):
        weights = initial_weights()
        init = lambda name: tf.constant_initializer(weights[name])
        with scope(0):
            hidden = tf.layers.dense(features, HIDDEN, activation=tf.nn.relu,
                                     kernel_initializer=init("d1/kernel"), name="d1")
        with scope(1):
            logits = tf.layers.dense(hidden, CLASSES, kernel_initializer=init("d2/kernel"),
                                     name="d2")
            classes = tf.argmax(logits, 1)
            loss = None
            if labels is not None:
                loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
        train_op = None
        if mode == tf.estimator.ModeKeys.TRAIN or (optimizer_in_every_mode and loss is not None):
            train_op = step_fn(loss) if step_fn is not None else \
                tf.train.MomentumOptimizer(0.1, 0.9).minimize(
                    loss, global_step=tf.train.get_or_create_global_step())
        spec = tf.estimator.tpu.TPUEstimatorSpec if tpu else tf.estimator.EstimatorSpec
        if mode == tf.estimator.ModeKeys.PREDICT:
            return spec(mode, predictions={"classes": classes, "logits": logits})
        if mode == tf.estimator.ModeKeys.EVAL:
            if tpu:
                metric = lambda labels, classes: {
                    "accuracy": tf.metrics.accuracy(labels, classes)}
                return spec(mode, loss=loss, eval_metrics=(metric, [labels, classes]))
            return spec(mode, loss=loss,
                        eval_metric_ops={"accuracy": tf.metrics.accuracy(labels, classes)})
        return spec(mode, loss=loss, train_op=train_op)
    return model_fn


def input_fn(x, y, batch, repeat=False):
    """An input_fn over the rows (x, y) in order, ``batch`` rows per pull."""
    def fn(params=None):
        size = params["batch_size"] if params and "batch_size" in params else batch
        data = tf.data.Dataset.from_tensor_slices((x, y))
        if repeat:
            data = data.repeat()
        return data.batch(size, drop_remainder=True)
    return fn


def features_fn(x, batch):
    """A predict input_fn (features only)."""
    def fn(params=None):
        size = params["batch_size"] if params and "batch_size" in params else batch
        return tf.data.Dataset.from_tensor_slices(x).batch(size)
    return fn


def run_config(model_dir, **kwargs):
    kwargs.setdefault("save_checkpoints_steps", 2)
    kwargs.setdefault("log_step_count_steps", None)
    return tf.estimator.RunConfig(model_dir=str(model_dir), **kwargs)


def serial_estimator_train(x, y, batch, steps, model_dir, stages=False):
    """Reference: a plain Estimator (EPL paused) trained ``steps`` global batches.
    Returns the trained weights read from its checkpoint."""
    with epl.paused():
        estimator = tf.estimator.Estimator(make_model_fn(stages), config=run_config(model_dir))
        estimator.train(input_fn(x, y, batch), steps=steps)
    return checkpoint_weights(model_dir)


def checkpoint_weights(model_dir):
    reader = tf.train.load_checkpoint(str(model_dir))
    values = dict((name, reader.get_tensor(name)) for name in TRAINED)
    values["global_step"] = reader.get_tensor("global_step")
    return values


def max_weight_diff(reference, values):
    return max(float(np.abs(reference[n] - values[n]).max()) for n in TRAINED)
