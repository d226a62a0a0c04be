# train.py: a wide & deep click model (tf.estimator.DNNLinearCombinedClassifier) on
# hashed, vocabulary, crossed, embedding, shared embedding and numeric feature columns,
# trained with data parallelism over every device of the job, then evaluated.
#
#   epl-launch --num_workers 2 --gpu_per_worker 2 examples/wide_deep/train.py \
#       --model_dir /tmp/wide_deep
#
# The lines marked "EPL" are the only changes to a single-device script; without the
# launcher (`python examples/wide_deep/train.py`) it trains on one device.
"""Train and evaluate a canned wide & deep Estimator on synthetic click logs."""
import argparse
import json
import os

import numpy as np
import tensorflow as tf
import epl                                                                       # EPL

# This example prints its own results, so it turns TensorFlow's deprecation warnings and C++
# info logs off (its own choice: EPL never changes TensorFlow's logging).
tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # TF reads it at its first C++ log line

CATEGORIES = ["news", "sports", "music", "games", "films", "food", "travel", "cars"]
DEVICES = ["phone", "tablet", "desktop"]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model_dir", default="/tmp/epl_wide_deep",
                        help="checkpoints; shared by the workers (worker 0 writes)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch_size", type=int, default=64, help="examples per replica")
    parser.add_argument("--learning_rate", type=float, default=0.5,
                        help="of FTRL (wide part) and Adagrad (deep part)")
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--eval_examples", type=int, default=8192)
    return parser.parse_args()


def click_logs(args, count, seed):
    """``count`` synthetic impressions and whether they were clicked.

    Each user likes a few categories and each item has a popularity; clicks follow a
    hidden logistic model of those, the device and the hour, so the user x category
    cross, the embeddings and the numeric columns all carry signal. The hidden model
    is the same everywhere (seed 7); ``seed`` draws the impressions.
    """
    hidden = np.random.RandomState(7)
    likes = hidden.normal(0, 2.0, (args.users, len(CATEGORIES)))
    popularity = hidden.normal(0, 1.5, args.items)
    item_category = hidden.randint(0, len(CATEGORIES), args.items)
    rng = np.random.RandomState(seed)
    user = rng.randint(0, args.users, count)
    item = rng.randint(0, args.items, count)
    last_item = rng.randint(0, args.items, count)
    device = rng.randint(0, len(DEVICES), count)
    hour = rng.randint(0, 24, count).astype(np.float32)
    category = item_category[item]
    score = (likes[user, category] + popularity[item] + 0.5 * (device == 0)
             - 0.05 * np.abs(hour - 20) - 0.5)
    clicked = (rng.rand(count) < 1 / (1 + np.exp(-score))).astype(np.int64)
    features = {
        "user": np.array(["user_%d" % u for u in user]),
        "item": np.array(["item_%d" % i for i in item]),
        "last_item": np.array(["item_%d" % i for i in last_item]),
        "category": np.array([CATEGORIES[c] for c in category]),
        "device": np.array([DEVICES[d] for d in device]),
        "hour": hour,
    }
    return features, clicked


def feature_columns(args):
    """(wide columns for the linear part, deep columns for the DNN)."""
    fc = tf.feature_column
    user = fc.categorical_column_with_hash_bucket("user", 2 * args.users)
    item = fc.categorical_column_with_hash_bucket("item", 2 * args.items)
    last_item = fc.categorical_column_with_hash_bucket("last_item", 2 * args.items)
    category = fc.categorical_column_with_vocabulary_list("category", CATEGORIES)
    device = fc.categorical_column_with_vocabulary_list("device", DEVICES)
    hour = fc.numeric_column("hour", normalizer_fn=lambda h: h / 24.0)
    wide = [user, item, category, device,
            fc.crossed_column(["user", "category"], 20 * args.users),
            fc.bucketized_column(hour, [0.25, 0.5, 0.75, 0.9])]
    deep = [fc.embedding_column(user, 16), fc.embedding_column(category, 4),
            fc.indicator_column(device), hour]
    deep += fc.shared_embedding_columns([item, last_item], 16)   # one table, two features
    return wide, deep


def input_fn(features, labels, batch_size, train):
    def make():
        data = tf.data.Dataset.from_tensor_slices((features, labels))
        if train:
            data = data.shuffle(10 * batch_size, seed=1).repeat()
        return data.batch(batch_size)
    return make


def main():
    args = parse_args()
    # TF 1's canned Estimators sum their loss over the batch, so the replicas' gradients
    # are summed too: the update is the one of the global batch.
    epl.init(epl.Config({"communication.gradients_reduce_method": "sum"}))      # EPL
    epl.set_default_strategy(epl.replicate(device_count=1))                     # EPL
    cluster = epl.Env.get().cluster
    wide, deep = feature_columns(args)
    estimator = tf.estimator.DNNLinearCombinedClassifier(
        linear_feature_columns=wide, dnn_feature_columns=deep, dnn_hidden_units=[64, 32],
        linear_optimizer=tf.train.FtrlOptimizer(args.learning_rate),
        dnn_optimizer=tf.train.AdagradOptimizer(args.learning_rate),
        input_layer_partitioner=tf.fixed_size_partitioner(2),
        config=tf.estimator.RunConfig(model_dir=args.model_dir, tf_random_seed=1,
                                      log_step_count_steps=None))
    # each worker reads its own impressions; its replicas take consecutive batches
    features, labels = click_logs(args, args.steps * args.batch_size
                                  * cluster.gpu_num_per_worker, seed=100 + cluster.worker_index)
    estimator.train(input_fn(features, labels, args.batch_size, train=True), steps=args.steps)
    eval_features, eval_labels = click_logs(args, args.eval_examples, seed=1)
    metrics = estimator.evaluate(input_fn(eval_features, eval_labels, 512, train=False))
    print("eval " + json.dumps(dict((k, round(float(v), 4)) for k, v in metrics.items()),
                               sort_keys=True), flush=True)
    print("global batch %d" % (args.batch_size * cluster.total_gpu_num))
    print("Train Finished.", flush=True)


if __name__ == "__main__":
    main()
