"""Gradient checkpointing: keep a few forward tensors, recompute the rest in backward.

Example::

    epl.init(epl.Config({"gradient_checkpoint.type": "auto"}))
    loss = model(features)                     # unchanged
    train = tf.train.AdamOptimizer(1e-3).minimize(loss)

Plugged into :mod:`epl.runtime.build_time` (:func:`wrap_gradients`), so it acts
inside every ``tf.gradients`` call, optimizers' included:

1. the forward region between the call's xs and ys is found and the
   *checkpoints* chosen (:mod:`epl.runtime.gc_select`: the ``checkpoints``
   collection, or repeated blocks / a memory-balanced partition for ``auto``),
   always with the tensors that cross TaskGraphs (pipeline stages), the xs that
   are activations, and the inputs of ops that cannot be recomputed;
2. the gradient is built level by level from the ys back to the xs: for each
   level, the recomputable ops behind its checkpoints are copied (they read the
   stored checkpoints, never the original activations) and differentiated with
   the checkpoints as stop points; what reaches a checkpoint is summed and fed to
   the next level as its ``grad_ys``. A level's copies wait (control edges) for
   the gradient that needs them, so recomputation happens during backprop.
3. with ``check_gradients`` the plain gradients are also built and every step
   asserts, per variable, that the values agree.

Copies are made by :func:`epl.runtime.gc_graph.copy_ops` inside the hook's
BACKWARD phase and under ``view.gradient_of(original)``: each belongs to the
TaskGraph (stage) of the op it recomputes, so data parallelism, micro-batches
(pipeline, gradient accumulation) and the pipeline schedule treat it like the
rest of that stage's backward. See docs/gradient_checkpoint.md.
"""
import collections
import logging

from epl.config import ConfigError
from epl.ir.traverse import unique_ops
from epl.ir.features import FeatureSlot
from epl.runtime import gc_graph, gc_select
from epl import tf_adapter
from epl.tf_adapter import tf

LOG = logging.getLogger("epl.gradient_checkpoint")
RECOMPUTE_SCOPE = "EPL_GC_RECOMPUTE"
CHECK_SCOPE = "EPL_GC_CHECK"
RTOL, ATOL = 1e-4, 1e-6          # check_gradients: |gc - plain| <= ATOL + RTOL * max|plain|


class GcCall(object):
    """What gradient checkpointing did for one ``tf.gradients`` call.

    ``checkpoints``: names of the recomputable ops whose outputs are kept;
    ``method``: how the selection was made; ``recomputed``: {copy op name:
    original op name} of the recomputed (non-checkpoint) ops; ``levels``: number
    of gradient calls made; ``checks``: [(variable op name, max |gc - plain|
    tensor)] with ``check_gradients``.
    """

    def __init__(self, method, checkpoints):
        self.method = method
        self.checkpoints = [op.name for op in checkpoints]
        self.recomputed = collections.OrderedDict()
        self.levels = 0
        self.checks = []


class GcState(object):
    """Gradient checkpointing's records for one graph."""

    def __init__(self):
        self.calls = []          # GcCall per tf.gradients call it rebuilt
        self.warned = set()      # reasons already reported (once per graph)


_STATES = FeatureSlot("gradient_checkpoint", GcState)


def applies(config):
    return config.gradient_checkpoint.type in ("collection", "auto")


def state(graph=None):
    """Records (:class:`GcState`) for a ``tf.Graph`` (default graph), or None."""
    return _STATES.for_graph(graph)


def _state(view):
    return _STATES.of(view)


def wrap_gradients(compute, build):
    """``tf.gradients`` that recomputes non-checkpoint activations in backward."""
    view, config = build.view, build.config

    def checkpointed_gradients(call):
        reason = _why_not(view, config)
        if reason:
            _warn_once(view, reason)
            return compute(call)
        ys = [_tensor(y) for y in call.ys]
        xs = [_x_tensor(x) for x in call.xs]
        region = gc_graph.Region(view, ys, xs, _last_taskgraph(view, config))
        selection = _select(region, view, config)
        checkpoints = _checkpoints(region, selection.ops)
        if not _saves_memory(region, checkpoints):
            _warn_once(view, "no activation between the variables and %s can be recomputed "
                       "with the checkpoints found (%s); this call's gradients are computed "
                       "as usual" % (ys[0].name, selection.method))
            return compute(call)
        record = GcCall(selection.method, checkpoints)
        builder = _Builder(compute, view, call, region, checkpoints, record)
        grads = builder.build(ys, list(call.grad_ys))
        _log(record, region)
        if config.gradient_checkpoint.check_gradients:
            grads = _check(compute, view, call, xs, grads, record)
        _state(view).calls.append(record)
        return call._replace(grads=grads)
    return checkpointed_gradients


