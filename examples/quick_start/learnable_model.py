# learnable_model.py: what `make demo` trains. The quick-start program (local_model.py) with
# labels that can be learned: local_model.py draws its labels at random, so its loss cannot
# fall. Here a fixed random linear "teacher" assigns each input its class; the model is the
# quick start's two dense layers (a wider hidden layer, Adam, batches of 32); the three EPL
# lines are the same.
# Run it with:  epl-launch --num_workers 2 --gpu_per_worker 2 learnable_model.py
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

STEPS, BATCH = 100, 32

# Define model
rng = np.random.RandomState(0)  # every worker builds the same data and teacher
num_x = rng.randint(0, 10, (4000, 20)).astype(dtype=np.float32)
teacher = rng.randn(20, 10).astype(np.float32)
num_y = np.argmax((num_x - 4.5).dot(teacher), axis=1).astype(np.int64)
dataset = tf.data.Dataset.from_tensor_slices((num_x, num_y)).batch(BATCH).repeat()
iterator = dataset.make_initializable_iterator()
tf.add_to_collection(tf.GraphKeys.TABLE_INITIALIZERS, iterator.initializer)
x, labels = iterator.get_next()
hidden = tf.layers.dense(x / 10.0, 32, activation=tf.nn.relu)
logits = tf.layers.dense(hidden, 10)
loss = tf.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32))
# Fetched values are the mean over every replica of every worker, not replica 0's.
epl.add_to_collection([loss, accuracy], epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
global_step = tf.train.get_or_create_global_step()
optimizer = tf.train.AdamOptimizer(learning_rate=0.01)
train_op = optimizer.minimize(loss, global_step=global_step)

# Training session
with tf.train.MonitoredTrainingSession() as sess:
    for i in range(STEPS):
        train_loss, train_accuracy, _, step = sess.run([loss, accuracy, train_op, global_step])
        if step == 1 or step % 10 == 0:
            print("Iteration %s , Loss: %.4f , Accuracy: %.3f ." % (step, train_loss,
                                                                    train_accuracy))
print("Train Finished.")
