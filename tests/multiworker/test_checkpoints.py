"""Only worker 0 writes checkpoints/summaries; a restore reaches every replica."""
import os

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from eplutil import (copy_values, dataset_input, initial_weights, make_data, mlp, run_workers,
                     train_step)

STEPS = 3


def _model(x, y, seed):
    epl.set_default_strategy(epl.replicate(1))
    loss = mlp(*dataset_input(x, y, 4), weights=initial_weights(seed))
    tf.summary.scalar("loss", loss)
    return train_step(loss)


@pytest.mark.timeout(180)
def test_chief_only_checkpoints_and_restore_reaches_all_replicas(tmp_path):
    x, y = make_data(64)
    dirs = [str(tmp_path / ("worker_%d" % i)) for i in range(2)]

    def train(index):
        train_op = _model(x, y, seed=1)
        with tf.train.MonitoredTrainingSession(checkpoint_dir=dirs[index],
                                               save_summaries_steps=1) as sess:
            for _ in range(STEPS):
                sess.run(train_op)

    run_workers(train, 2, 2)
    assert os.path.exists(os.path.join(dirs[0], "model.ckpt-%d.index" % STEPS))
    assert any(f.startswith("events.") for f in os.listdir(dirs[0]))
    assert not os.path.exists(dirs[1]) or os.listdir(dirs[1]) == []
    saved = tf.train.load_variable(dirs[0], "d1/kernel")

    def restore(index):
        # Worker 1 finds no checkpoint and starts from other weights; the
        # broadcast must still give it worker 0's restored values.
        train_op = _model(x, y, seed=1 + index * 7)
        del train_op
        with tf.train.MonitoredTrainingSession(checkpoint_dir=dirs[index]) as sess:
            return copy_values(sess._tf_sess(), "d1/kernel")  # pylint: disable=W0212

    results = run_workers(restore, 2, 2)
    for copies in results:
        assert len(copies) == 2
        for value in copies:
            np.testing.assert_allclose(value, saved, atol=1e-7)


def test_plain_saver_restore_resyncs_replicas(tmp_path):
    x, y = make_data(64)
    path = str(tmp_path / "model.ckpt")
    epl.init(cluster=Cluster(devices_per_worker=2))
    train_op = _model(x, y, seed=1)
    saver = tf.train.Saver()
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(train_op)
        saver.save(sess, path)
        trained = sess.run(tf.get_default_graph().get_tensor_by_name("d1/kernel:0"))
        sess.run(train_op)  # move away from the checkpoint
        saver.restore(sess, path)
        for value in copy_values(sess, "d1/kernel"):
            np.testing.assert_allclose(value, trained, atol=1e-7)
