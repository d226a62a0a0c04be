"""What each repetition of the step has, and what the passes ask about it.

A *repetition* is one (copy, micro-batch): local copy ``c`` of this worker (a
:class:`epl.parallel.mesh.Copy`) running micro-batch ``m`` of the step. Copy 0,
micro-batch 0 is the user's own graph. Every other repetition has, for each user op,
an op of its own (a clone), the op of its copy's micro-batch 0 (ops a copy runs once
per step: variables, the constant expressions micro-batches share), the user op
itself (ops no copy repeats: input pipelines, placeholders), or nothing (a gradient
gate the copies do without). Where stage functions run, a user tensor may be
computed by a call instead (see :mod:`epl.parallel.repeat.functions`).

The lowering fills one :class:`Instance` record per repetition; the passes ask the
:class:`Repetition` (``ctx.repetition``), never the records or the lowering:

* ``op(op, c, m)`` and ``tensor(t, c, m)``: what stands for a user op or tensor;
* ``gradient_sum(grad, c, ...)``: a gradient summed over the micro-batches of copy c;
* ``boundaries(ctx, c)``: where each pipeline action of copy c starts and ends, for
  the schedule's barriers.

Example::

    rep = ctx.repetition
    losses = [rep.tensor(loss, copy, m) for m in range(rep.micro_batches)]
"""
from epl import tf_adapter
from epl.parallel.repeat import backward_split
from epl.tf_adapter import tf


class Instance(object):
    """What one repetition has in place of the user's ops.

    Attributes:
      ops: {user op name: its op here}; a name that is absent here stands for the op
        of the copy's micro-batch 0 (or the user op itself).
      aliases: {name of a forwarding gradient gate done without: the tensor it forwards}.
      gates: {the same names: the ops a reader of that tensor must wait for}.
      dropped: names of user ops this repetition has no op for (gate NoOps).
      tensors: {user tensor name: what computes it here} where a call does (stage
        functions), plus the running sums of gradients the calls return.
      calls: {action (stage, kind, chunk): the call of that action's function}.
    """

    __slots__ = ("ops", "aliases", "gates", "dropped", "tensors", "calls")

    def __init__(self):
        self.ops = {}
        self.aliases = {}
        self.gates = {}
        self.dropped = set()
        self.tensors = {}
        self.calls = {}


