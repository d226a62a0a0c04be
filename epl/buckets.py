"""Bucket planning for tensor fusion, pure Python (no TensorFlow).

Given tensors in the order backprop produces them, :func:`plan_buckets` cuts
them into at most ``max_splits`` contiguous buckets of one dtype and roughly
equal bytes, so the first bucket can be reduced while later gradients are
still being computed. The gradient plan (:mod:`epl.parallel.gradient_plan`)
and the reducer (:mod:`epl.communicators.reducer`) both use it; it sits on the
lowest floor so the planner stays unit-testable without importing TensorFlow.

:func:`sparse_reduction` is the same kind of choice for a sparse gradient: gather
its rows or all-reduce it as a dense buffer, by the bytes either moves.

Example::

    >>> plan_buckets([4, 4, 8], ["float32"] * 3, 2)
    [[0, 1], [2]]
"""
from epl.checks import check_count

SPARSE_GATHER, SPARSE_ALL_REDUCE, SPARSE_AUTO = "gather", "all_reduce", "auto"


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


def owner_chunks(sizes, owners, members):
    """Layout of one ZeRO bucket, split by owner: (chunk, by_owner).

    A reduce-scatter hands member r the r-th equal chunk of a buffer and an
    all-gather concatenates equal chunks, so the buffer is laid out by owner:
    chunk r holds the items member r owns (indices ``by_owner[r]``, in bucket
    order), then zeros up to ``chunk``, the largest member's share (in elements).
    Each member thus receives its own variables' elements and padding only.

    >>> owner_chunks([4, 2, 3], [1, 0, 1], 2)
    (7, [[1], [0, 2]])
    """
    by_owner = [[i for i, owner in enumerate(owners) if owner == rank]
                for rank in range(members)]
    chunk = max(sum(sizes[i] for i in owned) for owned in by_owner) if sizes else 0
    return chunk, by_owner


def sparse_reduction(choice, table_shape, value_bytes, index_bytes, rows, group_size,
                     runs=1, accumulated=False):
    """(``gather`` or ``all_reduce``, why) for one sparse gradient
    (:mod:`epl.communicators.sparse` builds either); pure arithmetic.

    ``choice`` is ``communication.sparse_reduction``; "auto" compares the bytes a
    member receives: a gather of ``rows`` static rows per micro-batch times ``runs``
    (micro-batches and accumulated runs; ``accumulated`` ones are summed into the
    touched rows, at most the table's) from each other member, against a ring
    all-reduce of the table and its touch counts, ``2 (n - 1) / n`` of their size.
    Unknown rows (the usual case for SparseTensor features) keep the gather: its
    cost follows the batch, the all-reduce's the table.
    """
    if choice != SPARSE_AUTO:
        return choice, ""
    table_rows, row_elements = table_shape[0], 1
    for dim in table_shape[1:]:
        row_elements *= dim
    if rows is None:
        return SPARSE_GATHER, "auto: rows per step unknown until run time"
    rows *= runs
    if accumulated:
        rows = min(table_rows, rows)
    gather = (group_size - 1) * rows * (row_elements * value_bytes + index_bytes)
    reduce_ = 2.0 * (group_size - 1) / group_size * table_rows * (row_elements + 1) * value_bytes
    if reduce_ < gather:
        return SPARSE_ALL_REDUCE, "auto: all-reduce %d B < gather %d B" % (reduce_, gather)
    return SPARSE_GATHER, "auto: gather %d B <= all-reduce %d B" % (gather, reduce_)
