"""The real-model corpus: small versions of the models users actually train.

Toy models with friendly sizes hid a process abort for a whole wave, so every
parallel mode also runs on these (see tests/graph/test_corpus.py):

* ``resnet``: slim ``resnet_v1`` at a tiny input size and depth, with batch norm
  (moving statistics in UPDATE_OPS) and a ``tf.layers.dense`` classifier, Adam;
* ``bert``: a BERT-style encoder (word/position/segment embeddings, layer norm,
  masked multi-head attention, dropout, GELU feed-forward), sparse embedding
  gradients, Adam;
* ``embedding``: a wide-and-deep style model with two odd-sized embedding tables
  (sparse gradients) and momentum;
* ``odd``: every variable has an odd size (1, 3, 5, 7, 37 and a 1000-class bias),
  including a scalar variable.

Adam runs with epsilon 1e-4: a parallel run sums the same gradients in another
order (per replica, per micro-batch), and where two slices' gradients nearly
cancel, Adam's m/sqrt(v) turns a last-bit difference into a full-size step in
either direction (about lr); a larger epsilon keeps such elements' steps small
without hiding real errors (a wrong scale or a missed update moves every weight).

Each model is a :class:`Model`: ``data(rows)`` gives numpy inputs, ``build(batch,
stage)`` builds the loss from one batch (a tuple of tensors), calling
``stage(i)`` around the part that forms pipeline stage ``i`` (two stages).
Variables get deterministic initial values from their names (a custom getter),
so a serial graph and an EPL graph start from identical weights whatever order
their ops are created in.
"""
import contextlib
import hashlib

import numpy as np
import tensorflow.compat.v1 as tf

MOVING_STATS = ("moving_mean", "moving_variance")


def _seed(name):
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)


def deterministic_value(name, dims, dtype=tf.float32):
    """The initial value of variable ``name`` of shape ``dims``: derived from the name
    alone, so any graph (serial, parallel, a split layer given it as a constant
    initializer) starts from the same numbers."""
    rng = np.random.RandomState(_seed(name))
    fan_in = max(1, int(np.prod(dims[:-1]))) if len(dims) > 1 else 1
    scale = 1.0 / np.sqrt(fan_in)
    return rng.uniform(-scale, scale, size=dims).astype(tf.as_dtype(dtype).as_numpy_dtype)


def deterministic_getter(getter, name, *args, **kwargs):
    """Replace a trainable variable's initializer by values derived from its name."""
    shape = kwargs.get("shape")
    dtype = tf.as_dtype(kwargs.get("dtype") or tf.float32)
    trainable = kwargs.get("trainable", True)
    if shape is not None and dtype.is_floating and trainable and \
            tf.TensorShape(shape).is_fully_defined():
        value = deterministic_value(name, tf.TensorShape(shape).as_list(), dtype)
        kwargs["initializer"] = tf.constant_initializer(value)
    return getter(name, *args, **kwargs)


@contextlib.contextmanager
def no_stage(index):
    del index
    yield


class Model(object):
    """A corpus model: name, optimizer, data and a stage-annotated builder."""

    name = None
    batch = 4          # rows per micro-batch / per replica
    moving_stats = False

    def optimizer(self):
        return tf.train.AdamOptimizer(0.01, epsilon=1e-4)

    def data(self, rows, seed=0):
        raise NotImplementedError

    def build(self, batch, stage=no_stage):
        raise NotImplementedError

    def loss(self, batch, stage=no_stage, reuse=False):
        with tf.variable_scope("model", custom_getter=deterministic_getter,
                               reuse=tf.AUTO_REUSE if reuse else None):
            return self.build(batch, stage)

    def train_op(self, loss):
        """``minimize`` after the model's UPDATE_OPS (batch-norm statistics)."""
        step = tf.train.get_or_create_global_step()
        with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS)):
            return self.optimizer().minimize(loss, global_step=step)


class ResNet(Model):
    """slim resnet_v1: root block, two bottleneck units, batch norm; dense classifier."""

    name = "resnet"
    classes = 10
    moving_stats = True

    def data(self, rows, seed=0):
        rng = np.random.RandomState(seed)
        images = rng.rand(rows, 16, 16, 3).astype(np.float32)
        labels = rng.randint(0, self.classes, rows).astype(np.int64)
        return images, labels

    def build(self, batch, stage=no_stage):
        slim, resnet_v1 = _slim()
        images, labels = batch
        blocks = [resnet_v1.resnet_v1_block("block1", base_depth=4, num_units=1, stride=2),
                  resnet_v1.resnet_v1_block("block2", base_depth=5, num_units=1, stride=1)]
        with stage(0):
            with slim.arg_scope(resnet_v1.resnet_arg_scope(batch_norm_decay=0.9)):
                net, _ = resnet_v1.resnet_v1(images, blocks, num_classes=None, is_training=True,
                                             global_pool=True, scope="resnet")
            features = tf.squeeze(net, [1, 2])
        with stage(1):
            logits = tf.layers.dense(features, self.classes, name="classifier")
            return tf.losses.sparse_softmax_cross_entropy(labels, logits)


