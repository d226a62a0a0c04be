# train.py: a small Mixture-of-Experts transformer in the pattern of the EPL documentation
# (sections 5.3.2 and 10): attention and gating are replicated, the experts are split over
# the devices, and tokens travel to their expert's device and back by all-to-all.
#
#   epl-launch --num_workers 1 --gpu_per_worker 2 examples/moe/train.py
#   epl-launch --num_workers 2 --gpu_per_worker 2 examples/moe/train.py
#
# The lines marked "EPL" are the only changes to a single-device script. The MoE layer is
# written with einsums in the GShard layout (E experts, G groups, S tokens per group,
# C capacity, M model width, H expert hidden width), as the model zoo's MoE models are.
import argparse
import math
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
parser.add_argument("--batch_size", type=int, default=16, help="sequences per worker")
parser.add_argument("--experts_per_device", type=int, default=2)
parser.add_argument("--vocab", type=int, default=64)
parser.add_argument("--length", type=int, default=16)
parser.add_argument("--width", type=int, default=32)
parser.add_argument("--heads", type=int, default=4)
parser.add_argument("--expert_hidden", type=int, default=64)
parser.add_argument("--capacity_factor", type=float, default=1.5)
parser.add_argument("--learning_rate", type=float, default=0.003)
parser.add_argument("--print_every", type=int, default=10)
args = parser.parse_args()

config = epl.Config({"cluster.colocate_split_and_replicate": True})             # EPL
epl.init(config)                                                                 # EPL
total_gpu_num = epl.Env.get().cluster.total_gpu_num                              # EPL
epl.set_default_strategy(epl.replicate(total_gpu_num))                           # EPL

num_experts = args.experts_per_device * total_gpu_num  # a multiple of the device count
S, M, H = args.length, args.width, args.expert_hidden
capacity = int(math.ceil(args.capacity_factor * S / num_experts))


def synthetic_data(num_sequences, seed):
    """Random token sequences; the target of each token is a fixed permutation of it."""
    permutation = np.random.RandomState(1234).permutation(args.vocab)  # same on every worker
    rng = np.random.RandomState(seed)
    tokens = rng.randint(0, args.vocab, (num_sequences, S)).astype(np.int32)
    return tokens, permutation[tokens].astype(np.int32)


def dense(x, units, name):
    """A dense layer on [batch, S, in] through a 2-D matmul (static shapes throughout)."""
    flat = tf.reshape(x, [-1, x.shape.as_list()[-1]])
    return tf.reshape(tf.layers.dense(flat, units, name=name), [-1, S, units])


def layer_norm(x, name):
    with tf.variable_scope(name):
        gain = tf.get_variable("gain", [M], initializer=tf.ones_initializer())
        bias = tf.get_variable("bias", [M], initializer=tf.zeros_initializer())
        mean, variance = tf.nn.moments(x, [-1], keep_dims=True)
        return (x - mean) * tf.rsqrt(variance + 1e-6) * gain + bias


def attention(x):
    """Multi-head self-attention over each sequence."""
    head = M // args.heads

    def split_heads(t):
        return tf.transpose(tf.reshape(t, [-1, S, args.heads, head]), [0, 2, 1, 3])
    q, k, v = (split_heads(dense(x, M, n)) for n in ("query", "key", "value"))
    weights = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) / math.sqrt(head))
    context = tf.reshape(tf.transpose(tf.matmul(weights, v), [0, 2, 1, 3]), [-1, S, M])
    return dense(context, M, "attention_output")


def attention_and_gating(tokens):
    """Embedding, attention, and the top-1 gate's dispatch and combine tensors."""
    embedding = tf.get_variable("embedding", [args.vocab, M])
    position = tf.get_variable("position", [S, M])
    x = tf.nn.embedding_lookup(embedding, tokens) + position
    x = layer_norm(x + attention(x), "attention_norm")
    gate = tf.get_variable("gate", [M, num_experts])
    probabilities = tf.nn.softmax(tf.einsum("GSM,ME->GSE", x, gate))
    expert = tf.argmax(probabilities, axis=-1, output_type=tf.int32)
    mask = tf.one_hot(expert, num_experts)                                   # [G, S, E]
    slot = tf.cumsum(mask, axis=1, exclusive=True) * mask                    # place in queue
    mask *= tf.cast(slot < capacity, tf.float32)                             # drop overflow
    dispatch = tf.one_hot(tf.cast(slot, tf.int32), capacity) * mask[..., None]  # [G,S,E,C]
    combine = dispatch * tf.reduce_sum(probabilities * mask, -1)[..., None, None]
    # Switch-style load-balancing loss: 1.0 when tokens are spread evenly.
    balance = num_experts * tf.reduce_mean(
        tf.reduce_sum(tf.reduce_mean(mask, 1) * tf.reduce_mean(probabilities, 1), -1))
    return x, dispatch, combine, balance


def moe_variable_define():
    """The experts' weights: [E, ...]; under epl.split each device holds E / N experts."""
    w_in = tf.get_variable("expert_w_in", [num_experts, M, H])
    w_out = tf.get_variable("expert_w_out", [num_experts, H, M])
    return w_in, w_out


def moe_calculation_define(x, dispatch, combine, w_in, w_out):
    expert_inputs = tf.einsum("GSEC,GSM->EGCM", dispatch, x)
    hidden = tf.nn.relu(tf.einsum("EGCM,EMH->EGCH", expert_inputs, w_in))
    expert_outputs = tf.einsum("EGCH,EHM->EGCM", hidden, w_out)
    return tf.einsum("GSEC,EGCM->GSM", combine, expert_outputs)


tokens, targets = synthetic_data(8 * args.batch_size, seed=epl.Env.get().cluster.worker_index)
dataset = tf.data.Dataset.from_tensor_slices((tokens, targets)).repeat().batch(args.batch_size)
x_tokens, y_tokens = tf.data.make_one_shot_iterator(dataset).get_next()

x, dispatch, combine, balance = attention_and_gating(x_tokens)
with epl.split(total_gpu_num):                                                   # EPL
    w_in, w_out = moe_variable_define()
h = layer_norm(x + moe_calculation_define(x, dispatch, combine, w_in, w_out), "moe_norm")
logits = tf.layers.dense(tf.reshape(h, [-1, M]), args.vocab, name="logits")
loss = tf.losses.sparse_softmax_cross_entropy(tf.reshape(y_tokens, [-1]), logits)
total_loss = loss + 0.01 * balance
epl.add_to_collection([loss, balance], epl.GraphKeys.GLOBAL_MEAN_OBJECTS)       # EPL

global_step = tf.train.get_or_create_global_step()
optimizer = tf.train.AdamOptimizer(learning_rate=args.learning_rate)
train_op = optimizer.minimize(total_loss, global_step=global_step)

with tf.train.MonitoredTrainingSession() as sess:
    for i in range(1, args.steps + 1):
        train_loss, train_balance, _ = sess.run([loss, balance, train_op])
        if i == 1 or i % args.print_every == 0:
            print("step %d loss %.4f balance %.3f" % (i, train_loss, train_balance),
                  flush=True)
print("Train Finished.")