# ---- preconditions --------------------------------------------------------------------
def _why_not(view, config):
    """Why checkpointing cannot apply to this call (None if it can)."""
    from epl import tf_adapter
    if tf_adapter.control_flow_context(view.tf_graph) is not None:
        return "tf.gradients is called inside a tf.while_loop or tf.cond body"
    check_config(config)
    return None


def check_config(config):
    """Refuse checkpointing with automatic stages (needs only the config, so ``epl.init``
    refuses it too, before the model is built: epl.parallel.preflight)."""
    if config.gradient_checkpoint.type and config.auto.auto_parallel and \
            (config.pipeline.num_stages or 1) > 1:
        raise ConfigError(
            'gradient_checkpoint.type = %r with auto.auto_parallel = True and '
            "pipeline.num_stages = %d is not supported yet: stages are cut after the "
            "gradients are built, so recomputed segments could span stages. Use "
            "epl.replicate scopes for the stages, or set gradient_checkpoint.type = \"\""
            % (config.gradient_checkpoint.type, config.pipeline.num_stages))


def _warn_once(view, reason):
    """Say loudly, once per graph and reason, that memory is not being saved."""
    warned = _state(view).warned
    if reason in warned:
        return
    warned.add(reason)
    LOG.warning("EPL gradient checkpointing (gradient_checkpoint.type) does NOT apply: %s. "
                "No memory is saved here.", reason)


def _last_taskgraph(view, config):
    """Index of the last TaskGraph whose ops may be recomputed (None: all).

    ``end_taskgraph`` counts the TaskGraphs that have ops (the ones that get
    devices), in order, like ``epl.Graph.get().taskgraphs`` after planning."""
    end = config.gradient_checkpoint.end_taskgraph
    if end < 0:
        return None
    live = [tg for tg in view.taskgraphs if tg.op_names]
    if not live:
        return None
    if end >= len(live):
        raise ConfigError(
            "gradient_checkpoint.end_taskgraph = %d (source: %s) but the model has %d "
            "TaskGraph(s) (0..%d) when tf.gradients is called; use -1 for all of them"
            % (end, config.source("gradient_checkpoint.end_taskgraph"), len(live),
               len(live) - 1))
    return live[end].index


def _select(region, view, config):
    kind = config.gradient_checkpoint.type
    try:
        if kind == "collection":
            return gc_select.from_collection(region, view.tf_graph)
        return gc_select.automatic(region)
    except gc_select.CheckpointError as error:
        raise ConfigError(str(error))


def _checkpoints(region, selected):
    """Recomputable ops whose outputs are kept, in creation order.

    The selection, plus: tensors crossing TaskGraphs (no segment spans two
    stages); xs that are activations (their gradient must reach them); inputs of
    ops that are not recomputed (their gradients read those inputs, so they stay
    alive anyway, and keeping them stops backprop from reaching behind them
    through the original activations).
    """
    chosen = list(selected) + gc_select.stage_crossings(region)
    chosen += [x.op for x in region.xs if x.op in region]
    for op in region.ops:
        if not region.may_recompute(op):
            chosen += [t.op for t in op.inputs if t.op in region and gc_graph.differentiable(t)]
    kept = [op for op in chosen if region.may_recompute(op) and region.boundary(op)]
    return gc_graph.by_creation(unique_ops(kept))


def _saves_memory(region, checkpoints):
    """True when checkpoints exist and some activation other than a y is then
    recomputed instead of stored (recomputing only the ys saves nothing)."""
    marks = set(id(op) for op in checkpoints)
    marks.update(id(y.op) for y in region.ys)
    return bool(checkpoints) and any(
        region.may_recompute(op) and id(op) not in marks for op in region.ops)


