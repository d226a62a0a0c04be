"""Tensor fusion: pack gradients into a few buffers so each all-reduce moves more bytes.

Which tensors share a buffer is :func:`epl.buckets.plan_buckets` (pure, no
TensorFlow; re-exported here). ``pack``/``unpack`` use EPL's C++ ops
(``EplPack``/``EplUnpack``, one copy into one buffer) when the op library is
built, and the equivalent ``tf.concat``/``tf.split`` otherwise; both give
identical results.
"""
from epl.buckets import plan_buckets  # noqa: F401  (re-exported)
from epl.communicators import library
from epl.tf_adapter import tf


def pack(tensors):
    """One 1-D buffer holding every tensor's elements in order."""
    ops = library.load()
    if ops is not None and len(tensors) > 1:
        return ops.epl_pack(tensors)
    flat = [tf.reshape(t, [-1]) for t in tensors]
    return flat[0] if len(flat) == 1 else tf.concat(flat, 0)


def unpack(buffer, shapes):
    """Inverse of ``pack`` for tensors of the given static ``shapes``."""
    ops = library.load()
    if ops is not None and len(shapes) > 1:
        return ops.epl_unpack(buffer, shapes=shapes, N=len(shapes))
    sizes = [int(tf.TensorShape(s).num_elements()) for s in shapes]
    parts = [buffer] if len(sizes) == 1 else tf.split(buffer, sizes, 0)
    return [tf.reshape(p, s) for p, s in zip(parts, shapes)]
