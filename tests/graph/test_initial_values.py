"""Initial values under a graph-level seed equal plain TensorFlow's, under every strategy.

TF seeds an unseeded random op with the number of ops created before it, so a
strategy that builds other ops than plain TF (split layers' collectives, a sharded
loss) would change every later initial value, and a value drawn at rewrite time
would change with everything built after it (optimizer.num_apply_group, unrelated
ops). The program: a replicated backbone with dropout, a split classifier with
Glorot (unseeded) initial values and its loss, a MoE layer, and a layer created
after all of them; its variables' initial values must be plain TF's.
"""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from epl.ops.moe import moe_layer
from eplutil import copy_values

SEED = 123


def _program(backbone, head, extra_ops=0):
    """Build the program; ``backbone`` and ``head`` are strategy scopes (or None)."""
    tf.set_random_seed(SEED)
    rng = np.random.RandomState(0)
    x = tf.constant(rng.rand(8, 6).astype(np.float32))
    labels = tf.constant(np.arange(8) % 5, tf.int64)
    tokens = tf.constant(rng.rand(4, 6, 4).astype(np.float32))
    with backbone or _Nothing():
        hidden = tf.nn.dropout(tf.layers.dense(x, 16, tf.nn.relu, name="backbone"), rate=0.1)
    with head or _Nothing():
        logits = tf.layers.dense(hidden, 5, name="classifier")
        loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
    moe, aux = moe_layer(tokens, 4, 5, split=head)
    with backbone or _Nothing():
        after = tf.layers.dense(hidden, 3, name="after")
    for _ in range(extra_ops):
        tf.constant(1.0)
    total = loss + aux + tf.reduce_mean(moe) + tf.reduce_mean(after)
    return tf.train.AdamOptimizer(0.1).minimize(total, tf.train.get_or_create_global_step())


class _Nothing(object):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


VARIABLES = {  # name -> sharded axis when split
    "backbone/kernel": None, "classifier/kernel": 1, "classifier/bias": 0,
    "moe/gate": None, "moe/w_in": 0, "moe/w_out": 0, "after/kernel": None}


def _plain():
    with epl.paused(), tf.Graph().as_default():
        _program(None, None)
        graph = tf.get_default_graph()
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            return dict((name, sess.run(graph.get_tensor_by_name(name + ":0")))
                        for name in VARIABLES)


LAYOUTS = {
    # name: (config, devices, scopes(), extra ops after the model)
    "replicate": ({}, 2, lambda: (epl.replicate(1), None), 0),
    "pipeline": ({"pipeline.num_micro_batch": 2}, 2,
                 lambda: (epl.replicate(1, name="stage_0"), epl.replicate(1, name="stage_1")),
                 0),
    "split": ({"cluster.colocate_split_and_replicate": True}, 2,
              lambda: (epl.replicate(2), epl.split(2)), 0),
    "split, num_apply_group=3": (
        {"cluster.colocate_split_and_replicate": True, "optimizer.num_apply_group": 3}, 2,
        lambda: (epl.replicate(2), epl.split(2)), 0),
    "split, unrelated ops after": ({"cluster.colocate_split_and_replicate": True}, 2,
                                   lambda: (epl.replicate(2), epl.split(2)), 7),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_initial_values_equal_plain_tensorflow(layout):
    config, devices, scopes, extra = LAYOUTS[layout]
    reference = _plain()
    epl.init(epl.Config(config), cluster=Cluster(devices_per_worker=devices))
    backbone, head = scopes()
    split = "split" in layout
    _program(backbone, head, extra)
    differ = {}
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for name, axis in sorted(VARIABLES.items()):
            copies = copy_values(sess, name)
            if split and axis is not None:
                value = np.concatenate(copies, axis=axis)
            else:
                value = copies[0]
                for other in copies[1:]:
                    np.testing.assert_array_equal(other, value, err_msg=name)
            if not np.array_equal(value, reference[name]):
                differ[name] = "sum %.4f, plain TF %.4f" % (value.sum(), reference[name].sum())
    assert not differ, "initial values differ from plain TF's: %s" % differ
