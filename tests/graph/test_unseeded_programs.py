"""A user's program that sets no seed at all trains under EPL, whatever else the test run
collected. Regression: tests/gpu/conftest.py set TF_DETERMINISTIC_OPS=1 for the whole
process; on TF 2.x that turns on op determinism, which refuses every random op without a
seed, so with tests/gpu collected (`make test-tf2`) 510 tests failed on a CPU host."""
import numpy as np
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster


def test_program_without_any_seed_trains_under_data_parallelism():
    epl.init(cluster=Cluster(devices_per_worker=2))
    with epl.replicate(1):
        features = np.arange(64, dtype=np.float32).reshape(16, 4) / 64.0
        data = tf.data.Dataset.from_tensor_slices(features).shuffle(16).repeat().batch(4)
        batch = tf.data.make_one_shot_iterator(data).get_next()
        hidden = tf.layers.dense(batch, 8, activation=tf.nn.relu)
        hidden = tf.nn.dropout(hidden, rate=0.5)
        loss = tf.reduce_mean(tf.square(tf.layers.dense(hidden, 1)))
        train = tf.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        losses = [sess.run([loss, train])[0] for _ in range(3)]
    assert all(np.isfinite(losses)), losses
