"""The calls of the stage functions, per local copy and micro-batch.

:mod:`epl.parallel.passes.stage_functions` decides which ops become functions
(*cores*) and defines them before the replica clone, which then copies only what
is not in a function (variables, updates, residual ops). This module builds, per
copy, one call per action and micro-batch, and copies of the residual ops for
micro-batches 1..m-1, and points everything that read a user tensor of a core
at the call that now computes it.

The user's core ops stay in the graph (TF cannot delete ops) and stand in for
the calls' results until the calls exist: every copy's ops that read them
(its updates and residual ops, metrics, summaries, EPL's own ops) are rewired
to that copy's calls, and then nothing runs them.
"""
from epl import tf_adapter, tf_functions
from epl.ir.phase import Phase
from epl.ir.taskgraph import OpInfo
from epl.parallel.clone import Cloner
from epl.parallel.passes.micro_batches import MICRO_BATCH_PREFIX
from epl.parallel.passes.replicas import REPLICA_PREFIX
from epl.parallel.stage_partition import FORWARD
from epl.tf_adapter import tf


class StageCalls(object):
    """The lowering unit's record: the functions and what each (copy, micro-batch) has.

    ``functions[action]`` is the function of an action; ``firsts[action]`` its
    variant for micro-batch 0 when it sums gradients (no accumulator arguments).
    ``tensors[(copy, micro_batch)]`` maps a user tensor's name to the result of a
    call (or of a residual op's copy); ``sums[copy]`` maps a dense gradient's name
    to its sum over micro-batches; ``calls[(copy, micro_batch)][action]`` is the
    call op of action (stage, kind, chunk); ``replaced`` names the user ops that
    calls replace (never copied for other replicas).
    """

    def __init__(self, partition, bodies, functions, firsts):
        self.partition = partition
        self.bodies = bodies
        self.functions = functions
        self.firsts = firsts
        self.replaced = set(op.name for ops in partition.cores.values() for op in ops)
        self.sum_only = set(name for body in bodies.values() for name in body.sum_only)
        self.tensors = {}
        self.sums = {}
        self.calls = {}

    def tensor(self, tensor, copy, micro_batch):
        if micro_batch and tensor.name in self.sum_only:
            raise RuntimeError("EPL internal error: %s is summed inside the backward "
                               "functions; only micro-batch 0's calls return it"
                               % tensor.name)
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


def build_calls(ctx, unit):
    """Every local copy's calls; then the cross-micro-batch order and the program."""
    for copy in range(len(ctx.copies)):
        _CopyBuilder(ctx, unit, copy).build()
    _order_shared_writes(ctx, unit)
    _record_program(ctx, unit)


def _sum_key(tensor):
    return "EPL_SUM:" + tensor.name


