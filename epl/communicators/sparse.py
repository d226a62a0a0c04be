"""Sparse (IndexedSlices) gradient reduction over one communicator.

Two ways, chosen per variable by the gradient plan
(``communication.sparse_reduction``, :func:`epl.buckets.sparse_reduction`):

* ``gather``: every member's rows, values and indices, concatenated in group
  order, so the optimizer's sparse update (which sums duplicate rows) sees
  exactly the rows of the global batch. Members hold different numbers of rows
  (hashed ids, SparseTensor features, ``unique``), so this is a variable-size
  all-gather (:meth:`Communicator.all_gather_v`). Values and indices travel
  together as one buffer of 32-bit words per row (:func:`pack_rows`): one
  exchange of row counts and one of data per variable; with
  ``communication.fp16`` the values travel as float16.
* ``all_reduce``: the rows are added into a dense buffer of the variable's shape
  plus a per-row touch count (:func:`scatter_rows`; gradient accumulation keeps
  both across runs anyway), both are all-reduced, and the touched rows are
  released as an IndexedSlices again: the optimizer still makes a sparse update
  of exactly the touched rows (unlike ``communication.sparse_as_dense``, which
  hands it a dense gradient), and the bytes moved no longer depend on the batch.

Example (one member, on ``device``)::

    reducer = SparseReducer(comm, mean=True)
    values, indices = reducer.gather(values, indices, device, "embedding")
"""
from epl.tf_adapter import tf

_WORD = tf.int32
_HALF_WIRE = (tf.float32, tf.float64)


class SparseReducer(object):
    """Reduces IndexedSlices-shaped gradients (values, indices) over ``communicator``."""

    def __init__(self, communicator, mean, fp16=False, fp16_scale=128.0):
        self.communicator = communicator
        self.mean = mean
        self.fp16 = fp16
        self.fp16_scale = float(fp16_scale)

    def gather(self, values, indices, device, name):
        """Every member's rows, concatenated in group order; mean divides the values."""
        comm = self.communicator
        dtype = values.dtype.base_dtype
        half = self.fp16 and dtype in _HALF_WIRE
        with tf.device(device), tf.name_scope("EPL_SPARSE"):
            if half:
                values = tf.cast(values * self.fp16_scale, tf.float16)
            words, layout = pack_rows([values, indices])
        words = comm.all_gather_v(words, device, "grad_rows/" + name)
        with tf.device(device), tf.name_scope("EPL_SPARSE"):
            values, indices = unpack_rows(words, layout)
            if half:
                values = tf.cast(values, dtype) / self.fp16_scale
            if self.mean:
                values = values / tf.cast(comm.group_size, values.dtype)
        return values, indices

    def reduce_rows(self, dense, touched, device, name):
        """(dense sum or mean over members, per-row touch counts summed over members)."""
        comm = self.communicator
        dense = comm.all_reduce(dense, device, "grad_dense/" + name, mean=self.mean)
        touched = comm.all_reduce(touched, device, "grad_touched/" + name, mean=False)
        return dense, touched


def scatter_rows(values, indices, shape):
    """(dense sum of the rows at ``indices``, per-row touch counts) for a variable of
    static ``shape``. ``scatter_nd`` sums duplicate indices, as the optimizers'
    own de-duplication does."""
    rows = shape.as_list()[0]
    where = tf.expand_dims(tf.cast(indices, tf.int64), 1)
    dense = tf.scatter_nd(where, values, shape)
    touched = tf.scatter_nd(where, tf.ones_like(indices, values.dtype), [rows])
    return dense, touched


def touched_rows(dense, touched, index_dtype):
    """(values, indices) of the rows of ``dense`` with a non-zero touch count."""
    rows = tf.where(touched > 0)[:, 0]
    return tf.gather(dense, rows), tf.cast(rows, index_dtype)


# ---- rows as 32-bit words ----------------------------------------------------------
def pack_rows(tensors):
    """One int32 tensor ``[rows, words]`` holding each tensor's row bytes side by side
    (tensors share dim 0 and have static inner shapes), and the layout that
    :func:`unpack_rows` needs. Every backend gathers int32 (TF's CPU collectives have
    no float16), and one buffer needs one exchange instead of one per tensor."""
    parts, layout = [], []
    for tensor in tensors:
        inner = tensor.shape[1:]
        if not inner.is_fully_defined():
            raise ValueError("sparse gradient rows need a static row shape; %s has shape %s"
                             % (tensor.name, tensor.shape))
        words = _to_words(tf.reshape(tensor, [-1, max(1, inner.num_elements())]))
        parts.append(words)
        layout.append((tensor.dtype.base_dtype, inner, words.shape[1].value))
    return (parts[0] if len(parts) == 1 else tf.concat(parts, 1)), layout


def unpack_rows(words, layout):
    """The tensors :func:`pack_rows` packed, with the gathered number of rows."""
    widths = [width for _, _, width in layout]
    parts = [words] if len(widths) == 1 else tf.split(words, widths, 1)
    result = []
    for part, (dtype, inner, _) in zip(parts, layout):
        elements = max(1, inner.num_elements())
        flat = _from_words(part, dtype, elements)
        result.append(tf.reshape(flat, [-1] + inner.as_list()))
        result[-1].set_shape(tf.TensorShape([None]).concatenate(inner))
    return result


def _to_words(flat):
    """[rows, n] of any 2-, 4- or 8-byte dtype -> [rows, words] int32."""
    size = flat.dtype.size
    if flat.dtype.base_dtype == _WORD:
        return flat
    if size == 4:
        return tf.bitcast(flat, _WORD)
    if size == 8:
        return tf.reshape(tf.bitcast(flat, _WORD), [-1, 2 * flat.shape[1].value])
    if size == 2:
        n = flat.shape[1].value
        if n % 2:
            flat = tf.pad(flat, [[0, 0], [0, 1]])
        return tf.bitcast(tf.reshape(flat, [-1, (n + 1) // 2, 2]), _WORD)
    raise ValueError("cannot send rows of dtype %s as 32-bit words" % flat.dtype.name)


def _from_words(words, dtype, n):
    """Inverse of :func:`_to_words` for ``n`` elements of ``dtype`` per row."""
    if dtype == _WORD:
        return words
    if dtype.size == 4:
        return tf.bitcast(words, dtype)
    if dtype.size == 8:
        return tf.bitcast(tf.reshape(words, [-1, n, 2]), dtype)
    halves = tf.reshape(tf.bitcast(words, dtype), [-1, n + n % 2])
    return halves[:, :n] if n % 2 else halves
