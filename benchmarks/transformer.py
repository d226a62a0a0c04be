"""A BERT-shaped encoder for benchmarks (TF1 graph mode, no EPL imports).

Embeddings (word, position), ``layers`` transformer layers (multi-head
self-attention, GELU feed-forward, layer norm), a [CLS] classifier, Adam.
``stage_of(layer)`` (optional) returns a context manager per layer, so a
caller can cut the layers into pipeline stages with ``epl.replicate``.
"""
import contextlib

import numpy as np

BASE = dict(layers=12, hidden=768, heads=12, seq=64, intermediate=3072, vocab=30522)
# The encoder of the pipeline-at-scale measurements (issue 17): BERT's vocabulary,
# a quarter of BERT-base's width, half its sequence.
MID = dict(layers=12, hidden=384, heads=12, seq=32, intermediate=1536, vocab=30522)
SMALL = dict(layers=4, hidden=128, heads=4, seq=32, intermediate=512, vocab=1000)
SIZES = {"base": BASE, "mid": MID, "small": SMALL}


@contextlib.contextmanager
def _nothing():
    yield


def _layer_norm(tf, x, name):
    with tf.variable_scope(name):
        dim = x.shape[-1].value
        gamma = tf.get_variable("gamma", [dim], initializer=tf.ones_initializer())
        beta = tf.get_variable("beta", [dim], initializer=tf.zeros_initializer())
        mean, variance = tf.nn.moments(x, [-1], keep_dims=True)
        return (x - mean) * tf.rsqrt(variance + 1e-6) * gamma + beta


def _gelu(tf, x):
    return 0.5 * x * (1.0 + tf.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


def _attention(tf, x, size):
    heads, hidden, seq = size["heads"], size["hidden"], size["seq"]
    per_head = hidden // heads

    def split_heads(t):
        return tf.transpose(tf.reshape(t, [-1, seq, heads, per_head]), [0, 2, 1, 3])

    q = split_heads(tf.layers.dense(x, hidden, name="query"))
    k = split_heads(tf.layers.dense(x, hidden, name="key"))
    v = split_heads(tf.layers.dense(x, hidden, name="value"))
    probs = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) / np.sqrt(per_head))
    context = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]), [-1, seq, hidden])
    return tf.layers.dense(context, hidden, name="output")


def _layer(tf, x, size, index):
    with tf.variable_scope("layer_%d" % index):
        with tf.variable_scope("attention"):
            x = _layer_norm(tf, x + _attention(tf, x, size), "norm")
        with tf.variable_scope("ffn"):
            h = tf.layers.dense(x, size["intermediate"], activation=lambda t: _gelu(tf, t),
                                name="inner")
            h = tf.layers.dense(h, size["hidden"], name="outer")
            return _layer_norm(tf, x + h, "norm")


def build(tf, size, batch, stage_of=None, classes=2):
    """Loss and train op of the encoder on a synthetic repeating batch of ``batch`` rows."""
    stage_of = stage_of or (lambda layer: _nothing())
    rng = np.random.RandomState(0)
    ids = rng.randint(0, size["vocab"], (batch, size["seq"])).astype(np.int32)
    labels = rng.randint(0, classes, batch).astype(np.int64)
    data = tf.data.Dataset.from_tensors((ids, labels)).repeat()
    ids_t, labels_t = tf.data.make_one_shot_iterator(data).get_next()
    with stage_of(0):
        word = tf.get_variable("word_embeddings", [size["vocab"], size["hidden"]])
        position = tf.get_variable("position_embeddings", [size["seq"], size["hidden"]])
        x = _layer_norm(tf, tf.gather(word, ids_t) + position[None], "embedding_norm")
    for index in range(size["layers"]):
        with stage_of(index):
            x = _layer(tf, x, size, index)
    with stage_of(size["layers"] - 1):
        logits = tf.layers.dense(tf.layers.dense(x[:, 0], size["hidden"], activation=tf.tanh,
                                                 name="pooler"), classes, name="classifier")
        loss = tf.losses.sparse_softmax_cross_entropy(labels_t, logits)
    step = tf.train.get_or_create_global_step()
    train = tf.train.AdamOptimizer(1e-4).minimize(loss, global_step=step)
    return loss, train
