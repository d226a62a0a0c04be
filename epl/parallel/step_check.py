"""Never train serially by accident: find the training step or say why not.

EPL parallelizes a graph at its training step, which it sees as an optimizer's
``apply_gradients`` call. Three kinds of graph have none and are handled here:

* graphs EPL must leave alone: Estimator evaluation and prediction graphs
  (:mod:`epl.parallel.estimator` records the mode), and graphs whose optimizer
  runs under a ``tf.distribute`` strategy (the strategy distributes them; on one
  worker EPL stands aside with a warning, on several it refuses, because each
  worker would train its own model);
* graphs with strategy scopes that compute gradients or update trainable
  variables without an optimizer EPL can see (hand-written updates after
  ``tf.GradientTape``, an optimizer not derived from tf.train or Keras): EPL
  raises instead of letting every worker train on its own;
* everything else (inference graphs, unannotated graphs without a step) runs
  unchanged.
"""
import logging

from epl import tf_adapter
from epl.ir.features import FeatureSlot
from epl.ir.phase import Phase
from epl.parallel import estimator

LOG = logging.getLogger("epl")

# per view: the tf.distribute strategy class that owns its step; the last missing-step
# check as (graph version, error message or None)
_FOREIGN = FeatureSlot("foreign_strategy", None)
_CHECKED = FeatureSlot("missing_step_check", None)
# Ops whose value is a plain load, not a computed update (Keras set_weights feeds a
# placeholder; Checkpoint.restore reads a file; resets assign constants).
_LOADED_VALUE_TYPES = frozenset(["Placeholder", "PlaceholderV2", "PlaceholderWithDefault",
                                 "Const", "RestoreV2", "Restore", "RestoreSlice",
                                 "ReadVariableOp", "VariableV2", "VarHandleOp", "Fill",
                                 "ZerosLike", "OnesLike"])


def mark_foreign_strategy(view, strategy, cluster):
    """An optimizer ran under ``strategy`` (tf.distribute) in ``view``'s graph.

    On one worker EPL stands aside: the graph is not parallelized and a warning
    says so once. On several workers it raises: the strategy only sees this
    worker's devices, so the workers would train separate models.
    """
    name = type(strategy).__name__
    if cluster.worker_num > 1:
        raise RuntimeError(
            "EPL cannot run a %s training step on %d workers: a tf.distribute strategy "
            "(for example RunConfig(train_distribute=...)) only sees this worker's devices, "
            "so every worker would train its own model. Remove the strategy and let EPL "
            "parallelize the step (epl.replicate gives data parallelism across all "
            "workers' devices), or run without epl.init." % (name, cluster.worker_num))
    if _FOREIGN.get(view) is None:
        LOG.warning(
            "EPL: this graph's optimizer runs under tf.distribute's %s; EPL stands aside "
            "and does NOT parallelize this graph (the strategy distributes it). Remove the "
            "strategy (for example RunConfig(train_distribute=...)) to let EPL parallelize "
            "it instead.", name)
    _FOREIGN.set(view, name)


def foreign_strategy(view):
    """Name of the tf.distribute strategy that owns ``view``'s step, or None."""
    return _FOREIGN.get(view)


def left_alone(view):
    """True for graphs EPL never parallelizes: Estimator eval/predict graphs and
    graphs distributed by a tf.distribute strategy."""
    return foreign_strategy(view) is not None or not estimator.is_training_graph(view.tf_graph)


def check_missing_step(view):
    """Raise if ``view`` looks like training that EPL cannot see (see module doc).

    Only graphs with user strategy scopes are checked (an unannotated graph
    without a step is an ordinary TF graph). The answer is cached per graph
    version, so calling this on every ``session.run`` costs nothing.
    """
    if view.has_training_step or left_alone(view):
        return
    if not any(not tg.implicit for tg in view.taskgraphs):
        return
    version = (len(view.op_info), len(view.gradient_calls))
    cached = _CHECKED.get(view)
    if cached is None or cached[0] != version:
        cached = (version, _missing_step_message(view))
        _CHECKED.set(view, cached)
    if cached[1] is not None:
        raise RuntimeError(cached[1])


def _missing_step_message(view):
    found = []
    if view.gradient_calls:
        losses = sorted(set(getattr(y, "name", str(y)) for call in view.gradient_calls
                            for y in call.ys))
        more = ", ..." if len(losses) > 3 else ""
        found.append("%d tf.gradients call(s) (of %s%s)" % (
            len(view.gradient_calls), ", ".join(losses[:3]), more))
    updates = trainable_updates(view)
    if updates:
        found.append("%d op(s) updating trainable variables (for example %s)" % (
            len(updates), ", ".join("%r updates %r" % (op, var) for op, var in updates[:3])))
    if not found:
        return None
    names = ", ".join(tg.name for tg in view.taskgraphs)
    return (
        "EPL cannot find this graph's training step. The graph has strategy scopes "
        "(TaskGraphs: %s) and %s, but no optimizer apply_gradients call was recorded, so "
        "EPL cannot parallelize it, and running it would train every worker serially. "
        "EPL sees the step where an optimizer applies gradients: use a "
        "tf.compat.v1.train.Optimizer or a tf.keras optimizer (or a subclass of either; "
        "overriding apply_gradients is fine) and call its minimize or apply_gradients, "
        "instead of assigning new values to the variables yourself. To run this graph "
        "as plain TensorFlow, build and run it inside `with epl.paused():`."
        % (names, " and ".join(found)))


def trainable_updates(view):
    """[(op name, variable name)] of step ops that write a computed value into a
    trainable variable (not initializers, restores or loads of fed values)."""
    tf_graph = view.tf_graph
    tf = tf_adapter.tf
    trainable = set(v.op.name for v in tf_graph.get_collection(tf.GraphKeys.TRAINABLE_VARIABLES))
    if not trainable:
        return []
    initializers = set()
    for key in (tf.GraphKeys.GLOBAL_VARIABLES, tf.GraphKeys.LOCAL_VARIABLES):
        for var in tf_graph.get_collection(key):
            initializers.add(var.initializer.name)
    result = []
    for op in tf_graph.get_operations():
        info = view.info(op)
        if info is None or info.phase not in Phase.STEP or op.name in initializers:
            continue
        written = [v.name for v in tf_adapter.written_variables(op) if v.name in trainable]
        if written and _computes_value(op):
            result.append((op.name, written[0]))
    return result


def _computes_value(op):
    """True unless every non-variable input of ``op`` is a plain load."""
    values = [t for t in op.inputs if not tf_adapter.is_state_tensor(t)]
    return any(_producer(t).type not in _LOADED_VALUE_TYPES for t in values)


def _producer(tensor):
    op = tensor.op
    for _ in range(16):
        if op.type not in ("Identity", "RefIdentity") or not op.inputs:
            break
        op = op.inputs[0].op
    return op
