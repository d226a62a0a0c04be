"""Loss scaling for AMP: scale the loss, unscale the gradients, apply only finite steps.

One :class:`LossScale` per differentiated loss (``tf.gradients`` ys):

* fixed (``amp.loss_scale`` a number): a constant;
* dynamic (``"dynamic"``): a non-trainable float32 variable ``EPL_AMP/loss_scale``
  (starts at ``initial``) and an int64 counter of good steps. After ``interval``
  good steps in a row the scale doubles; a step with a non-finite gradient
  halves it (never below 1) and resets the counter.

An int64 ``EPL_AMP/skipped_in_a_row`` counts the skipped steps since the last
applied one (for the warning); with ``amp.debug_log`` an int64
``EPL_AMP/skipped_steps`` counts all skipped steps.
The variables are ordinary global variables of the loss's TaskGraph: EPL
clones them per copy like the user's, and checkpoints hold them (a restored run
keeps its scale).

Gradients come out of ``tf.gradients`` divided by the scale (in float32 for
float16 gradients). At ``apply_gradients`` (:func:`apply_if_finite`) the
gradients the optimizer receives are checked for inf/nan. EPL's gradient
aggregation later rewires those very inputs to the all-reduced gradients, so
every replica checks the same values and takes the same decision. A skipped
step changes nothing but the loss-scale state and ``global_step``: every other
state-changing op the optimizer built (updates, slots) gets a control input
that is dead on that step; the step still advances and is reported
(:mod:`epl.runtime.amp_skip`), so step-based hooks end.
"""
import collections
import sys

from epl import tf_adapter
from epl.ir.phase import Phase
from epl.ir.traverse import ancestors, control_flow_interior
from epl.runtime import amp_skip
from epl.runtime.amp_convert import clean_context, scope
from epl.tf_adapter import tf

_NOT_WRITES = frozenset(["ReadVariableOp", "VarIsInitializedOp", "IsVariableInitialized",
                         "VariableShape", "ResourceGather"])


def _values(grad):
    return grad.values if isinstance(grad, tf.IndexedSlices) else grad


def _with_values(grad, values):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
    return values


