"""Worker script for the epl-launch equivalence test: train, then dump weights.

Usage: dp_train.py OUT_DIR STEPS BATCH. Each worker reads the rows of the global
batches that belong to it (see eplutil.worker_rows) and writes its replicas'
weights to OUT_DIR/worker_<i>.npz.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import epl  # noqa: E402
import tensorflow.compat.v1 as tf  # noqa: E402
from eplutil import (dataset_input, initial_weights, mlp, this_workers_rows,  # noqa: E402
                     train_and_save_copies, train_step)


def main(out_dir, steps, batch):
    epl.init()
    wx, wy = this_workers_rows(batch, steps)
    epl.set_default_strategy(epl.replicate(1))
    loss = mlp(*dataset_input(wx, wy, batch), weights=initial_weights())
    train = train_step(loss)
    index = epl.Env.get().cluster.worker_index
    train_and_save_copies(train, steps, out_dir, index, after=lambda session: print(
        "worker %d session target %r, server %s" % (
            index, tf.compat.as_str(session.sess_str), epl.Env.get().server is not None)))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
