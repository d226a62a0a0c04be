"""The gradient plan: what happens to each variable's gradient, as plain data.

For every variable a copy trains, the plan says which communication group
reduces its gradient, in which fused bucket, with which collective, whether it
is accumulated over session runs (gradient accumulation), and by how much it is
scaled. It is computed from static facts only (shapes, dtypes, the order in
which backprop produced the gradients, the plan's groups and the config), so it
is identical on every member of a group and unit-testable without TensorFlow.
:mod:`epl.parallel.passes.gradients` lowers it into ops in small steps.

Reductions:

* ``all_reduce``: dense gradients, fused into buckets (``communication.max_splits``);
* ``all_gather``: sparse (IndexedSlices) gradients, values and indices gathered
  (each member's own number of rows); under gradient accumulation the touched
  rows of the accumulated sum, once per apply;
* ``rows_all_reduce``: sparse gradients added into a dense buffer with per-row
  touch counts, both all-reduced, the touched rows released
  (``communication.sparse_reduction``, :func:`epl.buckets.sparse_reduction`);
* ``local``: a group of one device, nothing to communicate;
* ``shared_device`` (listed in ``program.gradient_plans`` only): a copy of a TaskGraph
  narrower than its replica that shares its device with an earlier copy; it builds no
  collective and reads that copy's result, which combined theirs first.

* ``reduce_scatter``: ZeRO v1 and v2, buffers laid out by ``owner``
  (:func:`epl.buckets.owner_chunks`); each member receives only its own
  variables' reduced gradients. v1 reduces one buffer; v2 one per bucket of
  ``bucket_of`` (``communication.max_splits`` buckets, each balanced over the
  owners), each reduced as soon as its gradients exist.
"""
import collections

from epl.buckets import (SPARSE_ALL_REDUCE, SPARSE_AUTO, SPARSE_GATHER, plan_buckets,
                         sparse_reduction)
from epl.parallel.mesh import Group

ALL_REDUCE, ALL_GATHER, ROWS_ALL_REDUCE, LOCAL, REDUCE_SCATTER, SHARED_DEVICE = (
    "all_reduce", "all_gather", "rows_all_reduce", "local", "reduce_scatter", "shared_device")

GradientInfo = collections.namedtuple(
    "GradientInfo", ["name", "taskgraph", "sparse", "nbytes", "dtype", "order", "shape",
                     "rows", "index_bytes"])
GradientInfo.__new__.__defaults__ = (None, None, 8)
GradientInfo.__doc__ = """Static facts about one variable's gradient: variable name,
TaskGraph, IndexedSlices or not, bytes (dense; None when only known per copy, as for a
shard: such a gradient is reduced on its own, unfused), dtype name, production order;
for sparse ones the variable's static shape, the static rows of one micro-batch's
gradient (None: known at run time only) and the bytes of one index."""


class Entry(collections.namedtuple("Entry", [
        "name", "group", "bucket", "reduction", "accumulate", "divisor", "mean", "owner",
        "why"])):
    """The plan of one variable's gradient in one copy.

    ``group`` is the plan Group that reduces it; ``bucket`` its fused bucket
    within that group (None for sparse); ``divisor`` what the local sum is
    divided by before the collective (micro-batches x accumulation steps for
    "mean", else 1); ``mean`` whether the collective divides by the group size;
    ``owner`` the group rank that applies the update (None: every member);
    ``why`` the reason for a sparse gradient's reduction (plan print).
    """

    __slots__ = ()

    def __new__(cls, name, group, bucket, reduction, accumulate, divisor, mean, owner,
                why=""):
        return super(Entry, cls).__new__(cls, name, group, bucket, reduction, accumulate,
                                         divisor, mean, owner, why)

    def __str__(self):
        if self.reduction == SHARED_DEVICE:
            return "%s: %s (%s)" % (self.name, self.reduction, self.why)
        where = "bucket %d" % self.bucket if self.bucket is not None else "unfused"
        extras = []
        if self.accumulate:
            extras.append("accumulated")
        if self.divisor != 1:
            extras.append("/%d" % self.divisor)
        if self.mean and self.reduction != LOCAL:
            extras.append("mean")
        if self.why:
            extras.append(self.why)
        return "%s: %s %s over %s%s" % (self.name, self.reduction, where, self.group.name,
                                        " (%s)" % ", ".join(extras) if extras else "")


class GradientPlan(collections.namedtuple("GradientPlan", ["entries"])):
    """Entries in reduction order (per group: bucket order, then sparse ones)."""

    __slots__ = ()

    def buckets(self):
        """{(group name, bucket): [entries]} of the fused dense reductions, in order."""
        result = collections.OrderedDict()
        for entry in self.entries:
            if entry.reduction == ALL_REDUCE:
                result.setdefault((entry.group.name, entry.bucket), []).append(entry)
        return result

    def entry(self, name):
        for entry in self.entries:
            if entry.name == name:
                return entry
        raise KeyError(name)

    def __str__(self):
        return "\n".join(str(entry) for entry in self.entries)


