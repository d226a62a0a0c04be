"""Hooks that record every op's TaskGraph and phase while the model is built.

Op creation registers the op with the active strategy segment; ``tf.gradients``
runs in the BACKWARD phase, and the gradient ops of each forward op join that
op's TaskGraph (through tf.gradients' own per-op context, without forcing
``colocate_gradients_with_ops``, which makes graph building ~20% slower);
``apply_gradients`` runs in the APPLY phase and records the (gradient, variable)
pairs EPL aggregates; savers and MonitoredSession scaffolds run in the SESSION
phase (never cloned).
"""
import contextlib
import functools
import inspect

from epl import tf_adapter
from epl.ir.graph import Graph
from epl.ir.phase import Phase
from epl.ir.records import ApplyCall, GradientCall, as_list
from epl.parallel.hooks import Patch
from epl.strategies.context import get_context


def _view(tf_graph=None):
    """EPL view of a graph, or None for function-body graphs."""
    tf_graph = tf_graph if tf_graph is not None else tf_adapter.get_default_graph()
    if tf_adapter.is_function_graph(tf_graph):
        return None
    return Graph.get(tf_graph)


def _wrap_add_op(original):
    @functools.wraps(original)
    def _add_op(self, op):
        original(self, op)
        view = _view(self)
        if view is not None:
            view.register_op(op, get_context().current)
    return _add_op


def _wrap_gradients(original, provider):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def gradients_helper(*args, **kwargs):
        view = _view()
        if view is None:
            return original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        with view.phase_scope(Phase.BACKWARD):
            grads = original(*bound.args, **bound.kwargs)
            if provider().config.communication.sparse_as_dense:
                grads = [_densify(g) for g in grads]
        view.gradient_calls.append(GradientCall(
            as_list(bound.arguments["ys"]), as_list(bound.arguments["xs"]),
            as_list(bound.arguments.get("grad_ys")), list(grads)))
        return grads
    return gradients_helper


def _wrap_gradient_of_op(original):
    @functools.wraps(original)
    @contextlib.contextmanager
    def gradient_of(op, *args, **kwargs):
        view = _view(op.graph)
        if view is None or view.phase != Phase.BACKWARD:
            with original(op, *args, **kwargs):
                yield
            return
        with view.gradient_of(op), original(op, *args, **kwargs):
            yield
    return gradient_of


def _densify(grad):
    """``communication.sparse_as_dense``: IndexedSlices become dense before anything else."""
    if isinstance(grad, tf_adapter.tf.IndexedSlices):
        return tf_adapter.tf.convert_to_tensor(grad)
    return grad


def _wrap_apply_gradients(original):
    @functools.wraps(original)
    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        view = _view()
        if view is None or view.phase == Phase.APPLY:
            return original(self, grads_and_vars, global_step=global_step, name=name)
        grads_and_vars = tuple(grads_and_vars)
        view.apply_calls.append(ApplyCall(
            self, [(g, v) for g, v in grads_and_vars if g is not None], global_step, name))
        with view.phase_scope(Phase.APPLY):
            return original(self, grads_and_vars, global_step=global_step, name=name)
    return apply_gradients


def _wrap_session_phase(original):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        view = _view()
        if view is None or view.phase == Phase.SESSION:
            return original(*args, **kwargs)
        with view.phase_scope(Phase.SESSION):
            return original(*args, **kwargs)
    return wrapper


def patches(provider):
    """Graph-construction patches; ``provider`` returns the current epl.Env."""
    return [
        Patch("graph", tf_adapter.OP_CREATION, _wrap_add_op),
        Patch("graph", tf_adapter.GRADIENTS, lambda original: _wrap_gradients(original, provider)),
        Patch("graph", tf_adapter.GRADIENT_OF_OP, _wrap_gradient_of_op),
        Patch("graph", tf_adapter.APPLY_GRADIENTS, _wrap_apply_gradients),
        Patch("graph", tf_adapter.SAVER_INIT, _wrap_session_phase),
        Patch("graph", tf_adapter.SCAFFOLD_FINALIZE, _wrap_session_phase),
    ]
