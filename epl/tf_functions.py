"""TensorFlow functions made from a graph's own ops: define, call, rebuild.

Part of EPL's TensorFlow adapter (see :mod:`epl.tf_adapter`): the private
TensorFlow modules that pipeline stage functions need (FunctionDef protos, the
function library, TF's C API for call ops) are reached here and nowhere else.
What differs between TensorFlow lines comes from the adapter
(``list_input``, ``FUNCTION_BODY_OPTIONS``).
"""
from tensorflow.core.framework import attr_value_pb2 as _attr_value_pb2
from tensorflow.core.framework import function_pb2 as _function_pb2
from tensorflow.core.framework import node_def_pb2 as _node_def_pb2
from tensorflow.core.framework import tensor_shape_pb2 as _tensor_shape_pb2
from tensorflow.python.framework import function as _function
from tensorflow.python.framework import function_def_to_graph as _fdef_to_graph
from tensorflow.python.framework import op_def_registry as _op_def_registry
from tensorflow.python.util import function_utils as _function_utils

from epl import tf_adapter
from epl.tf_adapter import tf

# The call ops whose bodies the profiler looks into.
CALL_OPS = ("PartitionedCall", "StatefulPartitionedCall")
# A call's ``executor_type`` for TF's single-threaded function executor, whose nodes a
# traced step does not list (epl.parallel.repeat.executors).
SINGLE_THREADED = "SINGLE_THREADED_EXECUTOR"
# A call's own function-level rewrites: off (see call_function).
_DISABLED_REWRITES = _function_utils.get_disabled_rewriter_config()


def new_function_def(name):
    """An empty FunctionDef proto named ``name``."""
    fdef = _function_pb2.FunctionDef()
    fdef.signature.name = name
    return fdef


class DefinedFunction(object):
    """A function in a graph's library: its name and result types."""

    def __init__(self, name, output_types):
        self.name = name
        self.output_types = list(output_types)


def define_function(graph, fdef):
    """Add ``fdef`` to ``graph``'s function library; returns a
    :class:`DefinedFunction` for :func:`call_function`.

    Two marks keep grappler's function optimizer (when a session runs it) from
    multiplying the body by the number of call sites again: ``_noinline`` (it
    would paste the body back at every call) and a registered gradient function
    (TF never differentiates through these calls; grappler specializes a call
    site, a copy of the body per distinct call, only for functions without one)."""
    fdef.attr["_noinline"].b = True
    function = _function._from_definition(fdef)  # pylint: disable=protected-access
    function.set_grad_func(_never_differentiated())
    function.add_to_graph(graph)
    return DefinedFunction(fdef.signature.name, [a.type for a in fdef.signature.output_arg])


def _never_differentiated():
    """The gradient function registered for EPL's stage functions: an empty
    function that nothing calls (see :func:`define_function`)."""
    return _function._from_definition(  # pylint: disable=protected-access
        new_function_def("EPL_never_differentiated"))


def call_function(function, inputs, name, device, control_inputs=()):
    """Create one call of ``function`` (already in the default graph, see
    :func:`define_function`) there, on ``device``, after ``control_inputs``;
    returns (op, outputs).

    The call is a ``StatefulPartitionedCall`` with TF's shape inference through
    the body switched off (``_disable_call_shape_inference``, as ``Defun`` does):
    otherwise every call op costs a shape inference over the whole body (tens of
    ms for a transformer stage); calling TF's function object instead would also
    copy its definition into the graph again. The call's own function-level
    rewrites are off: the session's grappler, where it runs, optimizes the
    library once. The call is marked not to be compiled by XLA as a whole
    (``_XlaCompile``): TF's auto-clustering pass otherwise instantiates the body
    once per call site to decide, even with XLA off (measured on a 12-layer encoder, 2 stages x 32
    micro-batches: 3.5 s of the first step); XLA can still cluster ops inside
    the body when the function is instantiated.

    The op is made from its NodeDef through TF's C API, as the graph importer
    does, not through ``Graph.create_op``: a call takes every weight and saved
    activation of its stage as an input (about 160 on a 6-layer stage), and the
    Python constructor's per-input type checks and control-flow bookkeeping cost
    about 4 ms per call, a third of the rewrite at 32 micro-batches. EPL builds
    calls outside any control-flow context, with explicit device and
    dependencies, so none of that applies."""
    graph = tf_adapter.get_default_graph()
    value = _attr_value_pb2.AttrValue
    types = lambda dtypes: value(list=value.ListValue(type=dtypes))
    node = _node_def_pb2.NodeDef(op="StatefulPartitionedCall", name=graph.unique_name(name),
                                 device=device)
    attrs = {"f": value(func=_attr_value_pb2.NameAttrList(name=function.name)),
             "Tin": types([t.dtype.base_dtype.as_datatype_enum for t in inputs]),
             "Tout": types(function.output_types), "config": value(s=b""),
             "config_proto": value(s=_DISABLED_REWRITES), "executor_type": value(s=b""),
             "_disable_call_shape_inference": value(b=True), "_XlaCompile": value(b=False)}
    op = tf_adapter.op_from_node(graph, node, attrs, tf_adapter.list_input(list(inputs)),
                                 control_inputs)
    return op, list(op.outputs)


