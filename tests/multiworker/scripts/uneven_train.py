"""Worker script for the end-of-input launcher test: train until the input ends.

Usage: uneven_train.py OUT_DIR MODE COUNTS. MODE is "dp" (replicate(1) on every
device) or "pipeline" (the 2-stage MLP, 2 micro-batches); COUNTS is a comma list
of how many batches of 4 rows each worker reads. Worker i's batches are its rows
of the global batches (eplutil.worker_rows). Trains in a MonitoredTrainingSession
(worker 0 writes checkpoints to OUT_DIR/ckpt) until OutOfRangeError, then writes
OUT_DIR/worker_<i>.npz: runs, global step, the time of the OutOfRangeError and
every local copy of the weights, read in a hook's end().
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import numpy as np  # noqa: E402
import tensorflow.compat.v1 as tf  # noqa: E402

import epl  # noqa: E402
from eplutil import (copy_values, initial_weights, make_data, mlp, staged_mlp,  # noqa: E402
                     train_step, worker_rows)

B = 4


def main(out_dir, mode, counts):
    epl.init(epl.Config({"pipeline.num_micro_batch": 2} if mode == "pipeline" else {}))
    cluster = epl.Env.get().cluster
    index, devices = cluster.worker_index, cluster.gpu_num_per_worker
    x, y = make_data(cluster.worker_num * devices * B * max(counts))
    wx, wy = (worker_rows(a, max(counts), cluster.worker_num, devices * B, index)
              [:counts[index] * B] for a in (x, y))
    if mode == "pipeline":
        wx, wy = x[:counts[index] * B], y[:counts[index] * B]
    else:
        epl.set_default_strategy(epl.replicate(1))
    data = tf.data.Dataset.from_tensor_slices((wx, wy)).batch(B)
    features, labels = tf.data.make_one_shot_iterator(data).get_next()
    build = staged_mlp if mode == "pipeline" else mlp
    train = train_step(build(features, labels, weights=initial_weights()))
    step, found = tf.train.get_global_step(), {}

    class End(tf.train.SessionRunHook):
        def end(self, session):
            found["step"] = session.run(step)
            for var in tf.trainable_variables():
                found[var.op.name.replace("/", "__")] = np.stack(
                    copy_values(session, var.op.name))

    runs = 0
    with tf.train.MonitoredTrainingSession(checkpoint_dir=os.path.join(out_dir, "ckpt"),
                                           hooks=[End()], save_checkpoint_steps=100) as sess:
        while not sess.should_stop():
            try:
                sess.run(train)
            except tf.errors.OutOfRangeError:
                found["stopped"] = time.time()
                raise
            runs += 1
    np.savez(os.path.join(out_dir, "worker_%d.npz" % index), runs=runs, **found)
    print("worker %d stopped after %d runs" % (index, runs))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], [int(c) for c in sys.argv[3].split(",")])
