"""Stage functions: each stage's forward and backward built once, called per repetition.

Each stage's forward and backward ops become one function each (the backward in up to
``BACKWARD_CHUNKS`` pieces; :mod:`epl.parallel.repeat.function_body`), built once and
called once per micro-batch on the stage's device, per local copy
(:mod:`epl.parallel.repeat.calls`). The graph therefore holds the model once plus a few
ops per micro-batch, and TensorFlow optimizes each function body once, so the time to
the first step does not grow with ``pipeline.num_micro_batch`` or the local replicas.
The schedule orders the calls (one control edge per pair of consecutive actions of a
stage: an action's boundaries are its calls).

What the calls replace:
  * the user's forward and backward ops of every copy stay in the graph but no
    longer run: whatever read them (the optimizer's updates, metrics, summaries,
    EPL's own ops) reads the results of micro-batch 0's calls instead, and a
    fetch of a user tensor returns micro-batch 0's result (``program.fetches``);
  * a dense gradient is summed over micro-batches inside the backward function
    (each call takes the running sum and returns it plus its micro-batch's
    gradient), so the sum costs no op per micro-batch; micro-batch 0 calls a
    variant without the sums' arguments (no add to zero);
  * residual ops (see :mod:`epl.parallel.repeat.stage_partition`) are cloned per
    micro-batch like unrolled copies and read the calls' results.
"""
import logging

from epl import tf_adapter, tf_functions
from epl.ir.phase import Phase
from epl.ir.roles import GET_NEXT_TYPES, PLACEHOLDER_TYPES
from epl.parallel.repeat.backward_split import WEIGHT, kind_of
from epl.parallel.repeat.calls import build_calls, sum_key
from epl.parallel.repeat.copies import clone_copies, clone_micro_batches, order_shared_writes
from epl.parallel.repeat.function_body import FunctionBody, first_call_variant
from epl.parallel.repeat.control_flow import control_flow
from epl.parallel.repeat.record import Repetition
from epl.parallel.repeat.stage_partition import BACKWARD, FORWARD, partition
from epl.parallel.repeat.step_ops import (
    constant_expressions, gradient_parts, micro_batch_candidates, training_items)
from epl.tf_adapter import tf

LOG = logging.getLogger("epl")
_KINDS = {Phase.FORWARD: FORWARD, Phase.BACKWARD: BACKWARD}


class StageFunctions(Repetition):
    """The lowering's record: the partition of the step's ops into cores and residual
    ops, the bodies and functions of the cores (``firsts``: the variants for micro-batch
    0 of the functions that sum gradients), and, per repetition, its calls and what they
    compute (:class:`epl.parallel.repeat.record.Instance`)."""

    def __init__(self, copies, micro_batches, split_backward=frozenset()):
        super(StageFunctions, self).__init__(copies, micro_batches, split_backward)
        self.partition = None
        self.bodies, self.functions, self.firsts = {}, {}, {}
        self.sum_only = set()

    def build(self, ctx):
        self.weight_parts(ctx)  # drops the gradient gates before anything reads them
        stage_ops, self.shared = _stage_ops(ctx)
        self._define(ctx, stage_ops)
        clone_micro_batches(ctx, self, self.partition.residual)
        clone_copies(ctx, self)
        build_calls(ctx, self)
        order_shared_writes(ctx, self, self.partition.residual, self._calls_reading)

    def _define(self, ctx, stage_ops):
        """Partition the step's ops into function cores and residual ops, and define
        each core's function (before any clone: the clones copy only what the functions
        do not hold)."""
        blocked = (_downstream_of_gradients(ctx, stage_ops) | _built_per_copy(ctx, stage_ops)
                   | control_flow(stage_ops))
        weights = self.weight_parts(ctx)
        part = partition(stage_ops, lambda op: _action_of(ctx, op, weights),
                         lambda op: _movable(ctx, op, blocked), _chunk_ends(ctx))
        self.partition = part
        self.bodies = _bodies(ctx, part, self.shared, self.micro_batches)
        for action, body in self.bodies.items():
            fdef = body.function_def(_function_name(ctx, action))
            self.functions[action] = tf_functions.define_function(ctx.tf_graph, fdef)
            if body.accumulate:
                first = first_call_variant(fdef, _function_name(ctx, action, "_first"),
                                           body.returned_sums())
                self.firsts[action] = tf_functions.define_function(ctx.tf_graph, first)
        self.replaced = set(op.name for ops in part.cores.values() for op in ops)
        self.sum_only = set(name for body in self.bodies.values() for name in body.sum_only)
        LOG.info("EPL: the step as stage functions: %r", part)

    def _calls_reading(self, variable):
        """The actions whose functions take variable ``variable`` (its handle) as input."""
        return [action for action, body in self.bodies.items()
                if any(t.op.name == variable for t in body.inputs)]

    def call_inputs(self):
        return set([t.name for body in self.bodies.values() for t in body.inputs]
                   + [op.name for body in self.bodies.values() for op in body.outside_controls])

    def computed(self, tensor, copy, micro_batch):
        if micro_batch and tensor.name in self.sum_only:
            raise RuntimeError("EPL internal error: %s is summed inside the backward "
                               "functions; only micro-batch 0's calls return it"
                               % tensor.name)
        return super(StageFunctions, self).computed(tensor, copy, micro_batch)

    def summed_in_calls(self, grad, copy):
        return self.at(copy, self.micro_batches - 1).tensors.get(sum_key(grad))

    def boundaries(self, ctx, copy):
        """An action's entrances and exits are the calls of its functions (a backward
        may have several)."""
        found = {}
        for micro_batch in range(self.micro_batches):
            for (stage, kind, _), call in self.at(copy, micro_batch).calls.items():
                found.setdefault((stage, kind, micro_batch), []).append(call)
        return found, found


