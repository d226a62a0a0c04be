"""Memory per device before running: weights, gradients, optimizer slots, activations.

Why: a model that does not fit is otherwise found out at the first step, after
minutes of graph building and session start, with an allocator error that names
one tensor. The estimate answers "which saver, and how many devices?" first.

Two halves:

* a *profile* of the single-copy model (``Profile``): its variables, the forward
  activations the backward pass keeps, and the optimizer's temporaries, per
  TaskGraph, in forward order. It comes from a built TF graph
  (``profile_from_graph``, static shapes) or from a formula
  (``transformer_profile``, for the plan CLI and budget questions);
* ``estimate(profile, plan, config)``: pure arithmetic that spreads the profile
  over the plan's devices and applies every saver in ``config``.

Build-time savers (AMP's float16 ops, gradient checkpointing's recomputation, ZeRO's
owned slots) already show in a graph built with them; ``profile_from_graph`` reads
them. Rewrite-time savers (offload, grouped apply, ZeRO's partition of the slots,
gradient accumulation buffers) are applied by ``estimate``.

``epl.estimate_memory()`` estimates the step built in the default graph.

Example::

    plan = make_plan(Config(), Cluster(devices_per_worker=2), [TaskGraphSpec("tg", "replicate", 1)])
    profile = transformer_profile(layers=24, hidden=1024, heads=16, seq=512,
                                  intermediate=4096, vocab=30522, batch=8)
    print(estimate(profile, plan, Config({"zero.level": "v1"})))
"""
import collections

from epl.strategies.schedule import chunk_in_flight, peak_in_flight

_ALIASES = frozenset(["Identity", "Reshape", "ExpandDims", "Squeeze", "Snapshot", "StopGradient",
                      "RefIdentity", "ReadVariableOp"])
_VARIABLES = frozenset(["VariableV2", "Variable", "VarHandleOp", "Const", "VariableShape"])
_NOT_RECOMPUTE = frozenset(["ZerosLike", "OnesLike", "Shape", "ShapeN", "Size", "Rank"])
_FLOAT_NAMES = frozenset(["float16", "bfloat16", "float32", "float64"])
GIB = float(1 << 30)
MIB = float(1 << 20)


class MemoryEstimateError(ValueError):
    """The estimate cannot be made from what was given (says what is missing)."""


Variable = collections.namedtuple(
    "Variable", ["name", "nbytes", "trainable", "taskgraph", "position", "slot_bytes"])
Variable.__doc__ = """One model variable. ``position`` is the forward index of its first use
(its gradient exists from there backwards); ``slot_bytes`` its optimizer state (Adam: 2x)."""

Activation = collections.namedtuple("Activation", ["taskgraph", "position", "nbytes", "segment"])
Activation.__doc__ = """Forward bytes one micro-batch keeps for the backward pass. ``segment``
None: kept from its forward op to its backward op; an int: recomputed by gradient
checkpointing, alive only while that segment's backward runs."""

Profile = collections.namedtuple("Profile", ["variables", "activations", "apply_temporaries",
                                             "source", "notes"])
Profile.__doc__ = """The single-copy model's memory facts. ``apply_temporaries`` maps TaskGraph
-> bytes of optimizer temporaries if every variable were updated at once."""


class DeviceEstimate(collections.namedtuple("DeviceEstimate", [
        "device", "weights", "gradients", "slots", "accumulators", "activations",
        "temporaries", "peak"])):
    """Expected bytes on one device.

    weights, slots, accumulators: persistent (variables). gradients, activations,
    temporaries: each at its own maximum during a step. ``peak``: the most step
    memory alive at once (activations shrink while gradients grow, so it is below
    their sum); what RunMetadata allocation records call the step peak."""

    __slots__ = ()

    @property
    def persistent(self):
        return self.weights + self.slots + self.accumulators

    @property
    def total(self):
        """Persistent bytes plus the step peak: the device's high-water mark."""
        return self.persistent + self.peak


