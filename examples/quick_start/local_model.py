# local_model.py: the quick-start program from the EPL documentation (section 3.1),
# with the three EPL lines added. Run it with (from any directory):
#   epl-launch --num_workers 1 --gpu_per_worker 2 examples/quick_start/run.sh
import os

import numpy as np
import tensorflow as tf
import epl

# This example prints its own progress, so it turns TensorFlow's deprecation warnings and C++
# info logs off (its own choice: EPL never changes TensorFlow's logging).
tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # TF reads it at its first C++ log line

epl.init()
epl.set_default_strategy(epl.replicate(1))

# Define model
num_x = np.random.randint(0, 10, (500, 20)).astype(dtype=np.float32)
num_y = np.random.randint(0, 10, 500).astype(dtype=np.int64)
dataset = tf.data.Dataset.from_tensor_slices((num_x, num_y)).batch(10).repeat(1)
iterator = dataset.make_initializable_iterator()
tf.add_to_collection(tf.GraphKeys.TABLE_INITIALIZERS, iterator.initializer)
x, labels = iterator.get_next()
logits = tf.layers.dense(x, 2)
logits = tf.layers.dense(logits, 10)
loss = tf.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
global_step = tf.train.get_or_create_global_step()
optimizer = tf.train.MomentumOptimizer(learning_rate=0.001, momentum=0.9)
train_op = optimizer.minimize(loss, global_step=global_step)

# Training session
with tf.train.MonitoredTrainingSession() as sess:
    for i in range(10):
        train_loss, _, step = sess.run([loss, train_op, global_step])
        print("Iteration %s , Loss: %s ." % (step, train_loss))
print("Train Finished.")
