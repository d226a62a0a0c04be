"""The benchmark corpus of shapes: models written the way their users write them.

``benchmarks/rewrite_cost.py`` measured one model, ``transformer.py``, and EPL's
start-up was tuned on it: an independently written BERT-base encoder took 1.75x
plain TF's time to its first step at a shape where the benchmark said 0.87x
(issue 41). So the start-up and steady-step benchmarks (``startup.py``,
``steady_step.py``, ``cpu_allocator.py``) run every shape of this corpus:

* ``mid``: ``transformer.py``'s 12-layer encoder (hidden 384, seq 32), the
  benchmark's own model: a one-shot iterator over one repeated batch, a
  hand-written layer norm;
* ``bert``: BERT-base (12 layers, hidden 768, seq 64, 12 heads) written as in
  Google's ``modeling.py``: ``tf.contrib.layers.layer_norm``, dropout, an
  attention mask, token-type embeddings, 2-D dense layers; the input is an
  initializable ``tf.data`` iterator over numpy arrays, its initializer
  registered in ``TABLE_INITIALIZERS`` so that ``MonitoredTrainingSession``
  runs it; Adam;
* ``resnet``: a ResNet-style CNN (bottleneck blocks, ``tf.layers.batch_normalization``
  whose moving statistics the train op waits for through ``UPDATE_OPS``),
  momentum;
* ``moe``: a Mixture-of-Experts transformer in the GShard einsum layout of
  ``examples/moe`` (top-1 gate with capacity, the load-balancing loss), its
  experts replicated rather than split, so that every mode applies; Adam.

Each shape is a :class:`Shape`: ``build(tf, batch, stage_of)`` makes the loss and
the train op for ``batch`` rows per run, calling ``stage_of(i)`` (a context
manager, e.g. an ``epl.replicate`` scope) around the part of pipeline stage
``i`` of two; ``micro_batch`` is the rows per micro-batch and per replica. The
same builder makes plain TF's graph; :func:`train_op` builds a shape under one of
the corpus's modes (EPL is imported there only).

Modes, all at the same global batch (``micro_batch`` x ``micro_batches`` rows per
step):

* ``plain``: TensorFlow alone, one device;
* ``pipe``: EPL, 2 stages on 1 worker x 2 devices, ``micro_batches`` micro-batches;
* ``dp``: EPL, 2 local replicas (``epl.replicate(1)`` on 2 devices), half the rows each;
* ``ga``: EPL, gradient accumulation on one device: ``micro_batches`` runs of
  ``micro_batch`` rows per step (one apply).

``pipe`` and ``dp`` repeat the step per micro-batch or replica, lowered as stage
functions or unrolled copies (``pipeline.micro_batching``; ``None`` leaves EPL's
default).
"""
import collections
import contextlib
import math

import numpy as np

import transformer

Shape = collections.namedtuple("Shape", ["name", "micro_batch", "build", "doc"])


@contextlib.contextmanager
def _nothing():
    yield


def _first_stage(index):
    del index
    return _nothing()