class MemoryEstimate(collections.namedtuple("MemoryEstimate", ["devices", "savers", "notes"])):
    """Per-device estimates (``devices``: device -> DeviceEstimate), readable with print()."""

    __slots__ = ()

    def __getitem__(self, device):
        if isinstance(device, int):
            return tuple.__getitem__(self, device)
        return self.devices[device]

    @property
    def max_total(self):
        return max([d.total for d in self.devices.values()] or [0])

    def to_dict(self):
        return {"savers": list(self.savers), "notes": list(self.notes), "devices": dict(
            (name, dict(d._asdict(), persistent=d.persistent, total=d.total))
            for name, d in self.devices.items())}

    def __str__(self):
        headers = ("device", "weights", "gradients", "slots", "accum", "activations",
                   "temps", "step peak", "total")
        rows = [(name, d.weights, d.gradients, d.slots, d.accumulators, d.activations,
                 d.temporaries, d.peak, d.total) for name, d in self.devices.items()]
        savers = ", ".join(self.savers) or "none"
        lines = ["Memory estimate per device (MiB); savers: %s" % savers]
        lines.append("  " + " | ".join(headers))
        for row in rows:
            lines.append("  " + " | ".join([row[0]] + ["%.1f" % (v / MIB) for v in row[1:]]))
        lines += ["  note: " + note for note in self.notes]
        return "\n".join(lines)


# ---- savers in a config ---------------------------------------------------------------
def active_savers(config):
    """Names of the memory savers ``config`` turns on, in a fixed order."""
    found = []
    if config.gradient_checkpoint.type:
        found.append("gc:%s" % config.gradient_checkpoint.type)
    if config.zero.level:
        found.append("zero:%s" % config.zero.level)
    if config.offload.level:
        found.append("offload:%s" % config.offload.level)
    if config.amp.level:
        found.append("amp:%s" % config.amp.level)
    if config.optimizer.num_apply_group > 1:
        found.append("grouped_apply:%d" % config.optimizer.num_apply_group)
    return found


# ---- profile -> devices (pure) -----------------------------------------------------------
def in_flight(plan, stage):
    """Micro-batches whose activations a pipeline stage holds at once: 1F1B keeps at most
    (stages - stage), GPipe all of them; one without a pipeline (gradient accumulation
    runs one micro-batch per session run)."""
    if not plan.pipeline:
        return 1
    if plan.schedule is not None and plan.schedule.num_virtual_stages > 1:
        return chunk_in_flight(plan.schedule, stage)  # interleaved: this chunk's own
    if plan.schedule is not None:  # counts F to W when the backward is split (ZeroBubble)
        return peak_in_flight(plan.schedule)[stage]
    if plan.strategy == "PreferForward":
        return plan.num_micro_batch
    return min(plan.num_micro_batch, len(plan.stages) - stage)


def backward_peak(activations, gradients, extra_micro_batches=0, hold=True):
    """Most bytes alive while the backward pass walks down the positions.

    At position q the kept activations of positions <= q are still alive, plus the
    gradient flowing through q (the size of q's largest activation). Weight gradients
    of positions >= q are alive too when they are ``hold`` until a collective or an
    accumulator takes them all at once (data parallelism, ZeRO, micro-batches);
    otherwise each is applied, and freed, as soon as it exists. A recomputed segment
    adds its bytes while its backward runs (the largest one is taken). Pure.
    ``activations``: [(position, bytes, segment)]; ``gradients``: [(position, bytes)]."""
    kept = [(p, b) for p, b, s in activations if s is None]
    recompute = largest_segment(activations)
    all_kept = sum(b for _, b in kept)
    positions = sorted(set([p for p, _ in kept] + [p for p, _ in gradients] + [0]))
    best = 0
    for q in positions:
        flowing = max([b for p, b in kept if p == q] or [0])
        grads = sum(b for p, b in gradients if (p >= q if hold else p == q))
        best = max(best, sum(b for p, b in kept if p <= q) + grads + flowing)
    return best + recompute + extra_micro_batches * all_kept