# ---- building the gradients -----------------------------------------------------------
class _Builder(object):
    """Builds one call's gradients level by level (see the module docstring)."""

    def __init__(self, compute, view, call, region, checkpoints, record):
        self.compute = compute
        self.view = view
        self.call = call
        self.region = region
        self.checkpoints = checkpoints
        self.stops = set(id(op) for op in checkpoints)
        self.record = record
        self.copies = {}                                   # id(original) -> copy op
        self.pending = collections.defaultdict(list)       # tensor key -> gradient parts
        self.x_parts = [[] for _ in region.xs]

    def build(self, ys, grad_ys):
        """Gradients for the region's xs (aligned with them)."""
        grad_ys = grad_ys or [None] * len(ys)
        roots, root_grads = [], []
        for y, grad in zip(ys, grad_ys):
            if id(y.op) in self.stops:      # a checkpoint: its level differentiates it
                self.pending[gc_graph.tensor_key(y)].append(
                    grad if grad is not None else tf.ones_like(y))
            else:
                roots.append(y)
                root_grads.append(grad)
        if roots:
            self._differentiate(roots, root_grads, gate=False)
        level = gc_graph.levels(self.region, self.checkpoints)
        for depth in sorted(set(level.values()), reverse=True):
            tensors, grads = [], []
            for op in self.checkpoints:
                if level[id(op)] != depth:
                    continue
                for tensor in self.region.boundary(op):
                    parts = self.pending.pop(gc_graph.tensor_key(tensor), None)
                    if parts:
                        tensors.append(tensor)
                        grads.append(_dense_sum(self.view, op, parts))
            if tensors:
                self._differentiate(tensors, grads, gate=True)
        return [_sum(self.view, x, parts) for x, parts in zip(self.region.xs, self.x_parts)]

    def _differentiate(self, roots, grad_ys, gate):
        """One ``tf.gradients`` from ``roots`` (original tensors) down to the
        checkpoints and xs they reach; parts are collected for both."""
        root_ops = unique_ops([t.op for t in roots])
        new = gc_graph.to_copy(self.region, root_ops, self.stops, self.copies)
        made = gc_graph.copy_ops(self.view, new, RECOMPUTE_SCOPE, self.copies)
        for original, copy in zip(new, made):
            if id(original) not in self.stops:
                self.record.recomputed[copy.name] = original.name
        if gate and made:
            _wait_for(made, grad_ys)
        elif made:
            # The backward no longer reads the forward ops behind the ys, so nothing
            # would order them before the update: a fetched loss could read new weights.
            _wait_for(made, roots)
        ys = [self._current(t) for t in roots]
        stop_ops, x_indices = gc_graph.reached(self.region, root_ops, self.stops)
        stop_tensors = [t for op in stop_ops for t in self.region.boundary(op)]
        xs = [self.region.xs[i] for i in x_indices]
        if not xs and not stop_tensors:
            return
        grads = self.compute(self._arguments(ys, xs + stop_tensors, grad_ys, stop_tensors)).grads
        self.record.levels += 1
        for index, grad in zip(x_indices, grads[:len(xs)]):
            if grad is not None:
                self.x_parts[index].append(grad)
        for tensor, grad in zip(stop_tensors, grads[len(xs):]):
            if grad is not None:
                self.pending[gc_graph.tensor_key(tensor)].append(grad)

    def _current(self, tensor):
        copy = self.copies.get(id(tensor.op))
        return tensor if copy is None else copy.outputs[tensor.value_index]

    def _arguments(self, ys, xs, grad_ys, stop_tensors):
        """The user's call with other ys, xs, grad_ys and more stop points."""
        return self.call._replace(
            ys=ys, xs=xs, grad_ys=list(grad_ys) if any(g is not None for g in grad_ys) else [],
            stop_gradients=stop_tensors + list(self.call.stop_gradients))


def _wait_for(made, grads):
    """Copies that read no other new copy start only once ``grads`` exist, so a
    level is recomputed when backprop reaches it, not during the forward pass."""
    new = set(id(op) for op in made)
    gates = unique_ops([_op_of(g) for g in grads if g is not None])
    for op in made:
        if not any(id(t.op) in new for t in op.inputs):
            from epl import tf_adapter
            tf_adapter.add_control_inputs(op, gates)


def _op_of(grad):
    return grad.values.op if isinstance(grad, tf.IndexedSlices) else grad.op