def called_function_body(call_op, known_shapes=None):
    """The body of the function ``call_op`` calls, as a graph whose inputs are
    placeholders shaped like the call's inputs (nested calls find their functions:
    the caller's library is copied along). Saved-tensor reads become placeholders
    shaped as ``known_shapes`` ({tensor name: TensorShape}, from the bodies that
    wrote them) or as recorded when the body was built."""
    graph = call_op.graph
    name = call_op.get_attr("f").name
    fdef = _shaped_reads(graph._get_function(name).definition,  # pylint: disable=protected-access
                         known_shapes or {})
    with graph.as_default():
        return _fdef_to_graph.function_def_to_graph(
            fdef, input_shapes=[t.shape for t in call_op.inputs],
            **tf_adapter.FUNCTION_BODY_OPTIONS)


def step_tensor_array(dtype, size, name, device):
    """(handle, flow) of a new TensorArray of ``size`` (an int32 tensor) elements of
    ``dtype`` (any shapes) on ``device`` that clears each element when it is read;
    it lives in the step's resource container, so it is gone at the end of the step."""
    with tf.device(device):
        handle, flow = tf.raw_ops.TensorArrayV3(
            size=size, dtype=dtype,
            dynamic_size=False, clear_after_read=True, identical_element_shapes=False,
            name=name)
    return handle, flow


SAVED_TENSOR_ATTR = "_epl_saved_tensor"  # on a saved-tensor read: the tensor's name


def _shaped_reads(fdef, known_shapes):
    """``fdef`` with each TensorArray read that records its shape (``_output_shapes``,
    EPL's saved activations) replaced by a placeholder of that shape: TF infers no
    shape through a TensorArray handle that is an argument, and the profiler
    needs the shapes, not the values."""
    if not any(n.op == "TensorArrayReadV3" and "_output_shapes" in n.attr
               for n in fdef.node_def):
        return fdef
    shaped = _function_pb2.FunctionDef()
    shaped.CopyFrom(fdef)
    renamed = {}
    for node in shaped.node_def:
        if node.op == "TensorArrayReadV3" and "_output_shapes" in node.attr:
            shape = _tensor_shape_pb2.TensorShapeProto()  # a copy: clear() frees the attr's
            shape.CopyFrom(node.attr["_output_shapes"].list.shape[0])
            known = known_shapes.get(node.attr[SAVED_TENSOR_ATTR].s.decode())
            if known is not None:
                shape.CopyFrom(known.as_proto())
            dtype = node.attr["dtype"].type
            node.op = "Placeholder"
            del node.input[:]
            node.attr.clear()
            node.attr["dtype"].type = dtype
            node.attr["shape"].shape.CopyFrom(shape)
            renamed["%s:value:0" % node.name] = "%s:output:0" % node.name
    for node in shaped.node_def:
        node.input[:] = [renamed.get(ref, ref) for ref in node.input]
    for key in list(shaped.ret):
        shaped.ret[key] = renamed.get(shaped.ret[key], shaped.ret[key])
    return shaped


def called_node_names(call_op):
    """Names of the nodes inside the function ``call_op`` calls and the functions it
    calls in turn: a traced step reports them under these names, not the call's."""
    names, pending, seen = set(), [call_op.get_attr("f").name], set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        function = call_op.graph._get_function(name)  # pylint: disable=protected-access
        for node in function.definition.node_def:
            names.add(node.name)
            if node.op in CALL_OPS:
                pending.append(node.attr["f"].func.name)
    return names


def called_name(call_op):
    """The name of the function ``call_op`` calls."""
    return call_op.get_attr("f").name


def function_definition(graph, name):
    """The FunctionDef of function ``name`` of ``graph``'s library."""
    return graph._get_function(name).definition  # pylint: disable=protected-access


def set_call_executor(call_op, executor_type):
    """Run ``call_op``'s body on TF's executor ``executor_type`` (the call's
    ``executor_type`` attribute; empty: TF's default executor)."""
    tf_adapter.set_attr(call_op, "executor_type",
                        _attr_value_pb2.AttrValue(s=tf.compat.as_bytes(executor_type)))


def single_threaded_calls(graph):
    """The call ops of ``graph`` whose bodies run on TF's single-threaded executor."""
    single = tf.compat.as_bytes(SINGLE_THREADED)
    return [op for op in graph.get_operations()
            if op.type in CALL_OPS and op.get_attr("executor_type") == single]


def has_ref_outputs(op_type):
    """True when op ``op_type`` (registered) has reference-typed outputs."""
    if hasattr(_op_def_registry, "get"):  # TF 2.x: every registered op, through C
        op_def = _op_def_registry.get(op_type)
    else:  # TF 1.15: the ops the Python wrappers registered
        op_def = _op_def_registry.get_registered_ops().get(op_type)
    return op_def is not None and any(arg.is_ref for arg in op_def.output_arg)
