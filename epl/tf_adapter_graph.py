"""The TF adapter's graph editing: ops, their inputs and control edges, imports, adds.

Behind :mod:`epl.tf_adapter` (which re-exports every public name here; EPL imports the
adapter, never this module): what EPL does to a built graph through TensorFlow's private
graph API (rewiring inputs, adding control edges, importing NodeDefs, making ops from
NodeDefs through the C API). What differs between TensorFlow lines comes from
:mod:`epl.tf_adapter_version`.
"""
import contextlib

import tensorflow.compat.v1 as tf

from epl.tf_adapter_version import impl as _impl
from tensorflow.core.framework import attr_value_pb2 as _attr_value_pb2
from tensorflow.core.framework import node_def_pb2 as _node_def_pb2
from tensorflow.python.framework import ops as _ops
from tensorflow.python.framework import tensor_util as _tensor_util
from tensorflow.python.ops import control_flow_ops as _control_flow_ops
from tensorflow.python.ops import gen_math_ops as _gen_math
from tensorflow.python.training import training_util as _training_util


@contextlib.contextmanager
def undecorated_op_creation():
    """Build ops past the argument check of TF 1.15's ``Graph.create_op`` while inside.

    TF 1.15 builds every op through ``Graph.create_op``, whose deprecation decorator
    calls ``inspect.getcallargs`` on every call to warn about an argument
    (``compute_shapes``) that EPL never passes: about 70 us of the 220-290 us an op
    costs to build. EPL's rewrite builds thousands of ops (about 3000 for a pipeline of
    a 12-layer encoder, 6000 under data parallelism or gradient accumulation), so while
    it runs ``Graph.create_op`` is the method without its decorator (ops that other
    threads build meanwhile skip the warning too). TF 2.x builds ops through
    ``_create_op_internal``, past the decorator, and is left as it is; so is a
    ``create_op`` that someone else replaced."""
    decorated = _ops.Graph.__dict__["create_op"]
    decorator = getattr(decorated, "_tf_decorator", None)
    plain = getattr(decorated, "__wrapped__", None)
    if _impl.OPS_BUILT_PAST_CREATE_OP or plain is None or \
            getattr(decorator, "decorator_name", None) != "deprecated":
        yield
        return
    _ops.Graph.create_op = plain
    try:
        yield
    finally:
        _ops.Graph.create_op = decorated


def op_id(op):
    """Creation order of an op inside its graph (monotonic)."""
    return op._id  # pylint: disable=protected-access


def set_device(op, device):
    """Place an already-created op."""
    op._set_device(device)  # pylint: disable=protected-access


def add_control_inputs(op, control_ops):
    """Add control dependencies to an existing op."""
    control_ops = [c for c in control_ops if c is not op and c not in op.control_inputs]
    if control_ops:
        op._add_control_inputs(control_ops)  # pylint: disable=protected-access


def control_outputs(op):
    """The ops that take ``op`` as a control input."""
    return list(op._control_outputs)  # pylint: disable=protected-access


def set_attr(op, attr, value):
    """Set attribute ``attr`` (an AttrValue) of an existing op."""
    op._set_attr(attr, value)  # pylint: disable=protected-access


def is_ref_dtype(dtype):
    """True for the reference dtypes of TF1 ref variables (``float32_ref``)."""
    return dtype._is_ref_dtype  # pylint: disable=protected-access


def update_input(op, index, tensor):
    """Rewire input ``index`` of an existing op to ``tensor``."""
    op._update_input(index, tensor)  # pylint: disable=protected-access


@contextlib.contextmanager
def unfinalized(graph):
    """Let EPL add its ops to ``graph`` even if TF finalized it (MonitoredTrainingSession
    finalizes before its first run); a graph that was finalized is finalized again on
    the way out, also when building failed, so no failure leaves the user's graph open
    (and without calling ``finalize``, which EPL hooks to start the rewrite)."""
    finalized = graph.finalized
    if finalized:
        graph._unsafe_unfinalize()  # pylint: disable=protected-access
    try:
        yield graph
    finally:
        if finalized:  # TF's own flag: Graph.finalize is hooked to rewrite the graph
            graph._finalized = True  # pylint: disable=protected-access


