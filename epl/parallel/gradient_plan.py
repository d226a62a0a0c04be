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
* ``all_gather``: sparse (IndexedSlices) gradients, values and indices gathered;
* ``accumulated_sparse``: sparse gradients under gradient accumulation, reduced
  densely once per apply (replicas touch different rows);
* ``local``: a group of one device, nothing to communicate.

* ``reduce_scatter``: ZeRO v1 and v2, buffers laid out by ``owner``
  (:func:`epl.buckets.owner_chunks`); each member receives only its own
  variables' reduced gradients. v1 reduces one buffer; v2 one per bucket of
  ``bucket_of`` (``communication.max_splits`` buckets, each balanced over the
  owners), each reduced as soon as its gradients exist.
"""
import collections

from epl.buckets import plan_buckets
from epl.parallel.mesh import Group

ALL_REDUCE, ALL_GATHER, ACCUMULATED_SPARSE, LOCAL, REDUCE_SCATTER = (
    "all_reduce", "all_gather", "accumulated_sparse", "local", "reduce_scatter")

GradientInfo = collections.namedtuple(
    "GradientInfo", ["name", "taskgraph", "sparse", "nbytes", "dtype", "order"])
GradientInfo.__doc__ = """Static facts about one variable's gradient: variable name,
TaskGraph, IndexedSlices or not, bytes (dense; None when only known per copy, as for a
shard: such a gradient is reduced on its own, unfused), dtype name, production order."""


class Entry(collections.namedtuple("Entry", [
        "name", "group", "bucket", "reduction", "accumulate", "divisor", "mean", "owner"])):
    """The plan of one variable's gradient in one copy.

    ``group`` is the plan Group that reduces it; ``bucket`` its fused bucket
    within that group (None for sparse); ``divisor`` what the local sum is
    divided by before the collective (micro-batches x accumulation steps for
    "mean", else 1); ``mean`` whether the collective divides by the group size;
    ``owner`` the group rank that applies the update (None: every member).
    """

    __slots__ = ()

    def __str__(self):
        where = "bucket %d" % self.bucket if self.bucket is not None else "unfused"
        extras = []
        if self.accumulate:
            extras.append("accumulated")
        if self.divisor != 1:
            extras.append("/%d" % self.divisor)
        if self.mean and self.reduction != LOCAL:
            extras.append("mean")
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
            if group.size == 1:
                reduction = LOCAL
            else:
                reduction = ACCUMULATED_SPARSE if accumulate else ALL_GATHER
            entries.append(Entry(info.name, group, None, reduction, accumulate, divisor,
                                 collective_mean, None))
    return GradientPlan(tuple(entries))


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
