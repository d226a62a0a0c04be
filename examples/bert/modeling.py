"""A BERT encoder with a SQuAD span head, written for the EPL pipeline tutorials.

The layout follows Google's BERT (word + position + segment embeddings, post-norm
transformer layers with GELU, a start/end span head and the averaged start/end
cross-entropy of ``run_squad.py``), sized by :class:`BertConfig`.

:func:`build_squad_model` is the one entry point. It knows nothing about EPL: a caller
that wants hand-placed pipeline stages passes ``stage_scope``, a function from a stage
index to a context manager (for example ``lambda i: epl.replicate(1, name="stage_%d" % i)``);
a caller that lets EPL find the stages (``auto.auto_parallel``) or trains on one device
passes nothing. Keeping the model free of strategy code is what lets the hand-placed
and the automatic pipeline scripts share it.

Example::

    config = BertConfig.tiny()
    model = build_squad_model(features, config, num_stages=2,
                              stage_scope=lambda i: epl.replicate(1, name="stage_%d" % i))
    train_op = tf.train.AdamOptimizer(1e-3).minimize(model.loss)
"""
import collections
import contextlib
import math

import tensorflow as tf

SquadModel = collections.namedtuple("SquadModel", ["loss", "start_logits", "end_logits"])


class BertConfig(object):
    """The sizes of a BERT encoder; the defaults are BERT-base's."""

    def __init__(self, vocab_size=30522, hidden_size=768, num_hidden_layers=12,
                 num_attention_heads=12, intermediate_size=3072, hidden_dropout_prob=0.1,
                 attention_probs_dropout_prob=0.1, max_position_embeddings=512,
                 type_vocab_size=2, initializer_range=0.02):
        if hidden_size % num_attention_heads:
            raise ValueError("hidden_size %d is not a multiple of num_attention_heads %d"
                             % (hidden_size, num_attention_heads))
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.initializer_range = initializer_range

    @classmethod
    def tiny(cls, **overrides):
        """A CPU-sized BERT (4 layers, hidden 64): the tutorials' default."""
        sizes = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=4,
                     num_attention_heads=4, intermediate_size=256, max_position_embeddings=128)
        sizes.update(overrides)
        return cls(**sizes)

    def __repr__(self):
        return "BertConfig(%s)" % ", ".join("%s=%r" % item for item in sorted(vars(self).items()))


def _initializer(config):
    return tf.truncated_normal_initializer(stddev=config.initializer_range)


def _dropout(x, rate, is_training):
    """Dropout only while training and only when it does something."""
    return tf.nn.dropout(x, rate=rate) if is_training and rate > 0 else x


def layer_norm(x, name):
    """Layer normalization over the last axis (BERT's epsilon)."""
    with tf.variable_scope(name):
        width = x.shape[-1].value
        gamma = tf.get_variable("gamma", [width], initializer=tf.ones_initializer())
        beta = tf.get_variable("beta", [width], initializer=tf.zeros_initializer())
        mean, variance = tf.nn.moments(x, [-1], keep_dims=True)
        return (x - mean) * tf.rsqrt(variance + 1e-12) * gamma + beta


def gelu(x):
    """BERT's tanh approximation of GELU."""
    return 0.5 * x * (1.0 + tf.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * tf.pow(x, 3))))


def embeddings(input_ids, segment_ids, config, is_training):
    """Word + position + segment embeddings, normalized: [batch, seq, hidden].

    ``tf.gather`` gives the word table a sparse (IndexedSlices) gradient, as on GPUs.
    """
    seq_length = input_ids.shape[1].value
    if seq_length > config.max_position_embeddings:
        raise ValueError("sequence length %d > max_position_embeddings %d"
                         % (seq_length, config.max_position_embeddings))
    with tf.variable_scope("embeddings"):
        init = _initializer(config)
        words = tf.get_variable("word_embeddings", [config.vocab_size, config.hidden_size],
                                initializer=init)
        positions = tf.get_variable("position_embeddings",
                                    [config.max_position_embeddings, config.hidden_size],
                                    initializer=init)
        segments = tf.get_variable("token_type_embeddings",
                                   [config.type_vocab_size, config.hidden_size],
                                   initializer=init)
        out = (tf.gather(words, input_ids) + positions[None, :seq_length]
               + tf.gather(segments, segment_ids))
        return _dropout(layer_norm(out, "LayerNorm"), config.hidden_dropout_prob, is_training)


def attention_bias(input_mask):
    """[batch, 1, 1, seq]: 0 where a key is a real token, -10000 where it is padding."""
    mask = tf.cast(input_mask, tf.float32)
    return (1.0 - mask[:, None, None, :]) * -10000.0