# ---- which ops --------------------------------------------------------------------
def _stage_ops(ctx):
    """(forward and backward ops of the step that micro-batches repeat, names of the
    constant expressions among the candidates: copied into each body that reads them)."""
    candidates = micro_batch_candidates(ctx)
    constants = constant_expressions(candidates, ctx.view.specialized)
    invariant = _invariant_reads(candidates)
    ops = [op for op in candidates if op.name not in constants and op.name not in invariant]
    return ops, constants


def _invariant_reads(ops):
    """Names of snapshots of ref variables that no op of the step writes: every
    micro-batch reads the same value, so all calls share one."""
    written = set()
    for op in ops:
        written.update(v.name for v in tf_adapter.written_variables(op))
    return set(op.name for op in ops if op.type == "Identity" and len(op.inputs) == 1
               and not op.control_inputs and tf_adapter.is_ref_dtype(op.inputs[0].dtype)
               and tf_adapter.is_variable_op(op.inputs[0].op)
               and op.inputs[0].op.name not in written)


def _action_of(ctx, op, weights):
    info = ctx.view.info(op)
    return (info.taskgraph, kind_of(_KINDS[info.phase], op.name, weights))


# A stage's backward is cut into at most this many functions, each ending after
# about an equal share of the stage's gradient bytes (the first chunks hold the
# last layers, whose gradients exist first).
BACKWARD_CHUNKS = 4


def _chunk_ends(ctx):
    """``chunk_ends`` for :func:`partition`: one forward function per stage; the
    backward in up to BACKWARD_CHUNKS pieces of about equal gradient bytes, so that
    each piece frees the activations it read and hands its gradients on (to the
    next micro-batch's sum, or the all-reduce) before the rest of the backward."""
    sizes = {}
    for item in _training_items(ctx).values():
        if isinstance(item.grad, tf.IndexedSlices):  # a few rows, whatever the table's size
            sizes[item.grad.values.op.name] = 1
        else:
            sizes[item.grad.op.name] = max(1, item.var.shape.num_elements() or 1)

    def chunk_ends(action, ops):
        produced = [sizes.get(op.name, 0) for op in ops]
        total = sum(produced)
        if action[1] == FORWARD or not total:
            return []
        pieces = min(BACKWARD_CHUNKS, sum(1 for size in produced if size))
        ends, running = [], 0
        for index, size in enumerate(produced):
            running += size
            if size and running * pieces >= total * (len(ends) + 1):
                ends.append(index + 1)
        return ends
    return chunk_ends


def _movable(ctx, op, blocked):
    """May ``op`` live in a function? Not: input pulls (ordered across copies), ops on
    ref tensors (a function cannot take them) or updating variables (ordered
    across micro-batches), ops that make a resource (TF drops the resources a call
    made when it returns; made outside, they live in the step's container), ops the
    user pinned to the host, ops built per copy and
    what they read (``_built_per_copy``), TF1 control flow (see
    :mod:`epl.parallel.repeat.control_flow`), and ops downstream of the gradients
    (gradient aggregation rewires those)."""
    if op.type in GET_NEXT_TYPES or op.type in PLACEHOLDER_TYPES or op.name in blocked:
        return False
    if op.name in ctx.roles.pinned:
        return False
    if any(tf_adapter.is_ref_dtype(t.dtype) for t in list(op.inputs) + list(op.outputs)):
        return False
    if op.op_def.is_stateful and any(t.dtype == tf.resource for t in op.outputs):
        return False  # it makes a resource (a TensorArray, a stack): a call drops its own
    return not tf_adapter.writes_variable(op)


def _built_per_copy(ctx, ops):
    """Names of the step's ops that a model pass builds per copy and micro-batch
    (``view.specialized``: the collectives of split layers, whose group, rank and
    instance depend on the repetition) and of the producers of what they read: the
    clones of a repetition build their own from the clones' tensors, so what they
    read must be an op of each repetition too, never a call's result that does not
    exist yet when they are built."""
    names = set()
    for op in ops:
        spec = ctx.view.specialized.get(op.name)
        if spec is not None:
            names.add(op.name)
            names.update(t.op.name for t in spec.inputs)
    return names