# ---- mid: the benchmark's own encoder -----------------------------------------------
def _mid(tf, batch, stage_of):
    size = dict(transformer.SIZES["mid"])
    per_stage = size["layers"] // 2
    return transformer.build(tf, size, batch,
                             lambda layer: stage_of(min(layer // per_stage, 1)))


# ---- bert: BERT-base as Google's modeling.py writes it -------------------------------
BERT = dict(layers=12, hidden=768, heads=12, seq=64, intermediate=3072, vocab=30522,
            positions=512, rows=256, dropout=0.1)


def layer_norm(tf, x, scope):
    """``tf.contrib.layers.layer_norm`` over the last axis (TF 1.15); on TF 2.x, which
    has no contrib, the same computation and variables (``<scope>/beta``, ``gamma``)."""
    contrib = getattr(tf, "contrib", None)
    if contrib is not None:
        return contrib.layers.layer_norm(x, begin_norm_axis=-1, begin_params_axis=-1,
                                         scope=scope)
    with tf.variable_scope(scope):
        dim = x.shape[-1].value if hasattr(x.shape[-1], "value") else x.shape[-1]
        beta = tf.get_variable("beta", [dim], initializer=tf.zeros_initializer())
        gamma = tf.get_variable("gamma", [dim], initializer=tf.ones_initializer())
        mean, variance = tf.nn.moments(x, [-1], keep_dims=True)
        return tf.nn.batch_normalization(x, mean, variance, beta, gamma, 1e-12)


def _initializable_input(tf, arrays, batch):
    """An initializable iterator over ``arrays`` (repeated, batches of ``batch``) whose
    initializer is registered in TABLE_INITIALIZERS, as users do to have
    MonitoredTrainingSession's scaffold run it."""
    data = tf.data.Dataset.from_tensor_slices(arrays).repeat().batch(batch, drop_remainder=True)
    iterator = tf.data.make_initializable_iterator(data)
    tf.add_to_collection(tf.GraphKeys.TABLE_INITIALIZERS, iterator.initializer)
    return iterator.get_next()


def _bert_data(rows, seq, vocab):
    rng = np.random.RandomState(0)
    ids = rng.randint(0, vocab, (rows, seq)).astype(np.int32)
    lengths = rng.randint(seq // 2, seq + 1, rows)
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
    segments = (np.arange(seq)[None] >= (lengths // 2)[:, None]).astype(np.int32) * mask
    labels = rng.randint(0, 2, rows).astype(np.int32)
    return ids * mask, mask, segments, labels


def _bert_dense(tf, x, units, name, activation=None):
    init = tf.truncated_normal_initializer(stddev=0.02)
    return tf.layers.dense(x, units, activation=activation, name=name, kernel_initializer=init)


def _dropout(tf, x, rate):
    return tf.nn.dropout(x, rate=rate) if rate else x


def _bert_attention(tf, x2d, adder, batch, size):
    heads, seq, hidden = size["heads"], size["seq"], size["hidden"]
    width = hidden // heads

    def heads_first(t):
        return tf.transpose(tf.reshape(t, [batch, seq, heads, width]), [0, 2, 1, 3])
    query = heads_first(_bert_dense(tf, x2d, hidden, "query"))
    key = heads_first(_bert_dense(tf, x2d, hidden, "key"))
    value = heads_first(_bert_dense(tf, x2d, hidden, "value"))
    scores = tf.matmul(query, key, transpose_b=True) * (1.0 / math.sqrt(float(width)))
    probs = _dropout(tf, tf.nn.softmax(scores + adder), size["dropout"])
    context = tf.transpose(tf.matmul(probs, value), [0, 2, 1, 3])
    return tf.reshape(context, [batch * seq, hidden])


def _gelu(tf, x):
    return x * 0.5 * (1.0 + tf.erf(x / math.sqrt(2.0)))


def _bert_layer(tf, x2d, adder, batch, size, index):
    with tf.variable_scope("layer_%d" % index):
        with tf.variable_scope("attention"):
            with tf.variable_scope("self"):
                context = _bert_attention(tf, x2d, adder, batch, size)
            with tf.variable_scope("output"):
                out = _dropout(tf, _bert_dense(tf, context, size["hidden"], "dense"),
                               size["dropout"])
                x2d = layer_norm(tf, out + x2d, "LayerNorm")
        with tf.variable_scope("intermediate"):
            inner = _bert_dense(tf, x2d, size["intermediate"], "dense",
                                activation=lambda t: _gelu(tf, t))
        with tf.variable_scope("output"):
            out = _dropout(tf, _bert_dense(tf, inner, size["hidden"], "dense"), size["dropout"])
            return layer_norm(tf, out + x2d, "LayerNorm")


def _bert_embeddings(tf, ids, segments, size):
    init = tf.truncated_normal_initializer(stddev=0.02)
    seq, hidden = size["seq"], size["hidden"]
    with tf.variable_scope("embeddings"):
        word = tf.get_variable("word_embeddings", [size["vocab"], hidden], initializer=init)
        types = tf.get_variable("token_type_embeddings", [2, hidden], initializer=init)
        positions = tf.get_variable("position_embeddings", [size["positions"], hidden],
                                    initializer=init)
        x = tf.gather(word, ids)
        x += tf.reshape(tf.matmul(tf.one_hot(tf.reshape(segments, [-1]), 2), types),
                        [-1, seq, hidden])
        x += tf.reshape(tf.slice(positions, [0, 0], [seq, -1]), [1, seq, hidden])
        return _dropout(tf, layer_norm(tf, x, "LayerNorm"), size["dropout"])


def _bert(tf, batch, stage_of, size=None):
    size = size or BERT
    seq, hidden = size["seq"], size["hidden"]
    ids, mask, segments, labels = _initializable_input(
        tf, _bert_data(size["rows"], seq, size["vocab"]), batch)
    per_stage = size["layers"] // 2
    with tf.variable_scope("bert"):
        with stage_of(0):
            x = _bert_embeddings(tf, ids, segments, size)
            adder = (1.0 - tf.cast(tf.reshape(mask, [batch, 1, 1, seq]), tf.float32)) * -10000.0
            x2d = tf.reshape(x, [batch * seq, hidden])
        with tf.variable_scope("encoder"):
            for index in range(size["layers"]):
                with stage_of(min(index // per_stage, 1)):
                    x2d = _bert_layer(tf, x2d, adder, batch, size, index)
        with stage_of(1):
            first = tf.reshape(x2d, [batch, seq, hidden])[:, 0]
            pooled = _bert_dense(tf, first, hidden, "pooler", activation=tf.tanh)
            logits = _bert_dense(tf, _dropout(tf, pooled, size["dropout"]), 2, "classifier")
            log_probs = tf.nn.log_softmax(logits, axis=-1)
            loss = -tf.reduce_mean(tf.reduce_sum(tf.one_hot(labels, 2) * log_probs, axis=-1))
    step = tf.train.get_or_create_global_step()
    return loss, tf.train.AdamOptimizer(1e-4).minimize(loss, global_step=step)


def _bert_mid(tf, batch, stage_of):
    """The same BERT code at the ``mid`` encoder's shape (hidden 384, seq 32)."""
    return _bert(tf, batch, stage_of, dict(BERT, hidden=384, seq=32, intermediate=1536))


# ---- resnet: a CNN with batch norm ---------------------------------------------------
RESNET = dict(image=32, classes=100, base_width=16, blocks=(2, 2, 2, 2), rows=64)


def _conv_bn(tf, x, filters, kernel, stride, name, relu=True):
    x = tf.layers.conv2d(x, filters, kernel, stride, padding="same", use_bias=False,
                         kernel_initializer=tf.variance_scaling_initializer(2.0),
                         name=name + "_conv")
    x = tf.layers.batch_normalization(x, momentum=0.9, training=True, name=name + "_bn")
    return tf.nn.relu(x) if relu else x


def _bottleneck(tf, x, width, stride, name):
    with tf.variable_scope(name):
        shortcut = x
        if stride != 1 or x.shape[-1] != 4 * width:
            shortcut = _conv_bn(tf, x, 4 * width, 1, stride, "shortcut", relu=False)
        h = _conv_bn(tf, x, width, 1, 1, "reduce")
        h = _conv_bn(tf, h, width, 3, stride, "spatial")
        h = _conv_bn(tf, h, 4 * width, 1, 1, "expand", relu=False)
        return tf.nn.relu(h + shortcut)


def _resnet(tf, batch, stage_of, size=None):
    size = size or RESNET
    rng = np.random.RandomState(0)
    images = rng.normal(0.0, 1.0, (size["rows"], size["image"], size["image"], 3))
    labels = rng.randint(0, size["classes"], size["rows"]).astype(np.int64)
    data = tf.data.Dataset.from_tensor_slices((images.astype(np.float32), labels))
    x, y = tf.data.make_one_shot_iterator(
        data.repeat().batch(batch, drop_remainder=True)).get_next()
    blocks = size["blocks"]
    with stage_of(0):
        x = _conv_bn(tf, x, 2 * size["base_width"], 3, 1, "stem")
    for stage, count in enumerate(blocks):
        with stage_of(0 if stage < len(blocks) // 2 else 1):
            for block in range(count):
                stride = 2 if stage > 0 and block == 0 else 1
                x = _bottleneck(tf, x, size["base_width"] << stage, stride,
                                "stage%d_block%d" % (stage + 1, block + 1))
    with stage_of(1):
        logits = tf.layers.dense(tf.reduce_mean(x, [1, 2]), size["classes"], name="fc")
        loss = tf.losses.sparse_softmax_cross_entropy(y, logits)
    step = tf.train.get_or_create_global_step()
    with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS)):
        train = tf.train.MomentumOptimizer(0.05, momentum=0.9).minimize(loss, global_step=step)
    return loss, train


# ---- moe: a Mixture-of-Experts transformer --------------------------------------------
MOE = dict(layers=4, width=256, heads=8, seq=64, experts=8, expert_hidden=512, vocab=1000,
           capacity_factor=1.5, rows=128)


def _moe_norm(tf, x, name):
    with tf.variable_scope(name):
        dim = x.shape.as_list()[-1]
        gain = tf.get_variable("gain", [dim], initializer=tf.ones_initializer())
        bias = tf.get_variable("bias", [dim], initializer=tf.zeros_initializer())
        mean, variance = tf.nn.moments(x, [-1], keep_dims=True)
        return (x - mean) * tf.rsqrt(variance + 1e-6) * gain + bias


def _moe_dense(tf, x, units, name, seq):
    flat = tf.reshape(x, [-1, x.shape.as_list()[-1]])
    return tf.reshape(tf.layers.dense(flat, units, name=name), [-1, seq, units])


def _moe_attention(tf, x, size):
    seq, width, heads = size["seq"], size["width"], size["heads"]
    head = width // heads

    def split(t):
        return tf.transpose(tf.reshape(t, [-1, seq, heads, head]), [0, 2, 1, 3])
    q, k, v = (split(_moe_dense(tf, x, width, n, seq)) for n in ("query", "key", "value"))
    weights = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) / math.sqrt(head))
    context = tf.reshape(tf.transpose(tf.matmul(weights, v), [0, 2, 1, 3]), [-1, seq, width])
    return _moe_dense(tf, context, width, "output", seq)


def _moe_experts(tf, x, size):
    """Top-1 gate with capacity, the four GShard einsums, the balance loss."""
    experts, seq = size["experts"], size["seq"]
    capacity = int(math.ceil(size["capacity_factor"] * seq / experts))
    gate = tf.get_variable("gate", [size["width"], experts])
    probabilities = tf.nn.softmax(tf.einsum("GSM,ME->GSE", x, gate))
    mask = tf.one_hot(tf.argmax(probabilities, axis=-1, output_type=tf.int32), experts)
    slot = tf.cumsum(mask, axis=1, exclusive=True) * mask
    mask *= tf.cast(slot < capacity, tf.float32)
    dispatch = tf.one_hot(tf.cast(slot, tf.int32), capacity) * mask[..., None]
    combine = dispatch * tf.reduce_sum(probabilities * mask, -1)[..., None, None]
    balance = experts * tf.reduce_mean(
        tf.reduce_sum(tf.reduce_mean(mask, 1) * tf.reduce_mean(probabilities, 1), -1))
    w_in = tf.get_variable("expert_w_in", [experts, size["width"], size["expert_hidden"]])
    w_out = tf.get_variable("expert_w_out", [experts, size["expert_hidden"], size["width"]])
    inputs = tf.einsum("GSEC,GSM->EGCM", dispatch, x)
    hidden = tf.nn.relu(tf.einsum("EGCM,EMH->EGCH", inputs, w_in))
    outputs = tf.einsum("EGCH,EHM->EGCM", hidden, w_out)
    return tf.einsum("GSEC,EGCM->GSM", combine, outputs), balance


def _moe(tf, batch, stage_of, size=None):
    size = size or MOE
    seq, width = size["seq"], size["width"]
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, size["vocab"], (size["rows"], seq)).astype(np.int32)
    targets = rng.permutation(size["vocab"])[tokens].astype(np.int32)
    data = tf.data.Dataset.from_tensor_slices((tokens, targets))
    x_tokens, y_tokens = tf.data.make_one_shot_iterator(
        data.repeat().batch(batch, drop_remainder=True)).get_next()
    balances = []
    per_stage = size["layers"] // 2
    with stage_of(0):
        embedding = tf.get_variable("embedding", [size["vocab"], width])
        position = tf.get_variable("position", [seq, width])
        x = tf.nn.embedding_lookup(embedding, x_tokens) + position
    for index in range(size["layers"]):
        with stage_of(min(index // per_stage, 1)), tf.variable_scope("layer_%d" % index):
            x = _moe_norm(tf, x + _moe_attention(tf, x, size), "attention_norm")
            y, balance = _moe_experts(tf, x, size)
            balances.append(balance)
            x = _moe_norm(tf, x + y, "moe_norm")
    with stage_of(1):
        logits = tf.layers.dense(tf.reshape(x, [-1, width]), size["vocab"], name="logits")
        loss = tf.losses.sparse_softmax_cross_entropy(tf.reshape(y_tokens, [-1]), logits)
        total = loss + 0.01 * tf.add_n(balances)
    step = tf.train.get_or_create_global_step()
    return total, tf.train.AdamOptimizer(3e-3).minimize(total, global_step=step)


SHAPES = collections.OrderedDict((shape.name, shape) for shape in (
    Shape("mid", 4, _mid, "transformer.py's encoder: 12 layers, hidden 384, seq 32"),
    Shape("bert", 4, _bert, "BERT-base as modeling.py writes it: 12 layers, hidden 768, "
          "seq 64, contrib layer norm, dropout, initializable iterator"),
    Shape("bert_mid", 4, _bert_mid, "the bert shape's code at mid's size: hidden 384, seq 32"),
    Shape("resnet", 8, _resnet, "ResNet-style CNN: 32x32 images, bottleneck blocks 2-2-2-2, "
          "width 16, batch norm, momentum"),
    Shape("moe", 4, _moe, "MoE transformer: 4 layers, width 256, seq 64, 8 top-1 experts "
          "per layer, Adam"),
))


def build(tf, name, batch, stage_of=None):
    """(loss, train op) of shape ``name`` for ``batch`` rows per run."""
    return SHAPES[name].build(tf, batch, stage_of or _first_stage)


MODES = ("plain", "pipe", "dp", "ga")
Built = collections.namedtuple("Built", ["loss", "train", "devices", "runs_per_step"])


def mode_devices(mode):
    """Devices per worker of ``mode``."""
    return 1 if mode in ("plain", "ga") else 2


def train_op(tf, name, mode, lowering=None, micro_batches=4, launched=False, extra=None):
    """Build shape ``name`` under ``mode`` (see the module docstring) in the default
    graph: a :data:`Built` (loss, train op, devices the session needs, session runs
    per step). ``launched``: the process was started by ``epl-launch``, whose
    environment says the cluster (a one-worker TF_CONFIG: a server and gRPC
    sessions); otherwise EPL gets an in-process cluster of the mode's devices.
    ``extra``: more EPL config keys (``{"offload.level": "v0"}``)."""
    shape = SHAPES[name]
    rows = shape.micro_batch * micro_batches
    if mode == "plain":
        loss, train = build(tf, name, rows)
        return Built(loss, train, 1, 1)
    import epl
    from epl.cluster import Cluster
    devices = mode_devices(mode)
    config = {"pipeline.num_micro_batch": 1 if mode == "dp" else micro_batches}
    if lowering:
        config["pipeline.micro_batching"] = lowering
    config.update(extra or {})
    epl.init(epl.Config(config),
             cluster=None if launched else Cluster(devices_per_worker=devices))
    if mode == "pipe":
        stages = [epl.replicate(1, name="stage_%d" % s) for s in range(2)]
        loss, train = build(tf, name, shape.micro_batch, lambda index: stages[index])
        return Built(loss, train, devices, 1)
    epl.set_default_strategy(epl.replicate(1))
    if mode == "dp":
        loss, train = build(tf, name, rows // 2)
        return Built(loss, train, devices, 1)
    loss, train = build(tf, name, shape.micro_batch)
    return Built(loss, train, devices, micro_batches)
