"""Pipeline micro-batches as calls of stage functions (``Plan.micro_batching``).

Each stage's forward and backward ops become one function each
(:mod:`epl.parallel.function_body`), built once and called once per
micro-batch on the stage's device, per local copy. The graph therefore holds
the model once plus a few ops per micro-batch, and TensorFlow optimizes each
function body once, so the time to the first step does not grow with
``pipeline.num_micro_batch``. The schedule orders the calls (one control edge
per pair of consecutive actions of a stage: see ``ScheduleLowering``).

What the calls replace:
  * the user's forward and backward ops of every copy stay in the graph but no
    longer run: whatever read them (the optimizer's updates, metrics, summaries,
    EPL's own ops) reads the results of micro-batch 0's calls instead, and a
    fetch of a user tensor returns micro-batch 0's result (``program.substitutes``);
  * a dense gradient is summed over micro-batches inside the backward function
    (each call takes the running sum and returns it plus its micro-batch's
    gradient), so the sum costs no op per micro-batch;
  * residual ops (see :mod:`epl.parallel.stage_partition`) are copied per
    micro-batch and read the calls' results.
"""
import logging

from epl import tf_adapter
from epl.ir.phase import Phase
from epl.ir.taskgraph import OpInfo
from epl.ir.traverse import CONTROL_FLOW_TYPES, ancestor_ops
from epl.parallel.clone import Cloner
from epl.parallel.function_body import FunctionBody
from epl.parallel.passes import REPLICATE, Pass
from epl.parallel.passes.gradients import training_items
from epl.parallel.passes.micro_batches import (MICRO_BATCH_PREFIX, constant_expressions,
                                               micro_batch_candidates)
from epl.parallel.passes.replicas import REPLICA_PREFIX
from epl.parallel.plan import STAGE_FUNCTIONS
from epl.parallel.roles import GET_NEXT_TYPES, PLACEHOLDER_TYPES, step_roots
from epl.parallel.stage_partition import BACKWARD, FORWARD, partition
from epl.tf_adapter import tf

LOG = logging.getLogger("epl")
_KINDS = {Phase.FORWARD: FORWARD, Phase.BACKWARD: BACKWARD}
_PHASES = {FORWARD: Phase.FORWARD, BACKWARD: Phase.BACKWARD}


def unrolled_reason(view):
    """Why this graph's pipeline cannot use stage functions (None if it can).

    TF1 control flow (while loops, conds) in a stage runs in a function, but the
    tensors that its forward hands its backward may be dead (an untaken branch)
    or loop state, which a function cannot return; collectives built per copy
    (split layers) must be rebuilt per micro-batch. Such graphs keep one copy of
    the stage per micro-batch."""
    for op in ancestor_ops(step_roots(view)):
        info = view.info(op)
        if info is None or info.phase not in _KINDS:
            continue
        if op.type in CONTROL_FLOW_TYPES:
            return "TF1 control flow in a pipeline stage (%s op %s)" % (op.type, op.name)
        if op.name in view.specialized:
            return "a collective built per copy in a pipeline stage (%s)" % op.name
    return None


class StageCalls(object):
    """What each (copy, micro-batch) has, once the stage functions are called.

    ``tensors[(copy, micro_batch)]`` maps a user tensor's name to the result of a
    call (or of a residual op's copy); ``sums[copy]`` maps a dense gradient's name
    to its sum over micro-batches; ``calls[(copy, micro_batch)][action]`` is the
    call op of action (stage, kind, chunk).
    """

    def __init__(self, partition_):
        self.partition = partition_
        self.tensors = {}
        self.sums = {}
        self.calls = {}

    def tensor(self, tensor, copy, micro_batch):
        return self.tensors.get((copy, micro_batch), {}).get(tensor.name)

    def accumulated(self, tensor, copy):
        """The sum over micro-batches of dense tensor ``tensor`` in ``copy``, or None."""
        return self.sums.get(copy, {}).get(tensor.name)

    def boundaries(self, copy, micro_batches):
        """({action key: [ops it starts with]}, {action key: [ops it ends with]}):
        the calls of the action's functions (a backward may have several)."""
        found = {}
        for micro_batch in range(micro_batches):
            for (stage, kind, _), call in self.calls[(copy, micro_batch)].items():
                found.setdefault((stage, kind, micro_batch), []).append(call)
        return found, found