def drop_outside_colocation(node, names):
    """Keep only the colocation constraints (``_class``) of NodeDef ``node`` that name an
    op in ``names``: a copy of a set of ops cannot be colocated with ops outside it."""
    if "_class" not in node.attr:
        return
    kept = [loc for loc in node.attr["_class"].list.s
            if loc.decode()[len("loc:@"):] in names]
    if kept:
        del node.attr["_class"].list.s[:]
        node.attr["_class"].list.s.extend(kept)
    else:
        del node.attr["_class"]


def colocation_root(op):
    """Name of the op that ``op`` is explicitly colocated with, or None."""
    for group in _impl.colocation_groups(op) or ():
        name = group.decode() if isinstance(group, bytes) else group
        if name.startswith("loc:@"):
            return name[len("loc:@"):]
    return None


def is_function_graph(graph):
    """True for graphs TF builds for function bodies (dataset maps, defuns)."""
    return bool(getattr(graph, "_building_function", False))


def function_names(graph):
    """Names of the functions defined in ``graph``."""
    return set(graph._functions)  # pylint: disable=protected-access


def switch(tensor, pred):
    """(output_false, output_true): the untaken side is a dead tensor at run time."""
    return _control_flow_ops.switch(tensor, pred)


def merge(tensors):
    """The one live tensor of ``tensors`` (the others are dead at run time)."""
    return _control_flow_ops.merge(tensors)[0]


def remove_control_inputs(op):
    """Drop every control input of an existing op."""
    op._remove_all_control_inputs()  # pylint: disable=protected-access


def control_flow_context(graph=None):
    """The while/cond context new ops of ``graph`` are created in (None outside)."""
    graph = graph if graph is not None else _ops.get_default_graph()
    return graph._get_control_flow_context()  # pylint: disable=protected-access


def get_default_graph():
    return _ops.get_default_graph()


def global_step_tensor(graph):
    """The graph's global step variable (or None), without creating it."""
    return _training_util.get_global_step(graph)


def graph_is_nested():
    """True inside an explicit ``with tf.Graph().as_default():`` block."""
    return not _ops._default_graph_stack.is_cleared()  # pylint: disable=protected-access


def import_nodes(tf_graph, graph_def, input_map, prefix, return_elements):
    """``tf.import_graph_def`` for NodeDefs copied from ops of ``tf_graph`` itself.

    The public importer re-validates every NodeDef against its OpDef and, per
    imported op, resets its device and re-applies device functions in Python;
    then it finds the new ops by walking *every* op of the graph. For copies of a
    large model (and one import per micro-batch) that is most of the rewrite.
    EPL's NodeDefs come from existing ops (defaults already filled in) and carry
    the devices EPL wants, so this variant keeps TF's C++ import, asks it for
    every imported op and creates only those Python ops. Falls back to the
    public importer if TF's internals differ (another TF version).
    """
    c_api = _impl.c_api()
    from tensorflow.python.framework import c_api_util
    from tensorflow.python.framework import importer
    try:
        options_helper = importer._PopulateTFImportGraphDefOptions
        gather = importer._GatherReturnElements
    except AttributeError:  # pragma: no cover - other TF versions
        with tf_graph.as_default():
            return tf.import_graph_def(graph_def, input_map=input_map,
                                       return_elements=return_elements, name=prefix)
    every = [node.name for node in graph_def.node]
    with tf_graph.as_default(), tf.name_scope(None):
        with tf.name_scope(prefix) as scope:
            prefix = scope[:-1]
        scoped = c_api_util.ScopedTFImportGraphDefOptions()
        options_helper(scoped.options, prefix, input_map, list(return_elements) + every, True)
        with tf_graph._mutation_lock():
            with c_api_util.tf_buffer(graph_def.SerializeToString()) as serialized:
                results = c_api.TF_GraphImportGraphDefWithResults(
                    tf_graph._c_graph, serialized, scoped.options)
                results = c_api_util.ScopedTFImportGraphDefResults(results)
            c_ops = c_api.TF_ImportGraphDefResultsReturnOperations(results.results)
            _add_imported_ops(tf_graph, c_ops[-len(every):] if every else [])
        return gather(return_elements, tf_graph, results.results)


