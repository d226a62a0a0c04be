"""The one place EPL touches private TensorFlow modules.

Everything EPL needs from ``tensorflow.python...`` is imported or reached here
(functions made from a graph's ops, for pipeline stages, in its companion
``epl/tf_functions.py``), so that supporting another TensorFlow version changes
these files (and the per-version implementation modules) and nothing else.
Public TF API is used through ``tf`` (the ``tf.compat.v1`` namespace, which
exists in 1.15 too).

Two TensorFlow lines are supported: 1.15 and 2.x through ``tf.compat.v1``
(docs/tf2.md). What differs between them lives in ``epl/tf_adapter_tf1.py`` and
``epl/tf_adapter_tf2.py``; the one matching the installed TensorFlow is chosen
once, here, at import. Nothing else in EPL asks which TensorFlow it runs on.
"""
import contextlib
import sys

from epl.version import INSTALL_TENSORFLOW

try:
    import tensorflow.compat.v1 as tf
except ImportError as _missing:
    # `pip install .` succeeds without TensorFlow (setup.py says why it is not a
    # requirement); the first use of EPL must then say what to install, not fail with a
    # bare ModuleNotFoundError from deep inside.
    if (getattr(_missing, "name", None) or "").split(".")[0] != "tensorflow":
        raise
    raise ModuleNotFoundError(
        "EPL needs TensorFlow, and this Python (%s) cannot import it (%s): %s"
        % (sys.executable, _missing, INSTALL_TENSORFLOW), name="tensorflow") from _missing

if tf.version.VERSION.startswith("1."):
    from epl import tf_adapter_tf1 as _impl
else:
    from epl import tf_adapter_tf2 as _impl

from tensorflow.python.client import session as _session  # noqa: E402
from tensorflow.python.eager import context as _context  # noqa: E402
from tensorflow.python.framework import ops as _ops  # noqa: E402
from tensorflow.python.framework import random_seed as _random_seed  # noqa: E402
from tensorflow.python.ops import collective_ops  # noqa: E402
from tensorflow.python.ops import control_flow_ops as _control_flow_ops  # noqa: E402
from tensorflow.python.ops import gen_math_ops as _gen_math  # noqa: E402
from tensorflow.python.ops import gen_resource_variable_ops as _gen_rv  # noqa: E402
from tensorflow.python.ops import gen_state_ops as _gen_state  # noqa: E402
from tensorflow.python.ops import gradients_util as _gradients_util  # noqa: E402
from tensorflow.python.training import monitored_session as _monitored_session  # noqa: E402
from tensorflow.python.training import optimizer as _optimizer  # noqa: E402
from tensorflow.python.training import saver as _saver  # noqa: E402
from tensorflow.python.training import server_lib as _server_lib  # noqa: E402
from tensorflow.python.training import training_util as _training_util  # noqa: E402

__all__ = ["tf", "collective_ops"]

# The op library's directory under epl/lib/ for this TensorFlow (tools/build_ops.sh).
OP_LIBRARY_SUBDIR = _impl.OP_LIBRARY_SUBDIR
# Op types of EPL's AMP lists that have no float16 CPU kernel (epl/runtime/amp_lists.py).
LISTED_OPS_WITHOUT_CPU_HALF_KERNEL = _impl.LISTED_OPS_WITHOUT_CPU_HALF_KERNEL

# Patch targets, grouped by concern: (owner object, attribute name).
OP_CREATION = (_ops.Graph, "_add_op")
GRAPH_FINALIZE = (_ops.Graph, "finalize")
# How every random op derives its seeds (graph seed, op seed or the op count).
GET_SEED = (_random_seed, "get_seed")
GRADIENTS = (_gradients_util, "_GradientsHelper")
# The context tf.gradients opens around the gradient ops of each forward op.
GRADIENT_OF_OP = (_gradients_util, "_maybe_colocate_with")
APPLY_GRADIENTS = (_optimizer.Optimizer, "apply_gradients")
# Every optimizer family whose apply_gradients EPL records (their subclasses too):
# tf.compat.v1.train optimizers and Keras optimizers (OptimizerV2 in TF 1.15).
OPTIMIZER_BASES = tuple(base for base in (
    _optimizer.Optimizer, getattr(tf.keras.optimizers, "Optimizer", None))
    if isinstance(base, type))
