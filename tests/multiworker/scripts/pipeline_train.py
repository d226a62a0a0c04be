"""Worker script for multi-process pipeline tests: train a 2-stage MLP, dump weights.

Usage: pipeline_train.py OUT_DIR STEPS BATCH MICRO_BATCHES STRATEGY COPIES [INTRA [CHUNKS]]
COPIES is a comma list: how many pipeline replicas each worker drives (a
worker driving none only serves its devices). INTRA is 1/0 for
cluster.device_place_prefer_intra_node. CHUNKS > 1 trains interleavedutil's four-stage
model with pipeline.num_virtual_stages=CHUNKS instead of the 2-stage MLP.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import numpy as np  # noqa: E402

import epl  # noqa: E402
from eplutil import (dataset_input, initial_weights, make_data, staged_mlp,  # noqa: E402
                     train_and_save_copies, train_step)
import interleavedutil  # noqa: E402


def rows_of(data, steps, per_worker, index, batch):
    """This worker's rows of every global batch (a serving worker gets a dummy batch)."""
    if not per_worker[index]:
        return data[:batch]
    total, offset = sum(per_worker), sum(per_worker[:index])
    return np.concatenate([data[s * total + offset:s * total + offset + per_worker[index]]
                           for s in range(steps)])


def main(out_dir, steps, batch, micro_batches, strategy, copies, intra=True, chunks=1):
    epl.init(epl.Config({"pipeline.num_micro_batch": micro_batches,
                         "pipeline.strategy": strategy,
                         "pipeline.num_virtual_stages": chunks,
                         "cluster.device_place_prefer_intra_node": intra}))
    index = epl.Env.get().cluster.worker_index
    per_worker = [c * micro_batches * batch for c in copies]
    x, y = make_data(sum(per_worker) * steps)
    wx, wy = (rows_of(a, steps, per_worker, index, batch) for a in (x, y))
    if chunks > 1:
        loss = interleavedutil.model(*dataset_input(wx, wy, batch), staged=True)
    else:
        loss = staged_mlp(*dataset_input(wx, wy, batch), weights=initial_weights())
    train = train_step(loss)
    train_and_save_copies(train, steps, out_dir, index)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], int(args[1]), int(args[2]), int(args[3]), args[4],
         [int(c) for c in args[5].split(",")], len(args) < 7 or args[6] == "1",
         int(args[7]) if len(args) > 7 else 1)
