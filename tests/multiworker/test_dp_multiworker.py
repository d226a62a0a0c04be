"""Data parallelism across in-process workers (real gRPC servers on 127.0.0.1)."""
import pytest
import tensorflow.compat.v1 as tf

import epl
from eplutil import (copy_values, dataset_input, initial_weights, make_data, max_diff, mlp,
                     run_workers, serial_train, train_step, worker_rows)

STEPS = 3
TOL = 1e-5
BATCH = 4


def _train(workers, devices, checkpoint_dir=None):
    global_batch = workers * devices * BATCH
    x, y = make_data(global_batch * STEPS)
    _, reference = serial_train(x, y, global_batch, STEPS)

    def worker(index):
        wx = worker_rows(x, STEPS, workers, devices * BATCH, index)
        wy = worker_rows(y, STEPS, workers, devices * BATCH, index)
        epl.set_default_strategy(epl.replicate(1))
        loss = mlp(*dataset_input(wx, wy, BATCH), weights=initial_weights())
        train = train_step(loss)
        with tf.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir,
                                               save_checkpoint_steps=STEPS) as sess:
            for _ in range(STEPS):
                sess.run(train)
            raw = sess._tf_sess()  # pylint: disable=protected-access
            names = [v.op.name for v in tf.trainable_variables()]
            return dict((n, copy_values(raw, n)) for n in names)

    return reference, run_workers(worker, workers, devices)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers,devices", [(2, 1), (2, 2)])
def test_workers_match_serial(workers, devices):
    reference, results = _train(workers, devices)
    for name in ("d1/kernel", "d1/bias", "d2/kernel", "d2/bias"):
        copies = [c for result in results for c in result[name]]
        assert len(copies) == workers * devices
        assert max_diff(reference[name], copies) < TOL, name


@pytest.mark.timeout(180)
def test_user_server_and_plain_session():
    """A script that builds its own tf.train.Server and plain Session is parallel too."""
    workers, devices = 2, 1
    global_batch = workers * devices * BATCH
    x, y = make_data(global_batch * STEPS)
    _, reference = serial_train(x, y, global_batch, STEPS)

    def worker(index):
        cluster = epl.Env.get().cluster
        server = tf.train.Server(tf.train.ClusterSpec(cluster.cluster_spec()), "worker", index)
        wx = worker_rows(x, STEPS, workers, devices * BATCH, index)
        wy = worker_rows(y, STEPS, workers, devices * BATCH, index)
        with epl.replicate(1):
            loss = mlp(*dataset_input(wx, wy, BATCH), weights=initial_weights())
        train = train_step(loss)
        with tf.Session(server.target) as sess:
            sess.run(tf.global_variables_initializer())
            for _ in range(STEPS):
                sess.run(train)
            return copy_values(sess, "d1/kernel")

    results = run_workers(worker, workers, devices)
    assert max_diff(reference["d1/kernel"], [c for r in results for c in r]) < TOL
