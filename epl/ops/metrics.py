"""Accuracy on sharded logits: argmax, top-k and equal over the replica's batch.

Each shard finds its best columns (offset by its first column), the shards'
candidates are all-gathered, and the best of them wins; ties go to the lowest
column index, as in the unsplit ``tf.argmax``. Results cover the replica's
whole batch, so ``tf.equal`` with this copy's labels all-gathers the labels.
"""
from epl.ops import intents
from epl.ops.losses import _bounds, gather_rows
from epl.ops.state import is_replica_level, shard_info, state, view_of
from epl.tf_adapter import tf


class SplitMetricError(ValueError):
    """A metric cannot be computed on sharded logits as asked."""


def argmax(logits, output_type=tf.int64, name=None):
    """Column of the largest logit of each row (replica batch)."""
    info = shard_info(logits)
    width = info.width
    split = state(logits.graph)
    with split.implementing(view_of(logits.graph)), tf.name_scope(name, "SplitArgMax"):
        start, _ = _bounds(info.full_shape[-1], width)
        local_max = tf.reduce_max(logits, axis=1)
        local_arg = tf.cast(tf.argmax(logits, axis=1, output_type=tf.int32) + start, tf.int64)
        maxima = intents.all_gather(tf.expand_dims(local_max, 0), width)     # [width, B]
        columns = intents.all_gather(tf.expand_dims(local_arg, 0), width)    # [width, B]
        winner = tf.argmax(maxima, axis=0, output_type=tf.int32)             # first max wins
        rows = tf.range(tf.shape(winner)[0], dtype=tf.int32)
        result = tf.stop_gradient(tf.cast(tf.gather_nd(columns, tf.stack([winner, rows], axis=1)),
                                          output_type))
    split.replica_level[result.name] = width
    return result


def top_k(logits, k=1, sorted=True, name=None):  # noqa: A002 (TF's argument name)
    """(values, indices) of the k largest logits of each row (replica batch)."""
    info = shard_info(logits)
    width, total = info.width, info.full_shape[-1]
    if k > total // width:
        raise SplitMetricError(
            "tf.math.top_k(k=%d) on logits split over %d shards of %s columns: k must be at "
            "most the smallest shard (%d)" % (k, width, total, total // width))
    split = state(logits.graph)
    with split.implementing(view_of(logits.graph)), tf.name_scope(name, "SplitTopK"):
        start, _ = _bounds(total, width)
        values, indices = tf.nn.top_k(logits, k=k, sorted=True)
        indices = tf.cast(indices, tf.int32) + start
        all_values = intents.all_gather(tf.expand_dims(values, 0), width)    # [w, B, k]
        all_indices = intents.all_gather(tf.expand_dims(indices, 0), width)  # [w, B, k]
        rows = tf.shape(values)[0]
        flat_values = tf.reshape(tf.transpose(all_values, [1, 0, 2]), [rows, width * k])
        flat_indices = tf.reshape(tf.transpose(all_indices, [1, 0, 2]), [rows, width * k])
        best, where = tf.nn.top_k(flat_values, k=k, sorted=sorted)
        chosen = tf.batch_gather(flat_indices, where)
    split.replica_level[best.name] = width
    split.replica_level[chosen.name] = width
    return best, chosen


def equal(x, y, name=None):
    """``tf.equal`` where one side covers the replica's batch: gather the other side."""
    replica_x, replica_y = is_replica_level(x), is_replica_level(y)
    if replica_x == replica_y:
        return None
    local, full = (y, x) if replica_x else (x, y)
    width = state(full.graph).replica_level[full.name]
    split = state(full.graph)
    with split.implementing(view_of(full.graph)):
        gathered = gather_rows(tf.reshape(tf.convert_to_tensor(local), [-1]), width)
        result = tf.equal(full, tf.cast(gathered, full.dtype), name=name) if replica_x else \
            tf.equal(tf.cast(gathered, full.dtype), full, name=name)
    split.replica_level[result.name] = width
    return result
