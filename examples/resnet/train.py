# train.py: the documentation's ResNet data-parallel tutorial (section 8), sized for a CPU:
# a ResNet-50-style network (bottleneck blocks, batch norm) trained on synthetic
# ImageNet-shaped data, with every device running one model replica.
#
#   epl-launch --num_workers 1 --gpu_per_worker 2 examples/resnet/train.py
#   epl-launch --num_workers 2 --gpu_per_worker 1 examples/resnet/train.py
#   epl-launch --num_workers 2 --gpu_per_worker 2 examples/resnet/train.py
#
# The lines marked "EPL" are the only changes to a single-device script; without the
# launcher (`python examples/resnet/train.py`) it trains on one device.
"""Train a tiny ResNet with data parallelism over every device of the job."""
import argparse
import os
import time

import numpy as np
import tensorflow as tf
import epl                                                                       # EPL

# This example prints its own progress, so it turns TensorFlow's deprecation warnings and C++
# info logs off (its own choice: EPL never changes TensorFlow's logging).
tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # TF reads it at its first C++ log line

# ResNet-50 has (3, 4, 6, 3) bottleneck blocks of widths (64, 128, 256, 512) at 224x224;
# the defaults below keep its structure and shrink everything else to run on 2 CPU cores.


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch_size", type=int, default=16, help="images per replica")
    parser.add_argument("--image_size", type=int, default=32, help="ImageNet uses 224")
    parser.add_argument("--num_classes", type=int, default=10, help="ImageNet has 1000")
    parser.add_argument("--blocks", default="1,1,1",
                        help="bottleneck blocks per stage (ResNet-50: 3,4,6,3)")
    parser.add_argument("--base_width", type=int, default=8, help="ResNet-50: 64")
    parser.add_argument("--learning_rate", type=float, default=0.05)
    parser.add_argument("--print_every", type=int, default=5)
    return parser.parse_args()


def class_patterns(args):
    """One fixed low-frequency colour pattern per class, the same on every worker.

    A coarse 4x4 pattern, blown up to the image size, survives the network's global
    average pooling (fine pixel noise would not), so the task is learnable in a few
    dozen steps, which is what a smoke-sized tutorial needs.
    """
    coarse = np.random.RandomState(1234).normal(0.0, 1.0, (args.num_classes, 4, 4, 3))
    scale = -(-args.image_size // 4)
    fine = coarse.repeat(scale, axis=1).repeat(scale, axis=2)
    return fine[:, :args.image_size, :args.image_size].astype(np.float32)


def synthetic_imagenet(args, seed):
    """An endless dataset of (image [H, W, 3] float32, label int64), ImageNet's layout.

    Labels are drawn per worker (``seed``); each image is its class pattern plus noise
    made on the fly, so the graph holds only the small pattern table.
    """
    patterns = tf.constant(class_patterns(args))
    labels = np.random.RandomState(seed).randint(0, args.num_classes, 4096)

    def make_image(label):
        noise = tf.random.normal(patterns.shape[1:], stddev=0.5, seed=seed)
        return tf.gather(patterns, label) + noise, label

    dataset = tf.data.Dataset.from_tensor_slices(labels.astype(np.int64)).repeat()
    return dataset.map(make_image).batch(args.batch_size, drop_remainder=True)


def conv_bn(x, filters, kernel, stride, name, relu=True):
    """Convolution, batch norm (moving statistics go to UPDATE_OPS), optional ReLU."""
    x = tf.layers.conv2d(x, filters, kernel, stride, padding="same", use_bias=False,
                         kernel_initializer=tf.variance_scaling_initializer(2.0),
                         name=name + "_conv")
    x = tf.layers.batch_normalization(x, momentum=0.9, training=True, name=name + "_bn")
    return tf.nn.relu(x) if relu else x


def bottleneck(x, width, stride, name):
    """ResNet v1.5 bottleneck: 1x1 reduce, 3x3 (carries the stride), 1x1 expand x4."""
    with tf.variable_scope(name):
        shortcut = x
        if stride != 1 or x.shape[-1] != 4 * width:
            shortcut = conv_bn(x, 4 * width, 1, stride, "shortcut", relu=False)
        h = conv_bn(x, width, 1, 1, "reduce")
        h = conv_bn(h, width, 3, stride, "spatial")
        h = conv_bn(h, 4 * width, 1, 1, "expand", relu=False)
        return tf.nn.relu(h + shortcut)


def resnet(images, args):
    """Stem, one stage per entry of --blocks (width doubling, stride 2), pool, classifier.

    The stem is a 3x3 convolution without max pooling: at 32x32 pixels ResNet-50's 7x7/2
    stem and pooling would leave almost nothing for the stages.
    """
    x = conv_bn(images, 2 * args.base_width, 3, 1, "stem")
    for stage, count in enumerate(int(b) for b in args.blocks.split(",")):
        for block in range(count):
            stride = 2 if stage > 0 and block == 0 else 1
            x = bottleneck(x, args.base_width << stage, stride,
                           "stage%d_block%d" % (stage + 1, block + 1))
    features = tf.reduce_mean(x, [1, 2])
    return tf.layers.dense(features, args.num_classes, name="fc")


def build_training(args, seed):
    """Loss, accuracy and train op for one replica's batch; EPL copies them per device."""
    images, labels = tf.data.make_one_shot_iterator(synthetic_imagenet(args, seed)).get_next()
    logits = resnet(images, args)
    loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32))
    global_step = tf.train.get_or_create_global_step()
    optimizer = tf.train.MomentumOptimizer(args.learning_rate, momentum=0.9)
    # Batch norm's moving averages update with every step, as in any TF1 ResNet script.
    with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS)):
        train_op = optimizer.minimize(loss, global_step=global_step)
    return loss, accuracy, train_op


def train(args, loss, accuracy, train_op, global_batch):
    """Run the steps, printing the loss every --print_every steps and at the end."""
    with tf.train.MonitoredTrainingSession() as sess:
        start = None
        for step in range(1, args.steps + 1):
            if step == 2:
                start = time.time()  # step 1 includes graph optimization; leave it out
            step_loss, step_accuracy, _ = sess.run([loss, accuracy, train_op])
            if step == 1 or step % args.print_every == 0 or step == args.steps:
                print("step %d loss %.4f accuracy %.3f" % (step, step_loss, step_accuracy),
                      flush=True)
    rate = global_batch * (args.steps - 1) / max(time.time() - start, 1e-9) if start else 0.0
    print("final loss %.4f (global batch %d, %.1f images/s after step 1)"
          % (step_loss, global_batch, rate), flush=True)


def main():
    args = parse_args()
    epl.init()                                                                   # EPL
    epl.set_default_strategy(epl.replicate(device_count=1))                     # EPL
    cluster = epl.Env.get().cluster
    loss, accuracy, train_op = build_training(args, seed=cluster.worker_index)
    # Fetch the loss and accuracy averaged over every replica rather than replica 0's.
    epl.add_to_collection([loss, accuracy], epl.GraphKeys.GLOBAL_MEAN_OBJECTS)  # EPL
    train(args, loss, accuracy, train_op, global_batch=cluster.total_gpu_num * args.batch_size)
    print("Train Finished.")


if __name__ == "__main__":
    main()
