"""Meshes, communication groups and per-copy records: pure functions of a layout.

A TaskGraph's devices form a mesh ``replica x position``: ``devices[r][j]`` is
position ``j`` of model replica ``r``. What a position means depends on the
TaskGraph's kind:

* replicate: every position holds a full copy of the weights and a slice of the
  replica's batch (``replicate(device_count=k)``), so the *data-parallel group*
  is every device of the TaskGraph;
* split: position ``j`` holds shard ``j`` of the weights. Shard ``j`` of every
  replica forms one data-parallel group, and the devices of one replica form its
  *split group* (the collectives inside split layers); the *all* group spans
  every device (outputs merged over the whole job).

Groups are values with stable names (identical on every worker), computed here
once, so that no pass builds a group name by formatting strings. A *copy* is
one set of ops EPL builds on a worker for one (replica, position); a
:class:`Copy` record says which, and on which device each TaskGraph of it runs.

Example::

    >>> groups = taskgraph_groups("head", "split", ((d0, d1), (d2, d3)), worker_of)
    >>> [g.name for g in groups]
    ['head/dp/shard0', 'head/dp/shard1', 'head/split/replica0', 'head/split/replica1',
     'head/sync/shard0', 'head/sync/shard1', 'head/all', 'head/sync']
"""
import collections

from epl.ir.taskgraph import REPLICATE, SPLIT  # noqa: F401  (the kinds, re-exported)

DP, SPLIT_GROUP, SYNC, HOSTS, ALL = "dp", "split", "sync", "hosts", "all"


class Group(collections.namedtuple("Group", ["name", "role", "index", "devices"])):
    """A communication group: a stable name, its role (dp, split, sync, hosts), the
    shard or replica it serves (``index``, None when there is one group of that
    role) and its devices in rank order."""

    __slots__ = ()

    @property
    def size(self):
        return len(self.devices)

    def lanes(self, count):
        """``count`` groups over the same devices with distinct names: independent
        communicators (``communication.num_communicators``) for one purpose."""
        if count == 1:
            return (self,)
        return tuple(Group("%s/lane%d" % (self.name, i), self.role, self.index, self.devices)
                     for i in range(count))

    def __str__(self):
        return "%s: %d device(s) [%s]" % (self.name, self.size, ", ".join(self.devices))


class Mesh(collections.namedtuple("Mesh", ["axes"])):
    """Named axes and their sizes, e.g. ``(("replica", 2), ("shard", 4))``."""

    __slots__ = ()

    @property
    def shape(self):
        return tuple(size for _, size in self.axes)

    @property
    def size(self):
        total = 1
        for _, size in self.axes:
            total *= size
        return total

    def __str__(self):
        return " x ".join("%s=%d" % axis for axis in self.axes)


class Copy(collections.namedtuple("Copy", ["index", "replica", "position", "devices"])):
    """One copy of the model that a worker builds.

    ``index`` is the local copy number (copy 0 is the user's own ops),
    ``replica`` the model replica, ``position`` the place inside the replica (the
    batch slice of ``replicate(device_count=k)`` or the shard of a split
    TaskGraph), ``devices[t]`` the device of TaskGraph ``t`` in this copy.
    """

    __slots__ = ()

    @property
    def shard(self):
        """Shard index of split TaskGraphs in this copy (the position)."""
        return self.position


def mesh_of(kind, devices):
    inner = "shard" if kind == SPLIT else "batch"
    return Mesh((("replica", len(devices)), (inner, len(devices[0]) if devices else 0)))


def one_per_worker(devices, worker_of):
    """The first of ``devices`` on each worker, in worker order: the members of a
    two-level broadcast (a collective between workers, then local copies)."""
    first = {}
    for device in devices:
        first.setdefault(worker_of[device], device)
    return tuple(first[w] for w in sorted(first))


def taskgraph_groups(name, kind, devices, worker_of):
    """Every communication group of one TaskGraph, in a fixed order."""
    everything = tuple(d for replica in devices for d in replica)
    if kind != SPLIT:
        return (Group("%s/dp" % name, DP, None, everything),
                Group("%s/sync" % name, SYNC, None, one_per_worker(everything, worker_of)))
    width = len(devices[0])
    shards = [tuple(replica[j] for replica in devices) for j in range(width)]
    groups = [Group("%s/dp/shard%d" % (name, j), DP, j, shard) for j, shard in enumerate(shards)]
    groups += [Group("%s/split/replica%d" % (name, r), SPLIT_GROUP, r, tuple(replica))
               for r, replica in enumerate(devices)]
    groups += [Group("%s/sync/shard%d" % (name, j), SYNC, j, one_per_worker(shard, worker_of))
               for j, shard in enumerate(shards)]
    groups.append(Group("%s/all" % name, ALL, None, everything))
    groups.append(Group("%s/sync" % name, SYNC, None, one_per_worker(everything, worker_of)))
    return tuple(groups)


def device_at(row, position, width):
    """The device of ``row`` (one replica's devices of a TaskGraph) that runs position
    ``position`` of a replica ``width`` copies wide: a TaskGraph as wide as the replica
    gives each position a device of its own; a narrower one (``width`` a multiple of
    its own) runs ``width // len(row)`` consecutive positions on each of its devices."""
    return row[position * len(row) // width]


def spmd_copies(layout_devices, worker, worker_of):
    """Copies of one worker: each worker builds the (replica, position) pairs whose
    first TaskGraph's device it owns; the copy runs position j of every TaskGraph (on
    the same devices when they are colocated, on each TaskGraph's own devices
    otherwise; a TaskGraph narrower than the replica on a device it shares with the
    neighbouring positions, see :func:`device_at`)."""
    width = max(len(tg[0]) for tg in layout_devices)
    copies = []
    for replica in range(len(layout_devices[0])):
        for position in range(width):
            devices = tuple(device_at(tg[replica], position, width) for tg in layout_devices)
            if worker_of[devices[0]] == worker:
                copies.append(Copy(len(copies), replica, position, devices))
    return copies


def sharing_copies(copies, taskgraph):
    """[[local copy indices]] of ``copies`` that run ``taskgraph`` on one device, for
    each device more than one copy shares (a TaskGraph narrower than its replica):
    their collectives take one member per device (TF's collectives hang with two
    members on one device), so they combine on the device first."""
    by_device = collections.OrderedDict()
    for index, copy in enumerate(copies):
        by_device.setdefault(copy.devices[taskgraph], []).append(index)
    return [members for members in by_device.values() if len(members) > 1]