class _CopyBuilder(object):
    """Calls and residual copies of one local copy, for every micro-batch.

    Micro-batch 0 uses the copy's own residual ops; micro-batch k > 0 a clone of
    them. Clones first read the user tensors the calls replace; once the calls of
    their micro-batch exist they are rewired to the calls' results.
    """

    def __init__(self, ctx, unit, copy):
        self.ctx, self.unit, self.copy = ctx, unit, copy
        self.part = unit.partition
        self.residual = set(self.part.residual)
        self.clones = {}   # micro-batch -> CloneResult of the copy's residual ops
        self.array_sizes = {}  # (stage, dtype) -> size of the saved-tensor arrays
        skipped = ctx.skipped_ops(copy, 0)
        self.own_residual = [ctx.instance(op, copy) for op in self.part.residual
                             if op.name not in skipped]
        # user tensors and ops that calls replace (copy 0's: cores are never copied)
        self.stand_in = {}
        for body in unit.bodies.values():
            for tensor in body.outputs:
                self.stand_in[id(tensor)] = tensor
        self.dead = dict((id(op), action) for action, ops in self.part.cores.items()
                         for op in ops)

    def build(self):
        ctx = self.ctx
        micro_batches = ctx.num_micro_batch
        cloner = (Cloner(ctx.tf_graph, self.own_residual)
                  if self.own_residual and micro_batches > 1 else None)
        for micro_batch in range(micro_batches):
            if micro_batch and cloner is not None:
                self._clone_residual(cloner, micro_batch)
            self._calls(micro_batch)
        for micro_batch, result in self.clones.items():
            for op in result.ops.values():
                self._rewire(op, micro_batch)
        self._rewire_readers_of_micro_batch_0()
        last = self.unit.tensors[(self.copy, micro_batches - 1)]
        self.unit.sums[self.copy] = dict(
            (t.name, last[_sum_key(t)]) for body in self.unit.bodies.values()
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
            new_op = result.ops.get(ctx.instance(user_op, copy).name)
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
        arrays = {}  # (stage, dtype) -> [handle, flow] of this micro-batch's saved tensors
        for action in self.part.order:
            body, function = self.unit.bodies[action], self.unit.functions[action]
            inputs = [self._resolve(t, micro_batch) for t in body.inputs]
            if body.writes:
                self._new_arrays(arrays, body, action, micro_batch)
            for dtype in body.arrays:
                inputs += arrays[(action[0], dtype)]
            if micro_batch == 0 and body.accumulate:
                function = self.unit.firsts[action]  # the sums start at the gradients
            else:
                inputs += [self._running_sum(t, micro_batch) for t in body.accumulate]
            controls = [self._resolve_op(c, micro_batch) for c in body.outside_controls]
            stage, kind, _ = action
            prefix = REPLICA_PREFIX % copy + "/" if copy else ""
            with ctx.tf_graph.as_default(), tf.name_scope(None):
                call, results = tf_functions.call_function(
                    function, inputs,
                    "%s%s/%s" % (prefix, MICRO_BATCH_PREFIX % micro_batch, function.name),
                    ctx.device(stage, copy), controls)
            phase = Phase.FORWARD if kind == FORWARD else Phase.BACKWARD
            ctx.view.record_clone(call, OpInfo(stage, phase), copy, micro_batch, None)
            calls[action] = call
            layout = body.results(first=micro_batch == 0 and bool(body.accumulate))
            if len(layout) != len(results):
                raise RuntimeError("EPL internal error: %s returns %d results, expected %d"
                                   % (function.name, len(results), len(layout)))
            for (role, key), result in zip(layout, results):
                if role == "flow":
                    arrays[(stage, key)][1] = result
                    continue
                # Static shapes (a C call each, tens of thousands at m = 32) only where
                # something reads them: micro-batch 0's results replace user tensors;
                # the last sums feed gradient fusion.
                if role == "out":
                    tensors[key.name] = result
                    shaped = micro_batch == 0
                else:
                    tensors[_sum_key(key)] = result
                    shaped = micro_batch == ctx.num_micro_batch - 1
                if shaped:
                    result.set_shape(key.shape)

    def _new_arrays(self, arrays, body, action, micro_batch):
        """This micro-batch's TensorArrays of the saved tensors ``body`` writes, one per
        dtype, on the stage's device (the backward calls read and clear them)."""
        ctx, stage = self.ctx, action[0]
        prefix = REPLICA_PREFIX % self.copy + "/" if self.copy else ""
        for dtype in body.flows:
            name = "EPL_SAVED_%d_%s" % (stage, dtype.name)
            with ctx.tf_graph.as_default(), tf.name_scope(None):
                if (stage, dtype) not in self.array_sizes:  # one constant for all micro-batches
                    self.array_sizes[(stage, dtype)] = tf_adapter.constant_on(
                        sum(1 for t, _ in body.writes if t.dtype.base_dtype == dtype),
                        prefix + name + "/size", ctx.device(stage, self.copy))
                arrays[(stage, dtype)] = list(tf_functions.step_tensor_array(
                    dtype, self.array_sizes[(stage, dtype)],
                    "%s%s/%s" % (prefix, MICRO_BATCH_PREFIX % micro_batch, name),
                    ctx.device(stage, self.copy)))

    def _running_sum(self, tensor, micro_batch):
        return self.unit.tensors[(self.copy, micro_batch - 1)][_sum_key(tensor)]

    def _resolve(self, tensor, micro_batch):
        """The tensor (copy, micro_batch) reads for user tensor ``tensor``."""
        if tensor.op in self.part.action_of or (micro_batch and tensor.op in self.residual):
            return self.unit.tensors[(self.copy, micro_batch)][tensor.name]
        return self.ctx.tensor_instance(tensor, self.copy, 0)

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
        """Every other reader of the replaced user tensors in this copy (its updates,
        metrics, summaries, EPL's ops, residual ops of micro-batch 0) reads
        micro-batch 0's calls; ops of no copy (summaries) count as copy 0's."""
        seen, readers = set(), []
        candidates = [c for body in self.unit.bodies.values() for t in body.outputs
                      for c in t.consumers()]
        candidates += [c for ops in self.part.cores.values() for op in ops
                       for c in tf_adapter.control_outputs(op)]
        for consumer in candidates:
            if id(consumer) in self.dead or id(consumer) in seen:
                continue
            info = self.ctx.view.info(consumer)
            if (info.copy if info is not None else 0) != self.copy:
                continue
            seen.add(id(consumer))
            readers.append(consumer)
        for reader in readers:
            self._rewire(reader, 0)


def _order_shared_writes(ctx, unit):
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
    for action, body in unit.bodies.items():
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


def _record_program(ctx, unit):
    """Fetching a user tensor that a call replaces returns micro-batch 0's result;
    fetching one of its ops runs the other copies' calls of that action."""
    program = ctx.program
    for body in unit.bodies.values():
        for tensor in body.outputs:
            program.substitutes[tensor.name] = unit.tensors[(0, 0)][tensor.name]
    for action, ops in unit.partition.cores.items():
        others = [unit.calls[(copy, 0)][action] for copy in range(1, len(ctx.copies))]
        for op in ops:
            program.replaced_ops.add(op.name)
            if others:
                program.extras[op.name] = list(others)
