"""Canned recommendation Estimators on feature columns, for equivalence tests.

Features: hashed (user, two item fields sharing one embedding), vocabulary
(category), crossed (user x category), embedding, shared embedding and numeric
columns; tables split by each partitioner TF offers. Input is deterministic
(rows in order, no shuffle) unless asked; initial values come from the
RunConfig's seed, so serial and EPL training start from the same weights.
"""
import collections
import re

import numpy as np
import tensorflow.compat.v1 as tf

import epl

CATEGORIES = ["news", "sports", "music", "games", "films", "food", "travel"]
KINDS = ("dnn_classifier", "linear_classifier", "wide_deep_classifier", "dnn_regressor",
         "linear_regressor", "wide_deep_regressor")
SEED = 11


def make_data(rows, seed=0):
    """(features as numpy arrays by name, labels): clicks for classifiers, a float
    target for regressors (``labels[kind.endswith("regressor")]``)."""
    rng = np.random.RandomState(seed)
    user = rng.randint(0, 300, rows)
    features = {
        "user": np.array(["u%d" % u for u in user]),
        "query_item": np.array(["i%d" % i for i in rng.randint(0, 90, rows)]),
        "clicked_item": np.array(["i%d" % i for i in rng.randint(0, 90, rows)]),
        "category": np.array([CATEGORIES[c] for c in rng.randint(0, len(CATEGORIES), rows)]),
        "age": rng.rand(rows).astype(np.float32),
    }
    score = (user % 7) / 7.0 + features["age"] + 0.3 * rng.randn(rows)
    clicks = (score > 1.0).astype(np.int64)
    return features, {False: clicks, True: score.astype(np.float32)}


def columns():
    """(wide columns, deep columns)."""
    fc = tf.feature_column
    user = fc.categorical_column_with_hash_bucket("user", 64)
    query = fc.categorical_column_with_hash_bucket("query_item", 32)
    clicked = fc.categorical_column_with_hash_bucket("clicked_item", 32)
    category = fc.categorical_column_with_vocabulary_list("category", CATEGORIES)
    cross = fc.crossed_column(["user", "category"], 128)
    age = fc.numeric_column("age")
    wide = [user, category, cross, age]
    deep = [fc.embedding_column(user, 6), fc.embedding_column(category, 3), age]
    deep += fc.shared_embedding_columns([query, clicked], 4)
    return wide, deep


def make_estimator(kind, model_dir, partitions=2, **config):
    """One canned Estimator of ``kind`` (KINDS) with ``partitions`` parts per deep
    table; ``config`` goes to RunConfig.

    TF 1's canned Estimators sum their loss over the batch
    (``loss_reduction=SUM``), so EPL's jobs set
    ``communication.gradients_reduce_method: "sum"`` to train on the global batch."""
    wide, deep = columns()
    config.setdefault("tf_random_seed", SEED)
    config.setdefault("log_step_count_steps", None)
    config.setdefault("save_checkpoints_steps", 1000)
    run_config = tf.estimator.RunConfig(model_dir=str(model_dir), **config)
    split = tf.fixed_size_partitioner(partitions)
    est = tf.estimator
    if kind == "dnn_classifier":
        return est.DNNClassifier([8], deep, config=run_config, input_layer_partitioner=split)
    if kind == "dnn_regressor":
        return est.DNNRegressor([8], deep, config=run_config, input_layer_partitioner=split)
    if kind == "linear_classifier":
        return est.LinearClassifier(wide, config=run_config, partitioner=(
            tf.min_max_variable_partitioner(max_partitions=3, min_slice_size=64)))
    if kind == "linear_regressor":
        return est.LinearRegressor(wide, config=run_config, partitioner=(
            tf.variable_axis_size_partitioner(max_shard_bytes=96)))
    combined = (est.DNNLinearCombinedRegressor if kind == "wide_deep_regressor"
                else est.DNNLinearCombinedClassifier)
    return combined(linear_feature_columns=wide, dnn_feature_columns=deep,
                    dnn_hidden_units=[8], input_layer_partitioner=split, config=run_config)


def input_fn(features, labels, batch, repeat=False, shuffle=0):
    """Rows in order (``shuffle``: a buffer of that many rows, seeded)."""
    def fn():
        data = tf.data.Dataset.from_tensor_slices((dict(features), labels))
        if shuffle:
            data = data.shuffle(shuffle, seed=SEED)
        if repeat:
            data = data.repeat()
        return data.batch(batch, drop_remainder=True)
    return fn


EPL_CONFIG = {"communication.gradients_reduce_method": "sum"}


def serial_train(kind, features, labels, batch, steps, model_dir, shuffle=0):
    """Reference: the Estimator trained ``steps`` global batches with EPL paused."""
    with epl.paused():
        make_estimator(kind, model_dir).train(
            input_fn(features, labels, batch, shuffle=shuffle), steps=steps)
    return checkpoint_values(model_dir)


def checkpoint_values(model_dir):
    """{name: value} of every variable of the latest checkpoint (partitioned ones whole).

    TF 1 saves some optimizer slots of partitioned tables under a name per part
    (".../part_2/Ftrl", ".../t_1/Adagrad") holding that part's slice of the whole
    table's shape, which the reader refuses to return whole; those are read as their
    slice (parts split rows as TF does: the first ``rows % parts`` get one more)."""
    reader = tf.train.load_checkpoint(str(model_dir))
    shapes = reader.get_variable_to_shape_map()
    values, sliced = {}, []
    for name in shapes:
        try:
            values[name] = reader.get_tensor(name)
        except (tf.errors.InvalidArgumentError, ValueError):  # ValueError on TF 2.x
            sliced.append(name)
    values.update(_read_slices(tf.train.latest_checkpoint(str(model_dir)), sliced, shapes))
    return values


_PART = re.compile(r"/(part|t)_(\d+)/")


def _read_slices(prefix, names, shapes):
    """{name: its part's slice} for names saved as slices of a partitioned whole."""
    if not names:
        return {}
    groups = collections.Counter(_PART.sub("/*/", name) for name in names)
    with epl.paused(), tf.Graph().as_default():
        reads = {}
        for name in names:
            part = int(_PART.search(name).group(2))
            parts = groups[_PART.sub("/*/", name)]
            shape = shapes[name]
            rows = [shape[0] // parts + (1 if i < shape[0] % parts else 0)
                    for i in range(parts)]
            spec = " ".join(str(d) for d in shape) + " %d,%d" % (sum(rows[:part]), rows[part])
            spec += ":-" * (len(shape) - 1)
            reads[name] = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[name],
                                               shape_and_slices=[spec], dtypes=[tf.float32])[0]
        with tf.Session() as sess:
            return sess.run(reads)


def max_difference(reference, values):
    """(largest difference over the reference's variables, relative to the value's
    magnitude when above 1, where)."""
    missing = sorted(set(reference) - set(values))
    assert not missing, "checkpoint lacks %s" % missing
    worst = (-1.0, "")
    for name, value in reference.items():
        value = np.asarray(value, np.float64)
        scale = np.maximum(1.0, np.abs(value))
        worst = max(worst, (float((np.abs(value - values[name]) / scale).max()), name))
    return worst
