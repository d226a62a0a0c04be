"""The TF adapter's state: variables (ref and resource), checkpoints, optimizer internals.

Behind :mod:`epl.tf_adapter` (which re-exports every public name here; EPL imports the
adapter, never this module): which ops read or write variables, variables at the op
level, what a Saver saves, and the tf.train optimizer internals EPL reaches (slots,
the optimizer a wrapper delegates to, ``_finish``).
"""
import contextlib

import tensorflow.compat.v1 as tf

from epl.tf_adapter_graph import (get_default_graph, is_ref_dtype, op_from_node,
                                  undecorated_op_creation, unfinalized)
from epl.tf_adapter_version import impl as _impl
from tensorflow.python.ops import gen_resource_variable_ops as _gen_rv
from tensorflow.python.ops import gen_state_ops as _gen_state
from tensorflow.python.ops import variables as _variables
from tensorflow.python.training import saver as _saver_lib
from tensorflow.python.training.saving import saveable_object as _saveable
from tensorflow.core.framework import attr_value_pb2 as _attr_value_pb2
from tensorflow.core.framework import node_def_pb2 as _node_def_pb2


def touches_state(op):
    """True for ops that may read or change state: ops TF marks stateful (resource
    variable updates, random ops, queues) and ops taking a ref input (ref-variable
    updates such as Assign or ScatterAdd, which TF does not mark stateful)."""
    return bool(op.op_def.is_stateful) or any(is_ref_dtype(t.dtype) for t in op.inputs)


_VARIABLE_READS = frozenset(["Identity", "RefIdentity", "ReadVariableOp", "VariableShape",
                             "VarIsInitializedOp", "IsVariableInitialized", "ResourceGather",
                             "Enter", "RefEnter", "Switch", "RefSwitch",
                             # savers read ref variables directly; they write files, not
                             # variables (ZeRO once made every step save to "./model")
                             "SaveV2", "Save", "SaveSlices"])


_PASS_THROUGH = frozenset(["Identity", "RefIdentity", "Enter", "RefEnter", "Switch",
                           "RefSwitch"])


def is_state_tensor(tensor):
    """True for ref and resource tensors (handles on variables and other state)."""
    return is_ref_dtype(tensor.dtype) or tensor.dtype == tf.resource


def written_variables(op):
    """Variable ops (VariableV2/VarHandleOp) that ``op`` updates in place, found by
    following its ref/resource inputs back through identities and loop/cond plumbing."""
    if not writes_variable(op):
        return []
    result = []
    for tensor in op.inputs:
        if not is_state_tensor(tensor):
            continue
        source = tensor.op
        for _ in range(16):
            if source.type not in _PASS_THROUGH or not source.inputs:
                break
            source = source.inputs[0].op
        if is_variable_op(source):
            result.append(source)
    return result


def writes_variable(op):
    """True for ops that update a variable in place (Assign*, Scatter*, Apply*):
    an op taking a ref or resource input that is not a plain read of it."""
    if op.type in _VARIABLE_READS:
        return False
    return any(is_ref_dtype(t.dtype) or t.dtype == tf.resource for t in op.inputs)


# ---- variables at the op level (works for ref and resource variables) ---------
VARIABLE_OP_TYPES = frozenset(["VariableV2", "Variable", "VarHandleOp"])


def is_variable_op(op):
    return op.type in VARIABLE_OP_TYPES


def is_resource_variable(var_op):
    return var_op.type == "VarHandleOp"


def variable_dtype(var_op):
    return tf.as_dtype(var_op.get_attr("dtype")).base_dtype


def variable_shape(var_op):
    return tf.TensorShape(var_op.get_attr("shape"))


def remote_variable(template, device, shape, name):
    """A variable op on ``device`` naming the same variable as ``template`` does on its
    own worker (same type, container and shared name): in a TF cluster, variables of
    one device and name are one resource, whichever graph refers to them. Lets worker
    0 read (save) the shards that another worker holds."""
    shared = template.get_attr("shared_name") or template.name
    if isinstance(shared, bytes):
        shared = shared.decode()
    container = template.get_attr("container")
    dtype = template.get_attr("dtype")
    with tf.device(device):
        if is_resource_variable(template):
            return _gen_rv.var_handle_op(dtype=dtype, shape=shape, container=container,
                                         shared_name=shared, name=name).op
        return _gen_state.variable_v2(shape=shape, dtype=dtype, container=container,
                                      shared_name=shared, name=name).op


