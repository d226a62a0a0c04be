"""Gradients that come out of while loops and conds lose their static shape in TF.

Fusion needs every dense gradient's size; EPL takes it from the variable (a
dense gradient has its variable's shape). A dynamic_rnn model with a tf.cond
trained under data parallelism must match serial training.
"""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from eplutil import epl_paused

STEPS, BATCH = 3, 8


def _data():
    rng = np.random.RandomState(0)
    return rng.rand(64, 5, 4).astype(np.float32), rng.randint(0, 3, 64)


def _train(batch, use_cond):
    x, y = _data()
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)
    xb, yb = tf.data.make_one_shot_iterator(data).get_next()
    with tf.variable_scope("m", initializer=tf.constant_initializer(0.1)):
        out, _ = tf.nn.dynamic_rnn(tf.nn.rnn_cell.BasicRNNCell(6), xb, dtype=tf.float32)
        h = out[:, -1]
        v = tf.get_variable("v", [6, 3])
        if use_cond:
            logits = tf.cond(tf.reduce_sum(h) > 0, lambda: tf.matmul(h, v),
                             lambda: tf.matmul(h, v) * 2.0)
        else:
            logits = tf.matmul(h, v)
    loss = tf.losses.sparse_softmax_cross_entropy(yb, logits)
    # Plain SGD: Adam divides by the gradients' own magnitude, which turns float rounding
    # (two means of 8 rows vs one of 16) into 1e-6 differences on some CPUs.
    train = tf.train.GradientDescentOptimizer(0.5).minimize(
        loss, tf.train.get_or_create_global_step())
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(STEPS):
            sess.run(train)
        return dict((v.op.name, sess.run(v)) for v in tf.trainable_variables())


@pytest.mark.parametrize("use_cond", [False, True], ids=["rnn", "rnn_cond"])
def test_loop_and_cond_gradients_are_fused_under_data_parallelism(use_cond):
    with epl_paused(), tf.Graph().as_default():
        reference = _train(2 * BATCH, use_cond)
    with tf.Graph().as_default():
        epl.init(epl.Config(), cluster=Cluster(devices_per_worker=2))
        epl.set_default_strategy(epl.replicate(1))
        parallel = _train(BATCH, use_cond)
    assert sorted(parallel) == sorted(reference)
    for name, value in reference.items():
        np.testing.assert_allclose(parallel[name], value, atol=1e-6, err_msg=name)
