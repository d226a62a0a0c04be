"""Static estimates of a graph's float operations and tensor memory, from shapes.

::

    with tf.Graph().as_default():
        x = tf.placeholder(tf.float32, [None, 10])
        y = tf.layers.dense(x, 16, name="dense1")
        flops = epl.profiler.profile_flops(batch_size=8)
        flops["dense1/MatMul"]        # 2 * 8 * 10 * 16
        flops.total                   # every op with a flops statistic
        memory = epl.profiler.profile_memory(batch_size=8)
        memory["dense1/MatMul:0"]     # 8 * 16 * 4 bytes

Both return a ``ProfileResult``: a dict from op name (flops) or tensor name
(memory) to a number, with totals per device and per op type as attributes.
Unknown first dimensions of placeholders and iterator outputs are replaced by
``batch_size`` (or by the constant batch size of the graph's ``tf.data``
pipeline when ``batch_size`` is None); this happens on a private copy of the
graph, never on the user's graph. Whatever is still unknown is listed in
``result.unknown`` and left out of the totals.
"""
import collections
import logging

from epl.profiler import shapes as shape_lib
from epl import tf_functions
from epl.profiler.units import format_bytes, format_flops
from epl.tf_adapter import tf

LOG = logging.getLogger("epl.profiler")


class ProfileResult(dict):
    """``{name: value}`` plus summaries.

    Attributes:
      unit: ``"flops"`` or ``"bytes"``.
      total: sum of all values.
      per_device: ``{device string: total}`` (``""`` for ops without a device).
      per_op_type: ``{op type: total}``.
      unknown: names of ops (flops) or tensors (memory) whose shapes stayed
        unknown, so their values are missing.
      batch_size: the batch size used to fill unknown first dimensions, or None.
      persistent: bytes of the graph's variables (memory results; 0 for flops).
      source: ``"static"`` or ``"run_metadata"`` (shapes seen in a traced step).
      places: ``{name: (device, op type)}`` of the ops counted inside called
        functions (named ``<call op>/<inner op>``).
    """

    def __init__(self, values, unit, per_device, per_op_type, unknown=(), batch_size=None,
                 persistent=0, source="static", places=None):
        super(ProfileResult, self).__init__(values)
        self.unit = unit
        self.total = sum(values.values())
        self.per_device = dict(per_device)
        self.per_op_type = dict(per_op_type)
        self.unknown = sorted(unknown)
        self.batch_size = batch_size
        self.persistent = persistent
        self.source = source
        self.places = dict(places or {})  # name -> (device, type) of ops inside functions

    def summary(self):
        """The totals without the per-name values (JSON-ready)."""
        return collections.OrderedDict([
            ("unit", self.unit), ("total", self.total), ("source", self.source),
            ("batch_size", self.batch_size), ("persistent", self.persistent),
            ("per_device", dict(sorted(self.per_device.items()))),
            ("per_op_type", dict(sorted(self.per_op_type.items(), key=lambda kv: -kv[1]))),
            ("unknown", list(self.unknown)),
        ])

    def to_dict(self):
        """``summary()`` plus every value under ``"values"`` (JSON-ready)."""
        out = self.summary()
        out["values"] = dict(sorted(self.items(), key=lambda kv: (-kv[1], kv[0])))
        return out

    def describe(self):
        """One line for a log."""
        fmt = format_flops if self.unit == "flops" else format_bytes
        devices = ", ".join("%s: %s" % (dev or "<unplaced>", fmt(value))
                            for dev, value in sorted(self.per_device.items()))
        text = "total %s (%s)" % (fmt(self.total), devices or "no ops")
        if self.unit == "bytes":
            text += ", variables %s" % format_bytes(self.persistent)
        if self.unknown:
            text += ", %d with unknown shapes" % len(self.unknown)
        return text


def _graph(graph):
    return graph if graph is not None else tf.get_default_graph()


def _batch(graph, batch_size):
    return batch_size if batch_size is not None else shape_lib.infer_batch_size(graph)


def _group(values, place):
    """Totals of ``values`` per device and per op type; ``place(name)`` gives
    (device, op type)."""
    per_device = collections.Counter()
    per_type = collections.Counter()
    for name, value in values.items():
        device, op_type = place(name)
        per_device[device] += value
        per_type[op_type] += value
    return per_device, per_type


