"""Sparse softmax cross-entropy on sharded logits, never gathering the full logits.

For example i with label y_i and logits split in shards, with m_i the global
maximum (an all-gather of each shard's maximum), S_i the global sum of
exp(l - m) (an all-reduce) and t_i the label's shifted logit (found on the one
shard that holds it, all-reduced):

    loss_i = log(S_i) - t_i

The collectives carry exact gradients (an all-reduce's gradient is the
all-reduce of its output gradients), so every copy's loss reaches every shard:
the N copies of a replica all compute the replica's loss, and a shard's
gradient is N times the unsplit one, which the gradient plan divides out. The
maximum is a constant for the gradient (log-sum-exp does not depend on the
shift). The result is the loss of the unsplit layer for the replica's whole
batch (labels are all-gathered like the logits' rows).
"""
from epl.ops import intents
from epl.ops.state import shard_info, state, view_of
from epl.tf_adapter import tf


def _bounds(total, width):
    """This copy's (start, size) as tensors (its position is known per copy only)."""
    position = intents.position(width)
    base, extra = divmod(total, width)
    size = base + tf.cast(position < extra, tf.int32)
    start = position * base + tf.minimum(position, extra)
    return start, size


def per_example_loss(labels, logits):
    """[replica batch] losses of sharded ``logits`` for this copy's ``labels``."""
    info = shard_info(logits)
    width, total = info.width, info.full_shape[-1]
    dtype = logits.dtype
    all_labels = tf.stop_gradient(intents.all_gather(tf.reshape(labels, [-1]), width))
    start, size = _bounds(total, width)
    local_max = tf.reduce_max(logits, axis=1)
    maxima = intents.all_gather(tf.expand_dims(local_max, 0), width)
    shifted = logits - tf.stop_gradient(tf.reduce_max(maxima, axis=0))[:, None]
    total_sum = intents.all_reduce(tf.reduce_sum(tf.exp(shifted), axis=1), width)
    labels_i = tf.cast(all_labels, tf.int32) - start
    here = tf.logical_and(labels_i >= 0, labels_i < size)
    column = tf.clip_by_value(labels_i, 0, tf.maximum(size - 1, 0))
    picked = tf.reduce_sum(shifted * tf.one_hot(column, size, dtype=shifted.dtype), axis=1)
    target = intents.all_reduce(tf.where(here, picked, tf.zeros_like(picked)), width)
    return tf.cast(tf.log(total_sum) - target, dtype)


def gather_rows(tensor, width):
    """A per-copy tensor of the copy's batch rows, gathered to the replica's batch."""
    return tf.stop_gradient(intents.all_gather(tensor, width))


def sparse_softmax_cross_entropy(labels, logits, weights=1.0, scope=None,
                                 loss_collection=tf.GraphKeys.LOSSES,
                                 reduction=tf.losses.Reduction.SUM_BY_NONZERO_WEIGHTS):
    """``tf.losses.sparse_softmax_cross_entropy`` on sharded logits: the replica's loss."""
    width = shard_info(logits).width
    split = state(logits.graph)
    with split.implementing(view_of(logits.graph)):
        with tf.name_scope(scope, "sparse_softmax_cross_entropy_loss", (logits, labels)):
            losses = per_example_loss(labels, logits)
            if isinstance(weights, tf.Tensor) and weights.shape.ndims:
                weights = gather_rows(tf.reshape(weights, [-1]), width)
            loss = tf.losses.compute_weighted_loss(losses, weights, scope=None,
                                                   loss_collection=loss_collection,
                                                   reduction=reduction)
    split.replica_level[loss.name] = width
    return loss


def sparse_softmax_cross_entropy_with_logits(labels, logits, name=None):
    """``tf.nn.sparse_softmax_cross_entropy_with_logits`` on sharded logits: one loss per
    example of the replica's batch (the rows of every copy, in shard order)."""
    split = state(logits.graph)
    with split.implementing(view_of(logits.graph)):
        with tf.name_scope(name, "SparseSoftmaxCrossEntropyWithLogits", (logits, labels)):
            losses = per_example_loss(labels, logits)
    split.replica_level[losses.name] = shard_info(logits).width
    return losses
