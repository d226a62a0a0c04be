"""Pure readers of a ``RunMetadata`` proto (a traced step): memory per device, run-time shapes.

Nothing here needs a session or a graph, so every function can be tested on a
hand-built proto::

    md = tf.RunMetadata()
    dev = md.step_stats.dev_stats.add(device="/device:CPU:0")
    node = dev.node_stats.add(node_name="MatMul")
    mem = node.memory.add(allocator_name="cpu")
    mem.allocation_records.add(alloc_micros=10, alloc_bytes=400)
    mem.allocation_records.add(alloc_micros=20, alloc_bytes=-400)
    device_memory_stats(md)["/device:CPU:0"].peak_bytes   # 400

How the numbers are obtained: a traced step (``RunOptions(trace_level=FULL_TRACE)``)
records, per node, every allocation (positive ``alloc_bytes``) and free
(negative) with its time. Sorting a device's records by time and summing them
gives the bytes in use over the step; the maximum is the step's peak. It counts
memory allocated *during* the step only: variables and other buffers that
outlive the step are reported separately, as the sum of the nodes'
``memory_stats.persistent_memory_size``.
"""
import collections

DeviceMemory = collections.namedtuple(
    "DeviceMemory",
    ["device", "peak_bytes", "peak_micros", "persistent_bytes", "num_allocations",
     "timeline", "top_ops"])
DeviceMemory.__doc__ = """Memory of one device in one traced step.

device: the device string of the ``dev_stats`` entry.
peak_bytes: maximum of the running sum of allocation records (bytes allocated during
    the step and alive at the same time).
peak_micros: when the peak was reached, in microseconds since the step start.
persistent_bytes: sum of ``persistent_memory_size`` of the device's nodes (variables,
    constants kept by kernels).
num_allocations: number of allocation records with positive bytes.
timeline: list of ``(micros since step start, bytes in use)`` after each record.
top_ops: up to ``top_k`` ``(node name, bytes allocated by it during the step)``, largest first.
"""


def _records(dev_stats):
    """(micros, bytes, node name) of each allocation record of a dev_stats entry, in order."""
    out = []
    for node in dev_stats.node_stats:
        for memory in node.memory:
            for record in memory.allocation_records:
                out.append((record.alloc_micros, record.alloc_bytes, node.node_name))
    return out


def _has_memory_info(dev_stats):
    """True if any node of the entry carries memory data or output descriptions.

    TF's host tracer adds entries such as ``/host:CPU`` that repeat the op
    timings of real devices with no memory data; they are left out.
    """
    for node in dev_stats.node_stats:
        if node.memory or node.output or node.HasField("memory_stats"):
            return True
    return False


def step_start_micros(run_metadata):
    """Start of the traced step: the earliest node start, else the earliest allocation record."""
    starts = [node.all_start_micros
              for dev in run_metadata.step_stats.dev_stats
              for node in dev.node_stats if node.all_start_micros > 0]
    if starts:
        return min(starts)
    micros = [rec[0] for dev in run_metadata.step_stats.dev_stats for rec in _records(dev)]
    return min(micros) if micros else 0


def bytes_in_use_timeline(records):
    """Running sum of ``(micros, bytes)`` records sorted by time.

    Returns ``(timeline, peak_bytes, peak_micros)`` where timeline is the list of
    ``(micros, bytes in use)`` after each record. Records with the same time keep
    their given order (a stable sort), so an allocation listed before a free at
    the same microsecond counts toward the peak.
    """
    timeline = []
    in_use = 0
    peak, peak_micros = 0, None
    for micros, num_bytes in sorted(records, key=lambda rec: rec[0]):
        in_use += num_bytes
        timeline.append((micros, in_use))
        if in_use > peak:
            peak, peak_micros = in_use, micros
    return timeline, peak, peak_micros


def _top_ops(records, top_k):
    allocated = collections.Counter()
    for _, num_bytes, name in records:
        if num_bytes > 0:
            allocated[name] += num_bytes
    ranked = sorted(allocated.items(), key=lambda item: (-item[1], item[0]))
    return ranked[:top_k]


def device_memory_stats(run_metadata, top_k=10):
    """Per-device memory of a traced step: ``OrderedDict(device -> DeviceMemory)``.

    Devices are sorted by name. Several ``dev_stats`` entries naming the same
    device (GPU streams, for example) are merged. Times are relative to
    ``step_start_micros(run_metadata)``.
    """
    start = step_start_micros(run_metadata)
    records = collections.defaultdict(list)
    persistent = collections.Counter()
    for dev in run_metadata.step_stats.dev_stats:
        if not _has_memory_info(dev):
            continue
        records[dev.device].extend(_records(dev))
        persistent[dev.device] += sum(node.memory_stats.persistent_memory_size
                                      for node in dev.node_stats)
    stats = collections.OrderedDict()
    for device in sorted(records):
        recs = records[device]
        timeline, peak, peak_micros = bytes_in_use_timeline([(m, b) for m, b, _ in recs])
        stats[device] = DeviceMemory(
            device=device,
            peak_bytes=peak,
            peak_micros=None if peak_micros is None else peak_micros - start,
            persistent_bytes=persistent[device],
            num_allocations=sum(1 for _, b, _ in recs if b > 0),
            timeline=[(m - start, b) for m, b in timeline],
            top_ops=_top_ops(recs, top_k))
    return stats


