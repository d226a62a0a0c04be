"""The calls of the stage functions, per local copy and micro-batch.

:mod:`epl.parallel.repeat.functions` decides which ops become functions (*cores*)
and defines them; the residual ops and everything else of the step are cloned per
micro-batch and copy (:mod:`epl.parallel.repeat.copies`). This module builds, per
copy, one call per action and micro-batch, and points everything that read a user
tensor of a core at the call that now computes it.

The user's core ops stay in the graph (TF cannot delete ops) and stand in for the
calls' results until the calls exist: every copy's ops that read them (its updates
and residual ops, metrics, summaries, EPL's own ops) are rewired to that copy's
calls, and then nothing runs them.
"""
from epl import tf_adapter, tf_functions
from epl.ir.phase import Phase
from epl.ir.taskgraph import OpInfo
from epl.parallel.repeat.copies import MICRO_BATCH_PREFIX, REPLICA_PREFIX
from epl.parallel.repeat.stage_partition import FORWARD
from epl.tf_adapter import tf


def sum_key(tensor):
    """The key of a gradient's running sum among a repetition's ``tensors``."""
    return "EPL_SUM:" + tensor.name


def build_calls(ctx, rep):
    """Every local copy's calls; then what the session layer needs to know."""
    for copy in range(rep.copies):
        _CopyBuilder(ctx, rep, copy).build()
    _record_program(ctx, rep)


