"""ZeRO: optimizer states (v0), gradient reduction (v1, v2) partitioned over data parallelism.

Every trained variable gets one *owner*: a device of its data-parallel group
(the plan's group of its TaskGraph; a pipeline stage's own group), balanced by
bytes, the same on every worker. Only the owner's copy runs the optimizer's
update for it, so its slots (Adam's m and v) live on the owner alone; after the
update the members exchange the new values.

* ``v0``: gradients are all-reduced as usual; states are partitioned.
* ``v1``: each member also receives only its own variables' reduced gradients
  (a reduce-scatter of one buffer laid out by owner) instead of all of them.
* ``v2`` (an EPL extension, beyond the original library): the variables are cut
  into ``communication.max_splits`` buckets, each balanced over the members on
  its own (:func:`bucket_owner_devices`); each bucket's gradients are
  reduce-scattered to their owners as soon as they exist, and the updated values
  are all-gathered bucket by bucket, each member sending only its own.

It works on any layout (W workers x D devices, pipelines, gradient
accumulation), because owners are decided per copy when the graph is rewritten
(:mod:`epl.runtime.zero_partition`), from the plan, not while the user builds it.

Build time (:func:`wrap_apply`): the optimizer is called for every pair, as
without ZeRO; ZeRO records which of the ops it created belong to one variable
alone (that variable's *part*: its update and the variables only it writes,
the *slots*) and which are shared (Adam's beta powers, the final group). Slots
leave the graph's collections: they are ZeRO's state, initialized on their owner
only, saved and restored by :mod:`epl.runtime.zero_checkpoint` under the names
a job without ZeRO gives them. The returned op also waits for a barrier that
the rewrite connects to the exchange.
"""
import collections

from epl import tf_adapter
from epl.buckets import plan_buckets
from epl.ir.features import FeatureSlot
from epl.runtime.zero_error import ZeroError
from epl.tf_adapter import tf

ZeroBuild = collections.namedtuple("ZeroBuild", [
    "level", "variables", "nbytes", "slots", "parts", "shared_variables", "barrier"])
ZeroBuild.__doc__ = """What ZeRO recorded while the step was built: the level; the trained
variables' op names and bytes (apply order); ``slots``, {slot op name: (variable name,
tf.Variable)}; ``parts``, {variable name: the user ops only its update needs}; the
optimizer's variables every copy keeps (beta powers); the barrier op."""

# the graph's ZeroBuild, kept on its IR view (epl.ir.features); read by the rewrite
# passes of epl.runtime.zero_partition and zero_checkpoint, and the memory estimate
_SLOT = FeatureSlot("zero", None)


def applies(config):
    return bool(config.zero.level)


def owners(sizes, members):
    """Owner rank of each variable: largest first, each to the least loaded member."""
    load = [0] * members
    owner = [None] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(members), key=lambda r: (load[r], r))
        owner[index] = rank
        load[rank] += sizes[index]
    return owner


def owner_devices(variables, group_of):
    """{variable name: owner device}: each data-parallel group balances its own variables.

    ``variables`` are (name, bytes) in a fixed order (the same on every worker);
    ``group_of(name)`` gives the devices of the variable's data-parallel group, or
    None for a variable every holder updates itself (a split layer's shard). Pure:
    the same table on every worker and every copy.

    >>> owner_devices([("a", 8), ("b", 4), ("c", 4)], lambda n: ("d0", "d1"))
    {'a': 'd0', 'b': 'd1', 'c': 'd1'}
    """
    table = {}
    for devices, members in _by_group(variables, group_of).items():
        ranks = owners([nbytes for _, nbytes in members], len(devices))
        for (name, _), rank in zip(members, ranks):
            table[name] = devices[rank]
    return table


def bucket_owner_devices(variables, group_of, dtypes, max_splits):
    """ZeRO v2's ({variable name: owner device}, {variable name: bucket number}).

    Each data-parallel group's variables (in the given order, the same on every
    worker) are cut into at most ``max_splits`` buckets of one dtype
    (:func:`epl.buckets.plan_buckets`), and each bucket is balanced over the group on
    its own, largest first, ties to the member least loaded overall. A bucket's
    reduce-scatter and all-gather pad every member's chunk to the largest member's
    share of that bucket, so balance within each bucket keeps the padding small;
    the tie-break spreads buckets of a single variable over the members.

    >>> table, bucket = bucket_owner_devices(
    ...     [("a", 8), ("b", 8), ("c", 4), ("d", 4)], lambda n: ("d0", "d1"),
    ...     lambda n: "float32", 2)
    >>> sorted(table.items()), sorted(bucket.items())
    ([('a', 'd0'), ('b', 'd1'), ('c', 'd0'), ('d', 'd1')], [('a', 0), ('b', 0), ('c', 1), ('d', 1)])
    """
    table, bucket_of = {}, {}
    for devices, members in _by_group(variables, group_of).items():
        sizes = [nbytes for _, nbytes in members]
        total = [0] * len(devices)
        buckets = plan_buckets(sizes, [dtypes(name) for name, _ in members], max_splits)
        for number, bucket in enumerate(buckets):
            load = [0] * len(devices)
            for index in sorted(bucket, key=lambda i: (-sizes[i], i)):
                rank = min(range(len(devices)), key=lambda r: (load[r], total[r], r))
                load[rank] += sizes[index]
                total[rank] += sizes[index]
                table[members[index][0]] = devices[rank]
                bucket_of[members[index][0]] = number
    return table, bucket_of


