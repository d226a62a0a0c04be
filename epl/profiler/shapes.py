"""Static shapes for the profilers, completed on a private copy of the graph.

The user's graph is never changed. To fill unknown shapes, the graph is
exported to a GraphDef, the shapes of its *source* nodes (placeholders,
iterator outputs) are filled in there, and the GraphDef is imported into a new
``tf.Graph``; TensorFlow's own shape inference then propagates the shapes to
every op of the copy. Ops keep their names and devices in the copy.

Where the shapes come from, in order:

1. ``source_shapes``: exact shapes for named tensors (fed values, or shapes
   seen at run time);
2. ``batch_size``: the first dimension of a source output, when unknown;
3. after import, ``tensor_shapes`` (run-time shapes of any tensor) are merged
   into the copy's tensors that are still partially unknown.
"""
import logging

from epl.tf_adapter import tf

LOG = logging.getLogger("epl.profiler")

# Source op type -> (attr holding the output shape(s), True if a list of shapes).
SOURCE_SHAPE_ATTRS = {
    "Placeholder": ("shape", False),
    "PlaceholderV2": ("shape", False),
    "PlaceholderWithDefault": ("shape", False),
    "IteratorGetNext": ("output_shapes", True),
    "IteratorGetNextSync": ("output_shapes", True),
    "OptionalGetValue": ("output_shapes", True),
    "MultiDeviceIteratorGetNextFromShard": ("output_shapes", True),
    "DatasetToSingleElement": ("output_shapes", True),
}

# Dataset op type -> index of its batch_size input (a function of the op).
_BATCH_INPUT = {
    "BatchDataset": lambda op: 1,
    "BatchDatasetV2": lambda op: 1,
    "PaddedBatchDataset": lambda op: 1,
    "PaddedBatchDatasetV2": lambda op: 1,
    "MapAndBatchDataset": lambda op: 1 + len(op.get_attr("Targuments")),
    "ExperimentalMapAndBatchDataset": lambda op: 1 + len(op.get_attr("Targuments")),
}
# Types whose element size is not a property of the shape.
_UNSIZED = frozenset([tf.string, tf.resource, tf.variant])
VARIABLE_OPS = frozenset(["VariableV2", "Variable", "VarHandleOp", "AutoReloadVariable"])


def dtype_size(dtype):
    """Bytes per element of ``dtype`` (refs count as their base type), or None if unsized."""
    base = tf.as_dtype(dtype).base_dtype
    if base in _UNSIZED:
        return None
    return base.size


def num_elements(shape):
    """Element count of a fully defined ``tf.TensorShape``/tuple, else None."""
    shape = tf.TensorShape(shape)
    if not shape.is_fully_defined():
        return None
    count = 1
    for dim in shape.as_list():
        count *= dim
    return count


def infer_batch_size(graph):
    """The batch size of the graph's tf.data input pipeline, if one constant is used.

    Looks at batching dataset ops (by op type) and their constant ``batch_size``
    input. Returns None when there is none, when it is not a constant, or when
    different batch sizes are used.
    """
    sizes = set()
    for op in graph.get_operations():
        index_of = _BATCH_INPUT.get(op.type)
        if index_of is None:
            continue
        try:
            value = tf.get_static_value(op.inputs[index_of(op)])
        except (ValueError, TypeError, IndexError):
            value = None
        if value is None:
            return None
        sizes.add(int(value))
    return sizes.pop() if len(sizes) == 1 else None


def ops_for_fetches(graph, fetches, closure=True):
    """Ops a ``session.run(fetches)`` executes: the fetches and everything they depend on.

    ``fetches`` may be any nested structure of tensors, sparse tensors, ops or
    their names. Returns a set of op names (only the fetched ops themselves when
    ``closure`` is False). Both branches of a ``tf.cond`` are included.
    """
    stack = []
    for fetch in tf.nest.flatten(fetches, expand_composites=True):
        if fetch is None:
            continue
        element = graph.as_graph_element(fetch, allow_tensor=True, allow_operation=True)
        stack.append(element if isinstance(element, tf.Operation) else element.op)
    if not closure:
        return set(op.name for op in stack)
    seen = set()
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        stack.extend(tensor.op for tensor in op.inputs)
        stack.extend(op.control_inputs)
    return seen


def _fill_shape_proto(shape_proto, exact, batch_size):
    """Fill a TensorShapeProto in place: known dims of ``exact``, then an unknown first dim.

    ``exact`` is a sequence of dims (None or negative for unknown) or None.
    """
    if shape_proto.unknown_rank:
        if exact is None:
            return
        shape_proto.unknown_rank = False
        for _ in exact:
            shape_proto.dim.add(size=-1)
    dims = shape_proto.dim
    if exact is not None and len(exact) == len(dims):
        for dim, value in zip(dims, exact):
            if dim.size < 0 and value is not None and value >= 0:
                dim.size = value
    if batch_size is not None and dims and dims[0].size < 0:
        dims[0].size = batch_size