class _CopyBuilder(object):
    """Calls of one local copy, for every micro-batch, and the rewiring of the copy's
    ops that read user tensors the calls compute now.

    The clones of the residual ops for micro-batch k > 0 first read the user tensors
    the calls replace; once the calls of their micro-batch exist they are rewired to
    the calls' results.
    """

    def __init__(self, ctx, rep, copy):
        self.ctx, self.rep, self.copy = ctx, rep, copy
        self.part = rep.partition
        self.array_sizes = {}  # (stage, dtype) -> size of the saved-tensor arrays
        # user tensors and ops that calls replace (copy 0's: cores are never copied)
        self.stand_in = {}
        for body in rep.bodies.values():
            for tensor in body.outputs:
                self.stand_in[id(tensor)] = tensor
        self.dead = dict((id(op), action) for action, ops in self.part.cores.items()
                         for op in ops)

    def build(self):
        for micro_batch in range(self.rep.micro_batches):
            self._calls(micro_batch)
        for micro_batch in range(1, self.rep.micro_batches):
            instance = self.rep.at(self.copy, micro_batch)
            for name, op in list(instance.ops.items()):
                if name not in instance.aliases:  # residual clones, never stand-ins
                    self._rewire(op, micro_batch)
        self._rewire_readers_of_micro_batch_0()

    def _calls(self, micro_batch):
        ctx, rep, copy = self.ctx, self.rep, self.copy
        instance = rep.at(copy, micro_batch)
        arrays = {}  # (stage, dtype) -> [handle, flow] of this micro-batch's saved tensors
        for action in self.part.order:
            body, function = rep.bodies[action], rep.functions[action]
            inputs = [self._resolve(t, micro_batch) for t in body.inputs]
            if body.writes:
                self._new_arrays(arrays, body, action, micro_batch)
            for dtype in body.arrays:
                inputs += arrays[(action[0], dtype)]
            if micro_batch == 0 and body.accumulate:
                function = rep.firsts[action]  # the sums start at the gradients
            else:
                inputs += [rep.at(copy, micro_batch - 1).tensors[sum_key(t)]
                           for t in body.accumulate]
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
            instance.calls[action] = call
            self._record_results(body, function, action, results, arrays, micro_batch)

    def _record_results(self, body, function, action, results, arrays, micro_batch):
        tensors = self.rep.at(self.copy, micro_batch).tensors
        layout = body.results(first=micro_batch == 0 and bool(body.accumulate))
        if len(layout) != len(results):
            raise RuntimeError("EPL internal error: %s returns %d results, expected %d"
                               % (function.name, len(results), len(layout)))
        for (role, key), result in zip(layout, results):
            if role == "flow":
                arrays[(action[0], key)][1] = result
                continue
            # Static shapes (a C call each, tens of thousands at m = 32) only where
            # something reads them: micro-batch 0's results replace user tensors;
            # the last sums feed gradient fusion.
            if role == "out":
                tensors[key.name] = result
                shaped = micro_batch == 0
            else:
                tensors[sum_key(key)] = result
                shaped = micro_batch == self.rep.micro_batches - 1
            if shaped:
                result.set_shape(key.shape)

    def _new_arrays(self, arrays, body, action, micro_batch):
        """This micro-batch's TensorArrays of the saved tensors of ``body``'s stage, one
        per dtype, on the stage's device, made before the stage's first forward function
        that writes one (the backward calls read and clear them)."""
        ctx, stage = self.ctx, action[0]
        prefix = REPLICA_PREFIX % self.copy + "/" if self.copy else ""
        for dtype in body.flows:
            if (stage, dtype) in arrays:
                continue  # an earlier forward function of the stage made it
            name = "EPL_SAVED_%d_%s" % (stage, dtype.name)
            with ctx.tf_graph.as_default(), tf.name_scope(None):
                if (stage, dtype) not in self.array_sizes:  # one constant for all micro-batches
                    self.array_sizes[(stage, dtype)] = tf_adapter.constant_on(
                        sum(1 for (s, _, _), b in self.rep.bodies.items() if s == stage
                            for t, _ in b.writes if t.dtype.base_dtype == dtype),
                        prefix + name + "/size", ctx.device(stage, self.copy))
                arrays[(stage, dtype)] = list(tf_functions.step_tensor_array(
                    dtype, self.array_sizes[(stage, dtype)],
                    "%s%s/%s" % (prefix, MICRO_BATCH_PREFIX % micro_batch, name),
                    ctx.device(stage, self.copy)))

    def _resolve(self, tensor, micro_batch):
        """The tensor (copy, micro_batch) reads for user tensor ``tensor``."""
        if tensor.op in self.part.action_of:
            found = self.rep.computed(tensor, self.copy, micro_batch)
            if found is None:
                raise RuntimeError("EPL internal error: no call computes %s yet" % tensor.name)
            return found
        return self.rep.tensor(tensor, self.copy, micro_batch)

    def _resolve_op(self, op, micro_batch):
        action = self.part.action_of.get(op)
        if action is not None:
            return self.rep.at(self.copy, micro_batch).calls[action]
        return self.rep.op(op, self.copy, micro_batch)

    def _rewire(self, op, micro_batch):
        """Point ``op`` (of ``micro_batch``) at the calls' results instead of the
        user tensors they replace; make it wait for calls instead of user ops."""
        instance = self.rep.at(self.copy, micro_batch)
        for index, tensor in enumerate(op.inputs):
            user = self.stand_in.get(id(tensor))
            if user is not None:
                tf_adapter.update_input(op, index, instance.tensors[user.name])
        for control in list(op.control_inputs):
            action = self.dead.get(id(control))
            if action is not None:
                tf_adapter.replace_control_input(op, control, instance.calls[action])

    def _rewire_readers_of_micro_batch_0(self):
        """Every other reader of the replaced user tensors in this copy (its updates,
        metrics, summaries, EPL's ops, residual ops of micro-batch 0) reads
        micro-batch 0's calls; ops of no copy (summaries) count as copy 0's."""
        seen, readers = set(), []
        candidates = [c for body in self.rep.bodies.values() for t in body.outputs
                      for c in t.consumers()]
        candidates += [c for ops in self.part.cores.values() for op in ops
                       for c in tf_adapter.control_outputs(op)]
        for consumer in candidates:
            if id(consumer) in self.dead or id(consumer) in seen:
                continue
            info = self.ctx.view.info(consumer)
            if (info.copy if info is not None else 0) != self.copy:
                continue
            if info is not None and info.micro_batch:
                continue  # a clone of a later micro-batch: rewired to its own calls
            seen.add(id(consumer))
            readers.append(consumer)
        for reader in readers:
            self._rewire(reader, 0)


def _record_program(ctx, rep):
    """Fetching a user tensor that a call replaces returns micro-batch 0's result;
    fetching one of its ops runs the other copies' calls of that action."""
    fetches = ctx.program.fetches
    first = rep.at(0, 0)
    for body in rep.bodies.values():
        for tensor in body.outputs:
            fetches.substitutes[tensor.name] = first.tensors[tensor.name]
    for action, ops in rep.partition.cores.items():
        others = [rep.at(copy, 0).calls[action] for copy in range(1, rep.copies)]
        for op in ops:
            fetches.replaced_ops.add(op.name)
            if others:
                fetches.extras[op.name] = list(others)