def largest_segment(activations):
    """Bytes of the largest recomputed segment of [(position, bytes, segment)] (0: none)."""
    segments = collections.Counter()
    for _, nbytes, segment in activations:
        segments[segment] += nbytes if segment is not None else 0
    return max([b for s, b in segments.items() if s is not None] or [0])


def owned_slot_bytes(variables, members, rank, max_splits=None):
    """Slot bytes ZeRO leaves on member ``rank``: owners chosen exactly as ZeRO chooses
    them (:func:`epl.runtime.zero.owners`; v2, given ``max_splits``, per bucket)."""
    from epl.runtime.zero import bucket_owner_devices, owners  # the real tables
    trained = [v for v in variables if v.trainable]
    ranks = owners([v.nbytes for v in trained], members)
    if max_splits is not None:
        table, _ = bucket_owner_devices([(v.name, v.nbytes) for v in trained],
                                        lambda name: tuple(range(members)),
                                        lambda name: "float32", max_splits)
        ranks = [table[v.name] for v in trained]
    return sum(v.slot_bytes for v, r in zip(trained, ranks) if r == rank)


def largest_group_share(variables, groups):
    """Fraction of the update bytes in grouped apply's heaviest group (1.0 ungrouped)."""
    trained = [v.nbytes for v in variables if v.trainable]
    if groups <= 1 or len(trained) < 2 or not sum(trained):
        return 1.0
    from epl.runtime.grouped_apply import contiguous_groups
    trained.reverse()   # the saver's arrival order
    members = contiguous_groups(trained, groups)
    return max(sum(trained[i] for i in group) for group in members) / float(sum(trained))


def _taskgraph_share(profile, taskgraph, shards):
    """Per-device bytes of one TaskGraph's copy (a split TaskGraph divides by its shards)."""
    variables = [v for v in profile.variables if v.taskgraph == taskgraph]
    acts = [a for a in profile.activations if a.taskgraph == taskgraph]
    scale = 1.0 / shards
    return {
        "variables": variables,
        "weights": scale * sum(v.nbytes for v in variables),
        "gradients": scale * sum(v.nbytes for v in variables if v.trainable),
        "slots": scale * sum(v.slot_bytes for v in variables if v.trainable),
        "activations": [(a.position, scale * a.nbytes, a.segment) for a in acts],
        "grad_positions": [(v.position, scale * v.nbytes) for v in variables if v.trainable],
        "apply_temps": scale * profile.apply_temporaries.get(taskgraph, 0),
        "largest_weight": scale * max([v.nbytes for v in variables] or [0]),
    }


def _copy_estimate(share, plan, config, stage, rank):
    """(compute-device fields, host fields) for one copy of one TaskGraph."""
    flight = in_flight(plan, stage)
    acts = share["activations"]
    kept = sum(b for _, b, s in acts if s is None)
    activations = flight * kept + largest_segment(acts)
    slots = share["slots"]
    if config.zero.level and plan.num_replicas > 1:
        splits = config.communication.max_splits if config.zero.level == "v2" else None
        slots = owned_slot_bytes(share["variables"], plan.num_replicas, rank, splits)
    temps = share["apply_temps"] * largest_group_share(share["variables"],
                                                       config.optimizer.num_apply_group)
    grads = share["gradients"]
    hold = plan.num_replicas > 1 or plan.num_micro_batch > 1 or bool(config.zero.level)
    walk = backward_peak(acts, share["grad_positions"], flight - 1, hold)
    apply_peak = (grads if hold else max([g for _, g in share["grad_positions"]] or [0])) \
        + temps + (flight - 1) * kept
    if config.zero.level and plan.num_replicas > 1:
        apply_peak += share["weights"]  # the updated values' sum, reduced bucket by bucket
    device = {"weights": share["weights"], "gradients": grads, "slots": slots,
              "accumulators": grads if plan.gradient_accumulation else 0,
              "activations": activations, "temporaries": temps}
    host = dict.fromkeys(device, 0)
    peak = max(walk, apply_peak)
    if config.offload.level:
        # weights, slots and the update live on the host; a weight visits the device
        # for one use at a time (largest weight: the copy that may be in flight)
        for key in ("weights", "slots"):
            host[key], device[key] = device[key], 0
        host["temporaries"] = host["peak"] = temps
        device["temporaries"] = share["largest_weight"]
        peak = max(walk, apply_peak - temps) + device["temporaries"]
    device["peak"] = peak
    return device, host