# Keras models, whose own training loop (Model.fit) EPL refuses.
KERAS_MODEL_BASES = (tf.keras.Model,)
SESSION_INIT = (_session.BaseSession, "__init__")
SESSION_RUN = (_session.BaseSession, "run")
SESSION_MAKE_CALLABLE = (_session.BaseSession, "make_callable")
SAVER_INIT = (_saver.Saver, "__init__")
SAVER_SAVE = (_saver.Saver, "save")
SAVER_RESTORE = (_saver.Saver, "restore")
SERVER_INIT = (_server_lib.Server, "__init__")
SCAFFOLD_FINALIZE = (_monitored_session.Scaffold, "finalize")
_MTS = _monitored_session.MonitoredTrainingSession

try:  # tf.estimator ships with TF 1.15 and 2.x up to 2.15; optional elsewhere
    from tensorflow_estimator.python.estimator import estimator as _estimator
    from tensorflow_estimator.python.estimator import run_config as _run_config
    from tensorflow_estimator.python.estimator import training as _estimator_training
except ImportError:  # pragma: no cover - TF builds without tf.estimator
    _estimator = _run_config = _estimator_training = None

if _estimator is not None:
    ESTIMATOR_CALL_MODEL_FN = (_estimator.Estimator, "_call_model_fn")
    ESTIMATOR_TRAIN = (_estimator.Estimator, "train")
    # Module functions Estimator.evaluate writes its eval summaries with.
    ESTIMATOR_EVAL_SUMMARIES = [(_estimator, name) for name in (
        "_write_dict_to_summary", "_write_checkpoint_path_to_summary")
        if hasattr(_estimator, name)]
    RUN_CONFIG_INIT = (_run_config.RunConfig, "__init__")
    # Where RunConfig reads the cluster and task of TF_CONFIG (a parsed dict).
    RUN_CONFIG_CLUSTER = (_run_config.RunConfig, "_init_distributed_setting_from_environment_var")
    # train_and_evaluate's path for a local (non-distributed) RunConfig: train, and
    # evaluate after each checkpoint. Its ``_train_spec``/``_train_hooks``/``_estimator``
    # are what a training-only task needs (:func:`train_and_evaluate_parts`).
    TRAINING_EXECUTOR_RUN_LOCAL = (_estimator_training._TrainingExecutor, "run_local")
else:  # pragma: no cover
    ESTIMATOR_CALL_MODEL_FN = ESTIMATOR_TRAIN = RUN_CONFIG_INIT = RUN_CONFIG_CLUSTER = None
    TRAINING_EXECUTOR_RUN_LOCAL = None
    ESTIMATOR_EVAL_SUMMARIES = []


def train_and_evaluate_parts(executor):
    """``(estimator, train_spec, extra train hooks)`` of a train_and_evaluate executor."""
    # pylint: disable=protected-access
    return executor._estimator, executor._train_spec, list(executor._train_hooks)


def module_targets(value, names, prefixes=None):
    """Every (module, attribute) of an imported module (whose name starts with one of
    ``prefixes``, if given) that holds ``value`` under one of ``names``.

    Attributes are read from each module's namespace, never with ``getattr``: a
    module that TensorFlow loads lazily (``tf.contrib``, Keras) would be imported
    by the lookup. ``getattr`` on every module imported ``tf.contrib`` and about 800
    modules at each ``epl.init`` (0.4 s, a tenth of building a 12-layer encoder).
    A module that is not loaded yet exposes nothing EPL must patch; once loaded, its
    own module is in ``sys.modules``. TensorFlow's deprecation wrappers
    (``tf.train`` in 1.15) forward to the module they wrap, which is read too.
    """
    import sys
    targets = []
    for module in list(sys.modules.values()):
        if module is None or (prefixes and not getattr(module, "__name__", "").startswith(
                prefixes)):
            continue
        for name in names:
            if _loaded_attribute(module, name) is value:
                targets.append((module, name))
    return targets


def _loaded_attribute(module, name):
    try:
        namespace = vars(module)
    except TypeError:
        return None
    if name in namespace:
        return namespace[name]
    wrapped = namespace.get("_tfmw_wrapped_module")
    return _loaded_attribute(wrapped, name) if wrapped is not None else None


def monitored_training_session_targets():
    """Every module attribute that exposes MonitoredTrainingSession.

    ``tf.train.MonitoredTrainingSession`` and ``tf.compat.v1.train...`` are
    separate module attributes bound to the same function; all are patched.
    """
    return module_targets(_MTS, ("MonitoredTrainingSession",))