def _op_place(graph, places=None):
    """``place(name)`` for :func:`_group`: from ``places`` (ops inside called
    functions), else the op of ``graph``."""
    def place(name):
        if places and name in places:
            return places[name]
        op = graph.get_operation_by_name(name)
        return op.device, op.type
    return place


def _variable_bytes(op):
    if op.type not in shape_lib.VARIABLE_OPS:
        return 0
    try:
        count = shape_lib.num_elements(tf.TensorShape(op.get_attr("shape")))
        size = shape_lib.dtype_size(op.get_attr("dtype"))
    except ValueError:
        return 0
    return count * size if count is not None and size is not None else 0


def profile_memory(graph=None, batch_size=None, fetches=None):
    """Bytes of every op output tensor, from static shapes and each dtype's real size.

    Args:
      graph: a ``tf.Graph`` (default: the default graph). It is not modified.
      batch_size: replaces unknown first dimensions of placeholders and iterator
        outputs; None to use the ``tf.data`` pipeline's constant batch size if any.
      fetches: optionally restrict to the ops a ``session.run(fetches)`` executes.

    Returns a ``ProfileResult`` of ``{tensor name: bytes}``. ``total`` is the sum
    over all tensors (as if every tensor were alive at once: an upper bound of
    the activations, not a peak); ``persistent`` is the bytes of the variables.
    Tensors of string, resource and variant type have no static size and are
    skipped; tensors with unknown shapes are listed in ``unknown``.
    """
    graph = _graph(graph)
    batch = _batch(graph, batch_size)
    copy, _ = shape_lib.completed_copy(graph, batch_size=batch)
    scope = shape_lib.ops_for_fetches(graph, fetches) if fetches is not None else None
    values, unknown, persistent = {}, [], 0
    for op in copy.get_operations():
        if scope is not None and op.name not in scope:
            continue
        persistent += _variable_bytes(op)
        for tensor in op.outputs:
            size = shape_lib.dtype_size(tensor.dtype)
            if size is None:
                continue
            count = shape_lib.num_elements(tensor.shape)
            if count is None:
                unknown.append(tensor.name)
            else:
                values[tensor.name] = count * size
    per_device, per_type = _group(
        values, lambda name: _op_place(copy)(copy.get_tensor_by_name(name).op.name))
    return ProfileResult(values, "bytes", per_device, per_type, unknown, batch, persistent)


def _elementwise_flops(op):
    """One float operation per output element (TF's rule for Add, Mul, ...)."""
    return shape_lib.num_elements(op.outputs[0].shape)


def _batch_matmul_flops(op):
    """``2 * k`` per output element, as TF counts MatMul and BatchMatMul."""
    lhs = op.inputs[0].shape
    count = shape_lib.num_elements(op.outputs[0].shape)
    if lhs.rank is None or lhs.rank < 2 or count is None:
        return None
    k = tf.compat.dimension_value(lhs[-2] if op.get_attr("adj_x") else lhs[-1])
    return None if k is None else 2 * k * count


# Ops TF 1.15 has no flops statistic for, although it counts their V1 forms
# (``a + b`` builds AddV2; ``tf.matmul`` on batches builds BatchMatMulV2). Used
# only when tf.profiler reports nothing for the op. TF's registry is not touched.
EXTRA_FLOPS = {"AddV2": _elementwise_flops, "BatchMatMulV2": _batch_matmul_flops}


def _float_ops_per_op(graph):
    """``{op name: float ops}`` from TF's flops statistics (``tf.profiler``) for ``graph``."""
    options = (tf.profiler.ProfileOptionBuilder(
        tf.profiler.ProfileOptionBuilder.float_operation()).with_empty_output().build())
    root = tf.profiler.profile(graph, cmd="scope", options=options)
    flops = {}
    stack = [root]
    while stack:
        node = stack.pop()
        if node.float_ops > 0:
            flops[node.name] = int(node.float_ops)
        stack.extend(node.children)
    for op in graph.get_operations():
        extra = EXTRA_FLOPS.get(op.type)
        if extra is not None and op.name not in flops:
            value = extra(op)
            if value:
                flops[op.name] = int(value)
    return flops


