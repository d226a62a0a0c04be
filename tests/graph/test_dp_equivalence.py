"""Data parallelism on one worker's virtual devices equals serial training."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from eplutil import (all_copy_values, copy_values, dataset_input, make_data, max_diff, mlp,
                     serial_train, train_step, initial_weights)

STEPS = 4
TOL = 1e-5


def _epl_train(devices, batch, steps, strategy=None, opt_name="momentum", collect=False,
               session="plain"):
    x, y = make_data(64)
    epl.init(cluster=Cluster(devices_per_worker=devices))
    epl.set_default_strategy(strategy or epl.replicate(1))
    loss = mlp(*dataset_input(x, y, batch), weights=initial_weights())
    if collect:
        epl.add_to_collection(loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    train = train_step(loss, opt_name)
    step = tf.train.get_global_step()
    if session == "monitored":
        sess = tf.train.MonitoredTrainingSession()
        raw = sess._tf_sess()  # pylint: disable=protected-access
    else:
        sess = raw = tf.Session()
        sess.run(tf.global_variables_initializer())
    losses, steps_seen = [], []
    for _ in range(steps):
        value, _, global_step = sess.run([loss, train, step])
        losses.append(value)
        steps_seen.append(global_step)
    names = [v.op.name for v in tf.global_variables() if v.op.name != "global_step"]
    copies = all_copy_values(raw, names)
    sess.close()
    return losses, steps_seen, copies


@pytest.mark.parametrize("devices,opt_name,session", [
    (2, "momentum", "plain"), (4, "adam", "plain"), (2, "sgd", "monitored")])
def test_replicas_match_serial(devices, opt_name, session):
    x, y = make_data(64)
    ref_losses, ref = serial_train(x, y, 16, STEPS, opt_name)
    _, steps_seen, copies = _epl_train(devices, 16 // devices, STEPS, opt_name=opt_name,
                                       session=session)
    assert steps_seen == list(range(1, STEPS + 1))
    for name, reference in ref.items():
        if name == "global_step":
            continue
        assert len(copies[name]) == devices
        assert max_diff(reference, copies[name]) < TOL, name


def test_global_mean_loss_equals_serial_loss():
    x, y = make_data(64)
    ref_losses, _ = serial_train(x, y, 16, STEPS)
    losses, _, _ = _epl_train(2, 8, STEPS, collect=True)
    np.testing.assert_allclose(losses, ref_losses, atol=TOL)


def test_device_count_splits_each_batch():
    x, y = make_data(64)
    _, ref = serial_train(x, y, 8, STEPS)
    _, _, copies = _epl_train(2, 8, STEPS, strategy=epl.replicate(device_count=2))
    for name in ("d1/kernel", "d2/kernel", "d2/bias"):
        assert len(copies[name]) == 2
        assert max_diff(ref[name], copies[name]) < TOL, name


def test_every_replica_pulls_a_batch_even_when_only_loss_is_fetched():
    x, y = make_data(32)
    epl.init(cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1))
    loss = mlp(*dataset_input(x, y, 8), weights=initial_weights())
    train_step(loss)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(loss)
        sess.run(loss)
        with pytest.raises(tf.errors.OutOfRangeError):
            sess.run(loss)


def test_make_callable_runs_every_replica():
    x, y = make_data(64)
    _, ref = serial_train(x, y, 16, STEPS)
    epl.init(cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1))
    loss = mlp(*dataset_input(x, y, 8), weights=initial_weights())
    train = train_step(loss)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        step_fn = sess.make_callable([loss, train])
        for _ in range(STEPS):
            step_fn()
        assert max_diff(ref["d1/kernel"], copy_values(sess, "d1/kernel")) < TOL


def test_single_device_runs_unchanged():
    x, y = make_data(64)
    _, ref = serial_train(x, y, 16, STEPS)
    _, _, copies = _epl_train(1, 16, STEPS)
    assert max_diff(ref["d1/kernel"], copies["d1/kernel"]) < TOL


def test_fetched_loss_is_replica_zero_value():
    x, y = make_data(64)
    ref_losses, _ = serial_train(x, y, 8, 1)  # replica 0 reads the first 8 rows
    losses, _, _ = _epl_train(2, 8, 1)
    np.testing.assert_allclose(losses[0], ref_losses[0], atol=TOL)
