"""The one place EPL touches private TensorFlow modules.

Everything EPL needs from ``tensorflow.python...`` is imported or reached through this
module (functions made from a graph's ops, for pipeline stages, in its companion
``epl/tf_functions.py``), so that supporting another TensorFlow version changes the
adapter's files and nothing else. Public TF API is used through ``tf`` (the
``tf.compat.v1`` namespace, which exists in 1.15 too).

The adapter is split by concern, behind this face, which every EPL module imports:

* here: the targets EPL's hooks patch, and what the hooks and the session layer ask
  of TensorFlow (fetch structures, seeds, estimator internals);
* :mod:`epl.tf_adapter_graph`: editing a built graph (inputs, control edges, imports,
  ops from NodeDefs);
* :mod:`epl.tf_adapter_state`: variables, checkpoints and optimizer internals.

Two TensorFlow lines are supported: 1.15 and 2.x through ``tf.compat.v1``
(docs/tf2.md). What differs between them lives in ``epl/tf_adapter_tf1.py`` and
``epl/tf_adapter_tf2.py``; :mod:`epl.tf_adapter_version` chooses one once, at import,
for every concern module. Nothing else in EPL asks which TensorFlow it runs on.
"""
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

from epl.tf_adapter_version import impl as _impl
from epl.tf_adapter_graph import (  # noqa: F401 (the adapter's face)
    FUNCTION_BODY_OPTIONS, add_control_inputs, colocation_root, constant_on,
    control_flow_context, control_outputs, drop_outside_colocation, function_names,
    get_default_graph, global_step_tensor, graph_is_nested, import_nodes, is_function_graph,
    is_ref_dtype, list_input, merge, NodeOps, op_from_node, op_id, remove_control_inputs,
    replace_control_input, running_sum, set_attr, set_device, switch, undecorated_op_creation,
    unfinalized, update_input, with_unknown_rows)
from epl.tf_adapter_state import (  # noqa: F401 (the adapter's face)
    VARIABLE_OP_TYPES, SaveableObject, SaveSpec, all_saveable_objects, assign_any_shape,
    assign_variable, assign_variable_on, checkpoint_problem, create_slots, finishing_with,
    is_resource_variable, is_state_tensor, is_variable, is_variable_initialized, is_variable_op,
    read_variable, rebuild_saver, remote_variable, restore_op_name, saver_var_list,
    saver_with_deferred_restore, touches_state, variable_dtype,
    serialize_iterator, variable_shape, wrapped_optimizer_candidates, writes_variable,
    written_variables)
from tensorflow.python.client import session as _session
from tensorflow.python.eager import context as _context
from tensorflow.python.framework import ops as _ops
from tensorflow.python.framework import random_seed as _random_seed
from tensorflow.python.ops import collective_ops
from tensorflow.python.ops import gradients_util as _gradients_util
from tensorflow.python.training import monitored_session as _monitored_session
from tensorflow.python.training import optimizer as _optimizer
from tensorflow.python.training import saver as _saver
from tensorflow.python.training import server_lib as _server_lib

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
    return targets_of_values((value,), names, prefixes)[0]


def targets_of_values(values, names, prefixes=None):
    """:func:`module_targets` of each of ``values`` (a list per value, in order), from
    one scan of the imported modules: a scan reads every module's namespace, and
    ``epl.init`` looks for several functions among the same attribute names."""
    import sys
    index = dict((id(value), position) for position, value in enumerate(values))
    targets = [[] for _ in values]
    for module in list(sys.modules.values()):
        if module is None or (prefixes and not getattr(module, "__name__", "").startswith(
                prefixes)):
            continue
        for name in names:
            found = _loaded_attribute(module, name)
            position = index.get(id(found))
            if position is not None and found is values[position]:
                targets[position].append((module, name))
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


def seed_position(graph):
    """What TF derives the op seed of the next unseeded random op of ``graph`` from,
    under a graph-level seed: the id of the last op created (TF 1.15) or the count of
    seeds drawn so far (TF 2.x). Grows as the program builds; EPL measures it."""
    return _impl.seed_position(graph)


def seeds_at(get_seed, graph, position):
    """TF's ``get_seed`` for an unseeded op whose seed position is ``position`` (what
    plain TF's program would be at), counting the draw as TF would have."""
    return _impl.seeds_at(get_seed, graph, position)
