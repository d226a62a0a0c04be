"""Device layout math as pure functions (no TensorFlow, no globals).

A device is a ``(worker, local_index)`` pair here; :class:`epl.cluster.Cluster`
turns pairs into TF device strings. Keeping the math on plain tuples is what
lets us test layouts for clusters of hundreds of devices in microseconds.

Example: two pipeline stages of one device each on one worker with 4 devices::

    >>> replica_layout(1, 4, [1, 1])
    [[((0, 0),), ((0, 1),)], [((0, 2),), ((0, 3),)]]

Replica 0 runs stage 0 on device 0 and stage 1 on device 1; replica 1 uses
devices 2 and 3.
"""
from epl.checks import check_count


class LayoutError(ValueError):
    """A requested layout cannot be built on the available devices."""


def ordered_devices(worker_num, devices_per_worker, prefer_intra_node=True):
    """All devices of the job in the order replicas consume them.

    Row order (``prefer_intra_node=True``) walks one worker's devices before
    the next worker's, so consecutive devices, and therefore one model replica,
    stay inside a node. Column order takes device 0 of every worker first, so a
    model replica spreads across nodes and data parallelism stays intra-node.
    """
    _check_positive("worker_num", worker_num)
    _check_positive("devices_per_worker", devices_per_worker)
    if prefer_intra_node:
        return [(w, d) for w in range(worker_num) for d in range(devices_per_worker)]
    return [(w, d) for d in range(devices_per_worker) for w in range(worker_num)]


def replica_layout(worker_num, devices_per_worker, device_counts,
                   prefer_intra_node=True, colocate=False, names=None):
    """Assign devices to every TaskGraph of every model replica.

    Args:
      worker_num, devices_per_worker: the job's shape.
      device_counts: devices one model replica needs for each TaskGraph, in
        TaskGraph order.
      prefer_intra_node: row vs column device order (see ordered_devices).
      colocate: ``cluster.colocate_split_and_replicate``; all TaskGraphs of a
        replica share one device group instead of taking consecutive slices.
      names: TaskGraph names, used only to make error messages concrete.

    Returns:
      ``layout[replica][taskgraph]`` = tuple of devices.
    """
    counts = [_device_count(c, i, names) for i, c in enumerate(device_counts)]
    if not counts:
        raise LayoutError("no TaskGraphs to place")
    devices = ordered_devices(worker_num, devices_per_worker, prefer_intra_node)
    per_replica = max(counts) if colocate else sum(counts)
    _check_fits(len(devices), per_replica, counts, worker_num, devices_per_worker,
                colocate, names)
    layout = []
    for start in range(0, len(devices), per_replica):
        group = devices[start:start + per_replica]
        layout.append(_split_group(group, counts, colocate))
    return layout


def _split_group(group, counts, colocate):
    """Slice one replica's device group into per-TaskGraph device tuples."""
    if colocate:
        return [tuple(group) for _ in counts]
    slices, offset = [], 0
    for count in counts:
        slices.append(tuple(group[offset:offset + count]))
        offset += count
    return slices


def _check_fits(total, per_replica, counts, worker_num, devices_per_worker, colocate, names):
    if colocate and len(set(counts)) > 1:
        parts = ", ".join("%s: %d" % (_tg_name(i, names), c) for i, c in enumerate(counts))
        raise LayoutError(
            "with cluster.colocate_split_and_replicate=True all TaskGraphs share one device "
            "group, so they need the same device_count; got %s" % parts)
    if total % per_replica == 0:
        return
    if colocate:
        need = "the largest TaskGraph needs %d devices per model replica" % per_replica
    else:
        parts = ", ".join("%s: %d" % (_tg_name(i, names), c) for i, c in enumerate(counts))
        need = "one model replica needs %d devices (%s)" % (per_replica, parts)
    raise LayoutError(
        "%s, but the job has %d devices (%d workers x %d devices); %d is not a "
        "multiple of %d. Layouts that fit: %s" % (
            need, total, worker_num, devices_per_worker, total, per_replica,
            "; ".join(fitting_layouts(total, counts, colocate))))


def fitting_layouts(total, counts, colocate):
    """What would fit ``total`` devices instead of ``counts`` (for error messages):
    the colocate key, one device_count k for every TaskGraph, or a device total."""
    options = []
    width = max(counts)
    if not colocate and len(set(counts)) == 1 and total % width == 0:
        options.append("cluster.colocate_split_and_replicate=True (every TaskGraph of a "
                       "replica on the same %d devices: %d model replica(s))"
                       % (width, total // width))
    per_copy = 1 if colocate else len(counts)
    widths = [k for k in range(1, total + 1) if total % (k * per_copy) == 0]
    if widths:
        options.append("device_count k in %s for every TaskGraph%s" % (
            widths, "" if colocate else " (each on k devices of its own)"))
    need = max(counts) if colocate else sum(counts)
    options.append("a job with a multiple of %d devices" % need)
    return options


def _device_count(count, index, names):
    return check_count(count, "%s's device_count" % _tg_name(index, names), LayoutError)


def _tg_name(index, names):
    if names and index < len(names) and names[index]:
        return "TaskGraph %d (%s)" % (index, names[index])
    return "TaskGraph %d" % index


def _check_positive(what, value):
    check_count(value, what, LayoutError)


def local_replicas(layout, taskgraph, worker):
    """Replica indices whose copy of ``taskgraph`` has a device on ``worker``."""
    return [r for r, replica in enumerate(layout)
            if any(w == worker for w, _ in replica[taskgraph])]