def alive_at_peak(run_metadata, device):
    """What fills a device's peak: ``[(node name, bytes)]`` that each node had allocated
    during the step and not yet freed when the device's running sum peaked, largest
    first (ties by name). ``device`` is matched as a suffix (``"device:CPU:1"``).

    ``device_memory_stats`` says how high the peak is; this says which tensors are alive
    there (records in ``bytes_in_use_timeline``'s order, up to the one that reached the
    peak, so the sizes add up to ``peak_bytes``), which is what comparing two schedules'
    peaks needs: the ZeroBubble analysis in docs/design.md was read off it.
    """
    records = []
    for dev in run_metadata.step_stats.dev_stats:
        if dev.device.endswith(device) and _has_memory_info(dev):
            records.extend(_records(dev))
    if not records:
        raise ValueError("no allocation records for a device named like %r in this "
                         "RunMetadata (traced with FULL_TRACE?)" % (device,))
    ordered = sorted(records, key=lambda rec: rec[0])   # stable, as in the timeline
    in_use, peak, peak_index = 0, 0, -1
    for index, (_, num_bytes, _) in enumerate(ordered):
        in_use += num_bytes
        if in_use > peak:
            peak, peak_index = in_use, index
    alive = collections.Counter()
    for _, num_bytes, name in ordered[:peak_index + 1]:
        alive[name] += num_bytes
    return sorted(((name, size) for name, size in alive.items() if size > 0),
                  key=lambda item: (-item[1], item[0]))


def memory_stats_to_dict(stats):
    """JSON-ready form of ``device_memory_stats``: device -> plain dict."""
    out = collections.OrderedDict()
    for device, mem in stats.items():
        out[device] = collections.OrderedDict([
            ("peak_bytes", mem.peak_bytes),
            ("peak_micros", mem.peak_micros),
            ("persistent_bytes", mem.persistent_bytes),
            ("num_allocations", mem.num_allocations),
            ("top_ops", [[name, num_bytes] for name, num_bytes in mem.top_ops]),
            ("timeline", [[micros, num_bytes] for micros, num_bytes in mem.timeline]),
        ])
    return out


def run_time_shapes(run_metadata):
    """Output shapes seen in a traced step: ``{node name: {slot: tuple of dims}}``.

    A node that ran several times with different shapes (in a loop, for
    example) gets ``None`` for that slot: it has no single shape.
    """
    shapes = {}
    for dev in run_metadata.step_stats.dev_stats:
        for node in dev.node_stats:
            for output in node.output:
                desc = output.tensor_description
                if desc.shape.unknown_rank:
                    continue
                dims = tuple(int(d.size) for d in desc.shape.dim)
                slots = shapes.setdefault(node.node_name, {})
                if output.slot in slots and slots[output.slot] != dims:
                    slots[output.slot] = None
                else:
                    slots[output.slot] = dims
    return shapes


def fed_shapes(run_metadata, tensor_names):
    """Shapes of fed tensors in a traced step: ``{tensor name: dims}`` for those found.

    A fed tensor does not appear under its own name: the session replaces it by
    an argument node that TensorFlow names after it (``_arg_x_0_0`` for ``x:0``
    in a local session, ``_recv_x_0`` in a distributed one). This is a
    best-effort reading of those names, used only for placeholders whose shape
    is otherwise unknown.
    """
    shapes = run_time_shapes(run_metadata)
    out = {}
    for tensor_name in tensor_names:
        key = tensor_name.replace(":", "_")
        for node_name, slots in shapes.items():
            dims = slots.get(0)
            if dims is None:
                continue
            if node_name == "_recv_" + key or (
                    node_name.startswith("_arg_" + key + "_")
                    and node_name[len("_arg_" + key + "_"):].isdigit()):
                out[tensor_name] = dims
                break
    return out


def executed_nodes(run_metadata):
    """Names of all nodes that ran in a traced step (on any device)."""
    return set(node.node_name
               for dev in run_metadata.step_stats.dev_stats for node in dev.node_stats)


def execution_counts(run_metadata):
    """How many times each node ran in a traced step (more than once inside loops).

    A node runs on one device, but a device can have several ``dev_stats``
    entries (GPU streams); the count is the largest over the entries.
    """
    counts = collections.Counter()
    for dev in run_metadata.step_stats.dev_stats:
        here = collections.Counter(node.node_name for node in dev.node_stats)
        for name, count in here.items():
            counts[name] = max(counts[name], count)
    return counts