def _add_imported_ops(tf_graph, c_ops):
    """Python ops for freshly imported C ops (what ``Graph._add_new_tf_operations``
    does, without its walk over every op of the graph to find them)."""
    new_ops = [tf_graph._create_op_from_tf_operation(c_op, compute_device=False)
               for c_op in c_ops]
    for op in new_ops:
        op._add_control_inputs(tf_graph._control_dependencies_for_inputs(op.inputs))
        op._control_flow_post_processing()
    return new_ops


def running_sum(tensors, waits=None):
    """``tensors[0] + tensors[1] + ...`` as a chain of two-input adds, in order.

    Each add also carries a control input from its addend's op (redundant with
    the data edge, so it changes no schedule). Why: grappler's arithmetic
    optimizer folds a chain of adds into one AddN, and in the same optimizer
    round the memory optimizer rewrites every AddN of more than two inputs into
    temporary-variable updates, walking the whole fan-in of each one; on a
    pipelined BERT-base (one chain per variable) that cost seconds of the first
    step. Adds with control inputs are never folded; the dependency optimizer
    drops the redundant edges only after the arithmetic optimizer has run, and
    the memory optimizer runs in the first round only.

    ``waits[k]`` (optional) lists ops the add of ``tensors[k]`` also waits for.
    """
    waits = waits or [[] for _ in tensors]
    total = tensors[0]
    for position, tensor in enumerate(tensors[1:], 1):
        total = _gen_math.add_v2(total, tensor)
        extra = waits[0] + waits[1] if position == 1 else waits[position]
        # (tf.control_dependencies() drops a control input that is already a data input)
        add_control_inputs(total.op, [tensor.op] + list(extra))
    return total


def with_unknown_rows(tensor):
    """``tensor`` with dim 0 statically unknown (an identity at run time).

    EPL hands ops tensors with more or fewer rows than they were built for
    (gathered sparse gradients, a slice of a split batch), and TF refuses to
    rewire an input to a tensor whose static shape conflicts with the old one.
    """
    shape = tensor.shape
    if shape.ndims is None or shape.ndims == 0 or shape.dims[0].value is None:
        return tensor
    return tf.placeholder_with_default(tensor, [None] + shape.as_list()[1:])


# How TF's C API takes a list input (see op_from_node); what function_def_to_graph
# needs to rebuild a function body on this TensorFlow (epl/tf_functions.py).
list_input = _impl.list_input
FUNCTION_BODY_OPTIONS = _impl.FUNCTION_BODY_OPTIONS


def op_from_node(graph, node, attrs, inputs, control_inputs=()):
    """An op of ``graph`` made from ``node`` (a NodeDef with its name and device)
    with ``attrs`` through TF's C API; ``inputs`` as TF's ``_create_c_op`` takes
    them (see ``list_input``). For ops EPL makes by the hundred outside any
    control-flow context (see :func:`call_function`)."""
    for key, attr in attrs.items():
        node.attr[key].CopyFrom(attr)
    c_op = _ops._create_c_op(  # pylint: disable=protected-access
        graph, node, inputs, list(control_inputs))
    return graph._create_op_from_tf_operation(  # pylint: disable=protected-access
        c_op, compute_device=False)