class Repetition(object):
    """The step repeated per (copy, micro-batch) on this worker: its records and the
    questions every pass asks. A lowering subclasses it and fills the records in
    :meth:`build` (:class:`epl.parallel.repeat.unrolled.UnrolledCopies`,
    :class:`epl.parallel.repeat.functions.StageFunctions`).

    Attributes:
      copies: how many local copies this worker builds.
      micro_batches: micro-batches per step and copy (1 unless a pipeline runs).
      shared: names of the constant expressions every micro-batch shares.
      replaced: names of the user ops that no longer run (calls compute them).
      instances: {(copy, micro_batch): its :class:`Instance` record}.
      split_backward: the stages whose backward the schedule runs as B and W actions
        (:mod:`epl.parallel.repeat.backward_split`); the others run it fused.
    """

    def __init__(self, copies, micro_batches, split_backward=frozenset()):
        self.copies = copies
        self.micro_batches = micro_batches
        self.split_backward = frozenset(split_backward)
        self.shared = set()
        self.replaced = set()
        self.instances = {}
        self._weights = None

    def weight_parts(self, ctx):
        """Names of the user's backward ops in W parts (of the stages in
        ``split_backward``). Found once, before anything is repeated, and the B parts' gradient
        gates dropped: the clones and the calls then inherit the split."""
        if self._weights is None:
            self._weights = frozenset()
            if self.split_backward:
                self._weights = backward_split.weight_ops(ctx, self.split_backward)
                backward_split.ungate(ctx, self._weights, self.split_backward)
        return self._weights

    # ---- the lowering's side -----------------------------------------------------
    def build(self, ctx):
        """Repeat the step: fill the records, build the repetitions' ops."""
        raise NotImplementedError

    def at(self, copy, micro_batch):
        """The :class:`Instance` record of (copy, micro_batch), created when first asked."""
        key = (copy, micro_batch)
        if key not in self.instances:
            self.instances[key] = Instance()
        return self.instances[key]

    def record_gates(self, copy, micro_batch, aliases, gates, dropped):
        """Record what (copy, micro_batch) has instead of the gradient gates it does
        without: {name: forwarded tensor}, {name: ops to wait for}, dropped names."""
        instance = self.at(copy, micro_batch)
        instance.aliases = dict(aliases)
        instance.gates = dict(gates)
        instance.dropped = set(dropped)
        for name, tensor in aliases.items():
            instance.ops[name] = tensor.op

    def skipped(self, copy, micro_batch):
        """Names of user ops that (copy, micro_batch) has no op of its own for."""
        instance = self.instances.get((copy, micro_batch))
        return set() if instance is None else set(instance.aliases) | instance.dropped

    def computed(self, tensor, copy, micro_batch):
        """What a call computes for user tensor ``tensor`` in (copy, micro_batch), or None."""
        instance = self.instances.get((copy, micro_batch))
        return None if instance is None else instance.tensors.get(tensor.name)

    # ---- what the passes ask ---------------------------------------------------------
    def op(self, op, copy, micro_batch=0):
        """The op standing for user op ``op`` in (copy, micro_batch)."""
        if copy == 0 and micro_batch == 0:
            return op
        for key in ((copy, micro_batch), (copy, 0)) if micro_batch else ((copy, 0),):
            instance = self.instances.get(key)
            if instance is None:
                continue
            if op.name in instance.dropped:
                raise RuntimeError("EPL internal error: copy %d, micro-batch %d has no op for "
                                   "gradient gate %s" % (key + (op.name,)))
            found = instance.ops.get(op.name)
            if found is not None:
                return found
        return op

    def tensor(self, tensor, copy, micro_batch=0):
        """The tensor standing for user tensor ``tensor`` in (copy, micro_batch): a call's
        result, what a gate the copy does without forwards, or its op's output."""
        found = self.computed(tensor, copy, micro_batch)
        if found is not None:
            return found
        instance = self.instances.get((copy, micro_batch))
        alias = instance.aliases.get(tensor.op.name) if instance is not None else None
        if alias is not None:
            result = alias
        else:
            result = self.op(tensor.op, copy, micro_batch).outputs[tensor.value_index]
        if result is not tensor:  # a forwarded gate whose source a call computes now
            found = self.computed(result, copy, micro_batch)
            return result if found is None else found
        return result

    def waits(self, tensor, copy, micro_batch=0):
        """The ops a reader of ``tensor(tensor, ...)`` must wait for: the gradient gate's
        members where the copy does without a forwarding Identity, else none."""
        if self.computed(tensor, copy, micro_batch) is not None:
            return []  # a call's result: the call has finished every op of its body
        instance = self.instances.get((copy, micro_batch))
        members = instance.gates.get(tensor.op.name, []) if instance is not None else []
        return [op for op in members if op.name not in self.replaced]

    def gradient_sum(self, grad, copy, device, shape=None):
        """(value, indices) of ``copy``'s gradient ``grad`` over the step's micro-batches,
        on ``device``: a running sum of dense gradients (``shape``: their static shape,
        where TF lost it), the rows of sparse ones concatenated (indices None if dense).
        Waits for the gradient gates the copies do without."""
        micro_batches = range(self.micro_batches)
        if isinstance(grad, tf.IndexedSlices):
            values = [self.tensor(grad.values, copy, m) for m in micro_batches]
            indices = [self.tensor(grad.indices, copy, m) for m in micro_batches]
            gates = [gate for m in micro_batches for part in (grad.values, grad.indices)
                     for gate in self.waits(part, copy, m)]
            with tf.device(device), tf.name_scope("EPL_MICRO_BATCH_SUM"):
                if len(values) == 1:
                    return _after(values[0], gates), indices[0]
                return _after(tf.concat(values, 0), gates), tf.concat(indices, 0)
        summed = self.summed_in_calls(grad, copy)
        if summed is not None:
            return summed, None
        parts = [self.tensor(grad, copy, m) for m in micro_batches]
        gates = [self.waits(grad, copy, m) for m in micro_batches]
        with tf.device(device), tf.name_scope("EPL_MICRO_BATCH_SUM"):
            # A running sum in micro-batch order (not add_n, which waits for all of
            # them): each micro-batch's gradient is freed as soon as it is added, so
            # peak memory does not grow with the micro-batches.
            total = (tf_adapter.running_sum(parts, gates) if len(parts) > 1
                     else _after(parts[0], gates[0]))
        if not total.shape.is_fully_defined() and shape is not None:
            # gradients out of while loops or conds lose their static shape; fusion needs it
            with tf.device(device), tf.name_scope("EPL_GRADIENT_SHAPE"):
                total = tf.reshape(total, shape)
        return total, None

    def call_inputs(self):
        """Names of the user tensors and ops that calls read or wait for (stage
        functions); none where nothing is called."""
        return set()

    def summed_in_calls(self, grad, copy):
        """The sum over micro-batches of dense ``grad`` that ``copy``'s calls return, or
        None (nothing sums inside calls here)."""
        del grad, copy
        return None

    def boundaries(self, ctx, copy):
        """({action key: ops it starts with}, {action key: ops it ends with}) of ``copy``,
        keys (stage, "F" | "B" | "W", micro_batch): where the schedule's barriers go."""
        raise NotImplementedError


def _after(tensor, gates):
    """``tensor``, read only after ``gates`` (the gradient gates of a copy that does
    without the forwarding Identity; see :mod:`epl.parallel.repeat.gates`)."""
    if not gates:
        return tensor
    with tf.control_dependencies(gates):
        return tf.identity(tensor)
