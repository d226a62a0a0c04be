"""Tensor fusion: pack gradients into a few buffers so each all-reduce moves more bytes.

``plan_buckets`` is pure: given tensors in the order backprop produces them,
it cuts them into at most ``max_splits`` contiguous buckets of one dtype and
roughly equal bytes, so the first bucket can be reduced while later
gradients are still being computed. ``pack``/``unpack`` use EPL's C++ ops
(``EplPack``/``EplUnpack``, one copy into one buffer) when the op library is
built, and the equivalent ``tf.concat``/``tf.split`` otherwise; both give
identical results.
"""
from epl.checks import check_count
from epl.communicators import library
from epl.tf_adapter import tf


def plan_buckets(sizes, dtypes, max_splits):
    """Contiguous buckets (lists of indices) for tensors of ``sizes`` bytes.

    Each bucket holds a single dtype. The count is at most ``max_splits``,
    unless the list has more dtype runs than that (a bucket never mixes
    dtypes). Empty input gives no buckets.
    """
    check_count(max_splits, "max_splits")
    if len(sizes) != len(dtypes):
        raise ValueError("sizes and dtypes differ in length")
    if not sizes:
        return []
    runs = _dtype_runs(dtypes)
    budget = max(max_splits, len(runs))
    run_bytes = [sum(sizes[i] for i in run) for run in runs]
    total = float(sum(run_bytes)) or 1.0
    extra = budget - len(runs)
    shares = [1 + int(extra * b / total) for b in run_bytes]
    for index in sorted(range(len(runs)), key=lambda i: -run_bytes[i])[:budget - sum(shares)]:
        shares[index] += 1
    buckets = []
    for run, share in zip(runs, shares):
        buckets.extend(_cut(run, sizes, min(share, len(run))))
    return buckets


def _dtype_runs(dtypes):
    runs = []
    for index, dtype in enumerate(dtypes):
        if runs and dtypes[runs[-1][-1]] == dtype:
            runs[-1].append(index)
        else:
            runs.append([index])
    return runs


def _cut(run, sizes, parts):
    """Split one dtype run into ``parts`` contiguous pieces of about equal bytes."""
    target = sum(sizes[i] for i in run) / float(parts)
    pieces, current, filled = [], [], 0.0
    for position, index in enumerate(run):
        current.append(index)
        filled += sizes[index]
        left_items = len(run) - position - 1
        left_pieces = parts - len(pieces) - 1
        if left_pieces > 0 and (filled >= target or left_items == left_pieces):
            pieces.append(current)
            current, filled = [], 0.0
    if current:
        pieces.append(current)
    return pieces


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