def _by_group(variables, group_of):
    """{group's devices: [(name, bytes)]} of the variables owned within a group of
    more than one device, in the given order."""
    by_group = collections.OrderedDict()
    for name, nbytes in variables:
        devices = group_of(name)
        if devices is not None and len(devices) > 1:
            by_group.setdefault(tuple(devices), []).append((name, nbytes))
    return by_group


def load_by_device(table, nbytes):
    """{device: bytes of the variables it owns} (what each device's states are sized by)."""
    load = collections.defaultdict(int)
    for name, device in table.items():
        load[device] += nbytes[name]
    return dict(load)


def _nbytes(var):
    """Bytes of ``var``, or None when its shape is not static (a split layer's shard,
    whose width differs per copy: it has no owner; others are refused by
    :func:`check_static_sizes`, when the rewrite knows which variables are shards)."""
    shape = var.shape
    if not shape.is_fully_defined():
        return None
    return shape.num_elements() * var.dtype.base_dtype.size


def check_static_sizes(record, sharded):
    """ZeRO balances owners by bytes: every variable needs a static size. Shards of
    split layers are refused: each device already holds 1/k of their weights and
    slots, and ZeRO's state initializers do not build per-shard slots."""
    shards = sorted(n for n in record.variables if n in sharded)
    if shards:
        raise ZeroError("zero.level=%r does not partition the optimizer states of epl.split "
                        "layers (their variables %s): a split layer already keeps 1/k of its "
                        "weights and slots on each device. Remove zero.level, or build those "
                        "layers outside epl.split" % (record.level, ", ".join(shards[:4])))
    for name in record.variables:
        if record.nbytes[name] is None and name not in sharded:
            raise ZeroError("ZeRO needs static variable shapes to balance owners; %s has "
                            "an unknown shape" % name)


def build_record(view):
    """ZeRO's :data:`ZeroBuild` of ``view`` (its feature slot), or None."""
    return _SLOT.get(view)


def wrap_apply(call, build):
    """Build-time saver hook (:mod:`epl.runtime.build_time`): call the optimizer for
    every pair, then record what belongs to one variable."""
    view, level = build.view, build.config.zero.level

    def apply(record):
        if _SLOT.get(view) is not None:
            raise ZeroError("zero.level=%r supports one optimizer.apply_gradients call per "
                            "graph; this graph makes a second one. Remove zero.level or "
                            "apply every gradient in one call" % level)
        pairs = list(record.grads_and_vars)
        graph = view.tf_graph
        first = len(graph.get_operations())
        before = set(v.op.name for v in tf.global_variables())
        result = call(record)
        created = graph.get_operations()[first:]  # in creation order
        new_vars = [v for v in tf.global_variables() if v.op.name not in before]
        slots, parts = partition(created, pairs, new_vars)
        _drop_from_collections(graph, set(var.op for _, var in slots.values()))
        with tf.name_scope("EPL_ZERO"):
            barrier = tf.no_op(name="barrier")
            done = tf.group(result, barrier, name="apply")
        shared = tuple(v.op.name for v in new_vars if v.op.name not in slots)
        _SLOT.set(view, ZeroBuild(level, tuple(v.op.name for _, v in pairs),
                                  dict((v.op.name, _nbytes(v)) for _, v in pairs), slots,
                                  parts, shared, barrier))
        return done
    return apply