def _default_shape(graph, node_name):
    """PlaceholderWithDefault: the static shape of its default input (what runs when unfed)."""
    dims = graph.get_operation_by_name(node_name).inputs[0].shape
    return None if dims.rank is None else tuple(dims.as_list())


def _completed_graph_def(graph, source_shapes, batch_size):
    graph_def = graph.as_graph_def()
    for node in graph_def.node:
        spec = SOURCE_SHAPE_ATTRS.get(node.op)
        if spec is None:
            continue
        attr_name, is_list = spec
        if attr_name not in node.attr:
            continue
        protos = node.attr[attr_name].list.shape if is_list else [node.attr[attr_name].shape]
        for slot, proto in enumerate(protos):
            exact = source_shapes.get("%s:%d" % (node.name, slot))
            batch = batch_size
            if node.op == "PlaceholderWithDefault" and exact is None:
                # Unfed: it passes its default through, so the batch comes from there.
                exact, batch = _default_shape(graph, node.name), None
            _fill_shape_proto(proto, exact, batch)
    return graph_def


def _merge_tensor_shapes(copy, tensor_shapes):
    for name, dims in tensor_shapes.items():
        try:
            tensor = copy.get_tensor_by_name(name)
        except (KeyError, ValueError):
            continue
        if tensor.shape.is_fully_defined():
            continue
        try:
            tensor.set_shape(dims)
        except ValueError:
            LOG.debug("profiler: run-time shape %s of %s does not match %s", dims, name,
                      tensor.shape)


# Ops whose outputs have the shape of their first input (grappler often removes
# them from the executed graph, so a traced step has no shape for them).
_SAME_SHAPE_OPS = frozenset([
    "Identity", "RefIdentity", "Snapshot", "StopGradient", "PreventGradient", "CheckNumerics",
    "Enter", "RefEnter", "Exit", "RefExit", "NextIteration", "RefNextIteration", "Switch",
    "RefSwitch"])


def _try_merge(tensor, shape):
    if not shape.is_fully_defined() or tensor.shape.is_fully_defined():
        return False
    try:
        tensor.set_shape(shape)
    except ValueError:
        return False
    return True


def _propagate_same_shapes(copy, max_passes=50):
    """Carry known shapes through shape-preserving ops, forwards and backwards, to a fixpoint."""
    ops = [op for op in copy.get_operations() if op.type in _SAME_SHAPE_OPS and op.inputs]
    for _ in range(max_passes):
        changed = False
        for op in ops:
            source = op.inputs[0]
            for output in op.outputs:
                changed |= _try_merge(output, source.shape)
                changed |= _try_merge(source, output.shape)
        if not changed:
            return


def completed_copy(graph, batch_size=None, source_shapes=None, tensor_shapes=None):
    """A new ``tf.Graph`` equal to ``graph`` with as many static shapes known as possible.

    Args:
      graph: the user's graph (left unchanged).
      batch_size: value for an unknown first dimension of placeholders and
        iterator outputs.
      source_shapes: ``{tensor name: dims}`` exact shapes of source tensors.
      tensor_shapes: ``{tensor name: dims}`` shapes of any tensors (run-time
        shapes), merged after shape inference.

    Returns ``(copy, complete)``: ``complete`` is False when the graph could not
    be re-imported (an op without a registered kernel definition, for example);
    ``copy`` is then ``graph`` itself and must not be modified.
    """
    source_shapes = source_shapes or {}
    graph_def = _completed_graph_def(graph, source_shapes, batch_size)
    copy = tf.Graph()
    try:
        with copy.as_default():
            tf.import_graph_def(graph_def, name="")
    except (ValueError, TypeError, tf.errors.OpError) as error:
        LOG.warning("profiler: could not copy the graph to complete its shapes (%s); "
                    "using its static shapes as they are", error)
        return graph, False
    _merge_tensor_shapes(copy, tensor_shapes or {})
    _propagate_same_shapes(copy)
    return copy, True


def is_sized_float_tensor(tensor):
    """Tensors that take part in float operations (the ones flops are computed from)."""
    base = tensor.dtype.base_dtype
    return base.is_floating or base.is_complex


def incomplete_ops(graph, op_names=None):
    """Names of ops (among ``op_names``) with a float input or output of unknown shape."""
    out = []
    for op in graph.get_operations():
        if op_names is not None and op.name not in op_names:
            continue
        for tensor in list(op.inputs) + list(op.outputs):
            if is_sized_float_tensor(tensor) and not tensor.shape.is_fully_defined():
                out.append(op.name)
                break
    return out