def estimator_run_config(estimator):
    """An Estimator's RunConfig (``Estimator.config`` returns a deep copy)."""
    return estimator._config  # pylint: disable=protected-access


def collective_rank_order(devices):
    """The order in which TF's collective ops rank the member devices of a group
    (an all-gather concatenates in this order)."""
    return _impl.collective_rank_order(devices)


def subclasses(cls):
    """Every class derived from ``cls``, directly or not (each once)."""
    seen, pending, result = set(), list(cls.__subclasses__()), []
    while pending:
        sub = pending.pop()
        if id(sub) in seen:
            continue
        seen.add(id(sub))
        result.append(sub)
        pending.extend(sub.__subclasses__())
    return result


def distribution_strategy():
    """The tf.distribute strategy whose scope or replica context is active, or None
    (TF's default strategy counts as none)."""
    if not tf.distribute.has_strategy():
        return None
    return tf.distribute.get_strategy()


def fetch_mapper(graph, fetches):
    """TF's own structure mapper for ``session.run`` fetches.

    Gives the unique tf.Tensor/tf.Operation elements of any nested fetch
    structure and rebuilds the user's structure from their values.
    """
    with graph.as_default():
        return _session._FetchMapper.for_fetch(fetches)  # pylint: disable=protected-access


def executing_eagerly():
    """True when TF runs eagerly (EPL needs graph mode)."""
    return _context.executing_eagerly()


def op_id(op):
    """Creation order of an op inside its graph (monotonic)."""
    return op._id  # pylint: disable=protected-access


def seed_position(graph):
    """What TF derives the op seed of the next unseeded random op of ``graph`` from,
    under a graph-level seed: the id of the last op created (TF 1.15) or the count of
    seeds drawn so far (TF 2.x). Grows as the program builds; EPL measures it."""
    return _impl.seed_position(graph)


def seeds_at(get_seed, graph, position):
    """TF's ``get_seed`` for an unseeded op whose seed position is ``position`` (what
    plain TF's program would be at), counting the draw as TF would have."""
    return _impl.seeds_at(get_seed, graph, position)


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


def colocation_root(op):
    """Name of the op that ``op`` is explicitly colocated with, or None."""
    try:
        groups = op.get_attr("_class")
    except ValueError:
        return None
    for group in groups:
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
from tensorflow.python.ops import variables as _variables  # noqa: E402
from tensorflow.python.training.saving import saveable_object as _saveable  # noqa: E402

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


def rebuild_saver(saver, var_list):
    """A Saver over ``var_list`` with ``saver``'s options; returns its SaverDef."""
    rebuilt = tf.train.Saver(var_list, sharded=saver._sharded, max_to_keep=saver._max_to_keep,
                             keep_checkpoint_every_n_hours=saver._keep_checkpoint_every_n_hours,
                             save_relative_paths=saver._save_relative_paths)
    return rebuilt.saver_def


def assign_any_shape(var_op, value):
    """Assign ``value`` to a variable whatever its static shape (a shard's width)."""
    if is_resource_variable(var_op):
        return _gen_rv.assign_variable_op(var_op.outputs[0], value)
    return _gen_state.assign(var_op.outputs[0], value, validate_shape=False).op


# ---- ops made from NodeDefs (stage-function calls, the copies' initial assignments) --
# How TF's C API takes a list input (see op_from_node); what function_def_to_graph
# needs to rebuild a function body on this TensorFlow (epl/tf_functions.py).
list_input = _impl.list_input
FUNCTION_BODY_OPTIONS = _impl.FUNCTION_BODY_OPTIONS

from tensorflow.core.framework import attr_value_pb2 as _attr_value_pb2  # noqa: E402
from tensorflow.core.framework import node_def_pb2 as _node_def_pb2  # noqa: E402


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


def constant_on(value, name, device):
    """An int32 constant ``value`` on ``device``."""
    with tf.device(device):
        return tf.constant(value, tf.int32, name=name)


def replace_control_input(op, old, new):
    """Make ``op`` wait for ``new`` instead of ``old``."""
    kept = [c for c in op.control_inputs if c is not old]
    op._remove_all_control_inputs()  # pylint: disable=protected-access
    add_control_inputs(op, kept + [new])