def _downstream_of_gradients(ctx, ops):
    """Names of step ops reading (transitively) a gradient gradient aggregation
    rewires: with ``communication.clip_after_allreduce`` the user's clipping reads
    the reduced gradients, so it must stay an op of its own."""
    roots = set(t.op.name for item in _training_items(ctx).values()
                for t in gradient_parts(item.grad))
    found = set()
    for op in ops:  # creation order is topological
        if any(t.op.name in roots or t.op.name in found for t in op.inputs):
            found.add(op.name)
    return found


# ---- function bodies --------------------------------------------------------------
def _training_items(ctx):
    return training_items(ctx.view, ctx.config.communication.clip_after_allreduce)


def _bodies(ctx, part, constants, micro_batches):
    """{action: FunctionBody} with the results others read, the gradient sums and the
    activations a stage's forward saves for its backward (see ``_saved``)."""
    cores = part.cores
    member = dict((op.name, action) for action, ops in cores.items() for op in ops)
    wanted = _wanted_tensors(ctx)
    sums = _summed_gradients(ctx, micro_batches)
    writes, reads = _saved(cores, member, wanted)
    residual = set(op.name for op in part.residual)
    bodies = {}
    for action, ops in cores.items():
        saved = set(t.name for t, _ in writes.get(action, ()))
        outputs, accumulate = [], []
        for op in ops:
            for tensor in op.outputs:
                if tensor.name in sums:
                    accumulate.append(tensor)
                if tensor.name in saved:
                    continue
                if tensor.name in wanted or any(member.get(c.name) != action
                                                for c in tensor.consumers()):
                    outputs.append(tensor)
        copied = _constant_inputs(ops, constants)
        sum_only = [t.name for t in accumulate
                    if not any(c.name in member or c.name in residual for c in t.consumers())]
        bodies[action] = FunctionBody(copied + ops, outputs, accumulate,
                                      writes.get(action, ()), reads.get(action, ()), sum_only)
    return bodies


# Dtypes whose activations pass through TensorArrays: TF's GPU number types (half, float,
# double in TF 1.15), for which TensorArray kernels exist on every device.
_SAVED_DTYPES = (tf.float16, tf.float32, tf.float64)


def _saved(cores, member, wanted):
    """({forward action: [(tensor, slot)]}, {backward action: [(tensor, slot)]}): the
    float16/32/64 tensors a stage's forward hands only to its own backward
    functions, which pass through a TensorArray per stage, dtype and micro-batch
    (see :class:`FunctionBody`), one slot per reading function (a read clears
    its slot). Tensors anything else reads stay results of the call."""
    writes, reads, slots = {}, {}, {}
    for action, ops in cores.items():
        if action[1] != FORWARD:
            continue
        for op in ops:
            for tensor in op.outputs:
                readers = set(member.get(c.name) for c in tensor.consumers()) - {action}
                if (not readers or tensor.name in wanted
                        or tensor.dtype.base_dtype not in _SAVED_DTYPES
                        or any(r is None or r[0] != action[0] or r[1] == FORWARD
                               for r in readers)):
                    continue
                key = (action[0], tensor.dtype.base_dtype)
                for reader in sorted(readers):
                    slot = slots[key] = slots.get(key, -1) + 1
                    writes.setdefault(action, []).append((tensor, slot))
                    reads.setdefault(reader, []).append((tensor, slot))
    return writes, reads


def _wanted_tensors(ctx):
    """Names of tensors a fetch or a later pass asks for by name: losses, collected
    tensors and gradients."""
    names = set()
    for call in ctx.view.gradient_calls:
        names.update(y.name for y in call.ys if isinstance(y, tf.Tensor))
    for tensors in ctx.view.collections.values():
        names.update(t.name for t in tensors)
    for item in _training_items(ctx).values():
        names.update(t.name for t in gradient_parts(item.grad))
    return names


def _summed_gradients(ctx, micro_batches):
    """Names of the dense gradients gradient aggregation sums over micro-batches."""
    if micro_batches == 1:
        return set()
    return set(item.grad.name for item in _training_items(ctx).values()
               if not isinstance(item.grad, tf.IndexedSlices))


def _constant_inputs(ops, constants):
    """The constant expressions ``ops`` read, with what they are computed from, in
    creation order: copied into the body so that each function folds its own."""
    found, stack = {}, [t.op for op in ops for t in op.inputs if t.op.name in constants]
    while stack:
        op = stack.pop()
        if op.name in found:
            continue
        found[op.name] = op
        stack.extend(t.op for t in op.inputs)
    return sorted(found.values(), key=tf_adapter.op_id)


_FUNCTION_KINDS = {FORWARD: "forward", BACKWARD: "backward", WEIGHT: "weights"}


def _function_name(ctx, action, suffix=""):
    taken = tf_adapter.function_names(ctx.tf_graph)
    kind = _FUNCTION_KINDS[action[1]]
    chunk = "%d" % action[2] if action[1] != FORWARD or action[2] else ""
    base = "EPL_stage%d_%s%s%s" % (action[0], kind, chunk, suffix)
    name, index = base, 1
    while name in taken:
        name, index = "%s_%d" % (base, index), index + 1
    return name