class LossScale(object):
    """The scale of one loss and its state variables (see the module docstring)."""

    def __init__(self, view, taskgraph, setting, debug_log, initial):
        self.view = view
        self.taskgraph = taskgraph
        self.dynamic = setting == "dynamic"
        self.fixed = None if self.dynamic else float(setting)
        self.unscaled = set()           # ops that divide a gradient by this scale
        self.scale_var = self.good_var = self.skipped_var = None
        with clean_context(view.tf_graph), scope(view, taskgraph, Phase.FORWARD), \
                tf.name_scope("EPL_AMP"):
            if self.dynamic:
                self.scale_var = self._variable(float(initial), tf.float32, "loss_scale")
                self.good_var = self._variable(0, tf.int64, "good_steps")
                self.value = self.scale_var.value()
            else:
                self.value = tf.constant(self.fixed, tf.float32, name="loss_scale")
            if debug_log:
                self.skipped_var = self._variable(0, tf.int64, "skipped_steps")
            self.in_a_row_var = self._variable(0, tf.int64, "skipped_in_a_row")

    @staticmethod
    def _variable(value, dtype, name):
        return tf.Variable(value, dtype=dtype, trainable=False, name=name)

    @property
    def variables(self):
        return [v for v in (self.scale_var, self.good_var, self.skipped_var, self.in_a_row_var)
                if v is not None]

    def _taskgraph_of(self, op):
        info = self.view.info(op)
        return info.taskgraph if info is not None else None

    # ---- tf.gradients ------------------------------------------------------------
    def scaled_grad_ys(self, ys, grad_ys):
        """``grad_ys`` (None: TF's default ones) multiplied by the scale."""
        grad_ys = list(grad_ys) if grad_ys else [None] * len(ys)
        result = []
        with clean_context(self.view.tf_graph):
            for y, grad_y in zip(ys, grad_ys):
                with scope(self.view, self._taskgraph_of(y.op), Phase.BACKWARD), \
                        tf.name_scope("EPL_AMP/scaled_grad_ys"):
                    if grad_y is None:
                        result.append(tf.fill(tf.shape(y), tf.cast(self.value, y.dtype)))
                    else:
                        grad_y = tf.convert_to_tensor(grad_y)
                        result.append(grad_y * tf.cast(self.value, grad_y.dtype))
        return result

    def unscale(self, grads):
        """``grads`` divided by the scale; float16 ones are divided in float32."""
        result = []
        with clean_context(self.view.tf_graph):
            for grad in grads:
                if grad is None:
                    result.append(None)
                    continue
                values = _values(grad)
                dtype = values.dtype.base_dtype
                wide = tf.float32 if dtype in (tf.float16, tf.bfloat16) else dtype
                with scope(self.view, self._taskgraph_of(values.op), Phase.BACKWARD), \
                        tf.name_scope("EPL_AMP/unscale"):
                    unscaled = tf.cast(values, wide) / tf.cast(self.value, wide)
                    if wide != dtype:
                        unscaled = tf.cast(unscaled, dtype)
                    if values.op.device:
                        tf_adapter.set_device(unscaled.op, values.op.device)
                self.unscaled.add(unscaled.op)
                result.append(_with_values(grad, unscaled))
        return result

    # ---- apply_gradients ----------------------------------------------------------
    def update(self, finite, interval):
        """The op that updates this scale's state after a step (``finite``: bool)."""
        ops = []
        if self.dynamic:
            scale, good = self.scale_var.value(), self.good_var.value()
            grow = tf.logical_and(finite, good + 1 >= interval)
            new_scale = tf.where(finite, tf.where(grow, scale * 2.0, scale),
                                 tf.maximum(scale * 0.5, 1.0))
            new_good = tf.where(tf.logical_and(finite, tf.logical_not(grow)), good + 1,
                                tf.zeros_like(good))
            ops += [tf.assign(self.scale_var, new_scale), tf.assign(self.good_var, new_good)]
        if self.skipped_var is not None:
            ops.append(tf.assign_add(self.skipped_var, 1 - tf.cast(finite, tf.int64)))
        in_a_row = self.in_a_row_var.value()
        ops.append(tf.assign(self.in_a_row_var,
                             tf.where(finite, tf.zeros_like(in_a_row), in_a_row + 1)))
        return tf.group(*ops, name="update_loss_scale")

    def report(self, finite, after):
        """A print of the step's outcome and this scale's state, once ``after`` ran."""
        with tf.control_dependencies([after]):
            scale = self.scale_var.read_value() if self.dynamic else self.value
            items = ["EPL AMP: gradients finite:", finite, "loss scale:", scale]
            if self.skipped_var is not None:
                items += ["skipped steps:", self.skipped_var.read_value()]
            return tf.print(*items, output_stream=sys.stderr, name="report")


def scales_feeding(grads, scales, view):
    """The LossScales whose unscaled gradients ``grads`` are computed from (user code
    such as clipping may sit in between); the walk stops at forward ops."""
    by_op = {}
    for loss_scale in scales:
        for op in loss_scale.unscaled:
            by_op[op] = loss_scale
    found, seen = [], set()
    stack = [_values(g).op for g in grads]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        if op in by_op:
            if by_op[op] not in found:
                found.append(by_op[op])
            continue
        info = view.info(op)
        if info is not None and info.phase == Phase.FORWARD:
            continue
        stack.extend(t.op for t in op.inputs)
    return found