def _slim():
    """(slim, slim's resnet_v1): tf.contrib.slim on TF 1.15; on TF 2.x, where tf.contrib is
    gone, the tf-slim package it moved to (what a user switches to, docs/tf2.md)."""
    try:
        from tensorflow.contrib import slim
        from tensorflow.contrib.slim.nets import resnet_v1
    except ImportError:
        import tf_slim as slim
        from tf_slim.layers import layers as slim_layers
        from tf_slim.nets import resnet_v1
        # tf-slim 1.1's batch_norm builds TF's legacy BatchNormalization layer through
        # tensorflow.python.layers, which TF 2.15 resolves only with a tf-keras that has no
        # 2.15 release; the public class is the same layer (docs/tf2.md).
        slim_layers.normalization_layers = tf.layers
    return slim, resnet_v1


def _layer_norm(x, name):
    with tf.variable_scope(name):
        dim = x.shape[-1].value
        gamma = tf.get_variable("gamma", [dim], initializer=tf.ones_initializer())
        beta = tf.get_variable("beta", [dim], initializer=tf.zeros_initializer())
        mean, variance = tf.nn.moments(x, [-1], keep_dims=True)
        return (x - mean) * tf.rsqrt(variance + 1e-6) * gamma + beta


def _gelu(x):
    return 0.5 * x * (1.0 + tf.tanh(0.7978845608 * (x + 0.044715 * tf.pow(x, 3))))


class Bert(Model):
    """A two-layer BERT-style encoder with a [CLS] classifier."""

    name = "bert"
    vocab, seq, hidden, heads, intermediate, classes = 53, 7, 12, 3, 20, 3

    def __init__(self, dropout=0.0):
        self.dropout = dropout

    def data(self, rows, seed=0):
        rng = np.random.RandomState(seed)
        ids = rng.randint(0, self.vocab, (rows, self.seq)).astype(np.int32)
        segments = (np.arange(self.seq)[None, :] >= rng.randint(2, self.seq, (rows, 1)))
        lengths = rng.randint(3, self.seq + 1, (rows, 1))
        mask = (np.arange(self.seq)[None, :] < lengths).astype(np.float32)
        labels = rng.randint(0, self.classes, rows).astype(np.int64)
        return ids, segments.astype(np.int32), mask, labels

    def _rate(self):
        """A placeholder keeps the random dropout ops in the graph even at rate 0,
        where the mask is all ones and serial equivalence stays exact."""
        return tf.placeholder_with_default(float(self.dropout), [], name="dropout_rate")

    def _embed(self, ids, segments):
        word = tf.get_variable("word_embeddings", [self.vocab, self.hidden])
        position = tf.get_variable("position_embeddings", [self.seq, self.hidden])
        segment = tf.get_variable("segment_embeddings", [2, self.hidden])
        out = tf.gather(word, ids) + position[None] + tf.gather(segment, segments)
        return tf.nn.dropout(_layer_norm(out, "embedding_norm"), rate=self._rate())

    def _attention(self, x, mask):
        size = self.hidden // self.heads

        def heads(t):
            t = tf.reshape(t, [-1, self.seq, self.heads, size])
            return tf.transpose(t, [0, 2, 1, 3])

        q = heads(tf.layers.dense(x, self.hidden, name="query"))
        k = heads(tf.layers.dense(x, self.hidden, name="key"))
        v = heads(tf.layers.dense(x, self.hidden, name="value"))
        scores = tf.matmul(q, k, transpose_b=True) / np.sqrt(size)
        scores += (1.0 - mask[:, None, None, :]) * -10000.0
        probs = tf.nn.dropout(tf.nn.softmax(scores), rate=self._rate())
        context = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]),
                             [-1, self.seq, self.hidden])
        return tf.layers.dense(context, self.hidden, name="output")

    def _layer(self, x, mask, index):
        with tf.variable_scope("layer_%d" % index):
            with tf.variable_scope("attention"):
                x = _layer_norm(x + tf.nn.dropout(self._attention(x, mask), rate=self._rate()),
                                "norm")
            with tf.variable_scope("ffn"):
                h = tf.layers.dense(x, self.intermediate, activation=_gelu, name="inner")
                h = tf.layers.dense(h, self.hidden, name="outer")
                return _layer_norm(x + tf.nn.dropout(h, rate=self._rate()), "norm")

    def build(self, batch, stage=no_stage):
        ids, segments, mask, labels = batch
        with stage(0):
            x = self._layer(self._embed(ids, segments), mask, 0)
        with stage(1):
            x = self._layer(x, mask, 1)
            pooled = tf.layers.dense(x[:, 0], self.hidden, activation=tf.tanh, name="pooler")
            logits = tf.layers.dense(pooled, self.classes, name="classifier")
            return tf.losses.sparse_softmax_cross_entropy(labels, logits)


