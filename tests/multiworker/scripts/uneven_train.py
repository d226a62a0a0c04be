"""Worker script for the end-of-input launcher test: train until the input ends.

Usage: uneven_train.py OUT_DIR MODE COUNTS. MODE is "dp" (replicate(1) on every
device) or "pipeline" (the 2-stage MLP, 2 micro-batches); COUNTS is a comma list
of how many batches of 4 rows each worker reads. Worker i's batches are its rows
of the global batches (eplutil.worker_rows). Trains in a MonitoredTrainingSession
(worker 0 writes checkpoints to OUT_DIR/ckpt) until OutOfRangeError, then writes
OUT_DIR/worker_<i>.npz: what eplutil.train_to_the_end returns (runs, global step,
times) and every local copy of each weight, under its variable name.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import numpy as np  # noqa: E402
import tensorflow.compat.v1 as tf  # noqa: E402
tf.disable_v2_behavior()  # TF 2.x: graph mode (docs/tf2.md); nothing on TF 1.15

import epl  # noqa: E402
from eplutil import (initial_weights, make_data, mlp, staged_mlp, train_step,  # noqa: E402
                     train_to_the_end, worker_rows)

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
    found = train_to_the_end(train, [v.op.name for v in tf.trainable_variables()],
                             os.path.join(out_dir, "ckpt"))
    weights = dict((name, np.stack(copies)) for name, copies in found.pop("weights").items())
    np.savez(os.path.join(out_dir, "worker_%d.npz" % index), **dict(found, **weights))
    print("worker %d stopped after %d runs" % (index, found["runs"]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], [int(c) for c in sys.argv[3].split(",")])