class StageFunctions(Pass):
    """Lower a pipeline's micro-batches to calls of per-stage functions."""

    name = "stage_functions"
    phase = REPLICATE
    reads = ("roles", "copies", "instances", "plan.micro_batching", "apply records")
    writes = ("stage functions and their calls", "micro_batching (tensors per copy and "
              "micro-batch, gradient sums)", "instances[(c, m)] of residual ops",
              "program.substitutes", "program.extras")

    def applies(self, ctx):
        return ctx.plan.pipeline and ctx.plan.micro_batching[0] == STAGE_FUNCTIONS

    def run(self, ctx):
        stage_ops, constants = _stage_ops(ctx)
        built = [op.name for op in stage_ops if op.name in ctx.view.specialized]
        if built:  # made by a model pass after the plan chose the lowering
            raise NotImplementedError(
                "pipeline.micro_batching: a model pass built per-copy collectives in a "
                "pipeline stage (%s), which stage functions cannot call once per "
                "micro-batch; set pipeline.micro_batching='unrolled'" % ", ".join(built[:3]))
        blocked = _downstream_of_gradients(ctx, stage_ops)
        part = partition(stage_ops, lambda op: _action_of(ctx, op),
                         lambda op: _movable(ctx, op, blocked), _chunk_ends(ctx))
        unit = StageCalls(part)
        bodies = _bodies(ctx, part, constants)
        functions = dict(
            (action, tf_adapter.define_function(ctx.tf_graph, body.function_def(
                _function_name(ctx, action)))) for action, body in bodies.items())
        for copy in range(len(ctx.copies)):
            _CopyBuilder(ctx, unit, bodies, functions, copy).build()
        _order_shared_writes(ctx, unit, bodies)
        _record_program(ctx, unit, bodies)
        ctx.micro_batching = unit
        LOG.info("EPL: pipeline micro-batches as stage functions: %r", part)


# ---- which ops --------------------------------------------------------------------
def _stage_ops(ctx):
    """(forward and backward ops of the step that micro-batches repeat, names of the
    constant expressions among the candidates: copied into each body that reads them)."""
    candidates = micro_batch_candidates(ctx)
    constants = constant_expressions(candidates)
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
               and not op.control_inputs and op.inputs[0].dtype._is_ref_dtype
               and tf_adapter.is_variable_op(op.inputs[0].op)
               and op.inputs[0].op.name not in written)