def read_variable(var_op):
    """Current value of a variable given its VariableV2/VarHandleOp op."""
    if is_resource_variable(var_op):
        return _gen_rv.read_variable_op(var_op.outputs[0], variable_dtype(var_op))
    return tf.identity(var_op.outputs[0])


def assign_variable(var_op, value):
    """Assign (and initialize, if needed) a variable from its op."""
    if is_resource_variable(var_op):
        return _gen_rv.assign_variable_op(var_op.outputs[0], value)
    return _gen_state.assign(var_op.outputs[0], value, validate_shape=True).op


def is_variable_initialized(var_op):
    if is_resource_variable(var_op):
        return _gen_rv.var_is_initialized_op(var_op.outputs[0])
    return _gen_state.is_variable_initialized(var_op.outputs[0])


# ---- checkpoints --------------------------------------------------------------
SaveableObject = _saveable.SaveableObject
SaveSpec = _saveable.SaveSpec


def is_variable(value):
    """True for every variable object, ref or resource: in TF 2.x a resource variable is
    not a ``tf.compat.v1.Variable`` (that class is TF 1's VariableV1 there)."""
    return isinstance(value, _variables.Variable)


def all_saveable_objects():
    """What a Saver without a var_list saves: global variables and SAVEABLE_OBJECTS."""
    return _variables._all_saveable_objects()


def saver_var_list(saver):
    """The var_list a Saver was made with (None: everything saveable)."""
    return saver._var_list


def serialize_iterator(resource):
    """SerializeIterator of a tf.data iterator's resource, failing on unsaveable state."""
    return _impl.serialize_iterator(tf, resource)


def checkpoint_problem(prefix):
    """None when every tensor of checkpoint ``prefix`` reads back, else TF's error (its
    first line). Reading a tensor checks the CRC32C its bundle's index records for it,
    so a checkpoint whose index is intact needs no checksum of its data file of its own.
    Variant tensors (an iterator saved in SAVEABLE_OBJECTS) cannot be read here; a
    restore still checks them, and fails loudly on damage."""
    try:
        reader = tf.train.NewCheckpointReader(prefix)
        for name, dtype in sorted(reader.get_variable_to_dtype_map().items()):
            if dtype != tf.variant:
                reader.get_tensor(name)
    except Exception as err:  # pylint: disable=broad-except (any TF error: a problem)
        lines = [line for line in str(err).splitlines() if line.strip()]
        return "%s: %s" % (type(err).__name__, lines[0] if lines else "")
    return None


def rebuild_saver(saver, var_list):
    """A Saver over ``var_list`` with ``saver``'s options (a deferred restore stays
    deferred); returns its SaverDef."""
    deferred = isinstance(saver._builder, _DeferredRestoreBuilder)
    rebuilt = tf.train.Saver(var_list, sharded=saver._sharded, max_to_keep=saver._max_to_keep,
                             keep_checkpoint_every_n_hours=saver._keep_checkpoint_every_n_hours,
                             save_relative_paths=saver._save_relative_paths, name=saver._name,
                             builder=_DeferredRestoreBuilder() if deferred else None)
    if deferred:
        saver._builder = rebuilt._builder
    return rebuilt.saver_def


def saver_with_deferred_restore(var_list, name):
    """A ``tf.train.Saver`` over ``var_list`` (kept for every checkpoint) whose restore
    ops are built when :func:`restore_op_name` first asks for them.

    A Saver builds a read and an assign per saved tensor for its restore: on BERT-base
    most of the time its construction takes, for a restore a healthy run never does.
    Until then the SaverDef names a guard that fails loudly if run."""
    return tf.train.Saver(var_list, max_to_keep=None, name=name,
                          builder=_DeferredRestoreBuilder())


def restore_op_name(saver):
    """The name of ``saver``'s restore op, building it first if it was deferred (in the
    scope, devices and graph the Saver was made in, finalized or not)."""
    builder = saver._builder
    if isinstance(builder, _DeferredRestoreBuilder) and builder.pending is not None:
        saver.saver_def.restore_op_name = builder.build_restore().name
    return saver.saver_def.restore_op_name


