"""Offload v0 (``offload.level="v0"``): weights live in host memory, and each use
reads its own copy, sent to its compute device just in time.

A rewrite pass of the replicate phase, right after ``placement`` and before the
step is repeated per micro-batch and copy (``repeat_step``). On copy 0 it

1. places every model variable (trainable weights, optimizer slots and non-slot
   variables such as Adam's beta powers, batch-norm statistics), every op that
   TF must keep with them (ops colocated with them, ops taking their ref or
   resource handle: reads, initializers, updates) and every apply-phase op on
   this worker's host CPU (``ctx.host``), and adds them to ``roles.pinned``, so
   the replica clones of every other copy go to the host too
   (``ctx.device_for`` honours ``pinned``); micro-batch clones keep their
   source's device. Ops that only compute the initial values of those variables
   go to the host as well, so a weight is never whole on a compute device, not
   even at initialization;
2. gives every forward or backward use of a weight (a compute-device op reading
   a host op's value: ``var/read``, ``ReadVariableOp``, a colocated gather) its
   own fresh ``Identity`` of that value, with control inputs on the consumer's
   other inputs: the weight is sent to the device when the consumer is about to
   run, and the device's copy is freed after it, instead of one copy being sent
   at the start of the step and kept until the backward pass's last use. The
   identities join ``roles.cloned`` and ``roles.step``, so micro-batches and
   copies get their own.

   The identity sits on the host, not on the consumer's device. TensorFlow
   starts a ``_Recv`` as soon as the step starts, shares one transfer of a
   tensor among all its readers on a device, and grappler folds an identity
   that is only fed from another device into its consumer; so a device-side
   identity of ``var/read`` still transfers the weight at step start, once,
   for every use. A host-side identity per use is its own transfer, and its
   ``_Send`` runs only when the identity has run, after the consumer's other
   inputs (measured: see ``docs/offload.md``).

Shape-only readers (``Shape``, ``Size``, ``Rank``, ``ShapeN``) go to the host
instead of copying a weight to read its shape. Uses inside while loops are left
alone (an op added outside a loop cannot feed one inside it): the loop's
``Enter`` is the use that gets the copy. Gradient accumulators
(:mod:`epl.runtime.gradient_accumulation`) and collectives stay on the compute
devices: they hold gradients, not weights.

Reads: ``roles`` (cloned, variables, init_only), the IR's phases, colocation.
Writes: devices of copy 0's variable and apply ops (host), ``roles.pinned``,
just-in-time identities (``roles.cloned``, ``roles.step``).
"""
from epl import tf_adapter
from epl.ir.phase import Phase
from epl.ir.traverse import ancestor_ops, control_flow_interior
from epl.protocols.passes import REPLICATE, Pass
from epl.ir.roles import initializers_of
from epl.tf_adapter import tf

OFFLOAD_SCOPE = "EPL_OFFLOAD"
SHAPE_READERS = frozenset(["Shape", "ShapeN", "Size", "Rank"])
_PASS_THROUGH = frozenset(["Identity", "RefIdentity", "Enter", "RefEnter", "Switch",
                           "RefSwitch", "Merge", "RefMerge"])
_USES = (Phase.FORWARD, Phase.BACKWARD)


class Offload(Pass):
    """Weights, optimizer state and updates on the host; per-use copies sent to devices."""

    name = "offload"
    phase = REPLICATE
    reads = ("view", "cluster", "plan")
    writes = ("graph", "roles")

    def applies(self, ctx):
        return ctx.config.offload.level == "v0"

    def run(self, ctx):
        refuse_wide_stages(ctx.plan)
        host_ops = offloaded_ops(ctx)
        uses = weight_uses(ctx, host_ops)
        for op in ctx.roles.cloned:
            if op.name in host_ops:
                _to_host(ctx, op)
        for op in init_only_ops(ctx):
            tf_adapter.set_device(op, ctx.host)
        for consumer, tensors in uses:
            just_in_time_reads(ctx, consumer, tensors, host_ops)


