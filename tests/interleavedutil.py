"""The models of the interleaved-stages tests (tests/graph/test_interleaved.py,
tests/multiworker/test_interleaved_workers.py): four dense layers, layer i in TaskGraph
``stage_i``, and its serial reference; two corpus models (tests/realmodels.py) cut into
four stages."""
import contextlib

import numpy as np
import tensorflow.compat.v1 as tf

import epl
from eplutil import CLASSES, FEATURES, HIDDEN, dataset_input, epl_paused, train_step
from realmodels import Bert, WideDeep, no_stage

TOL = 1e-5
K = 3
LAYERS = ("l0", "l1", "l2", "l3")
NAMES = tuple("%s/kernel" % name for name in LAYERS) + ("l3/bias",)


def weights(seed=3):
    rng = np.random.RandomState(seed)
    sizes = [(FEATURES, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, CLASSES)]
    return [rng.rand(*size).astype(np.float32) - 0.5 for size in sizes]


def model(x, y, staged):
    """Four dense layers, layer i in TaskGraph ``stage_i`` when ``staged``."""
    value = x
    for index, kernel in enumerate(weights()):
        scope = epl.replicate(1, name="stage_%d" % index) if staged else contextlib.ExitStack()
        with scope:
            value = tf.layers.dense(value, kernel.shape[1], name=LAYERS[index],
                                    activation=None if index == 3 else tf.nn.tanh,
                                    kernel_initializer=tf.constant_initializer(kernel))
            if index == 3:
                value = tf.losses.sparse_softmax_cross_entropy(y, value)
    return value


def serial(x, y, batch, steps=K):
    """The reference: the same layers on one device, global batches."""
    with epl_paused(), tf.Graph().as_default():
        train = train_step(model(*dataset_input(x, y, batch), staged=False))
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            for _ in range(steps):
                sess.run(train)
            return dict((name, sess.run(name + ":0")) for name in NAMES)


class Bert4(Bert):
    """The corpus's BERT-style encoder cut into four stages: embeddings, layer 0,
    layer 1, pooler and classifier."""

    name = "bert4"

    def build(self, batch, stage=no_stage):
        ids, segments, mask, labels = batch
        with stage(0):
            x = self._embed(ids, segments)
        with stage(1):
            x = self._layer(x, mask, 0)
        with stage(2):
            x = self._layer(x, mask, 1)
        with stage(3):
            pooled = tf.layers.dense(x[:, 0], self.hidden, activation=tf.tanh, name="pooler")
            logits = tf.layers.dense(pooled, self.classes, name="classifier")
            return tf.losses.sparse_softmax_cross_entropy(labels, logits)


class WideDeep4(WideDeep):
    """The corpus's embedding model (two odd-sized tables, sparse gradients) in four
    stages: the tables, then one dense layer each."""

    name = "embedding4"

    def build(self, batch, stage=no_stage):
        user, item, dense, labels = batch
        with stage(0):
            features = self.features(user, item, dense)
        with stage(1):
            hidden = tf.layers.dense(features, 9, activation=tf.nn.relu, name="deep_1")
        with stage(2):
            hidden = tf.layers.dense(hidden, 5, activation=tf.nn.relu, name="deep_2")
        with stage(3):
            logits = tf.layers.dense(hidden, self.classes, name="head")
            return tf.losses.sparse_softmax_cross_entropy(labels, logits)