def shared_device_entry(entry, leader):
    """What a copy that shares its device with copy ``leader`` does with ``entry``'s
    gradient: no collective; it reads the leader's result."""
    return entry._replace(reduction=SHARED_DEVICE, bucket=None, why=(
        "no collective: reads copy %d's result, the gradients of the copies on this device "
        "combined, then %s" % (leader, entry.reduction)))


def describe_sparse(plans):
    """The plan print's lines on sparse gradients (copy 0's plan): how each is reduced
    and, under ``communication.sparse_reduction: auto``, why."""
    return ["  sparse gradient " + str(entry) for plan in plans[:1] for entry in plan.entries
            if entry.reduction in (ALL_GATHER, ROWS_ALL_REDUCE)]


def plan_gradients(infos, group_of, comm_config, micro_batches=1, accumulation_steps=1,
                   owner_of=None, bucket_of=None):
    """The gradient plan of one copy.

    Args:
      infos: GradientInfo per trained variable.
      group_of: function(info) -> this copy's data-parallel Group for that variable, or
        (Group, shards): also divide by ``shards`` (for "mean"). A shard of a split
        layer is trained by all ``shards`` copies of its replica at once (their
        losses reach it through the layer's collectives), so its gradient is
        ``shards`` times the gradient of the mean loss.
      comm_config: the ``communication`` config section.
      micro_batches: pipeline micro-batches summed before the reduction.
      accumulation_steps: runs accumulated per apply (gradient accumulation).
      owner_of: ZeRO v1/v2 {variable name: owner rank}: dense gradients are
        reduce-scattered to their owners instead of all-reduced.
      bucket_of: ZeRO v2 {variable name: bucket number}, decided with the owners
        (:func:`epl.runtime.zero.bucket_owner_devices`); None: one bucket (v1).
    """
    mean = comm_config.gradients_reduce_method == "mean"
    accumulate = accumulation_steps > 1
    by_group = collections.OrderedDict()
    for info in sorted(infos, key=lambda i: (i.order, i.name)):
        group, replicas = _group_and_replicas(group_of(info))
        by_group.setdefault((group, replicas), []).append(info)
    entries = []
    for (group, shards), members in by_group.items():
        divisor = micro_batches * accumulation_steps * (shards or 1) if mean else 1
        collective_mean = mean
        dense = [i for i in members if not i.sparse and i.nbytes is not None]
        for info in (i for i in members if not i.sparse and i.nbytes is None):
            entries.append(Entry(info.name, group, None, ALL_REDUCE if group.size > 1 else LOCAL,
                                 accumulate, divisor, collective_mean, None))
        if owner_of is not None and group.size > 1:
            entries += [Entry(i.name, group, (bucket_of or {}).get(i.name, 0), REDUCE_SCATTER,
                              accumulate, divisor, collective_mean, owner_of[i.name])
                        for i in dense]
            dense = []
        for info, bucket in zip(dense, _bucket_of(dense, comm_config.max_splits)):
            reduction = ALL_REDUCE if group.size > 1 else LOCAL
            entries.append(Entry(info.name, group, bucket if group.size > 1 else None,
                                 reduction, accumulate, divisor, collective_mean, None))
        for info in (i for i in members if i.sparse):
            reduction, why = LOCAL, ""
            if group.size > 1:
                reduction, why = _sparse_reduction(info, group, comm_config,
                                                   micro_batches * accumulation_steps,
                                                   accumulate)
            entries.append(Entry(info.name, group, None, reduction, accumulate, divisor,
                                 collective_mean, None, why))
    return GradientPlan(tuple(entries))


def _sparse_reduction(info, group, comm_config, runs, accumulated):
    """ALL_GATHER or ROWS_ALL_REDUCE for a sparse gradient summed over ``runs``
    micro-batches and (``accumulated``) runs, and why."""
    choice = comm_config.sparse_reduction
    if info.shape is None or None in info.shape:
        if choice == SPARSE_ALL_REDUCE:
            raise ValueError("communication.sparse_reduction='all_reduce' needs the static "
                             "shape of %s, which is %s; use 'gather' or 'auto'"
                             % (info.name, info.shape))
        return ALL_GATHER, ("variable shape unknown" if choice == SPARSE_AUTO else "")
    choice, why = sparse_reduction(
        choice, info.shape, _dtype_bytes(info.dtype), info.index_bytes, info.rows,
        group.size, runs, accumulated)
    return (ALL_GATHER if choice == SPARSE_GATHER else ROWS_ALL_REDUCE), why


def _dtype_bytes(name):
    """Bytes of a float dtype by name ("float16" -> 2, "bfloat16" -> 2)."""
    digits = "".join(c for c in name if c.isdigit())
    return int(digits) // 8 if digits else 4


def _group_and_replicas(found):
    return (found, None) if isinstance(found, Group) else found


def _bucket_of(dense, max_splits):
    """Bucket index of each dense gradient (contiguous, one dtype per bucket)."""
    buckets = plan_buckets([i.nbytes for i in dense], [i.dtype for i in dense], max_splits)
    index = {}
    for number, members in enumerate(buckets):
        for position in members:
            index[position] = number
    return [index[position] for position in range(len(dense))]
