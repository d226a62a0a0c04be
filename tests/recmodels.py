"""A recommendation model whose replicas hold different numbers of gradient rows.

Each example has a variable number of user ids (a SparseTensor built from -1
padded rows), looked up with ``embedding_lookup_sparse`` (``unique`` inside:
one gradient row per distinct id of the batch) in a table split by
``fixed_size_partitioner`` (each part gets the ids that fall in it), a wide
linear part over the same ids, a plain item embedding and dense features. So
every replica's IndexedSlices has its own row count, every step: what canned
estimators with hashed features produce, with deterministic data and initial
values for equivalence tests.
"""
import contextlib

import numpy as np
import tensorflow.compat.v1 as tf

import epl

USERS, ITEMS, MAX_IDS, DENSE = 37, 23, 5, 3
USER_DIM, ITEM_DIM = 6, 4


def make_data(rows, seed=0):
    """(user ids [rows, MAX_IDS] padded with -1, item [rows], dense [rows, DENSE], labels)."""
    rng = np.random.RandomState(seed)
    users = rng.randint(0, USERS, (rows, MAX_IDS)).astype(np.int64)
    lengths = rng.randint(0, MAX_IDS + 1, rows)
    users[np.arange(MAX_IDS)[None, :] >= lengths[:, None]] = -1
    items = rng.randint(0, ITEMS, rows).astype(np.int64)
    dense = rng.rand(rows, DENSE).astype(np.float32)
    labels = (rng.rand(rows) < 0.5).astype(np.float32)
    return users, items, dense, labels


def dataset_input(data, batch):
    """The rows in order, ``batch`` at a time (one-shot iterator)."""
    dataset = tf.data.Dataset.from_tensor_slices(tuple(data)).batch(batch)
    return tf.data.make_one_shot_iterator(dataset).get_next()


def sparse_ids(padded):
    """The SparseTensor of the ids >= 0 of a -1 padded [batch, n] tensor."""
    where = tf.where(padded >= 0)
    return tf.SparseTensor(where, tf.gather_nd(padded, where),
                           tf.shape(padded, out_type=tf.int64))


class _Values(object):
    """Initial values of a whole variable; each part of a partitioned one gets its slice
    (so a model starts from the same values however it is partitioned)."""

    def __init__(self, values):
        self.values = values

    def __call__(self, shape, dtype=None, partition_info=None):
        offset = partition_info.var_offset if partition_info is not None else [0] * len(shape)
        part = tuple(slice(o, o + n) for o, n in zip(offset, shape))
        return tf.constant(self.values[part], dtype=dtype or tf.float32)


def _init(shape, seed):
    return _Values(np.random.RandomState(seed).uniform(-0.5, 0.5, shape).astype(np.float32))


def no_stage(_):
    """No strategy scope (the serial model, or data parallelism by default strategy)."""
    return contextlib.nullcontext()


def build(batch, combiner="mean", partitions=2, stage=no_stage):
    """The loss of a wide & deep model on ``batch`` (dataset_input's tuple)."""
    users, items, dense, labels = batch
    ids = sparse_ids(users)
    partitioner = tf.fixed_size_partitioner(partitions) if partitions > 1 else None
    with stage(0):
        user_table = tf.get_variable("user_embedding", [USERS, USER_DIM],
                                     initializer=_init([USERS, USER_DIM], 1),
                                     partitioner=partitioner)
        item_table = tf.get_variable("item_embedding", [ITEMS, ITEM_DIM],
                                     initializer=_init([ITEMS, ITEM_DIM], 2))
        wide_weights = tf.get_variable("wide/user_weights", [USERS, 1],
                                       initializer=_init([USERS, 1], 3))
        user = tf.nn.embedding_lookup_sparse(user_table, ids, None, combiner=combiner)
        # rows without ids give no row: pad to the batch (what feature columns do)
        user = tf.pad(user, [[0, tf.shape(dense)[0] - tf.shape(user)[0]], [0, 0]])
        wide = tf.nn.embedding_lookup_sparse(wide_weights, ids, None, combiner="sum")
        wide = tf.pad(wide, [[0, tf.shape(dense)[0] - tf.shape(wide)[0]], [0, 0]])
        item = tf.nn.embedding_lookup(item_table, items)
        features = tf.concat([user, item, dense], 1)
    with stage(1):
        hidden = tf.layers.dense(features, 7, activation=tf.nn.relu, name="deep_1",
                                 kernel_initializer=_init([USER_DIM + ITEM_DIM + DENSE, 7], 4))
        logit = tf.layers.dense(hidden, 1, name="deep_2", kernel_initializer=_init([7, 1], 5))
        logit = tf.reshape(logit + wide, [-1])
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=logit))


OPTIMIZERS = {
    "adagrad": lambda: tf.train.AdagradOptimizer(0.1),
    "ftrl": lambda: tf.train.FtrlOptimizer(0.1, l1_regularization_strength=0.001),
    "momentum": lambda: tf.train.MomentumOptimizer(0.1, 0.9),
}


def train_op(loss, optimizer="adagrad"):
    """The wide part's usual optimizer (FTRL) with ``optimizer`` for the rest when
    ``optimizer`` is "wide_deep"; else ``optimizer`` for every variable."""
    step = tf.train.get_or_create_global_step()
    if optimizer != "wide_deep":
        return OPTIMIZERS[optimizer]().minimize(loss, global_step=step)
    wide = [v for v in tf.trainable_variables() if v.op.name.startswith("wide/")]
    deep = [v for v in tf.trainable_variables() if not v.op.name.startswith("wide/")]
    return tf.group(OPTIMIZERS["ftrl"]().minimize(loss, var_list=wide),
                    OPTIMIZERS["adagrad"]().minimize(loss, var_list=deep, global_step=step))


def serial_weights(data, batch, steps, optimizer="adagrad", combiner="mean", partitions=2):
    """Trainable weights after ``steps`` global batches of ``batch`` rows, EPL paused."""
    with epl.paused(), tf.Graph().as_default():
        loss = build(dataset_input(data, batch), combiner, partitions)
        train = train_op(loss, optimizer)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            for _ in range(steps):
                sess.run(train)
            return dict((v.op.name, sess.run(v)) for v in tf.trainable_variables())
