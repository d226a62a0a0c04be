"""Lower split layers' intents into real ops for every copy (a model-phase pass).

Each stand-in recorded by :mod:`epl.ops.intents` is replaced, in the user's
single-copy graph, by the real op for copy 0: a collective over the split group
of copy 0's replica (rank = its position), its position as a constant, or its
per-copy value. The op is registered with ``Graph.specialize`` so every other
copy and micro-batch builds its own (its group, its rank, its instance key)
instead of copying copy 0's.
"""
from epl.ir.phase import Phase
from epl.ops import intents
from epl.ops.state import peek, state
from epl.protocols.passes import LAYERS, MODEL, Pass
from epl.tf_adapter import tf


class SplitLoweringError(ValueError):
    """A split layer cannot be lowered on this plan."""


class SplitLowering(Pass):
    """Replace split intents with real per-copy ops."""

    name = "split_lowering"
    phase = MODEL
    reads = ("view", "config", "cluster", "plan", "copies")
    writes = ("graph", "communicators")

    def applies(self, ctx):
        return bool(peek(ctx.tf_graph).intents)

    def run(self, ctx):
        check_readers(ctx)
        for intent in list(peek(ctx.tf_graph).intents):
            _lower(ctx, intent)


def check_readers(ctx):
    """Only split-aware ops may read sharded logits: any other forward op would see one
    shard's columns and silently compute something else than the user wrote."""
    split = state(ctx.tf_graph)
    for name, info in split.sharded.items():
        tensor = ctx.tf_graph.get_tensor_by_name(name)
        for reader in tensor.consumers():
            op_info = ctx.view.info(reader)
            if reader.name in split.own_ops or (op_info and op_info.phase != Phase.FORWARD):
                continue
            raise SplitLoweringError(
                "op %r (%s) reads the sharded output of layer %r, split over %d devices by "
                "epl.split: each device holds only its columns. On sharded logits EPL supports "
                "tf.losses.sparse_softmax_cross_entropy, "
                "tf.nn.sparse_softmax_cross_entropy_with_logits, tf.argmax, tf.math.top_k and "
                "tf.equal with their results; compute %r outside the split layer's output or "
                "leave that layer unsplit" % (reader.name, reader.type, info.layer, info.width,
                                              reader.type))


def _lower(ctx, intent):
    stand_in = intent.stand_in
    info = ctx.view.info(stand_in.op)
    taskgraph, phase = info.taskgraph, info.phase
    _check_width(ctx, intent, taskgraph)
    consumers = list(stand_in.consumers())

    def builder(copy, micro_batch, inputs):
        return _build(ctx, intent, taskgraph, copy, micro_batch, inputs).op

    before = len(ctx.view.op_info)
    with ctx.view.building(taskgraph, phase if phase in Phase.STEP else Phase.FORWARD):
        real = _build(ctx, intent, taskgraph, 0, 0, intent.inputs)
    created = list(ctx.view.op_info)[before:]
    graph = ctx.tf_graph
    helpers = [graph.get_operation_by_name(n) for n in created if n != real.op.name]
    ctx.view.specialize(real.op, builder, inputs=intent.inputs, helpers=helpers)
    ctx.rewire(stand_in, real, consumers)


def _split_taskgraph(ctx, intent, taskgraph):
    """The split TaskGraph whose groups an intent uses: its own, or (for the MoE pattern,
    whose einsums run in the replicated part) a split TaskGraph on the same devices."""
    own = ctx.plan.taskgraphs[taskgraph]
    if own.kind == "split":
        return own
    for tg_plan in ctx.plan.taskgraphs:
        if tg_plan.kind == "split" and tg_plan.devices == own.devices:
            return tg_plan
    raise SplitLoweringError(_no_shared_devices_message(ctx, intent, own))


