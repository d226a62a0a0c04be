"""Worker script of the GPU suite's epl-launch tests: train, trace the last step, dump.

Usage: gpu_train.py OUT_DIR STEPS BATCH OPTIMIZER. The configuration comes from EPL_*
variables (e.g. EPL_ZERO_LEVEL). Each worker reads its rows of the global batches
(eplutil.worker_rows), writes its copies' weights to OUT_DIR/worker_<i>.npz and, to
OUT_DIR/worker_<i>.json, the gradient collectives (name, type, device), the device each
of them ran on in the traced step, and how many Adam slot elements the worker holds.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), os.path.join(HERE, "..")]

import numpy as np  # noqa: E402
import tensorflow.compat.v1 as tf  # noqa: E402

import epl  # noqa: E402
from eplutil import (copy_values, dataset_input, initial_weights, make_data, mlp,  # noqa: E402
                     train_step, worker_rows)
from gpuutil import collectives, traced_run  # noqa: E402


def main(out_dir, steps, batch, opt_name):
    epl.init()
    cluster = epl.Env.get().cluster
    workers, devices = cluster.worker_num, cluster.gpu_num_per_worker
    x, y = make_data(workers * devices * batch * steps)
    rows = [worker_rows(a, steps, workers, devices * batch, cluster.worker_index) for a in (x, y)]
    epl.set_default_strategy(epl.replicate(1))
    loss = mlp(*dataset_input(rows[0], rows[1], batch), weights=initial_weights())
    train = train_step(loss, opt_name)
    with tf.train.MonitoredTrainingSession() as sess:
        for _ in range(steps - 1):
            sess.run(train)
        raw = sess._tf_sess()  # pylint: disable=protected-access
        _, ran = traced_run(raw, train)
        values = dict((v.op.name.replace("/", "__"), np.stack(copy_values(raw, v.op.name)))
                      for v in tf.trainable_variables())
        graph = tf.get_default_graph()
        ops = collectives(epl.Graph.get(graph).parallel, graph, "grads/")
    index = cluster.worker_index
    np.savez(os.path.join(out_dir, "worker_%d.npz" % index), **values)
    slots = [v for v in tf.global_variables() if "Adam" in v.op.name and "power" not in v.op.name]
    report = {"device_type": cluster.device_type,
              "slot_elements": sum(int(np.prod(v.shape.as_list())) for v in slots),
              "collectives": [(op.name, op.type, op.device) for op in ops],
              "ran": dict((op.name, ran.get(op.name)) for op in ops)}
    with open(os.path.join(out_dir, "worker_%d.json" % index), "w") as out:
        json.dump(report, out)
    print("worker %d done" % index)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
