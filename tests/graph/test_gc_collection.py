"""Gradient checkpointing by collection composed with AMP and with several losses.

* AMP O1 replaces a checkpointed float32 activation with a float16 twin before the
  gradients are built; the collection entry follows it, and training matches AMP
  without checkpointing.
* A GAN-style program (two losses, two optimizers, each tower with its own
  checkpoint tensor): each tf.gradients call uses the checkpoints between its own
  variables and loss, and training matches serial training.
* An entry that no gradient call can use is an error naming it when the graph is
  parallelized.
"""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from epl.config import ConfigError
from epl.runtime import gradient_checkpoint as gc
from epl.runtime.amp_convert import HALF_SUFFIX
from eplutil import all_copy_values, make_data, max_diff

STEPS = 3
TOL = 1e-5
GC = {"gradient_checkpoint.type": "collection"}
AMP = {"amp.level": "O1"}


def _dense(value, units, name, activation=None, seed=0):
    rng = np.random.RandomState(seed)
    kernel = rng.rand(int(value.shape[-1]), units).astype(np.float32) - 0.5
    return tf.layers.dense(value, units, activation, name=name,
                           kernel_initializer=tf.constant_initializer(kernel))


def _input(arrays, batch):
    data = tf.data.Dataset.from_tensor_slices(arrays).batch(batch)
    return tf.data.make_one_shot_iterator(data).get_next()


def _deep_mlp(batch, mark):
    """Four dense layers on dataset input; ``mark`` adds two hidden outputs to the
    collection."""
    x, y = make_data(16 * STEPS)
    features, labels = _input((x, y), batch)
    value = features
    for index in range(3):
        value = _dense(value, 16, "h%d" % index, tf.nn.relu, seed=index)
        if mark and index < 2:
            tf.add_to_collection("checkpoints", value)
    logits = _dense(value, 3, "out", seed=9)
    loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
    return tf.train.AdamOptimizer(0.01).minimize(loss, tf.train.get_or_create_global_step())


def _train_dp(config, build):
    epl.init(epl.Config(config), cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1))
    train = build()
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(STEPS):
            sess.run(train)
        names = sorted(v.op.name for v in tf.trainable_variables())
        return all_copy_values(sess, names)


def test_collection_entries_follow_amp_float16_twins():
    reference = _train_dp(AMP, lambda: _deep_mlp(8, mark=False))
    epl.reset()
    copies = _train_dp(dict(AMP, **GC), lambda: _deep_mlp(8, mark=True))
    calls = gc.state().calls
    assert len(calls) == 1 and calls[0].method == "collection"
    marked = [name for name in calls[0].checkpoints if name.startswith(("h0/", "h1/"))]
    assert len(marked) == 2 and all(name.endswith(HALF_SUFFIX) for name in marked), \
        calls[0].checkpoints
    assert calls[0].recomputed
    worst = 0.0
    for name, values in reference.items():
        worst = max(worst, max_diff(values[0], copies[name]))
    assert worst < TOL
    initial = np.random.RandomState(0).rand(6, 16).astype(np.float32) - 0.5
    assert not np.allclose(copies["h0/kernel"][0], initial, atol=1e-3)


def _gan(batch, mark):
    """A generator and a discriminator, each trained on its own loss by its own Adam in
    the same step; each tower puts its first hidden activation into the collection.
    Resource variables: the generator's backward reads the discriminator's weights,
    which ref variables would let the discriminator's update change under it."""
    rng = np.random.RandomState(3)
    real = rng.rand(16 * STEPS, 6).astype(np.float32)
    noise = rng.randn(16 * STEPS, 4).astype(np.float32)
    real_batch, z = _input((real, noise), batch)
    with tf.variable_scope("G", use_resource=True):
        g1 = _dense(z, 16, "g1", tf.nn.relu, seed=1)
        fake = _dense(_dense(g1, 16, "g2", tf.nn.relu, seed=2), 6, "g3", seed=3)

    def discriminator(value, reuse):
        with tf.variable_scope("D", reuse=reuse, use_resource=True):
            d1 = _dense(value, 16, "d1", tf.nn.relu, seed=4)
            if mark and not reuse:
                tf.add_to_collection("checkpoints", d1)
            return _dense(_dense(d1, 16, "d2", tf.nn.relu, seed=5), 1, "d3", seed=6)

    if mark:
        tf.add_to_collection("checkpoints", g1)
    real_logit, fake_logit = discriminator(real_batch, False), discriminator(fake, True)
    xent = tf.nn.sigmoid_cross_entropy_with_logits
    d_loss = tf.reduce_mean(xent(labels=tf.ones_like(real_logit), logits=real_logit)) + \
        tf.reduce_mean(xent(labels=tf.zeros_like(fake_logit), logits=fake_logit))
    g_loss = tf.reduce_mean(xent(labels=tf.ones_like(fake_logit), logits=fake_logit))
    train_d = tf.train.AdamOptimizer(0.01).minimize(d_loss, var_list=tf.trainable_variables("D"))
    train_g = tf.train.AdamOptimizer(0.01).minimize(
        g_loss, tf.train.get_or_create_global_step(), var_list=tf.trainable_variables("G"))
    return tf.group(train_d, train_g)


def test_each_loss_of_a_gan_uses_the_checkpoints_of_its_own_region():
    with epl.paused(), tf.Graph().as_default():
        train = _gan(16, mark=False)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            for _ in range(STEPS):
                sess.run(train)
            reference = dict((v.op.name, sess.run(v)) for v in tf.trainable_variables())
            assert reference
    copies = _train_dp(GC, lambda: _gan(8, mark=True))
    calls = gc.state().calls
    assert len(calls) == 2
    d_call, g_call = calls
    assert "D/d1/Relu" in d_call.checkpoints and "G/g1/Relu" not in d_call.checkpoints
    assert "G/g1/Relu" in g_call.checkpoints and "D/d1/Relu" not in g_call.checkpoints
    assert d_call.recomputed and g_call.recomputed
    worst = max(max_diff(value, copies[name]) for name, value in reference.items())
    assert worst < TOL
    initial = np.random.RandomState(1).rand(4, 16).astype(np.float32) - 0.5
    assert not np.allclose(copies["G/g1/kernel"][0], initial, atol=1e-3)


def test_entry_no_gradient_call_uses_is_named_when_the_graph_is_parallelized():
    epl.init(epl.Config(GC), cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1))
    train = _deep_mlp(8, mark=True)
    features = tf.get_default_graph().get_tensor_by_name("IteratorGetNext:0")
    tf.add_to_collection("checkpoints", features * 2.0)    # not on the way to the loss
    with tf.Session() as sess:
        with pytest.raises(ConfigError, match=r"checkpoint tensor\(s\) 'mul:0' .* not "
                                              r"between the variables and the loss of any"):
            sess.run(tf.global_variables_initializer())
        with pytest.raises(RuntimeError, match="mul:0"):
            sess.run(train)