def _called_flops(graph, names=None):
    """Float ops of the ops inside the functions ``graph``'s call ops run (EPL's stage
    functions, nested calls included), named ``<call>/<inner op>``: ``{name: value}``,
    ``{name: (device, type)}`` (an inner op without a device runs on its call's) and
    the inner names whose shapes stayed unknown. ``names`` restricts the calls.
    A pipeline calls each function once per micro-batch with the same shapes, so each
    (function, input shapes) body is built and profiled once; calls come in creation
    order, a stage's forward before its backward, which takes the shapes of the
    activations it reads from the forward's body."""
    values, places, unknown = {}, {}, []
    bodies, known = {}, {}  # known: shapes of the tensors forward bodies save for backward ones
    for call in graph.get_operations():
        if call.type not in tf_functions.CALL_OPS or (names is not None and call.name not in names):
            continue
        key = (call.get_attr("f").name, tuple(str(t.shape) for t in call.inputs))
        if key not in bodies:
            body = tf_functions.called_function_body(call, known)
            known.update((t.name, t.shape) for op in body.get_operations()
                         for t in op.outputs if t.shape.is_fully_defined())
            bodies[key] = _body_flops(body)
        inner_values, inner_places, inner_unknown = bodies[key]
        for name, value in inner_values.items():
            device, op_type = inner_places[name]
            values[call.name + "/" + name] = value
            places[call.name + "/" + name] = (device or call.device, op_type)
        unknown += [call.name + "/" + name for name in inner_unknown]
    return values, places, unknown


def _body_flops(body):
    """:func:`_called_flops` of one function body: its own ops and its nested calls."""
    values, places, unknown = _called_flops(body)
    for name, value in _float_ops_per_op(body).items():
        op = body.get_operation_by_name(name)
        values[name], places[name] = value, (op.device, op.type)
    return values, places, unknown + shape_lib.incomplete_ops(body)


def graph_flops(graph=None, batch_size=None, fetches=None, source_shapes=None,
                tensor_shapes=None, source="static"):
    """Float operations per op of ``graph``; the engine of ``profile_flops`` and the hook.

    ``source_shapes``/``tensor_shapes`` are exact shapes by tensor name (fed
    values, run-time shapes), see ``epl.profiler.shapes.completed_copy``.
    Returns a ``ProfileResult`` of ``{op name: float ops}``.
    """
    graph = _graph(graph)
    batch = _batch(graph, batch_size)
    copy, _ = shape_lib.completed_copy(graph, batch_size=batch, source_shapes=source_shapes,
                                       tensor_shapes=tensor_shapes)
    scope = shape_lib.ops_for_fetches(graph, fetches) if fetches is not None else None
    flops = _float_ops_per_op(copy)
    values = {}
    for name, value in flops.items():
        if scope is None or name in scope:
            values[name] = value
    called, places, called_unknown = _called_flops(copy, scope)
    values.update(called)
    per_device, per_type = _group(values, _op_place(copy, places))
    unknown = shape_lib.incomplete_ops(copy, scope) + called_unknown
    return ProfileResult(values, "flops", per_device, per_type, unknown, batch, source=source,
                         places=places)


def repeated(result, repeats, graph):
    """``result`` with each op's value multiplied by how many times it ran (``repeats``).

    ``repeats`` maps op names to execution counts in one step (ops in a loop body
    run once per iteration); ops not in it count once. ``graph`` gives each
    op's device and type for the totals.
    """
    values = dict((name, value * max(1, repeats.get(name, 1))) for name, value in result.items())
    if values == dict(result):
        return result
    per_device, per_type = _group(values, _op_place(graph, result.places))
    return ProfileResult(values, result.unit, per_device, per_type, result.unknown,
                         result.batch_size, result.persistent, result.source, result.places)


def profile_flops(graph=None, batch_size=None, fetches=None):
    """Float operations of every op with a TF flops statistic, from static shapes.

    Args:
      graph: a ``tf.Graph`` (default: the default graph). It is not modified.
      batch_size: replaces unknown first dimensions of placeholders and iterator
        outputs; None to use the ``tf.data`` pipeline's constant batch size if any.
      fetches: optionally restrict to the ops a ``session.run(fetches)`` executes
        (one training step, without initializers or savers).

    Returns a ``ProfileResult`` of ``{op name: float ops}`` (a MatMul of
    ``[m, k] x [k, n]`` counts ``2 * m * n * k``). Ops whose float inputs or
    outputs still have unknown shapes are listed in ``unknown``.
    """
    return graph_flops(graph, batch_size=batch_size, fetches=fetches)