def _action_of(ctx, op):
    info = ctx.view.info(op)
    return (info.taskgraph, _KINDS[info.phase])


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
    for item in training_items(ctx).values():
        if isinstance(item.grad, tf.IndexedSlices):  # a few rows, whatever the table's size
            sizes[item.grad.values.op.name] = 1
        else:
            sizes[item.grad.op.name] = max(1, item.var.shape.num_elements() or 1)

    def chunk_ends(action, ops):
        produced = [sizes.get(op.name, 0) for op in ops]
        total = sum(produced)
        if action[1] != BACKWARD or not total:
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
    across micro-batches), ops the user pinned to the host, and ops downstream of
    the gradients (gradient aggregation rewires those)."""
    if op.type in GET_NEXT_TYPES or op.type in PLACEHOLDER_TYPES or op.name in blocked:
        return False
    if op.name in ctx.roles.pinned or op.name in ctx.view.specialized:
        return False
    if any(t.dtype._is_ref_dtype for t in list(op.inputs) + list(op.outputs)):
        return False
    return not tf_adapter.writes_variable(op)


def _downstream_of_gradients(ctx, ops):
    """Names of step ops reading (transitively) a gradient gradient aggregation
    rewires: with ``communication.clip_after_allreduce`` the user's clipping reads
    the reduced gradients, so it must stay an op of its own."""
    roots = set(t.op.name for item in training_items(ctx).values()
                for t in _parts(item.grad))
    found = set()
    for op in ops:  # creation order is topological
        if any(t.op.name in roots or t.op.name in found for t in op.inputs):
            found.add(op.name)
    return found


# ---- function bodies --------------------------------------------------------------
def _bodies(ctx, part, constants):
    """{action: FunctionBody} with the results others read and the gradient sums."""
    cores = part.cores
    member = dict((op.name, action) for action, ops in cores.items() for op in ops)
    wanted = _wanted_tensors(ctx)
    sums = _summed_gradients(ctx)
    bodies = {}
    for action, ops in cores.items():
        outputs, accumulate = [], []
        for op in ops:
            for tensor in op.outputs:
                if tensor.name in sums:
                    accumulate.append(tensor)
                if tensor.name in wanted or any(member.get(c.name) != action
                                                for c in tensor.consumers()):
                    outputs.append(tensor)
        copied = _constant_inputs(ops, constants)
        bodies[action] = FunctionBody(copied + ops, outputs, accumulate)
    return bodies


def _wanted_tensors(ctx):
    """Names of tensors a fetch or a later pass asks for by name: losses, collected
    tensors and gradients."""
    names = set()
    for call in ctx.view.gradient_calls:
        names.update(y.name for y in call.ys if isinstance(y, tf.Tensor))
    for tensors in ctx.view.collections.values():
        names.update(t.name for t in tensors)
    for item in training_items(ctx).values():
        names.update(t.name for t in _parts(item.grad))
    return names


def _parts(grad):
    """The tensors of a dense or sparse gradient."""
    return [grad.values, grad.indices] if isinstance(grad, tf.IndexedSlices) else [grad]


def _summed_gradients(ctx):
    """Names of the dense gradients gradient aggregation sums over micro-batches."""
    return set(item.grad.name for item in training_items(ctx).values()
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


def _function_name(ctx, action):
    taken = tf_adapter.function_names(ctx.tf_graph)
    base = "EPL_stage%d_%s" % (action[0], "forward" if action[1] == FORWARD
                               else "backward%d" % action[2])
    name, index = base, 1
    while name in taken:
        name, index = "%s_%d" % (base, index), index + 1
    return name


# ---- calls ----------------------------------------------------------------------
class _CopyBuilder(object):
    """Calls and residual copies of one local copy, for every micro-batch.

    Micro-batch 0 uses the copy's own residual ops; micro-batch k > 0 a clone of
    them. Clones first read the copy's (no longer running) user tensors; once the
    calls of their micro-batch exist they are rewired to the calls' results.
    """

    def __init__(self, ctx, unit, bodies, functions, copy):
        self.ctx, self.unit, self.copy = ctx, unit, copy
        self.bodies, self.functions = bodies, functions
        self.part = unit.partition
        self.residual = set(self.part.residual)
        self.clones = {}   # micro-batch -> CloneResult of the copy's residual ops
        skipped = ctx.skipped_ops(copy, 0)
        self.own_residual = [ctx.instance(op, copy) for op in self.part.residual
                             if op.name not in skipped]
        # the copy's instances of user tensors/ops that calls replace
        self.stand_in = {}
        for action, body in bodies.items():
            for tensor in body.outputs:
                self.stand_in.setdefault(id(self._own(tensor)), tensor)
        dropped = ctx.dropped.get((copy, 0), ())
        self.dead = dict((id(ctx.instance(op, copy)), action)
                         for action, ops in self.part.cores.items() for op in ops
                         if op.name not in dropped)
        self._zeros = {}

    def _own(self, tensor):
        return self.ctx.tensor_instance(tensor, self.copy, 0)

    def build(self):
        ctx = self.ctx
        micro_batches = ctx.num_micro_batch
        cloner = Cloner(ctx.tf_graph, self.own_residual) if self.own_residual else None
        for micro_batch in range(micro_batches):
            if micro_batch and cloner is not None:
                self._clone_residual(cloner, micro_batch)
            self._calls(micro_batch)
        for micro_batch in range(1, micro_batches):
            for op in (self.clones[micro_batch].ops.values() if micro_batch in self.clones
                       else ()):
                self._rewire(op, micro_batch)
        self._rewire_readers_of_micro_batch_0()
        last = self.unit.tensors[(self.copy, micro_batches - 1)]
        self.unit.sums[self.copy] = dict(
            (t.name, last[_sum_key(t)]) for body in self.bodies.values()
            for t in body.accumulate)

    def _clone_residual(self, cloner, micro_batch):
        ctx, copy = self.ctx, self.copy
        prefix = MICRO_BATCH_PREFIX % micro_batch
        if copy:
            prefix = "%s/%s" % (REPLICA_PREFIX % copy, prefix)
        result = cloner.clone(prefix, device_of=lambda src: src.device, tag=(copy, micro_batch))
        self.clones[micro_batch] = result
        table = ctx.instances.setdefault((copy, micro_batch), {})
        tensors = self.unit.tensors.setdefault((copy, micro_batch), {})
        for user_op in self.part.residual:
            own = ctx.instance(user_op, copy)
            new_op = result.ops.get(own.name)
            if new_op is None:
                continue
            table[user_op.name] = new_op
            ctx.view.record_clone(new_op, ctx.view.info(user_op), copy, micro_batch,
                                  user_op.name)
            for tensor, new in zip(user_op.outputs, new_op.outputs):
                tensors[tensor.name] = new

    def _calls(self, micro_batch):
        ctx, copy = self.ctx, self.copy
        tensors = self.unit.tensors.setdefault((copy, micro_batch), {})
        calls = self.unit.calls.setdefault((copy, micro_batch), {})
        for action in self.part.order:
            body = self.bodies[action]
            inputs = [self._resolve(t, micro_batch) for t in body.inputs]
            inputs += [self._running_sum(t, micro_batch) for t in body.accumulate]
            controls = [self._resolve_op(c, micro_batch) for c in body.outside_controls]
            stage, kind, _ = action
            prefix = REPLICA_PREFIX % copy + "/" if copy else ""
            with ctx.tf_graph.as_default(), tf.name_scope(None), tf.device(
                    ctx.device(stage, copy)), tf.control_dependencies(controls):
                call, results = tf_adapter.call_function(
                    self.functions[action], inputs,
                    "%s%s/%s" % (prefix, MICRO_BATCH_PREFIX % micro_batch,
                                 self.functions[action].name))
            ctx.view.record_clone(call, OpInfo(stage, _PHASES[kind]), copy, micro_batch, None)
            calls[action] = call
            # Static shapes (a C call each, tens of thousands at m = 32) only where
            # something reads them: micro-batch 0's results replace user tensors;
            # the last sums feed gradient fusion.
            if micro_batch == 0:
                for tensor, result in zip(body.outputs, results):
                    result.set_shape(tensor.shape)
            if micro_batch == ctx.num_micro_batch - 1:
                for tensor, result in zip(body.accumulate, results[len(body.outputs):]):
                    result.set_shape(tensor.shape)
            for tensor, result in zip(body.outputs, results):
                tensors[tensor.name] = result
            for tensor, result in zip(body.accumulate, results[len(body.outputs):]):
                tensors[_sum_key(tensor)] = result

    def _running_sum(self, tensor, micro_batch):
        if micro_batch:
            return self.unit.tensors[(self.copy, micro_batch - 1)][_sum_key(tensor)]
        dtype = tensor.dtype.base_dtype
        if dtype not in self._zeros:
            with self.ctx.tf_graph.as_default(), tf.name_scope(None), tf.device(
                    self.ctx.host):
                self._zeros[dtype] = tf.zeros([], dtype, name="EPL_STAGE_FUNCTIONS/zero")
        return self._zeros[dtype]

    def _resolve(self, tensor, micro_batch):
        """The tensor (copy, micro_batch) reads for user tensor ``tensor``."""
        if tensor.op in self.part.action_of or (micro_batch and tensor.op in self.residual):
            return self.unit.tensors[(self.copy, micro_batch)][tensor.name]
        return self._own(tensor)

    def _resolve_op(self, op, micro_batch):
        action = self.part.action_of.get(op)
        if action is not None:
            return self.unit.calls[(self.copy, micro_batch)][action]
        if micro_batch and op in self.residual:
            return self.ctx.instances[(self.copy, micro_batch)][op.name]
        return self.ctx.instance(op, self.copy)

    def _rewire(self, op, micro_batch):
        """Point ``op`` (of ``micro_batch``) at the calls' results instead of the
        user tensors they replace; make it wait for calls instead of user ops."""
        tensors = self.unit.tensors[(self.copy, micro_batch)]
        calls = self.unit.calls[(self.copy, micro_batch)]
        for index, tensor in enumerate(op.inputs):
            user = self.stand_in.get(id(tensor))
            if user is not None:
                tf_adapter.update_input(op, index, tensors[user.name])
        for control in list(op.control_inputs):
            action = self.dead.get(id(control))
            if action is not None:
                tf_adapter.replace_control_input(op, control, calls[action])

    def _rewire_readers_of_micro_batch_0(self):
        """Every other reader of the copy's user tensors (its updates, metrics,
        summaries, EPL's ops, residual ops of micro-batch 0) reads micro-batch 0's
        calls."""
        seen, readers = set(), []
        for action, body in self.bodies.items():
            for tensor in body.outputs:
                for consumer in self._own(tensor).consumers():
                    if id(consumer) not in self.dead and id(consumer) not in seen:
                        seen.add(id(consumer))
                        readers.append(consumer)
        dropped = self.ctx.dropped.get((self.copy, 0), ())
        for action, ops in self.part.cores.items():
            for op in ops:
                if op.name in dropped:
                    continue
                for consumer in tf_adapter.control_outputs(self.ctx.instance(op, self.copy)):
                    if id(consumer) not in self.dead and id(consumer) not in seen:
                        seen.add(id(consumer))
                        readers.append(consumer)
        for reader in readers:
            self._rewire(reader, 0)


def _sum_key(tensor):
    return "EPL_SUM:" + tensor.name


# ---- ordering and the session's view -------------------------------------------------
def _order_shared_writes(ctx, unit, bodies):
    """Micro-batch k touches a variable that residual ops write (batch norm's moving
    statistics) only after micro-batch k-1's writes, as with unrolled copies."""
    writers, users = {}, {}
    for op in unit.partition.residual:
        for variable in tf_adapter.written_variables(op):
            writers.setdefault(variable.name, []).append(op)
    if not writers:
        return
    for op in unit.partition.residual:
        for tensor in op.inputs:
            if tensor.op.name in writers:
                users.setdefault(tensor.op.name, []).append(("op", op))
    for action, body in bodies.items():
        for tensor in body.inputs:
            if tensor.op.name in writers:
                users.setdefault(tensor.op.name, []).append(("call", action))
    for copy in range(len(ctx.copies)):
        for name, written_by in writers.items():
            for micro_batch in range(1, ctx.num_micro_batch):
                before = [ctx.instances[(copy, micro_batch - 1)][w.name] if micro_batch > 1
                          else ctx.instance(w, copy) for w in written_by]
                for kind, user in users.get(name, ()):
                    target = (unit.calls[(copy, micro_batch)][user] if kind == "call"
                              else ctx.instances[(copy, micro_batch)][user.name])
                    tf_adapter.add_control_inputs(target, before)


def _record_program(ctx, unit, bodies):
    """Fetching a user tensor that a call replaces returns micro-batch 0's result;
    fetching one of its ops runs the other copies' calls of that action."""
    program = ctx.program
    for body in bodies.values():
        for tensor in body.outputs:
            program.substitutes[tensor.name] = unit.tensors[(0, 0)][tensor.name]
    for action, ops in unit.partition.cores.items():
        others = [unit.calls[(copy, 0)][action] for copy in range(1, len(ctx.copies))]
        for op in ops:
            program.replaced_ops.add(op.name)
            if op.name in program.extras:
                program.extras[op.name] = list(others)