def _no_shared_devices_message(ctx, intent, own):
    """Why a split op outside its epl.split TaskGraph (MoE's einsums in the replicated
    part) cannot run: its collectives need the shards' devices, which the seeds' default
    placement gives to the split TaskGraph alone."""
    splits = ["%r %s on %s" % (tg.name, tg.kind, ", ".join(tg.devices[0]))
              for tg in ctx.plan.taskgraphs if tg.kind == "split"]
    placement = ("cluster.colocate_split_and_replicate=%s"
                 % ctx.config.cluster.colocate_split_and_replicate)
    return ("op %r (the %s of a split layer, as an MoE layer's expert einsums build) runs "
            "in TaskGraph %d %r (%s on %s), but the split weights are in %s; with %s (the "
            "seeds' default placement) each TaskGraph has devices of its own, and the "
            "layer's collectives need the devices holding the shards. Set "
            "cluster.colocate_split_and_replicate=True and give both TaskGraphs the same "
            "device_count (MoE: docs/split.md)" % (
                intent.stand_in.op.name, intent.kind, own.index, own.name, own.kind,
                ", ".join(own.devices[0]), " and ".join(splits) or "no epl.split TaskGraph",
                placement))


def _check_width(ctx, intent, taskgraph):
    tg_plan = _split_taskgraph(ctx, intent, taskgraph)
    if tg_plan.device_count != intent.width:
        raise SplitLoweringError(
            "a split layer was built for %d devices but its TaskGraph %r has device_count=%d"
            % (intent.width, tg_plan.name, tg_plan.device_count))


def _build(ctx, intent, taskgraph, copy, micro_batch, inputs):
    """The real tensor standing for ``intent`` in (copy, micro_batch), with no more static
    shape than the stand-in declared: copies' values differ in shape (shard widths)."""
    value = _build_value(ctx, intent, taskgraph, copy, micro_batch, inputs)
    declared = intent.stand_in.shape
    if value.shape.is_compatible_with(declared) and value.shape.as_list() != declared.as_list():
        with tf.device(ctx.device(taskgraph, copy)), tf.name_scope("EPL_SPLIT"):
            value = tf.placeholder_with_default(value, declared)
    return value


def _build_value(ctx, intent, taskgraph, copy, micro_batch, inputs):
    record = ctx.copies[copy]
    device = ctx.device(taskgraph, copy)
    with tf.device(device), tf.name_scope("EPL_SPLIT"):
        if intent.kind == intents.POSITION:
            return tf.constant(record.position, tf.int32, name="position")
        if intent.kind == intents.PER_COPY:
            return intent.build(record.position)
    group = _split_taskgraph(ctx, intent, taskgraph).split_group(record.replica)
    comm = ctx.communicator(group, LAYERS)
    name = "intent%d/mb%d" % (intent.index, micro_batch)
    with tf.device(device), tf.name_scope("EPL_SPLIT"):
        # TF's collectives want their input placed; the model's ops are not yet.
        value = tf.identity(inputs[0])
    return _COLLECTIVES[intent.kind](comm, value, device, name, group.size,
                                     group.devices.index(device))


def _all_gather(comm, x, device, name, size, rank):
    del size, rank
    return comm.all_gather(x, device, name)


def _all_reduce(comm, x, device, name, size, rank):
    del size, rank
    return comm.all_reduce(x, device, name, mean=False)


def _reduce_scatter(comm, x, device, name, size, rank):
    total = comm.all_reduce(x, device, name, mean=False)
    with tf.device(device):
        rows = tf.shape(total)[0] // size
        return total[rank * rows:(rank + 1) * rows]


def _all_to_all(comm, x, device, name, size, rank):
    """Chunk j of every member lands on member j (dynamic row counts allowed)."""
    gathered = comm.all_gather(x, device, name)
    with tf.device(device):
        rows = tf.shape(x)[0] // size
        rest = tf.shape(x)[1:]
        chunks = tf.reshape(gathered, tf.concat([[size, size, rows], rest], 0))
        return tf.reshape(chunks[:, rank], tf.concat([[size * rows], rest], 0))


_COLLECTIVES = {intents.ALL_GATHER: _all_gather, intents.ALL_REDUCE: _all_reduce,
                intents.REDUCE_SCATTER: _reduce_scatter, intents.ALL_TO_ALL: _all_to_all}
