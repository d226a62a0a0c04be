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

import numpy as np  # noqa: E402
import tensorflow.compat.v1 as tf  # noqa: E402

import epl  # noqa: E402
from eplutil import (copy_values, dataset_input, initial_weights, make_data, mlp,  # noqa: E402
                     train_step, worker_rows)


def main(out_dir, steps, batch):
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger("epl").addHandler(handler)
    logging.getLogger("epl").setLevel(logging.INFO)
    epl.init()
    cluster = epl.Env.get().cluster
    workers, devices, index = cluster.worker_num, cluster.gpu_num_per_worker, cluster.worker_index
    x, y = make_data(workers * devices * batch * steps)
    wx = worker_rows(x, steps, workers, devices * batch, index)
    wy = worker_rows(y, steps, workers, devices * batch, index)
    epl.set_default_strategy(epl.replicate(1))
    loss = mlp(*dataset_input(wx, wy, batch), weights=initial_weights())
    train = train_step(loss)
    with tf.train.MonitoredTrainingSession() as sess:
        for _ in range(steps):
            sess.run(train)
        raw = sess._tf_sess()  # pylint: disable=protected-access
        values = dict((v.op.name.replace("/", "__"), np.stack(copy_values(raw, v.op.name)))
                      for v in tf.trainable_variables())
        connects = [op for op in raw.graph.get_operations() if op.type == "EplRingConnect"]
        states = raw.run([op.outputs[0] for op in connects])
    np.savez(os.path.join(out_dir, "worker_%d.npz" % index), **values)
    found = cluster.discovery
    report = {"source": found.source, "detail": found.detail, "hosts": cluster.hosts,
              "index": index, "hostname": socket.gethostname(),
              "ring": [{"communicator": op.get_attr("communicator").decode(),
                        "rank": op.get_attr("rank"), "state": int(state),
                        "worker": tf.DeviceSpec.from_string(op.device).task}
                       for op, state in zip(connects, states)]}
    with open(os.path.join(out_dir, "worker_%d.json" % index), "w") as out:
        json.dump(report, out)
    print("worker %d done" % index)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
