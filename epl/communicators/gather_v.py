"""Variable-size all-gather: members contribute different numbers of rows.

Sparse gradients are the reason: an embedding lookup of a batch's ids gives an
IndexedSlices whose row count depends on the batch (hashed ids, SparseTensor
features, ``unique`` in ``embedding_lookup_sparse``), so each replica has its
own. TensorFlow's collective all-gather and NCCL's ``ncclAllGather`` need the
same shape on every member; a backend with a native variable-size all-gather
(``all_gather_v``) moves exactly the rows, and every other backend gets this
protocol, built from its fixed-size all-gather:

1. all-gather the row counts (one int32 per member);
2. pad this member's rows with zeros to the largest count;
3. all-gather the padded tensors (``size x padded`` rows, in group order);
4. keep the first ``count[i]`` rows of member i's block.

TensorFlow's collective ops fix the shape of a collective instance on its first
run (TF 1.15: "Inconsistent output shapes" on a later step with another size),
so for backends with ``static_shapes`` step 3 pads to a power of two instead,
``BUCKETS`` sizes from 16 to 2**24 rows, each its own collective: every member
takes the same one (all computed it from the same counts); the others are dead
in that step and do not run (:meth:`Communicator.step_op_names` gives what to wait
for instead). A tensor whose rows are static is gathered as is.

Example (one member, on ``device``)::

    rows = all_gather_v(comm, values, device, "grad_values/emb")
"""
from epl import tf_adapter
from epl.tf_adapter import tf

BUCKETS = tuple(2 ** k for k in range(4, 25))


def as_rows(tensor):
    """``tensor`` with rank >= 1 (dim 0 counts rows)."""
    if tensor.shape.ndims is None:
        raise ValueError("a variable-size all-gather needs a tensor of known rank: %s"
                         % tensor.name)
    return tf.reshape(tensor, [1]) if tensor.shape.ndims == 0 else tensor


def all_gather_v(comm, tensor, device, name):
    """Every member's ``tensor`` concatenated on dim 0 in group order; dim 0 may differ.

    ``comm`` is a :class:`epl.communicators.Communicator`; the collectives it
    builds are named ``name + "/rows"`` (the counts) and ``name + "/data..."``.
    """
    with tf.device(device), tf.name_scope("EPL_GATHER_V"):
        tensor = as_rows(tensor)
    if tensor.shape[0].value is not None:  # the same static rows on every member
        return comm.all_gather(tensor, device, name + "/data")
    with tf.device(device), tf.name_scope("EPL_GATHER_V"):
        count = tf.shape(tensor, out_type=tf.int32)[:1]
    counts = comm.all_gather(count, device, name + "/rows")
    with tf.device(device), tf.name_scope("EPL_GATHER_V"):
        most = tf.reduce_max(counts)
    if getattr(comm.backend, "static_shapes", False):
        gathered, padded = _bucketed(comm, tensor, count[0], most, device, name)
    else:
        with tf.device(device), tf.name_scope("EPL_GATHER_V"):
            padded_tensor = _pad(tensor, most - count[0])
        gathered, padded = comm.all_gather(padded_tensor, device, name + "/data"), most
    with tf.device(device), tf.name_scope("EPL_GATHER_V"):
        keep = tf.reshape(tf.sequence_mask(counts, padded), [-1])
        result = tf.boolean_mask(gathered, keep)
        result.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]))
        return result


def _pad(tensor, rows):
    """``tensor`` with ``rows`` rows of zeros appended."""
    padding = tf.concat([[[0, rows]], tf.zeros([tensor.shape.ndims - 1, 2], tf.int32)], 0)
    padded = tf.pad(tensor, padding)
    padded.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]))
    return padded


def _bucketed(comm, tensor, count, most, device, name):
    """(gathered rows, rows per member block): the rows padded to the smallest bucket
    that holds ``most``, gathered by that bucket's collective."""
    with tf.device(device), tf.name_scope("EPL_GATHER_V"):
        check = tf.debugging.assert_less_equal(
            most, BUCKETS[-1], message="EPL: a variable-size all-gather (%s) of more rows "
            "than its largest bucket (%d rows per member); set communication.sparse_reduction"
            "='all_reduce' for this model" % (name, BUCKETS[-1]))
        with tf.control_dependencies([check]):
            choice = tf.reduce_sum(tf.cast(most > tf.constant(BUCKETS), tf.int32))
        parts = []
    for index, size in enumerate(BUCKETS):
        with tf.device(device), tf.name_scope("EPL_GATHER_V"):
            live = tf_adapter.switch(tensor, tf.equal(choice, index))[1]
            padded = _pad(live, size - count)
            padded.set_shape(tf.TensorShape([size]).concatenate(tensor.shape[1:]))
        parts.append(comm.all_gather(padded, device, "%s/data%d" % (name, size)))
    with tf.device(device), tf.name_scope("EPL_GATHER_V"):
        gathered = tf_adapter.merge(parts)
    comm.gate([part.op.name for part in parts], gathered.op)
    with tf.device(device), tf.name_scope("EPL_GATHER_V"):
        return gathered, tf.shape(gathered, out_type=tf.int32)[0] // comm.size


def wire_rows(counts, native, static_shapes=False):
    """Rows each member receives in a variable-size all-gather of ``counts`` rows
    (per member): exactly the others' rows natively; ``(size - 1) x max`` padded, or
    ``x`` the bucket that holds ``max`` with ``static_shapes``."""
    if native:
        return [sum(counts) - own for own in counts]
    block = max(counts)
    if static_shapes:
        block = min(size for size in BUCKETS if size >= block)
    return [(len(counts) - 1) * block] * len(counts)