def estimate(profile, plan, config):
    """Per-device MemoryEstimate of ``profile`` trained under ``plan`` and ``config``.

    Every copy of every TaskGraph adds its share to its device (a TaskGraph narrower
    than its replica runs ``plan.width // device_count`` copies on each of its devices,
    each with weights, slots and activations of its own); with offload, the weights,
    slots and optimizer update of a copy go to its worker's host CPU."""
    if not plan.taskgraphs:
        raise MemoryEstimateError("the plan has no TaskGraphs")
    fields = DeviceEstimate._fields[1:]
    totals = collections.OrderedDict()

    def add(device, values, host=False):
        entry = totals.setdefault(device, dict.fromkeys(fields, 0))
        for key in fields:
            if host and key == "peak":  # the host updates after the device's backward
                entry[key] = max(entry[key], values[key])
            else:
                entry[key] += values.get(key, 0)
    stage_of = dict((index, pos) for pos, index in enumerate(plan.stages))
    for tg in plan.taskgraphs:
        shards = tg.device_count if tg.kind == "split" else 1
        share = _taskgraph_share(profile, tg.index, shards)
        for replica, devices in enumerate(tg.devices):
            for device in [d for d in devices for _ in range(plan.width // tg.device_count)]:
                compute, host = _copy_estimate(share, plan, config,
                                               stage_of.get(tg.index, 0), replica)
                add(device, compute)
                if config.offload.level:
                    add(plan.hosts[plan.worker_of[device]], host, host=True)
    devices = collections.OrderedDict(
        (name, DeviceEstimate(name, **dict((k, int(round(v))) for k, v in values.items())))
        for name, values in totals.items())
    return MemoryEstimate(devices, tuple(active_savers(config)), tuple(profile.notes))


# ---- formula profile: the benchmarks' transformer ------------------------------------------
TRANSFORMER_KEYS = ("layers", "hidden", "heads", "seq", "intermediate", "vocab", "batch")


def transformer_profile(layers, hidden, heads, seq, intermediate, vocab, batch, stages=1,
                        slots_per_weight=2, amp=False, checkpoint=False, classes=2):
    """Profile of ``benchmarks/transformer.py``'s encoder from its sizes alone.

    Per layer and sample the backward keeps (float32 elements, counted on the built
    graph): attention 8 s*h (q, k, v, context, residual, layer norm) + 2 heads*s^2
    (scores, softmax); feed-forward 8 s*i (tanh-GELU's intermediates) + 4 s*h.
    Under AMP the matrix-product outputs and GELU's intermediates are float16 and
    each product's float32 input gets a float16 copy. With checkpointing each layer
    keeps its output and recomputes the rest in its own segment. Layers are cut
    into ``stages`` equal TaskGraphs (embeddings on the first, the head on the last).
    """
    for key, value in zip(TRANSFORMER_KEYS, (layers, hidden, heads, seq, intermediate,
                                             vocab, batch)):
        if not isinstance(value, int) or value < 1:
            raise MemoryEstimateError("transformer %s must be a positive int, got %r"
                                      % (key, value))
    f32, f16 = 4, (2 if amp else 4)
    tokens = batch * seq
    stage = [min(stages - 1, layer * stages // layers) for layer in range(layers)]
    variables = [Variable("embeddings", 4 * (vocab + seq + 2) * hidden, True, 0, 0, 0)]
    acts = [Activation(0, 0, 3 * tokens * hidden * f32, None)]
    per_layer_weights = 4 * (4 * hidden * hidden + 2 * hidden * intermediate + intermediate
                             + 9 * hidden)
    kept32 = tokens * (4 * hidden) + batch * heads * seq * seq
    kept16 = tokens * (4 * hidden + 8 * intermediate) + batch * heads * seq * seq
    layer_bytes = kept32 * f32 + kept16 * f16 + (2 * tokens * hidden * 2 if amp else 0)
    for layer in range(layers):
        position = layer + 1
        variables.append(Variable("layer_%d" % layer, per_layer_weights, True, stage[layer],
                                  position, 0))
        if checkpoint:
            acts.append(Activation(stage[layer], position, tokens * hidden * f32, None))
            acts.append(Activation(stage[layer], position, layer_bytes, layer))
        else:
            acts.append(Activation(stage[layer], position, layer_bytes, None))
    last = stage[-1]
    variables.append(Variable("head", 4 * (hidden * hidden + hidden * (classes + 1) + classes),
                              True, last, layers + 1, 0))
    acts.append(Activation(last, layers + 1, 2 * batch * hidden * f32, None))
    variables = [v._replace(slot_bytes=slots_per_weight * v.nbytes) for v in variables]
    return Profile(variables, acts, {}, "formula: transformer", ())


def profile_for_config(sizes, config, stages=1, slots_per_weight=2):
    """``transformer_profile`` with the build-time savers of ``config`` applied."""
    return transformer_profile(stages=stages, slots_per_weight=slots_per_weight,
                               amp=bool(config.amp.level),
                               checkpoint=bool(config.gradient_checkpoint.type), **sizes)


def parse_sizes(text):
    """``"layers=24,hidden=1024,..."`` -> dict for transformer_profile (all keys required)."""
    sizes = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in TRANSFORMER_KEYS:
            raise MemoryEstimateError("bad model size %r: expected key=value with keys %s"
                                      % (item, ", ".join(TRANSFORMER_KEYS)))
        try:
            sizes[key] = int(value)
        except ValueError:
            raise MemoryEstimateError("model size %s=%r is not an int" % (key, value))
    missing = [k for k in TRANSFORMER_KEYS if k not in sizes]
    if missing:
        raise MemoryEstimateError("model sizes miss %s (give all of %s)"
                                  % (", ".join(missing), ", ".join(TRANSFORMER_KEYS)))
    return sizes


def largest_fitting(budget, build, low=1, high=4096):
    """Largest n in [low, high] whose ``build(n)`` MemoryEstimate fits ``budget`` bytes on
    every device (estimates grow with n), or 0 when even ``low`` does not fit."""
    if build(low).max_total > budget:
        return 0
    while low < high:
        middle = (low + high + 1) // 2
        if build(middle).max_total <= budget:
            low = middle
        else:
            high = middle - 1
    return low


# ---- graph profile: static shapes of a built TF graph ----------------------------------------
def _root(tensor):
    """The tensor whose buffer ``tensor`` shares (reshapes and identities allocate nothing)."""
    while tensor.op.type in _ALIASES and tensor.op.inputs:
        tensor = tensor.op.inputs[0]
    return tensor


def _weight_like(op, memo):
    """True for ops computed from variables and constants only (weights, not activations)."""
    key = op.name
    if key not in memo:
        memo[key] = True  # breaks cycles (loops) on the safe side
        memo[key] = op.type in _VARIABLES or (bool(op.inputs) and all(
            _weight_like(t.op, memo) for t in op.inputs))
    return memo[key]


def _is_float(tensor):
    return tensor.dtype.name in _FLOAT_NAMES  # a ref dtype is named "float32_ref"


class _Sizes(object):
    """Static bytes of tensors, completing unknown batch dimensions on a private copy."""

    def __init__(self, tf_graph, batch_size):
        self.graph, self.batch_size, self.copy, self.unknown = tf_graph, batch_size, None, []

    def __call__(self, tensor):
        shape = tensor.shape
        if not shape.is_fully_defined():
            shape = self._completed(tensor)
        if shape is None or not shape.is_fully_defined():
            self.unknown.append(tensor.name)
            return 0
        return shape.num_elements() * tensor.dtype.base_dtype.size

    def _completed(self, tensor):
        if self.copy is None:
            from epl.profiler.shapes import completed_copy
            self.copy = completed_copy(self.graph, batch_size=self.batch_size)[0]
        try:
            return self.copy.get_tensor_by_name(tensor.name).shape
        except (KeyError, ValueError):
            return None


def _gradient_flow(backward):
    """Names of backward ops on the gradient's data path: descended from a seed, a
    backward op that makes a float from constants and shapes only (tf.gradients'
    ones, a user's grad_ys). Float constants are neutral."""
    flow = set()
    for op in backward:  # creation order is topological for data edges
        if op.type == "Const":
            continue
        floats = [t for t in op.inputs if _is_float(t) and t.op.type != "Const"]
        if any(t.op.name in flow for t in floats):
            flow.add(op.name)
        elif not floats and op.inputs and any(_is_float(t) for t in op.outputs):
            flow.add(op.name)
    return flow


def _recompute_segments(backward, flow):
    """{op name: segment id} of recomputed forward copies (backward ops off the gradient's
    data path), segments being their connected groups."""
    ops = [op for op in backward if op.name not in flow and op.type not in _NOT_RECOMPUTE
           and any(_is_float(t) for t in op.outputs)]
    parent = dict((op.name, op.name) for op in ops)

    def find(name):
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name
    for op in ops:
        for tensor in op.inputs:
            if tensor.op.name in parent:
                parent[find(tensor.op.name)] = find(op.name)
    roots = {}
    return dict((op.name, roots.setdefault(find(op.name), len(roots))) for op in ops)


def _slot_bytes(variables, trainable, size):
    """({trainable variable op name: bytes of the non-trainable variables colocated with
    it}, their names): optimizer slots are created next to their primary, and so are
    Adam's beta powers."""
    slots, names = collections.Counter(), set()
    for var in variables:
        if var.op.name in trainable:
            continue
        for group in var.op.colocation_groups():
            text = group.decode() if isinstance(group, bytes) else group
            primary = text[len("loc:@"):]
            if primary in trainable:
                slots[primary] += size(var)
                names.add(var.op.name)
                break
    return slots, names


def profile_from_graph(view, tf_graph, taskgraph_index, batch_size=None):
    """Profile of a built training step (``view``: its ``epl.Graph``).

    Activations are the forward tensors (by buffer) that backward ops read, minus
    weights; under gradient checkpointing, the recomputed copies' tensors that the
    gradient reads, per segment. Optimizer temporaries are the apply phase's float
    results that are not variable updates. ``taskgraph_index`` maps the view's
    TaskGraph index to the plan's."""
    from epl.ir.phase import Phase
    if not view.has_training_step:
        raise MemoryEstimateError(
            "no training step in this graph: estimate_memory() reads the activations the "
            "backward pass keeps, so build the model and call optimizer.minimize() or "
            "apply_gradients() first")
    size = _Sizes(tf_graph, batch_size)
    ops = [op for op in tf_graph.get_operations() if view.info(op) is not None
           and view.info(op).copy == 0 and view.info(op).micro_batch == 0]
    phase = dict((op.name, view.info(op).phase) for op in ops)
    order = dict((op.name, i) for i, op in enumerate(ops))
    tg_of = dict((op.name, taskgraph_index.get(view.info(op).taskgraph, 0)) for op in ops)
    backward = [op for op in ops if phase[op.name] == Phase.BACKWARD]
    flow = _gradient_flow(backward)
    segments = _recompute_segments(backward, flow)
    memo, seen, acts = {}, set(), []
    for op in backward:
        for tensor in op.inputs:
            root = _root(tensor)
            source = phase.get(root.op.name)
            if root.name in seen or not _is_float(root) or _weight_like(root.op, memo):
                continue
            if source == Phase.FORWARD:
                segment = None
            elif root.op.name in segments and op.name in flow:
                segment = segments[root.op.name]
            else:
                continue
            seen.add(root.name)
            acts.append(Activation(tg_of[root.op.name], order[root.op.name], size(root),
                                   segment))
    return Profile(_graph_variables(view, tf_graph, ops, tg_of, size),
                   acts, _apply_temporaries(ops, phase, tg_of, size, Phase.APPLY),
                   "graph", ["%d tensors of unknown or data-dependent shape counted as 0 "
                             "bytes (e.g. %s); batch_size= fills unknown batch dimensions"
                             % (len(size.unknown), size.unknown[0])] if size.unknown else [])


def _graph_variables(view, tf_graph, ops, tg_of, size):
    """Variables with their first forward use and their slots (under ZeRO the slots are
    out of the collections, in ZeRO's build record: every variable's, as without ZeRO)."""
    from epl.tf_adapter import tf
    trained = set(v.op.name for call in view.apply_calls for v in call.variables)
    variables = [v for v in tf_graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES)
                 if view.info(v.op) is None or view.info(v.op).copy == 0]
    from epl.runtime.zero import build_record
    zero = build_record(view)
    if zero is not None:
        variables += [var for _, var in zero.slots.values()]
    slots, slot_names = _slot_bytes(variables, trained, size)
    first_use = {}
    for index, op in enumerate(ops):
        for tensor in op.inputs:
            root = _root(tensor)
            if root.op.name in trained:
                first_use.setdefault(root.op.name, index)
    result = []
    for var in variables:
        name, nbytes = var.op.name, size(var)
        if name in slot_names:
            continue
        result.append(Variable(name, nbytes, name in trained, tg_of.get(name, 0),
                               first_use.get(name, 0), int(slots.get(name, 0))))
    return result


def _apply_temporaries(ops, phase, tg_of, size, apply_phase):
    """{TaskGraph: float bytes produced in the apply phase by ops that are not updates
    (fused Apply* kernels write in place; sparse or hand-written updates allocate)}."""
    temps = collections.Counter()
    init_only = _init_only(ops)
    for op in ops:
        if phase[op.name] != apply_phase or op.type in _ALIASES or op.type in _VARIABLES \
                or op.name in init_only:
            continue
        if op.type.startswith(("Apply", "ResourceApply", "Assign", "Scatter", "ResourceScatter",
                               "SparseApply", "ResourceSparseApply")):
            continue
        temps[tg_of[op.name]] += sum(size(t) for t in op.outputs if _is_float(t))
    return dict(temps)


def _init_only(ops):
    """Names of ops that only feed variable initializers (slot zeros run once, at init)."""
    from epl.tf_adapter import tf
    graph = ops[0].graph if ops else None
    inits = set(v.initializer.name for key in (tf.GraphKeys.GLOBAL_VARIABLES,
                                               tf.GraphKeys.LOCAL_VARIABLES)
                for v in (graph.get_collection(key) if graph is not None else []))
    for op in reversed(ops):
        consumers = [c for t in op.outputs for c in t.consumers()]
        if consumers and all(c.name in inits for c in consumers):
            inits.add(op.name)
    return inits


# ---- the estimate of a built graph ---------------------------------------------------------
def estimate_graph(view, config, cluster=None, batch_size=None):
    """Expected bytes per device of the training step built in the EPL graph ``view``
    under the plan of ``config`` on ``cluster`` (None: the view's cluster), with every
    saver of ``config`` applied. ``epl.estimate_memory`` (:mod:`epl.env`) is the public
    entry: it finds the graph and the Env's config.

    ``batch_size`` fills unknown batch dimensions of placeholders and iterators."""
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise MemoryEstimateError("batch_size must be a positive int, got %r" % (batch_size,))
    if view is None or not view.live_taskgraphs():
        raise MemoryEstimateError("this graph has no EPL TaskGraphs: call epl.init() and "
                                  "build the model (under epl.replicate/split) first")
    plan, index = view.placement(cluster)
    profile = profile_from_graph(view, view.tf_graph, index, batch_size)
    return estimate(profile, plan, config)