class NodeOps(object):
    """Small ops on one device of the default graph, made as :func:`op_from_node`
    makes ops, under the current name scope: EPL's gradient accumulators make about
    10 such ops per variable (2k on a 12-layer encoder), where TF's generated wrappers
    and ``tf.zeros``' constants cost 0.3-1.5 ms each. Outside any control-flow context
    only (the rewrite's own ops)."""

    def __init__(self, device):
        self.device = device
        self._zero = {}   # {dtype or (dtype, divisor): scalar constant on the device}

    def _make(self, node_type, name, inputs, attrs, control_inputs=()):
        graph = _ops.get_default_graph()
        node = _node_def_pb2.NodeDef(op=node_type, name=graph.unique_name(name),
                                     device=self.device)
        return op_from_node(graph, node, attrs, inputs, control_inputs)

    def _const(self, value, dtype, name):
        attrs = {"dtype": _type_attr(dtype), "value": _attr_value_pb2.AttrValue(
            tensor=_tensor_util.make_tensor_proto(value, dtype))}
        return self._make("Const", name, [], attrs).outputs[0]

    def zeros(self, shape, dtype, control_inputs=()):
        """A tensor of zeros of the fully defined ``shape`` (made after
        ``control_inputs``, and dead when one of them is)."""
        dtype = tf.as_dtype(dtype).base_dtype
        if dtype not in self._zero:
            self._zero[dtype] = self._const(0, dtype, "zero")
        dims = self._const(list(tf.TensorShape(shape).as_list()), tf.int32, "shape")
        attrs = {"T": _type_attr(dtype), "index_type": _type_attr(tf.int32)}
        return self._make("Fill", "zeros", [dims, self._zero[dtype]], attrs,
                          control_inputs).outputs[0]

    def variable(self, shape, dtype, name):
        """The ref tensor of a ``VariableV2`` of the fully defined ``shape`` that no
        initializer, collection or saver knows: its owner assigns it before reading it."""
        attrs = {"dtype": _type_attr(dtype), "container": _attr_value_pb2.AttrValue(s=b""),
                 "shared_name": _attr_value_pb2.AttrValue(s=b""),
                 "shape": _attr_value_pb2.AttrValue(shape=tf.TensorShape(shape).as_proto())}
        return self._make("VariableV2", name, [], attrs).outputs[0]

    def assign(self, ref, value):
        """``Assign`` (locking, shape-validating, as ``tf.assign``): copies ``value``
        into ``ref``'s buffer when that is initialized with the same size."""
        attrs = {"T": _type_attr(value.dtype), "validate_shape": _attr_value_pb2.AttrValue(b=True),
                 "use_locking": _attr_value_pb2.AttrValue(b=True)}
        return self._make("Assign", "Assign", [ref, value], attrs).outputs[0]

    def assign_add(self, ref, value):
        """``AssignAdd`` (not locking, as ``tf.assign_add``): adds in place."""
        attrs = {"T": _type_attr(value.dtype), "use_locking": _attr_value_pb2.AttrValue(b=False)}
        return self._make("AssignAdd", "AssignAdd", [ref, value], attrs).outputs[0]

    def switch(self, tensor, pred):
        """(output_false, output_true), as :func:`switch`; a ref (a variable) goes
        through ``RefSwitch``, which reads it only where an output is alive."""
        node_type = "RefSwitch" if is_ref_dtype(tensor.dtype) else "Switch"
        op = self._make(node_type, node_type, [tensor, pred], {"T": _type_attr(tensor.dtype)})
        return op.outputs[0], op.outputs[1]

    def divide(self, tensor, divisor):
        """``tensor / divisor`` for a floating ``tensor`` and a Python number, as
        ``tf.truediv`` makes it (``RealDiv`` by a constant of ``tensor``'s dtype); one
        constant per dtype and divisor."""
        dtype = tf.as_dtype(tensor.dtype).base_dtype
        if not dtype.is_floating:
            raise TypeError("NodeOps.divide takes a floating tensor, got %s" % dtype.name)
        key = (dtype, divisor)
        if key not in self._zero:
            self._zero[key] = self._const(divisor, dtype, "y")
        return self._make("RealDiv", "truediv", [tensor, self._zero[key]],
                          {"T": _type_attr(dtype)}).outputs[0]

    def add(self, a, b):
        return self._make("AddV2", "add", [a, b], {"T": _type_attr(a.dtype)}).outputs[0]

    def identity(self, tensor, control_inputs=()):
        return self._make("Identity", "Identity", [tensor], {"T": _type_attr(tensor.dtype)},
                          control_inputs).outputs[0]

    def merge(self, tensors):
        """The one live tensor of ``tensors``, as :func:`merge`."""
        attrs = {"T": _type_attr(tensors[0].dtype),
                 "N": _attr_value_pb2.AttrValue(i=len(tensors))}
        return self._make("Merge", "Merge", list_input(list(tensors)), attrs).outputs[0]


def _type_attr(dtype):
    return _attr_value_pb2.AttrValue(type=tf.as_dtype(dtype).base_dtype.as_datatype_enum)


def constant_on(value, name, device):
    """An int32 constant ``value`` on ``device``."""
    with tf.device(device):
        return tf.constant(value, tf.int32, name=name)


def replace_control_input(op, old, new):
    """Make ``op`` wait for ``new`` instead of ``old``."""
    kept = [c for c in op.control_inputs if c is not old]
    op._remove_all_control_inputs()  # pylint: disable=protected-access
    add_control_inputs(op, kept + [new])
