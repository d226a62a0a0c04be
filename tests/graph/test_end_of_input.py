"""The end of the input ends the step on every replica (one worker, virtual devices).

When one replica's pull finds no data, every replica stops at that step, nothing of
it is applied, and ``session.run`` raises OutOfRangeError at once (before, the other
replica waited in its all-reduce for communication.timeout). See
epl/parallel/passes/end_of_input.py and docs/data_parallelism.md.
"""
import os
import sys

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from eplutil import (copy_values, initial_weights, make_data, max_diff, mlp, serial_train,
                     staged_mlp, train_step)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "multiworker",
                                "scripts"))
from estimator_model import (checkpoint_weights, input_fn, make_model_fn,  # noqa: E402
                             max_weight_diff, run_config, serial_estimator_train)

B, TOL = 4, 1e-5
NAMES = ("d1/kernel", "d2/kernel", "d1/bias")
GUARD = "EPL_END_OF_INPUT"


def _data(rows):
    x, y = make_data(rows)
    iterator = tf.data.make_initializable_iterator(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(B))
    return x, y, iterator


def _dp_model(batches, devices=2, config=None):
    """The MLP under replicate(1) on ``devices`` local devices, reading ``batches``
    batches from an initializable iterator: (x, y, iterator, features, train op)."""
    epl.init(config, cluster=Cluster(devices_per_worker=devices))
    epl.set_default_strategy(epl.replicate(1))
    x, y, iterator = _data(batches * B)
    features, labels = iterator.get_next()
    return x, y, iterator, features, train_step(mlp(features, labels, initial_weights()))


def _run_until_end(sess, fetches):
    """Runs ``fetches`` until OutOfRangeError; returns (runs, the error's text)."""
    runs = 0
    while True:
        try:
            sess.run(fetches)
        except tf.errors.OutOfRangeError as err:
            return runs, str(err)
        runs += 1


def _check_weights(sess, reference, copies):
    for name in NAMES:
        values = copy_values(sess, name)
        assert len(values) == copies
        assert max_diff(reference[name], values) < TOL, name


@pytest.mark.timeout(60)
def test_local_replicas_stop_together_and_continue_after_a_new_epoch():
    """1 worker x 2 devices, 5 batches per epoch: 2 steps, then every replica stops
    at the step where replica 1 has no batch (before: replica 0 waited in its
    all-reduce for communication.timeout). The iterator is re-initialized and a second
    epoch trains on from the same weights on both replicas."""
    x, y, iterator, _, train = _dp_model(5)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        ends = []
        for _ in range(2):
            sess.run(iterator.initializer)
            ends.append(_run_until_end(sess, train))
        assert [runs for runs, _ in ends] == [2, 2]
        assert all(GUARD in text for _, text in ends)
        epochs = np.concatenate([x[:4 * B], x[:4 * B]]), np.concatenate([y[:4 * B], y[:4 * B]])
        _, reference = serial_train(epochs[0], epochs[1], 2 * B, 4)
        _check_weights(sess, reference, 2)
        assert sess.run(tf.train.get_global_step()) == 4


@pytest.mark.timeout(60)
def test_a_fetched_batch_is_the_batch_copy_zero_trained_on():
    """Fetching the get-next output with the step returns copy 0's guarded batch and
    pulls nothing more."""
    x, _, iterator, features, train = _dp_model(4)
    with tf.Session() as sess:
        sess.run([tf.global_variables_initializer(), iterator.initializer])
        seen = [sess.run([train, features])[1] for _ in range(2)]
        with pytest.raises(tf.errors.OutOfRangeError):
            sess.run(train)
    np.testing.assert_array_equal(seen[0], x[:B])
    np.testing.assert_array_equal(seen[1], x[2 * B:3 * B])


@pytest.mark.timeout(90)
@pytest.mark.parametrize("lowering", ["stage_functions", "unrolled"])
def test_pipeline_stops_when_a_micro_batch_has_no_data(lowering):
    """2 stages x 4 micro-batches on 2 devices, 10 batches: 2 steps, then micro-batch 2
    of step 3 finds nothing; no micro-batch of that step runs a stage."""
    epl.init(epl.Config({"pipeline.num_micro_batch": 4, "pipeline.micro_batching": lowering}),
             cluster=Cluster(devices_per_worker=2))
    x, y, iterator = _data(10 * B)
    train = train_step(staged_mlp(*iterator.get_next(), weights=initial_weights()))
    with tf.Session() as sess:
        sess.run([tf.global_variables_initializer(), iterator.initializer])
        runs, text = _run_until_end(sess, train)
        assert runs == 2 and GUARD in text
        _, reference = serial_train(x, y, 4 * B, 2)
        _check_weights(sess, reference, 1)


@pytest.mark.timeout(90)
def test_a_cut_accumulation_window_is_dropped_and_the_next_epoch_continues_the_window():
    """Gradient accumulation (3 runs per update) on 1 x 2 devices. Epoch 1 has data for
    4 runs: one update, one run accumulated, then the end. The stopped run must not
    move the accumulation counter (before, it did: the window then ended one run early
    on the next epoch), so epoch 2's first 2 runs complete the second window."""
    x, y, iterator, _, train = _dp_model(9, config=epl.Config({"pipeline.num_micro_batch": 3}))
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(iterator.initializer)
        assert _run_until_end(sess, train)[0] == 4
        sess.run(iterator.initializer)
        for _ in range(2):
            sess.run(train)
        assert sess.run(tf.train.get_global_step()) == 2
        rows = 2 * B  # one run: both replicas' batches
        order = np.concatenate([np.arange(4 * rows), np.arange(2 * rows)])
        _, reference = serial_train(x[order], y[order], 3 * rows, 2)
        _check_weights(sess, reference, 2)


@pytest.mark.timeout(120)
def test_estimator_returns_normally_at_the_end_of_uneven_input(tmp_path):
    """Static batches (drop_remainder): each of the 2 copies pulls a whole batch of 8;
    5 batches give 2 steps, and train() returns with the final checkpoint at step 2."""
    x, y = make_data(5 * 8)
    reference = serial_estimator_train(x, y, 16, 2, tmp_path / "serial")
    epl.init(cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1))
    model_dir = tmp_path / "epl"
    estimator = tf.estimator.Estimator(make_model_fn(), config=run_config(model_dir))
    estimator.train(input_fn(x, y, 8))
    trained = checkpoint_weights(model_dir)
    assert trained["global_step"] == 2
    assert max_weight_diff(reference, trained) < TOL


def test_one_replica_without_accumulation_is_left_as_plain_tensorflow():
    _, _, iterator, _, train = _dp_model(2, devices=1)
    with tf.Session() as sess:
        sess.run([tf.global_variables_initializer(), iterator.initializer])
        assert _run_until_end(sess, train)[0] == 2
    assert not [op for op in tf.get_default_graph().get_operations()
                if op.name.startswith(GUARD)]


def test_a_queue_input_that_cannot_be_guarded_is_named_in_a_warning(caplog):
    epl.init(cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1))
    x, y = make_data(4 * B)
    queue = tf.FIFOQueue(64, [tf.float32, tf.int64], shapes=[x.shape[1:], []], name="rows")
    features, labels = queue.dequeue_many(B, name="take_rows")
    train_step(mlp(features, labels, initial_weights()))
    tf.get_default_graph().finalize()  # the rewrite
    assert "take_rows (QueueDequeueManyV2), which EPL cannot guard" in caplog.text
