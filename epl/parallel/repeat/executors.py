"""Which TensorFlow executor runs each call of a stage function (issue 41, item 3).

A call's body runs, by default, on TF's default executor, which hands every ready node
to the inter-op thread pool. On CPU that costs about 5 us per node (thread wake-ups,
scheduling), and stage functions execute about twice the nodes of unrolled copies
(their ``_Arg``/``_Retval`` nodes, saved-tensor reads and writes, per-call constants):
5-7% more CPU per step on the ResNet-style and MoE pipelines in the pairs of
2026-11-28. TF's single-threaded
function executor (the call's ``executor_type`` attribute ``SINGLE_THREADED_EXECUTOR``)
runs a body's nodes in order on the calling thread, with no hand-off per node; the
kernels still use the intra-op pool.

TF accepts it only for some bodies, and refuses the others at the first run (an
``Unimplemented`` or ``FailedPrecondition`` error), so :class:`CallExecutors` asks for
it only where TF's own check (``single_threaded_executor.cc``) passes. TF 1.15 refuses
a body with a node of reference type, a node of v1 control flow (Switch, Merge, Enter,
Exit, NextIteration), a collective, or a send/recv node, which the function runtime
adds when a body spans devices: a node placed elsewhere, a resource argument whose
resource lives elsewhere, or an ``int32`` or ``string`` argument or result (TF keeps
those in host memory: on the task's ``CPU:0``, another device for a stage on
``CPU:1``; the MoE pipeline's stage-1 forward takes the labels that way). TF 2.15
accepts partitioned bodies; the rule is the same on both lines. Nested calls and
kernels that wait for other work (queues, iterators, remote calls) are not refused
by TF 1.15 but would block the calling thread: their bodies keep the default too.

GPU stages keep the default executor: their kernels are launched asynchronously, so
the executor's per-node cost hides behind device time, while the default executor's
parallel dispatch overlaps the host-side nodes (``int32`` shape arithmetic stays in
host memory) with launches; their ``int32`` arguments also live on the host. Not
measured here (no GPU). The pass runs with ``pipeline.call_executor: auto`` (an
opt-in: measured no faster on the ResNet-style and MoE pipelines, docs/design.md); TF's
traced steps do not list the nodes of single-threaded bodies, so EPL's memory
profiler warns when a graph has such calls.
"""
import logging

from epl import tf_adapter, tf_functions
from epl.protocols.passes import LOWER, Pass
from epl.tf_adapter import tf

LOG = logging.getLogger("epl")
SINGLE_THREADED = tf_functions.SINGLE_THREADED
AUTO = "auto"  # pipeline.call_executor: the pass runs ("default": it does not)

# TF's Node::IsControlFlow (switch, merge, enter, exit, next-iteration classes).
_CONTROL_FLOW = frozenset([
    "Switch", "RefSwitch", "_SwitchN", "Merge", "RefMerge", "_XlaMerge", "Enter",
    "RefEnter", "Exit", "RefExit", "NextIteration", "RefNextIteration", "LoopCond"])
# Node::IsSend / IsRecv (what partitioning adds) and calls of other functions.
_SEND_RECV = frozenset(["_Send", "_Recv", "_HostSend", "_HostRecv"])
_CALLS = frozenset(tf_functions.CALL_OPS) | frozenset([
    "If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase", "For",
    "SymbolicGradient", "RemoteCall"])
# Kernels that wait for other work (TF's collectives are refused outright).
_WAITING_PREFIXES = ("Collective", "Nccl", "Queue", "Iterator", "MultiDeviceIterator",
                     "Barrier", "Remote", "Send", "Recv")
# Argument and result types TF keeps in host memory (MTypeFromDType).
_HOST_TYPES = frozenset([tf.int32.as_datatype_enum, tf.string.as_datatype_enum])


class CallExecutors(Pass):
    """Give each call of a stage function on a CPU the single-threaded executor when
    TF can run its body that way; log which functions got it and why not the others.

    Runs last, when every call's inputs and devices are final."""

    name = "call_executors"
    phase = LOWER
    reads = ("config", "repetition")
    writes = ("graph",)

    def applies(self, ctx):
        return ctx.config.pipeline.call_executor == AUTO and bool(_calls(ctx.repetition))

    def run(self, ctx):
        chosen = choose(ctx.tf_graph, _calls(ctx.repetition))
        LOG.info("EPL: %s", describe(chosen))


