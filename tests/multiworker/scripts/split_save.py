"""Worker script: a replica split over every device of every worker, trained under
MonitoredTrainingSession with a checkpoint directory.

Usage: split_save.py CKPT_DIR STEPS. Worker 0 waits 3 s after its last step, so the
other workers finish first and worker 0's final checkpoint, which reads their
shards, would fail if they took their servers down. Prints the global step and the
sum of this worker's classifier shards (after restoring, with STEPS = 0).
"""
import sys
import time

import numpy as np
import tensorflow.compat.v1 as tf

import epl

tf.disable_v2_behavior()  # TF 2.x: graph mode (docs/tf2.md); nothing on TF 1.15

CLASSES, FEATURES, BATCH = 11, 6, 4


def main(ckpt_dir, steps):
    epl.init(epl.Config({"cluster.colocate_split_and_replicate": True}))
    cluster = epl.Env.get().cluster
    total = cluster.total_gpu_num
    rng = np.random.RandomState(cluster.worker_index)
    data = tf.data.Dataset.from_tensors(
        (rng.rand(BATCH * cluster.gpu_num_per_worker, FEATURES).astype(np.float32),
         rng.randint(0, CLASSES, BATCH * cluster.gpu_num_per_worker))).repeat()
    x, y = tf.data.make_one_shot_iterator(data).get_next()
    with epl.replicate(total):
        h = tf.layers.dense(x, 8, activation=tf.nn.relu, name="backbone")
    with epl.split(total):
        loss = tf.losses.sparse_softmax_cross_entropy(
            y, tf.layers.dense(h, CLASSES, name="classifier"))
    step = tf.train.get_or_create_global_step()
    train = tf.train.AdamOptimizer(0.1).minimize(loss, global_step=step)
    with tf.train.MonitoredTrainingSession(checkpoint_dir=ckpt_dir,
                                           save_checkpoint_steps=2) as sess:
        for _ in range(steps):
            sess.run(train)
        raw = sess._tf_sess()  # pylint: disable=protected-access
        copies = epl.Graph.get().parallel.variable_copies["classifier/kernel"]
        total_sum = sum(float(np.sum(v)) for v in raw.run([op.outputs[0] for op in copies]))
        print("global_step %d shard_sum %.9g" % (raw.run(step), total_sum), flush=True)
        if cluster.worker_index == 0 and steps:
            time.sleep(3)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
