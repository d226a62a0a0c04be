# train.py: the documentation's large-scale image classification program (sections 1.1 and
# 5.3.1), sized for a CPU: a ResNet-style backbone replicated over every device and a
# classifier with many classes split over the same devices.
#
#   epl-launch --num_workers 1 --gpu_per_worker 2 examples/large_scale_classification/train.py
#   epl-launch --num_workers 2 --gpu_per_worker 2 examples/large_scale_classification/train.py
#
# The lines marked "EPL" are the only changes to a single-device script.
import argparse
import os

import numpy as np
import tensorflow as tf
import epl                                                                       # EPL

# This example prints its own progress, so it turns TensorFlow's deprecation warnings and C++
# info logs off (its own choice: EPL never changes TensorFlow's logging).
tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # TF reads it at its first C++ log line

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--batch_size", type=int, default=32, help="per worker")
parser.add_argument("--num_classes", type=int, default=1000)
parser.add_argument("--image_size", type=int, default=16)
parser.add_argument("--learning_rate", type=float, default=0.001)
parser.add_argument("--print_every", type=int, default=10)
args = parser.parse_args()

config = epl.Config({"cluster.colocate_split_and_replicate": True})             # EPL
epl.init(config)                                                                 # EPL
total_gpu_num = epl.Env.get().cluster.total_gpu_num                              # EPL
worker_index = epl.Env.get().cluster.worker_index


def synthetic_data(num_images, seed):
    """Images of num_classes classes: each class a fixed random pattern plus noise."""
    rng = np.random.RandomState(1234)   # the same class patterns on every worker
    size, channels = args.image_size, 3
    patterns = rng.normal(0.0, 1.0, (args.num_classes, size, size, channels))
    rng = np.random.RandomState(seed)   # each worker its own images
    labels = rng.randint(0, args.num_classes, num_images).astype(np.int64)
    noise = rng.normal(0.0, 0.5, (num_images, size, size, channels))
    return (patterns[labels] + noise).astype(np.float32), labels


def residual_block(x, filters, stride, name):
    with tf.variable_scope(name):
        shortcut = x
        if stride != 1 or x.shape[-1] != filters:
            shortcut = tf.layers.conv2d(x, filters, 1, stride, use_bias=False, name="shortcut")
        h = tf.layers.conv2d(x, filters, 3, stride, padding="same", use_bias=False,
                             name="conv1")
        h = tf.nn.relu(h)
        h = tf.layers.conv2d(h, filters, 3, 1, padding="same", use_bias=False, name="conv2")
        return tf.nn.relu(h + shortcut)


def resnet(images):
    """A small ResNet: stem, three residual stages, a 256-wide feature layer."""
    h = tf.nn.relu(tf.layers.conv2d(images, 16, 3, padding="same", name="stem"))
    h = residual_block(h, 16, 1, "block1")
    h = residual_block(h, 32, 2, "block2")
    h = residual_block(h, 64, 2, "block3")
    # Flattened rather than average-pooled: the synthetic classes differ in where their
    # patterns are, which pooling would average away.
    flat = tf.layers.flatten(h)
    return tf.layers.dense(flat, 256, activation=tf.nn.relu, name="features")


def classification(features, labels):
    """The large classifier: logits, loss and accuracy (split over the devices)."""
    logits = tf.layers.dense(features, args.num_classes, name="classifier")
    loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
    predictions = tf.argmax(logits, 1)
    accuracy = tf.reduce_mean(tf.cast(tf.equal(predictions, labels), tf.float32))
    return loss, accuracy


images, labels = synthetic_data(8 * args.batch_size, seed=worker_index)
dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(args.batch_size)
x, y = tf.data.make_one_shot_iterator(dataset).get_next()

with epl.replicate(total_gpu_num):                                               # EPL
    features = resnet(x)
with epl.split(total_gpu_num):                                                   # EPL
    loss, accuracy = classification(features, y)

global_step = tf.train.get_or_create_global_step()
optimizer = tf.train.AdamOptimizer(learning_rate=args.learning_rate)
train_op = optimizer.minimize(loss, global_step=global_step)

with tf.train.MonitoredTrainingSession() as sess:
    for i in range(1, args.steps + 1):
        train_loss, train_accuracy, _, step = sess.run([loss, accuracy, train_op, global_step])
        if i == 1 or i % args.print_every == 0:
            print("step %d loss %.4f accuracy %.3f" % (step, train_loss, train_accuracy),
                  flush=True)
print("Train Finished.")