class _DeferredRestoreBuilder(_saver_lib.BulkSaverBuilder):
    """TF's Saver builder, but the restore ops it is asked for are recorded (with the
    name scope and device stack of the moment) and built by :meth:`build_restore`."""

    def __init__(self):
        super(_DeferredRestoreBuilder, self).__init__()
        self.pending = None
        self._building = False

    def _AddRestoreOps(self, *args, **kwargs):  # noqa: N802 (TF's name)
        parent = super(_DeferredRestoreBuilder, self)._AddRestoreOps
        return parent(*args, **kwargs) if self._building else self._defer(parent, args, kwargs)

    def _AddShardedRestoreOps(self, *args, **kwargs):  # noqa: N802 (TF's name)
        parent = super(_DeferredRestoreBuilder, self)._AddShardedRestoreOps
        return parent(*args, **kwargs) if self._building else self._defer(parent, args, kwargs)

    def _defer(self, build, args, kwargs):
        graph = get_default_graph()
        self.pending = (graph, graph.get_name_scope(), graph._device_function_stack.copy(),
                        build, args, kwargs)
        message = tf.constant("EPL: this Saver's restore ops were deferred; build them "
                              "with tf_adapter.restore_op_name(saver) before restoring")
        return tf.raw_ops.Assert(condition=tf.constant(False), data=[message],
                                 name="restore_all")

    def build_restore(self):
        graph, scope, devices, build, args, kwargs = self.pending
        outer = graph._device_function_stack
        with unfinalized(graph), graph.as_default(), undecorated_op_creation(), \
                tf.control_dependencies(None), tf.name_scope(scope + "/" if scope else None):
            graph._device_function_stack = devices
            self._building = True
            try:
                restore = build(*args, **kwargs)
            finally:
                self._building = False
                graph._device_function_stack = outer
        self.pending = None
        return restore


def assign_any_shape(var_op, value):
    """Assign ``value`` to a variable whatever its static shape (a shard's width)."""
    if is_resource_variable(var_op):
        return _gen_rv.assign_variable_op(var_op.outputs[0], value)
    return _gen_state.assign(var_op.outputs[0], value, validate_shape=False).op


def _loc(op):
    return ("loc:@" + op.name).encode()


def assign_variable_on(var_op, value, device, name):
    """:func:`assign_variable` on ``device`` under the unique name ``name`` (in the
    default graph), made as :func:`op_from_node` makes ops: EPL assigns every
    local copy of every variable its initial value (hundreds of ops), where the
    generated op wrappers cost about 1 ms each."""
    graph = get_default_graph()
    value_attr = _attr_value_pb2.AttrValue
    dtype = value_attr(type=value.dtype.base_dtype.as_datatype_enum)
    if is_resource_variable(var_op):
        node_type, attrs = "AssignVariableOp", {"dtype": dtype}
    else:  # colocated with the variable, as TF colocates an op with its ref input
        node_type, attrs = "Assign", {"T": dtype, "validate_shape": value_attr(b=True),
                                      "use_locking": value_attr(b=True), "_class": value_attr(
                                          list=value_attr.ListValue(s=[_loc(var_op)]))}
        device = var_op.device or device
    node = _node_def_pb2.NodeDef(op=node_type, name=graph.unique_name(name), device=device)
    return op_from_node(graph, node, attrs, [var_op.outputs[0], value])


# Attributes under which wrapper optimizers keep the optimizer they delegate to: TF's own
# wrappers (MovingAverageOptimizer, the loss-scale optimizers), Horovod and tensor2tensor use
# the first two, private ones.
_WRAPPED_OPTIMIZER_ATTRIBUTES = ("_opt", "_optimizer", "optimizer", "_inner_optimizer")


def wrapped_optimizer_candidates(optimizer):
    """What a wrapper optimizer keeps under the attributes wrappers use for the optimizer
    they delegate to, in that order (instance attributes only: no property runs)."""
    found = vars(optimizer) if hasattr(optimizer, "__dict__") else {}
    return [found[name] for name in _WRAPPED_OPTIMIZER_ATTRIBUTES
            if found.get(name) is not None]


def create_slots(optimizer, variables):
    """Let a tf.train optimizer create the slots (and non-slot variables such as Adam's
    beta powers) of ``variables`` now; it creates only what is missing later."""
    optimizer._create_slots(variables)  # pylint: disable=protected-access


_MISSING = object()


@contextlib.contextmanager
def finishing_with(optimizer, finish):
    """Inside, the tf.train optimizer's ``_finish(update_ops, name)`` (what ends its
    ``apply_gradients``: Adam's beta-power updates) is ``finish``; restored on exit."""
    own = vars(optimizer).get("_finish", _MISSING)
    optimizer._finish = finish  # pylint: disable=protected-access
    try:
        yield
    finally:
        if own is _MISSING:
            del optimizer._finish  # pylint: disable=protected-access
        else:
            optimizer._finish = own  # pylint: disable=protected-access