def refuse_wide_stages(plan):
    """Offload is not built for TaskGraphs on devices of their own that are several
    devices wide (measured: the run pulls more batches than the step has); refused,
    naming both settings, rather than training on the wrong rows."""
    wide = [tg for tg in plan.taskgraphs if tg.device_count > 1]
    if plan.stages and wide:
        raise ValueError(
            "offload.level='v0' does not support TaskGraphs placed on devices of their own "
            "with device_count > 1 (%s) in this EPL version; remove offload.level, use "
            "device_count=1 per TaskGraph, or set cluster.colocate_split_and_replicate=True"
            % ", ".join("%s: %s(%d)" % (tg.name, tg.kind, tg.device_count) for tg in wide))


def _to_host(ctx, op):
    tf_adapter.set_device(op, ctx.host)
    ctx.roles.pinned.add(op.name)


def source_variable(tensor):
    """The variable op behind a ref or resource tensor (through identities, loop and
    cond plumbing), or None."""
    if not tf_adapter.is_state_tensor(tensor):
        return None
    op = tensor.op
    for _ in range(32):
        if tf_adapter.is_variable_op(op):
            return op
        if op.type not in _PASS_THROUGH or not op.inputs:
            return None
        op = op.inputs[0].op
    return None


def offloaded_ops(ctx):
    """Names of copy 0's cloned ops that go to the host.

    Variables; ops colocated with one (reads, updates, colocated gathers); ops that
    take a variable's ref or handle, which TF runs where the variable is; every
    apply-phase op; shape-only readers of those."""
    names = set(op.name for op in ctx.roles.variables)
    host = set(names)
    for op in ctx.roles.cloned:
        if op.name in host:
            continue
        info = ctx.view.info(op)
        if tf_adapter.colocation_root(op) in names or info.phase == Phase.APPLY:
            host.add(op.name)
        elif any(getattr(source_variable(t), "name", None) in names for t in op.inputs):
            host.add(op.name)
    for op in ctx.roles.cloned:
        if op.type in SHAPE_READERS and op.name not in host and op.inputs and \
                all(t.op.name in host for t in op.inputs):
            host.add(op.name)
    return host


def init_only_ops(ctx):
    """Ops that only compute the initial values of offloaded variables (never cloned)."""
    variables = set(op.name for op in ctx.roles.variables)
    initializers = initializers_of(ctx.tf_graph, variables).values()
    return [op for op in ancestor_ops(initializers)
            if op.name in ctx.roles.init_only and op.name not in ctx.roles.shared
            and op.name not in variables]


def weight_uses(ctx, host_ops):
    """[(consumer, [host tensors it reads])]: forward/backward uses of weights on a
    compute device, in graph order; none inside while loops."""
    in_loop, _ = control_flow_interior(ctx.tf_graph)
    uses = []
    for op in ctx.roles.cloned:
        if op.name in host_ops or op.name in in_loop:
            continue
        if ctx.view.info(op).phase not in _USES:
            continue
        tensors = []
        for tensor in op.inputs:
            producer = tensor.op
            if producer.name not in host_ops or producer.name in in_loop:
                continue
            if tf_adapter.is_state_tensor(tensor) or producer.type in SHAPE_READERS:
                continue
            if tensor not in tensors:
                tensors.append(tensor)
        if tensors:
            uses.append((op, tensors))
    return uses


def just_in_time_reads(ctx, consumer, tensors, host_ops):
    """Rewire ``consumer``'s reads of ``tensors`` to fresh identities on the host that
    wait for its other inputs: each one is sent to the consumer's device when the
    consumer is about to run."""
    others = []
    for tensor in consumer.inputs:
        producer = tensor.op
        if producer.name in host_ops or (producer.type == "Const" and
                                         not producer.control_inputs):
            continue
        if producer not in others:
            others.append(producer)
    info = ctx.view.info(consumer)
    for tensor in tensors:
        with ctx.tf_graph.as_default(), tf.name_scope(None), \
                ctx.view.building(info.taskgraph, info.phase), \
                tf.control_dependencies(None), tf.name_scope(OFFLOAD_SCOPE + "/"):
            copy = tf.identity(tensor, name=tensor.op.name.replace("/", "_"))
        _to_host(ctx, copy.op)
        tf_adapter.add_control_inputs(copy.op, others)
        ctx.rewire(tensor, copy, [consumer])
        ctx.roles.cloned.append(copy.op)
        ctx.roles.step.add(copy.op.name)
