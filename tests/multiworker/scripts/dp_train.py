"""Worker script for the epl-launch equivalence test: train, then dump weights.

Usage: dp_train.py OUT_DIR STEPS BATCH. Each worker reads the rows of the global
batches that belong to it (see eplutil.worker_rows) and writes its replicas'
weights to OUT_DIR/worker_<i>.npz.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import numpy as np  # noqa: E402
import tensorflow.compat.v1 as tf  # noqa: E402

import epl  # noqa: E402
from eplutil import (copy_values, dataset_input, initial_weights, make_data, mlp,  # noqa: E402
                     train_step, worker_rows)


def main(out_dir, steps, batch):
    epl.init()
    cluster = epl.Env.get().cluster
    workers, devices = cluster.worker_num, cluster.gpu_num_per_worker
    x, y = make_data(workers * devices * batch * steps)
    wx = worker_rows(x, steps, workers, devices * batch, cluster.worker_index)
    wy = worker_rows(y, steps, workers, devices * batch, cluster.worker_index)
    epl.set_default_strategy(epl.replicate(1))
    loss = mlp(*dataset_input(wx, wy, batch), weights=initial_weights())
    train = train_step(loss)
    with tf.train.MonitoredTrainingSession() as sess:
        for _ in range(steps):
            sess.run(train)
        raw = sess._tf_sess()  # pylint: disable=protected-access
        values = dict((v.op.name.replace("/", "__"), np.stack(copy_values(raw, v.op.name)))
                      for v in tf.trainable_variables())
    np.savez(os.path.join(out_dir, "worker_%d.npz" % cluster.worker_index), **values)
    print("worker %d done" % cluster.worker_index)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
