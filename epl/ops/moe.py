"""A Mixture-of-Experts layer (top-1 gating with capacity) written in the einsum pattern.

``moe_layer`` builds the gate in the current (replicated) scope and the
experts' variables inside ``split`` (an ``epl.split(N)`` strategy), so with N
devices each holds E/N experts and tokens travel to their expert and back by
all-to-all (see :mod:`epl.ops.experts`). With ``split=None`` it is the same
layer unsplit, which is what equivalence tests compare against.

Gating (Switch-style): each token goes to its most probable expert, at most
``capacity = ceil(capacity_factor * S / E)`` tokens per expert and group (the
rest are dropped: their output is zero). The auxiliary load-balancing loss is
``E * sum_e(fraction of tokens routed to e * mean gate probability of e)``,
averaged over groups; it is 1 for a perfectly balanced router.
"""
import contextlib
import math

from epl.tf_adapter import tf


@contextlib.contextmanager
def _nothing():
    yield


def _gating(tokens, gate, num_experts, capacity):
    """(dispatch [G,S,E,C], combine [G,S,E,C], aux loss) for tokens [G,S,M]."""
    probabilities = tf.nn.softmax(tf.einsum("GSM,ME->GSE", tokens, gate))
    chosen = tf.argmax(probabilities, axis=-1, output_type=tf.int32)
    mask = tf.one_hot(chosen, num_experts, dtype=tokens.dtype)                 # [G,S,E]
    position = tf.cumsum(mask, axis=1, exclusive=True) * mask                  # [G,S,E]
    keep = mask * tf.cast(position < capacity, tokens.dtype)
    slot = tf.one_hot(tf.cast(position, tf.int32), capacity, dtype=tokens.dtype)  # [G,S,E,C]
    dispatch = slot * keep[..., None]
    weight = tf.reduce_sum(probabilities * mask, axis=-1)                      # [G,S]
    combine = dispatch * weight[..., None, None]
    routed = tf.reduce_mean(mask, axis=1)                                      # [G,E]
    mean_probability = tf.reduce_mean(probabilities, axis=1)                   # [G,E]
    aux = num_experts * tf.reduce_mean(tf.reduce_sum(routed * mean_probability, axis=-1))
    return dispatch, combine, aux


def moe_layer(tokens, num_experts, hidden, split=None, capacity_factor=1.0,
              activation=tf.nn.relu, initializer=None, name="moe"):
    """Returns (output [G,S,M], auxiliary loss) for ``tokens`` [G, S, M]."""
    shape = tokens.shape.as_list()
    if len(shape) != 3 or shape[1] is None or shape[2] is None:
        raise ValueError("moe_layer %r needs tokens of shape [groups, tokens, width] with static "
                         "tokens and width, got %s" % (name, tokens.shape))
    _, length, width = shape
    capacity = int(math.ceil(capacity_factor * length / float(num_experts)))
    with tf.variable_scope(name):
        gate = tf.get_variable("gate", [width, num_experts], initializer=initializer)
        with split if split is not None else _nothing():
            w_in = tf.get_variable("w_in", [num_experts, width, hidden], initializer=initializer)
            w_out = tf.get_variable("w_out", [num_experts, hidden, width],
                                    initializer=initializer)
        dispatch, combine, aux = _gating(tokens, gate, num_experts, capacity)
        expert_inputs = tf.einsum("GSEC,GSM->EGCM", dispatch, tokens)
        hidden_units = activation(tf.einsum("EGCM,EMH->EGCH", expert_inputs, w_in))
        expert_outputs = tf.einsum("EGCH,EHM->EGCM", hidden_units, w_out)
        output = tf.einsum("GSEC,EGCM->GSM", combine, expert_outputs)
    return output, aux