def partition(created, pairs, new_vars):
    """(slots, parts) of one optimizer call (see :data:`ZeroBuild`).

    A created variable belongs to variable i (is its slot) when the ops writing it
    read i's gradient and no other one. An op created by the call belongs to i when
    the updates it follows (through data or control edges among the created ops)
    and the gradients and slots it reads are all i's. Found from the graph, so
    any optimizer works: Apply* kernels, plain assigns (BERT's AdamWeightDecay),
    sparse updates with their own group ops.
    """
    created_set = set(created)
    grad_index = {}
    for index, (grad, _) in enumerate(pairs):
        for tensor in (grad.values, grad.indices) if isinstance(grad, tf.IndexedSlices) \
                else (grad,):
            grad_index[tensor.op] = index
    var_index = dict((var.op, index) for index, (_, var) in enumerate(pairs))
    reads = _uses(created, created_set, grad_index)  # gradients only: no slots yet
    slots = collections.OrderedDict()
    for var in new_vars:
        writers = [op for op in created if var.op in tf_adapter.written_variables(op)]
        sources = set().union(*[reads[op] for op in writers]) if writers else set()
        if len(sources) == 1:
            index = sources.pop()
            var_index[var.op] = index
            slots[var.op.name] = (pairs[index][1].op.name, var)
        elif len(sources) > 1:
            raise ZeroError("zero.level: the optimizer variable %s is written from the "
                            "gradients of %d variables, so no single owner can update it; "
                            "run this optimizer without zero.level" % (var.op.name,
                                                                       len(sources)))
    follows = _follows(created, created_set, var_index)
    uses = _uses(created, created_set, grad_index, var_index, slots)
    shared = _shared_updates(created, created_set, var_index)
    parts = collections.defaultdict(list)
    for op in created:
        owners_of_op = follows[op] | uses[op]
        if len(owners_of_op) == 1 and not tf_adapter.is_variable_op(op) and op not in shared:
            parts[pairs[next(iter(owners_of_op))][1].op.name].append(op)
    return slots, dict(parts)


def _follows(created, created_set, var_index):
    """{created op: indices of the variables whose updates it follows (data or control)}.

    A control edge counts when it comes from an op that writes a variable (Adam's beta
    powers wait for every update; a sparse update's group waits for its scatters).
    One from an op that only groups others orders, it does not make the op theirs:
    grouped apply chains each group after the previous group's NoOp."""
    follows = {}
    for op in created:
        found = set(var_index[v] for v in tf_adapter.written_variables(op) if v in var_index)
        for source in op.inputs:
            if source.op in created_set:
                found |= follows.get(source.op, set())
        for source in op.control_inputs:
            if source in created_set and tf_adapter.written_variables(source):
                found |= follows.get(source, set())
        follows[op] = found
    return follows


def _shared_updates(created, created_set, var_index):
    """Created ops every copy must run: those writing a variable that is neither trained
    nor a slot (Adam's beta powers, the global step), the created ops they read (data),
    and the ops after them (data or control) that write no trained variable or slot.

    Such an op may follow one variable's update alone: grouped apply's last group can
    hold a single variable, and Adam's ``_finish`` orders the beta-power updates after
    that group's updates. Counted as that variable's part, the beta powers advanced on
    its owner only (ResNet, 2 workers x 1 device, 3 groups: worker 1 kept beta1_power
    at 0.9 and its next step's updates were off by 0.013)."""
    def owns_state(op):
        return any(v in var_index for v in tf_adapter.written_variables(op))

    def writes_shared(op):  # a Mul or Cast reading a ref variable writes nothing
        mutates = op.op_def.is_stateful or any(arg.is_ref for arg in op.op_def.input_arg)
        return mutates and bool(tf_adapter.written_variables(op)) and not owns_state(op)

    after = set()
    for op in created:  # creation order: an op's inputs come first
        if owns_state(op):
            continue
        if (writes_shared(op) or any(t.op in after for t in op.inputs)
                or any(c in after for c in op.control_inputs)):
            after.add(op)
    before, stack = set(), [op for op in after if writes_shared(op)]
    while stack:  # what the shared writers read (not the variables themselves)
        for tensor in stack.pop().inputs:
            source = tensor.op
            if source in created_set and source not in before and source not in after \
                    and not owns_state(source) and not tf_adapter.is_variable_op(source):
                before.add(source)
                stack.append(source)
    return after | before


def _uses(created, created_set, grad_index, var_index=None, slots=()):
    """{created op: indices of the variables whose gradient or slots it reads, directly
    or through created ops (data)}: an update's arithmetic (BERT's ``beta2 * v + ...``)
    belongs to its variable. Without ``slots``, the gradients each op reads."""
    uses = {}
    for op in created:
        found = set()
        if op.name in slots:
            found.add(var_index[op])
        for tensor in op.inputs:
            if tensor.op in grad_index:
                found.add(grad_index[tensor.op])
            elif tensor.op in created_set:
                found |= uses.get(tensor.op, set())
        uses[op] = found
    return uses


def _drop_from_collections(graph, var_ops):
    """Slots are ZeRO's state: initialized on their owner only, saved by ZeRO's saveables
    (the user's initializers, readiness checks and savers never see them)."""
    for key in graph.get_all_collection_keys():
        items = graph.get_collection_ref(key)
        kept = [item for item in items if getattr(item, "op", None) not in var_ops]
        if len(kept) != len(items):
            items[:] = kept
