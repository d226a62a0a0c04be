"""Worker script for the cluster-engine tests: the epl-launch equivalence script
(dp_train.py's model and data), started by any engine.

Usage: engine_train.py OUT_DIR STEPS BATCH. Every worker trains its rows of each
global batch and writes OUT_DIR/worker_<i>.npz (its replicas' weights) and
OUT_DIR/worker_<i>.json: where its cluster came from (epl.init's discovery), its
host name, and the ring's own report of its links (each EplRingConnect's state:
1 connected, +2 the link to the successor in shared memory, +4 the link from the
predecessor in shared memory), read by running the connect ops again after
training (they are idempotent; every worker does it, so their port all-gather
meets).
"""
import json
import logging
import os
import socket
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import tensorflow.compat.v1 as tf  # noqa: E402

import epl  # noqa: E402
from eplutil import (dataset_input, initial_weights, mlp, this_workers_rows,  # noqa: E402
                     train_and_save_copies, train_step)


def ring_links(session):
    """Each EplRingConnect of this worker, run again: its ring, rank, state, worker."""
    connects = [op for op in session.graph.get_operations() if op.type == "EplRingConnect"]
    states = session.run([op.outputs[0] for op in connects])
    return [{"communicator": op.get_attr("communicator").decode(), "rank": op.get_attr("rank"),
             "state": int(state), "worker": tf.DeviceSpec.from_string(op.device).task}
            for op, state in zip(connects, states)]


def main(out_dir, steps, batch):
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger("epl").addHandler(handler)
    logging.getLogger("epl").setLevel(logging.INFO)
    epl.init()
    cluster = epl.Env.get().cluster
    wx, wy = this_workers_rows(batch, steps)
    epl.set_default_strategy(epl.replicate(1))
    loss = mlp(*dataset_input(wx, wy, batch), weights=initial_weights())
    links = train_and_save_copies(train_step(loss), steps, out_dir, cluster.worker_index,
                                  after=ring_links)
    report = {"source": cluster.discovery.source, "detail": cluster.discovery.detail,
              "hosts": cluster.hosts, "index": cluster.worker_index,
              "hostname": socket.gethostname(), "ring": links}
    with open(os.path.join(out_dir, "worker_%d.json" % cluster.worker_index), "w") as out:
        json.dump(report, out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
