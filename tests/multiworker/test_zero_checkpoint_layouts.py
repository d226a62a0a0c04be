"""ZeRO checkpoints on layouts with several devices per worker: worker 0's checkpoint
holds every slot under its name without ZeRO, with the values training without ZeRO
gives, and restores on another number of devices, with or without ZeRO."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from eplutil import (MEASURED, dataset_input, initial_weights, make_data, mlp, run_workers,
                     worker_rows)

BATCH = 8


def _run(workers, devices, config, steps, save_to, restore_from=None):
    per_worker = devices * BATCH
    x, y = make_data(workers * per_worker * max(steps, 1), seed=3)

    def worker(index):
        epl.set_default_strategy(epl.replicate(1))
        rows = [worker_rows(v, max(steps, 1), workers, per_worker, index) for v in (x, y)]
        loss = mlp(*dataset_input(rows[0], rows[1], BATCH), weights=initial_weights())
        step = tf.train.get_or_create_global_step()
        train = tf.train.AdamOptimizer(0.01, epsilon=1e-4).minimize(loss, global_step=step)
        saver = tf.train.Saver()
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            if restore_from is not None:
                saver.restore(sess, restore_from)
            for _ in range(steps):
                sess.run(train)
            return saver.save(sess, save_to)

    return run_workers(worker, workers, devices, epl.Config(config), timeout=240)[0]


def _read(path):
    reader = tf.train.load_checkpoint(path)
    return dict((name, reader.get_tensor(name)) for name, _ in tf.train.list_variables(path))


def _worst(reference, values):
    assert sorted(values) == sorted(reference)
    return max(float(np.abs(np.asarray(reference[n]) - values[n]).max()) for n in reference)


# resumed with ZeRO: v1's checkpoint under v0, v2's under v2 (on the same layout too)
_OTHER = {"v1": "v0", "v2": "v2"}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("level", ["v1", "v2"])
def test_zero_checkpoints_on_2x2_hold_every_slot_and_restore_elsewhere(tmp_path, level):
    zero = _run(2, 2, {"zero.level": level}, 2, str(tmp_path / "zero" / "ckpt"))
    plain = _run(2, 2, {}, 2, str(tmp_path / "plain" / "ckpt"))
    saved = _read(zero)
    assert any(name.endswith("/Adam_1") for name in saved)
    worst = _worst(_read(plain), saved)
    MEASURED.append(("zero %s 2x2 checkpoint vs without ZeRO" % level, worst))
    assert worst < 1e-6
    # resume on another layout, with ZeRO and without: one more step, same result
    for workers, devices in ((1, 2), (1, 1), (2, 1)) + (((2, 2),) if level == "v2" else ()):
        tag = "%dx%d" % (workers, devices)
        resumed = _read(_run(workers, devices, {"zero.level": _OTHER[level]}, 1,
                             str(tmp_path / ("zero_" + tag) / "ckpt"), restore_from=zero))
        reference = _read(_run(workers, devices, {}, 1,
                               str(tmp_path / ("plain_" + tag) / "ckpt"), restore_from=zero))
        worst = _worst(reference, resumed)
        MEASURED.append(("zero %s checkpoint resumed on %s" % (level, tag), worst))
        assert worst < 1e-6, tag
    # restored and saved again without a step: the owners got every slot back
    again = _read(_run(1, 2, {"zero.level": level}, 0, str(tmp_path / "again" / "ckpt"),
                       restore_from=zero))
    assert _worst(saved, again) == 0.0