def _dense_sum(view, op, parts):
    """One dense gradient for a checkpoint tensor (it becomes a ``grad_ys``);
    built as part of ``op``'s gradient, in its TaskGraph."""
    with view.gradient_of(op):
        dense = [tf.convert_to_tensor(p) for p in parts]
        return dense[0] if len(dense) == 1 else tf.add_n(dense)


def _sum(view, x, parts):
    """The gradient of ``x`` from every level's part (None if no level reached it);
    IndexedSlices stay sparse when every part is."""
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    with view.gradient_of(x.op):
        if all(isinstance(p, tf.IndexedSlices) for p in parts):
            return tf.IndexedSlices(tf.concat([p.values for p in parts], 0),
                                    tf.concat([p.indices for p in parts], 0),
                                    parts[0].dense_shape)
        return tf.add_n([tf.convert_to_tensor(p) for p in parts])


# ---- check_gradients --------------------------------------------------------------------
def _check(compute, view, call, xs, grads, record):
    """Also build the plain gradients; every step, assert per variable that the
    values agree (|gc - plain| <= ATOL + RTOL * max|plain|). Structure (None,
    shape, dtype) is compared now, naming the variable."""
    with tf.name_scope(CHECK_SCOPE):
        plain = compute(call).grads
    checked = []
    for x, grad, reference in zip(xs, grads, plain):
        name = x.op.name
        if (grad is None) != (reference is None):
            raise ValueError(
                "gradient_checkpoint.check_gradients: the gradient of %s is %s with "
                "recomputation but %s without" % (name, _describe(grad), _describe(reference)))
        if grad is None:
            checked.append(grad)
            continue
        _check_structure(name, grad, reference)
        checked.append(_assert_close(view, x, name, grad, reference, record))
    return checked


def _describe(grad):
    return "None" if grad is None else "a %s" % type(grad).__name__


def _check_structure(name, grad, reference):
    if grad.dtype != reference.dtype:
        raise ValueError("gradient_checkpoint.check_gradients: the gradient of %s is %s with "
                         "recomputation but %s without" % (name, grad.dtype, reference.dtype))
    shape, other = _shape(grad), _shape(reference)
    if not shape.is_compatible_with(other):
        raise ValueError("gradient_checkpoint.check_gradients: the gradient of %s has shape %s "
                         "with recomputation but %s without" % (name, shape, other))


def _shape(grad):
    if isinstance(grad, tf.IndexedSlices):
        return tf.TensorShape(None)
    return grad.shape


def _assert_close(view, x, name, grad, reference, record):
    with view.gradient_of(x.op), tf.name_scope(CHECK_SCOPE):
        ours, theirs = tf.convert_to_tensor(grad), tf.convert_to_tensor(reference)
        diff = tf.reduce_max(tf.abs(ours - theirs))
        scale = tf.reduce_max(tf.abs(theirs))
        ok = tf.less_equal(diff, ATOL + RTOL * scale)
        check = tf.Assert(ok, [
            "EPL gradient_checkpoint.check_gradients: the gradient of variable %s differs "
            "from plain tf.gradients: max|gc - plain| =" % name, diff, "max|plain| =", scale])
        record.checks.append((name, diff))
        with tf.control_dependencies([check]):
            if isinstance(grad, tf.IndexedSlices):
                return tf.IndexedSlices(tf.identity(grad.values), grad.indices,
                                        grad.dense_shape)
            return tf.identity(grad)


# ---- helpers ------------------------------------------------------------------------------
def _tensor(value):
    return value if isinstance(value, (tf.Tensor, tf.IndexedSlices)) \
        else tf.convert_to_tensor(value)


def _x_tensor(x):
    """What tf.gradients differentiates for an x: a variable's handle (resource) or
    its ref tensor, else the tensor itself."""
    if tf_adapter.is_variable(x):
        handle = getattr(x, "handle", None)
        return handle if handle is not None and handle.dtype == tf.resource \
            else x.op.outputs[0]
    return _tensor(x)


def _log(record, region):
    LOG.info("EPL gradient checkpointing (%s): %d checkpoint op(s), %d op(s) recomputed "
             "of %d forward op(s), %d gradient call(s)", record.method,
             len(record.checkpoints), len(record.recomputed), len(region.ops), record.levels)
