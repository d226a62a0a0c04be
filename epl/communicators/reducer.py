"""Batched gradient all-reduce: fusion buckets, several communicators, fp16.

Example (one member, on ``device``)::

    reducer = GradientReducer([comm0, comm1], max_splits=5, fp16=False, fp16_scale=128,
                              mean=True)
    buckets = reducer.plan(grads)           # same on every member: static shapes only
    reduced = reducer.reduce(grads, device, buckets)

Bucket b goes to communicator ``b % len(communicators)``: independent groups,
so buckets need not wait for one another. With ``fp16`` each float bucket is
multiplied by ``fp16_scale``, sent as float16 and divided again, which halves
the bytes moved at a small precision cost. EPL's ring converts inside its
op (vectorized, no TF casts). Backends without a float16
all-reduce (TF's CPU collectives) all-gather the float16 payload, bit-cast to
int32, and sum it locally in the bucket's own precision: the same bytes per
worker as a float16 ring for two workers, and a more accurate sum.
"""
from epl.communicators.fusion import pack, plan_buckets, unpack
from epl.tf_adapter import tf

_COMPRESSIBLE = (tf.float32, tf.float64)


class GradientReducer(object):
    """All-reduces a list of dense tensors in fused buckets."""

    def __init__(self, communicators, max_splits, fp16, fp16_scale, mean):
        self.communicators = list(communicators)
        self.max_splits = max_splits
        self.fp16 = fp16
        self.fp16_scale = fp16_scale
        self.mean = mean

    def plan(self, tensors):
        """Buckets of indices from static shapes and dtypes (identical on all members)."""
        sizes, dtypes = [], []
        for tensor in tensors:
            if not tensor.shape.is_fully_defined():
                raise ValueError("gradient fusion needs static shapes; %s has shape %s"
                                 % (tensor.name, tensor.shape))
            sizes.append(tensor.shape.num_elements() * tensor.dtype.size)
            dtypes.append(tensor.dtype.base_dtype.name)
        return plan_buckets(sizes, dtypes, self.max_splits)

    def reduce(self, tensors, device, buckets, tag="grads"):
        """Reduced tensors, in the order of ``tensors``, built on ``device``."""
        reduced = [None] * len(tensors)
        for index, bucket in enumerate(buckets):
            comm = self.communicators[index % len(self.communicators)]
            members = [tensors[i] for i in bucket]
            name = "%s/bucket_%d" % (tag, index)
            with tf.device(device), tf.name_scope("EPL_FUSION"):
                buffer = pack(members)
            if self.fp16 and buffer.dtype.base_dtype in _COMPRESSIBLE:
                buffer = self._reduce_fp16(comm, buffer, device, name)
            else:
                buffer = comm.all_reduce(buffer, device, name, mean=self.mean)
            with tf.device(device), tf.name_scope("EPL_FUSION"):
                parts = unpack(buffer, [t.shape for t in members])
            for i, part in zip(bucket, parts):
                reduced[i] = part
        return reduced

    def _reduce_fp16(self, comm, buffer, device, name):
        dtype = buffer.dtype.base_dtype
        if getattr(comm.backend, "fp16_wire", False) and dtype == tf.float32:
            return comm.all_reduce_fp16_wire(buffer, device, name, self.mean, self.fp16_scale)
        if comm.backend.native_fp16:
            with tf.device(device), tf.name_scope("EPL_FP16"):
                half = tf.cast(buffer * self.fp16_scale, tf.float16)
            half = comm.all_reduce(half, device, name, mean=self.mean)
            with tf.device(device), tf.name_scope("EPL_FP16"):
                return tf.cast(half, dtype) / self.fp16_scale
        count = buffer.shape.num_elements()
        padded = count + count % 2
        with tf.device(device), tf.name_scope("EPL_FP16"):
            half = tf.cast(buffer * self.fp16_scale, tf.float16)
            if padded != count:
                half = tf.concat([half, tf.zeros([1], tf.float16)], 0)
            words = tf.bitcast(tf.reshape(half, [padded // 2, 2]), tf.int32)
        gathered = comm.all_gather(words, device, name)
        with tf.device(device), tf.name_scope("EPL_FP16"):
            halves = tf.reshape(tf.bitcast(gathered, tf.float16), [comm.group_size, padded])
            total = tf.reduce_sum(tf.cast(halves, dtype), axis=0)[:count]
            if self.mean:
                total = total / comm.group_size
            return total / self.fp16_scale
