"""ZeRO on N workers x 1 device: states (v0) and gradient reduction (v1) partitioned,
training unchanged."""
import os

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from eplutil import (MEASURED, dataset_input, initial_weights, make_data, mlp, run_workers,
                     serial_train, worker_rows)

STEPS, BATCH = 3, 4


def _train(level, workers):
    x, y = make_data(workers * BATCH * STEPS)

    def worker(index):
        epl.set_default_strategy(epl.replicate(1))
        loss = mlp(*dataset_input(worker_rows(x, STEPS, workers, BATCH, index),
                                  worker_rows(y, STEPS, workers, BATCH, index), BATCH),
                   weights=initial_weights())
        step = tf.train.get_or_create_global_step()
        train = tf.train.AdamOptimizer(0.01, epsilon=1e-4).minimize(loss, global_step=step)
        slots = [v for v in tf.global_variables() if "Adam" in v.op.name
                 and "power" not in v.op.name]
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            for _ in range(STEPS):
                sess.run(train)
            names = [v.op.name for v in tf.trainable_variables()]
            values = dict(zip(names, sess.run(tf.trainable_variables())))
            slot_bytes = sum(int(np.prod(v.shape.as_list())) * 4 for v in slots)
            return values, slot_bytes, sess.run(step)

    return x, y, run_workers(worker, workers, 1, epl.Config({"zero.level": level}))


@pytest.mark.parametrize("level", ["v0", "v1"])
@pytest.mark.parametrize("workers", [2, 4])
def test_zero_matches_serial_and_partitions_optimizer_states(level, workers):
    x, y, results = _train(level, workers)
    with epl.paused():
        _, reference = serial_train(x, y, workers * BATCH, STEPS, "adam_eps")
    worst = 0.0
    for values, _, step in results:
        assert step == STEPS
        for name, value in values.items():
            worst = max(worst, float(np.abs(value - reference[name]).max()))
    import os
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], worst))
    assert worst < 2e-5
    # m and v of every variable exist exactly once across the workers
    var_bytes = sum(int(np.prod(v.shape)) * 4 for v in results[0][0].values())
    assert sum(b for _, b, _ in results) == 2 * var_bytes
    assert all(0 < b < 2 * var_bytes for _, b, _ in results)


def test_zero_refuses_what_it_cannot_partition():
    def worker(index):
        epl.set_default_strategy(epl.replicate(1))
        x, y = make_data(8)
        loss = mlp(*dataset_input(x, y, 4), weights=initial_weights())
        with pytest.raises(ValueError, match="2 devices per worker"):
            tf.train.AdamOptimizer(0.01).minimize(loss)
        return True
    assert run_workers(worker, 1, 2, epl.Config({"zero.level": "v1"})) == [True]


def test_zero_refuses_a_checkpoint_missing_other_workers_slots(tmp_path, monkeypatch):
    """Worker 0 alone writes checkpoints; under ZeRO it lacks the others' Adam slots.
    A training step never runs a saver (ZeRO once made every step write ./model)."""
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)

    def worker(index):
        epl.set_default_strategy(epl.replicate(1))
        x, y = make_data(8)
        loss = mlp(*dataset_input(x, y, 4), weights=initial_weights())
        train = tf.train.AdamOptimizer(0.01).minimize(loss)
        everything = tf.train.Saver()
        model_only = tf.train.Saver(var_list=tf.trainable_variables())
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            sess.run(train)
            path = str(tmp_path / ("w%d" % index))
            refused = None
            try:
                everything.save(sess, path + "-all")
            except ValueError as error:
                refused = str(error)
            written = model_only.save(sess, path + "-model")
            return refused, written
    results = run_workers(worker, 2, 1, epl.Config({"zero.level": "v0"}))
    refused, written = results[0]
    assert refused is not None and "zero.level='v0'" in refused and "2 workers" in refused
    assert written is not None and written.endswith("-model")
    assert results[1] == (None, None)  # worker 1 never writes
    assert os.listdir(str(workdir)) == []