def _calls(repetition):
    return [call for instance in repetition.instances.values()
            for call in instance.calls.values()]


def choose(graph, calls):
    """Set the single-threaded executor on every call of ``calls`` that TF can run
    that way; return {(function name, device): None (single-threaded) or why not}.
    The decision is per function and device (a call's arguments may live on the
    caller's device or another one): one refusal keeps all of that function's calls
    on that device on the default executor, so that an instantiation runs one way."""
    library = tf_adapter.function_names(graph)
    reasons, members = {}, {}
    for call in calls:
        key = (tf_functions.called_name(call), call.device)
        members.setdefault(key, []).append(call)
        if reasons.get(key) is None:
            reasons[key] = refusal(call, tf_functions.function_definition(graph, key[0]),
                                   library)
    for key, group in members.items():
        if reasons[key] is None:
            for call in group:
                tf_functions.set_call_executor(call, SINGLE_THREADED)
    return reasons


def describe(chosen):
    """One line for the log: which stage functions run single-threaded on which
    device, and why the others keep TF's default executor."""
    single = sorted("%s@%s" % (name, _short(device))
                    for (name, device), why in chosen.items() if why is None)
    others = sorted("%s@%s (%s)" % (name, _short(device), why)
                    for (name, device), why in chosen.items() if why is not None)
    line = "stage functions on TF's single-threaded executor: %s" % (
        ", ".join(single) or "none")
    if others:
        line += "; on the default executor: %s" % "; ".join(others)
    return line


def _short(device):
    """``CPU:1`` of a full device string."""
    return device.rsplit("device:", 1)[-1] if device else "no device"


def refusal(call, fdef, library):
    """Why TF's single-threaded executor cannot (or should not) run ``call``'s body
    ``fdef``, or None when it can. ``library``: the graph's function names."""
    device = tf.DeviceSpec.from_string(call.device or "")
    if device.device_type != "CPU":
        return "on %s, not a CPU: a GPU stage keeps the inter-op parallelism" % (
            call.device or "no device")
    return (_argument_refusal(call, fdef, device)
            or _node_refusal(fdef, device, library))


def _argument_refusal(call, fdef, device):
    """Arguments and results TF would place on another device than the call's."""
    host = device.device_index in (None, 0)
    signature = fdef.signature
    for arg, tensor in zip(signature.input_arg, call.inputs):
        if arg.type in _HOST_TYPES and not host:
            return "argument %s (%s) is kept in host memory, on CPU:0" % (
                arg.name, tf.as_dtype(arg.type).name)
        if tensor.dtype == tf.resource and not _same_device(
                _resource_device(tensor), device):
            return "resource argument %s lives on %s" % (
                arg.name, _resource_device(tensor) or "no device")
    for arg in signature.output_arg:
        if arg.type in _HOST_TYPES and not host:
            return "result %s (%s) is kept in host memory, on CPU:0" % (
                arg.name, tf.as_dtype(arg.type).name)
    return None


def _node_refusal(fdef, device, library):
    """Body nodes TF's check refuses, places elsewhere, or that would block."""
    for node in fdef.node_def:
        op = node.op
        if op in _CONTROL_FLOW:
            return "control flow node %s (%s)" % (node.name, op)
        if op in _SEND_RECV or op.startswith(_WAITING_PREFIXES):
            return "node %s (%s) waits for other work" % (node.name, op)
        if op in _CALLS or op in library:
            return "node %s calls a function (%s)" % (node.name, op)
        if node.device and not _same_device(node.device, device):
            return "node %s is placed on %s" % (node.name, node.device)
        if tf_functions.has_ref_outputs(op):
            return "node %s (%s) has reference-typed outputs" % (node.name, op)
    return None


def _resource_device(tensor):
    """The device of the resource ``tensor``'s handle refers to (through identities)."""
    op = tensor.op
    while op.type == "Identity" and op.inputs:
        op = op.inputs[0].op
    return op.device


def _same_device(name, device):
    """``name`` (possibly partial) is ``device``: every field it gives matches."""
    if not name:
        return False
    other = tf.DeviceSpec.from_string(name)
    fields = ("job", "replica", "task", "device_type", "device_index")
    return all(getattr(other, f) is None or getattr(other, f) == getattr(device, f)
               for f in fields)