def self_attention(x, bias, config, is_training):
    """Multi-head self-attention over the sequence, then the output projection."""
    seq_length, width = x.shape[1].value, config.hidden_size
    heads = config.num_attention_heads
    size = width // heads
    init = _initializer(config)

    def project(name):
        t = tf.layers.dense(x, width, kernel_initializer=init, name=name)
        return tf.transpose(tf.reshape(t, [-1, seq_length, heads, size]), [0, 2, 1, 3])

    query, key, value = project("query"), project("key"), project("value")
    scores = tf.matmul(query, key, transpose_b=True) / math.sqrt(size) + bias
    probs = _dropout(tf.nn.softmax(scores), config.attention_probs_dropout_prob, is_training)
    context = tf.transpose(tf.matmul(probs, value), [0, 2, 1, 3])
    context = tf.reshape(context, [-1, seq_length, width])
    return tf.layers.dense(context, width, kernel_initializer=init, name="output")


def transformer_layer(x, bias, config, is_training, index):
    """One post-norm encoder layer: attention + residual + norm, GELU FFN + residual + norm."""
    init = _initializer(config)
    with tf.variable_scope("layer_%d" % index):
        with tf.variable_scope("attention"):
            attended = self_attention(x, bias, config, is_training)
            x = layer_norm(x + _dropout(attended, config.hidden_dropout_prob, is_training),
                           "LayerNorm")
        with tf.variable_scope("ffn"):
            h = tf.layers.dense(x, config.intermediate_size, activation=gelu,
                                kernel_initializer=init, name="intermediate")
            h = tf.layers.dense(h, config.hidden_size, kernel_initializer=init, name="output")
            return layer_norm(x + _dropout(h, config.hidden_dropout_prob, is_training),
                              "LayerNorm")


def squad_logits(sequence_output, input_mask, config):
    """Start and end logits per position: [batch, seq] each.

    Padding positions get -10000 so that neither the loss nor a prediction can pick
    them; BERT's ``run_squad.py`` leaves that to post-processing instead.
    """
    logits = tf.layers.dense(sequence_output, 2, kernel_initializer=_initializer(config),
                             name="squad_output")
    padding = (1.0 - tf.cast(input_mask, tf.float32)) * -10000.0
    start_logits, end_logits = tf.unstack(logits, axis=-1)
    return start_logits + padding, end_logits + padding


def squad_loss(start_logits, end_logits, start_positions, end_positions):
    """The mean of the start and end cross-entropies, as in BERT's SQuAD fine-tuning."""
    start = tf.losses.sparse_softmax_cross_entropy(start_positions, start_logits)
    end = tf.losses.sparse_softmax_cross_entropy(end_positions, end_logits)
    return (start + end) / 2.0


def stage_layers(num_layers, num_stages):
    """Split layer indices into ``num_stages`` contiguous, nearly equal runs.

    >>> stage_layers(4, 2)
    [[0, 1], [2, 3]]
    """
    if not 1 <= num_stages <= num_layers:
        raise ValueError("num_stages must be in 1..%d (the number of layers), got %d"
                         % (num_layers, num_stages))
    return [list(range(s * num_layers // num_stages, (s + 1) * num_layers // num_stages))
            for s in range(num_stages)]


def _no_scope(index):
    del index
    return contextlib.nullcontext()


def build_squad_model(features, config, is_training=True, num_stages=1, stage_scope=None):
    """Build the encoder, span head and loss from a batch of SQuAD features.

    ``features`` holds ``input_ids``, ``input_mask``, ``segment_ids`` ([batch, seq]) and
    ``start_positions``, ``end_positions`` ([batch]). The embeddings join stage 0, the
    layers are split evenly over the stages (:func:`stage_layers`) and the head and loss
    join the last stage, each stage built inside ``stage_scope(stage)``. Returns a
    :class:`SquadModel`.
    """
    stage_scope = stage_scope or _no_scope
    bias = None
    with tf.variable_scope("bert"):
        for stage, layers in enumerate(stage_layers(config.num_hidden_layers, num_stages)):
            with stage_scope(stage):
                if stage == 0:
                    x = embeddings(features["input_ids"], features["segment_ids"], config,
                                   is_training)
                    bias = attention_bias(features["input_mask"])
                for index in layers:
                    x = transformer_layer(x, bias, config, is_training, index)
                if stage == num_stages - 1:
                    start_logits, end_logits = squad_logits(x, features["input_mask"], config)
                    loss = squad_loss(start_logits, end_logits, features["start_positions"],
                                      features["end_positions"])
    return SquadModel(loss, start_logits, end_logits)