class WideDeep(Model):
    """Two odd-sized embedding tables (sparse gradients) plus dense features."""

    name = "embedding"
    users, items, dense_features, classes = 101, 13, 3, 2

    def optimizer(self):
        return tf.train.MomentumOptimizer(0.05, 0.9)

    def data(self, rows, seed=0):
        rng = np.random.RandomState(seed)
        user = rng.randint(0, self.users, (rows, 2)).astype(np.int64)
        item = rng.randint(0, self.items, rows).astype(np.int64)
        dense = rng.rand(rows, self.dense_features).astype(np.float32)
        labels = rng.randint(0, self.classes, rows).astype(np.int64)
        return user, item, dense, labels

    def features(self, user, item, dense):
        """The two tables' lookups (sparse gradients) beside the dense features."""
        users = tf.get_variable("user_table", [self.users, 7])
        items = tf.get_variable("item_table", [self.items, 5])
        wide = tf.reduce_sum(tf.nn.embedding_lookup(users, user), axis=1)
        return tf.concat([wide, tf.nn.embedding_lookup(items, item), dense], 1)

    def build(self, batch, stage=no_stage):
        user, item, dense, labels = batch
        with stage(0):
            features = self.features(user, item, dense)
            hidden = tf.layers.dense(features, 9, activation=tf.nn.relu, name="deep_1")
        with stage(1):
            hidden = tf.layers.dense(hidden, 5, activation=tf.nn.relu, name="deep_2")
            logits = tf.layers.dense(hidden, self.classes, name="head")
            return tf.losses.sparse_softmax_cross_entropy(labels, logits)


class OddSizes(Model):
    """Every variable has an odd number of elements: 1, 3, 5, 7, 37, 1000, ..."""

    name = "odd"
    features, classes = 5, 1000
    batch = 3

    def optimizer(self):
        return tf.train.AdamOptimizer(0.005, epsilon=1e-4)

    def data(self, rows, seed=0):
        rng = np.random.RandomState(seed)
        x = rng.rand(rows, self.features).astype(np.float32)
        labels = rng.randint(0, self.classes, rows).astype(np.int64)
        return x, labels

    head_alone = False  # stage 1 is only the classifier (else: temperature, d3, classifier)

    def build(self, batch, stage=no_stage):
        x, labels = batch
        with stage(0):
            h = tf.layers.dense(x, 37, activation=tf.nn.relu, name="d37")
            h = tf.layers.dense(h, 7, activation=tf.nn.tanh, name="d7")
            h = tf.layers.dense(h, 1, name="d1")
            if self.head_alone:
                h = self._middle(h)
        with stage(1):
            if not self.head_alone:
                h = self._middle(h)
            return tf.losses.sparse_softmax_cross_entropy(labels, self._classifier(h))

    def _middle(self, h):
        temperature = tf.get_variable("temperature", [])
        return tf.layers.dense(h * temperature, 3, activation=tf.nn.relu, name="d3")

    def _classifier(self, h):
        return tf.layers.dense(h, self.classes, name="classes")


class OddSplitHead(OddSizes):
    """``odd`` with 1001 classes whose classifier alone forms stage 1, for an
    ``epl.split`` stage: a split layer is given its weights (the getter's values) as a
    constant initializer, of which each shard takes its slice, because it asks the
    getter for no shape (epl/ops/shards.py)."""

    name = "odd_split_head"
    classes = 1001
    head_alone = True

    def _classifier(self, h):
        scope = tf.get_variable_scope().name + "/classes/"
        return tf.layers.dense(
            h, self.classes, name="classes",
            kernel_initializer=tf.constant_initializer(
                deterministic_value(scope + "kernel", [3, self.classes])),
            bias_initializer=tf.constant_initializer(
                deterministic_value(scope + "bias", [self.classes])))


CORPUS = (ResNet, Bert, WideDeep, OddSizes)
