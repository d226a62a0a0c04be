"""Worker script for the epl-launch equivalence test: train, then dump weights.

Usage: dp_train.py OUT_DIR STEPS BATCH. Each worker reads the rows of the global
batches that belong to it (see eplutil.worker_rows) and writes its replicas'
weights to OUT_DIR/worker_<i>.npz.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import epl  # noqa: E402
from eplutil import (dataset_input, initial_weights, make_data, mlp,  # noqa: E402
                     train_and_save_copies, train_step, worker_rows)


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
    train_and_save_copies(train, steps, out_dir, cluster.worker_index)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
