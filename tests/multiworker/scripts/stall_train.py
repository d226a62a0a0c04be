"""Worker script for timeout tests: worker 0 trains; worker 1 misbehaves.

Usage: stall_train.py MODE. MODE "stall": worker 1 starts its server but never
runs a step (so worker 0's collectives wait for it). MODE "solo": run as the
only process of a 2-worker TF_CONFIG (worker 1 never joins). MODE "die": both
train; worker 1's process exits (code 3) after two steps, worker 0 keeps going.
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import tensorflow.compat.v1 as tf  # noqa: E402
tf.disable_v2_behavior()  # TF 2.x: graph mode (docs/tf2.md); nothing on TF 1.15

import epl  # noqa: E402
from eplutil import dataset_input, initial_weights, make_data, mlp, train_step  # noqa: E402


def main(mode):
    epl.init()
    index = epl.Env.get().cluster.worker_index
    if mode == "stall" and index == 1:
        epl.Env.get().get_or_create_server()
        print("worker 1 is up and will never run a step", flush=True)
        time.sleep(3600)
    x, y = make_data(64)
    epl.set_default_strategy(epl.replicate(1))
    loss = mlp(*dataset_input(x, y, 4), weights=initial_weights())
    train = train_step(loss)
    with tf.train.MonitoredTrainingSession() as sess:
        sess.run(train)
        if mode == "die":
            sess.run(train)
            if index == 1:
                print("worker 1 exits now", flush=True)
                os._exit(3)
            for _ in range(200):
                sess.run(train)
    print("worker %d trained" % index)


if __name__ == "__main__":
    main(sys.argv[1])