def all_finite(view, pairs, taskgraph):
    """A bool tensor: every gradient of ``pairs`` is finite. One check per TaskGraph
    (next to its variables), combined in ``taskgraph``."""
    by_taskgraph = collections.OrderedDict()
    for grad, var in pairs:
        info = view.info(var.op)
        by_taskgraph.setdefault(info.taskgraph if info is not None else None, []).append(grad)
    flags = []
    for index, grads in by_taskgraph.items():
        with scope(view, index, Phase.APPLY), tf.name_scope("EPL_AMP/all_finite"):
            checks = [tf.reduce_all(tf.is_finite(_values(g))) for g in grads]
            flags.append(tf.reduce_all(tf.stack(checks)))
    with scope(view, taskgraph, Phase.APPLY), tf.name_scope("EPL_AMP"):
        return tf.reduce_all(tf.stack(flags), name="all_finite")


def apply_if_finite(view, call, record, scales, interval, flags):
    """Run the optimizer's ``call(record)`` (an :class:`epl.ir.records.ApplyCall`) so
    that its updates happen only when every gradient is finite, and update ``scales``
    every step; the "all finite" tensor is appended to ``flags``. Returns what ``call``
    returns."""
    graph = view.tf_graph
    pairs = list(record.grads_and_vars)
    taskgraph = scales[0].taskgraph
    with clean_context(graph):
        finite = all_finite(view, pairs, taskgraph)
        flags.append(finite)
        with scope(view, taskgraph, Phase.APPLY), tf.name_scope("EPL_AMP"):
            token = tf.identity(tf_adapter.switch(finite, finite)[1], name="apply_if_finite").op
        gated = []
        for grad, var in pairs:
            if grad is not None:
                info = view.info(var.op)
                with scope(view, info.taskgraph if info is not None else None, Phase.APPLY), \
                        tf.name_scope("EPL_AMP/apply_if_finite"):
                    grad = tf_adapter.switch(grad, finite)[1]
            gated.append((grad, var))
    first = len(graph.get_operations())
    result = call(record._replace(grads_and_vars=gated))
    new_ops = graph.get_operations()[first:]
    increments = amp_skip.step_increments(new_ops, record.global_step)
    gate_ops(graph, new_ops, token, exempt=increments)
    with clean_context(graph), scope(view, taskgraph, Phase.APPLY), tf.name_scope("EPL_AMP"):
        amp_skip.always_advance(increments, finite)
        first_copy = amp_skip.first_copy_flag(view)
        last = [s.update(finite, interval) for s in scales]
        last = [s.report(finite, op) if s.skipped_var is not None else op
                for s, op in zip(scales, last)]
        last = [amp_skip.warn_skipped(s, finite, op, first_copy) for s, op in zip(scales, last)]
    result_op = result if isinstance(result, tf.Operation) else getattr(result, "op", None)
    if result_op is not None:
        tf_adapter.add_control_inputs(result_op, last)
    return result


def gate_ops(graph, new_ops, token, exempt=()):
    """Give every op in ``new_ops`` that writes state a control input from ``token``
    (dead on skipped steps), except what initializes the variables they created, ops
    inside while loops (which cannot take control inputs) and ``exempt`` ops (the
    global step's increment, which advances on skipped steps too)."""
    exempt = set(exempt)
    new_ops = [op for op in new_ops if op not in exempt]
    created = set(new_ops)
    roots = []
    for key in (tf.GraphKeys.GLOBAL_VARIABLES, tf.GraphKeys.LOCAL_VARIABLES):
        roots += [v.initializer for v in graph.get_collection(key) if v.op in created]
    keep = ancestors(roots)
    loops = None
    for op in new_ops:
        if op.name in keep or tf_adapter.is_variable_op(op) or not _writes(op):
            continue
        if loops is None:
            loops = control_flow_interior(graph)[0]
        if op.name not in loops:
            tf_adapter.add_control_inputs(op, [token])


def _writes(op):
    """Updates of variables (Assign*, Apply*, Scatter*) and other stateful ops with
    inputs (collectives, prints); not reads of variables."""
    if tf_adapter.writes_variable(op):
        return True
    return bool(op.op_def.is_stateful) and bool(op.inputs) and op.type not in _NOT_WRITES
