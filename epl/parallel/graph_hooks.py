"""Hooks that record every op's TaskGraph and phase while the model is built.

Op creation registers the op with the active strategy segment; ``tf.gradients``
runs in the BACKWARD phase, and the gradient ops of each forward op join that
op's TaskGraph (through tf.gradients' own per-op context, without forcing
``colocate_gradients_with_ops``, which makes graph building ~20% slower);
every optimizer's ``apply_gradients`` (tf.train and Keras optimizers and every
subclass that overrides it, defined before or after ``epl.init``) runs in the
APPLY phase and records the (gradient, variable) pairs EPL aggregates; savers
and MonitoredSession scaffolds run in the SESSION phase (never cloned).
"""
import contextlib
import functools
import inspect
import weakref

from epl import tf_adapter
from epl.ir.graph import Graph
from epl.ir.phase import Phase
from epl.parallel import step_check
from epl.parallel.plan import TaskGraphSpec, make_plan
from epl.protocols.hooks import Patch
from epl.runtime import build_time, optimizers
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
        op_id = original(self, op)  # None in TF 1.15; the op's id in TF 2.x
        view = _view(self)
        if view is not None:
            view.register_op(op, get_context().current)
        return op_id
    return _add_op


def _wrap_gradients(original, provider):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def gradients_helper(*args, **kwargs):
        view = _view()
        if view is None:
            return original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        build = build_context(view, provider())
        with view.phase_scope(Phase.BACKWARD):
            grads = build_time.gradients(build, original, bound)
            if build.config.communication.sparse_as_dense:
                grads = [_densify(g) for g in grads]
        view.gradient_calls.append(build_time.gradient_record(bound)._replace(grads=list(grads)))
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


def _wrap_apply_gradients(original, provider):
    """Record one optimizer's ``apply_gradients(grads_and_vars, ...)`` and run it in
    the APPLY phase. Works for any signature whose first argument after ``self`` is
    the (gradient, variable) pairs (tf.train and Keras optimizers, user subclasses);
    nested calls (a subclass calling ``super()``, a wrapper optimizer calling the one
    it wraps) are recorded once, by the outermost call; calls EPL makes while building
    its own ops (ZeRO learning the other workers' slots) are not recorded. An optimizer
    that brings its own data parallelism (:func:`epl.runtime.optimizers.refusal`) is
    refused there."""
    signature = inspect.signature(original)
    params = list(signature.parameters.values())
    pairs_arg = params[1].name if len(params) > 1 and params[1].kind in (
        inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) else None

    @functools.wraps(original)
    def apply_gradients(self, *args, **kwargs):
        _refuse_function_step(self)
        view = _view()
        if view is None or view.phase in (Phase.APPLY, Phase.EPL):
            return original(self, *args, **kwargs)
        # Horovod's or parameter-server data parallelism; a second loss scale with AMP
        optimizers.check_supported(self, provider().config.amp.level)
        if pairs_arg is None:
            return original(self, *args, **kwargs)
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:  # TF's own error message, unchanged
            return original(self, *args, **kwargs)
        pairs = tuple(bound.arguments[pairs_arg])
        bound.arguments[pairs_arg] = pairs
        strategy = tf_adapter.distribution_strategy()
        if strategy is not None:
            step_check.mark_foreign_strategy(view, strategy, provider().cluster)
            return original(*bound.args, **bound.kwargs)
        view.apply_calls.append(build_time.apply_record(bound, pairs_arg))
        with view.phase_scope(Phase.APPLY):
            return build_time.apply(build_context(view, provider()), original, bound, pairs_arg)
    return apply_gradients


def build_context(view, env):
    """What build-time savers receive: the view, the Env's config and cluster, and the
    plan of the TaskGraphs built so far (computed only if a saver asks)."""
    def plan_of(view):
        specs = [TaskGraphSpec(tg.name, tg.kind, tg.device_count)
                 for tg in view.live_taskgraphs()]
        return make_plan(env.config, env.cluster, specs)
    return build_time.BuildContext(view, env.config, env.cluster, plan_of)


def _refuse_function_step(optimizer):
    """A training step traced inside a ``tf.function`` is invisible to EPL (its ops live
    in the function's body, run by one call op): refuse it, rather than train serially."""
    if tf_adapter.is_function_graph(tf_adapter.get_default_graph()):
        raise RuntimeError(
            "EPL cannot parallelize a training step built inside a tf.function: %s."
            "apply_gradients was called while tracing one. EPL rewrites TF1-style graph "
            "programs: build the step in the graph (remove @tf.function around it, call "
            "optimizer.minimize / apply_gradients there) and run the train op in a "
            "tf.compat.v1.Session or MonitoredTrainingSession (docs/tf2.md)."
            % type(optimizer).__name__)


def _refuse_keras_training(original):
    """Keras ``Model.fit`` (and ``fit_generator``, ``train_on_batch``) runs its own
    training loop and session, which EPL does not rewrite: refuse it with what to do."""
    @functools.wraps(original)
    def keras_training(self, *args, **kwargs):
        raise RuntimeError(
            "EPL does not parallelize Keras %s.%s(): EPL rewrites TF1-style graph programs. "
            "Keep the Keras model, build the loss and optimizer.minimize(loss) in the graph "
            "and run the train op in a tf.compat.v1.Session or MonitoredTrainingSession "
            "(or an Estimator); see docs/tf2.md." % (type(self).__name__, original.__name__))
    return keras_training


_OFF, _ON = "off", "on"


class MethodCoverage(object):
    """Wrap one method on base classes and on every subclass that overrides it.

    BERT's ``AdamWeightDecayOptimizer`` overrides ``apply_gradients`` without
    calling the base class; wrapping ``tf.train.Optimizer.apply_gradients`` alone
    never sees it. This wraps the method of each base and of each overriding
    subclass that exists when it is switched on, and of subclasses defined later
    (an ``__init_subclass__`` hook on each base). Switching off restores every
    class exactly.

    It is a patch target for the :class:`~epl.protocols.hooks.HookRegistry`: the
    registry sets ``state`` to ``"on"`` when it installs and back to ``"off"``
    when it uninstalls (``epl.reset``, ``epl.paused``)::

        >>> coverage = MethodCoverage(tf_adapter.OPTIMIZER_BASES, "apply_gradients", wrap)
        >>> patch = coverage.patch("graph")
    """

    def __init__(self, bases, attr, make_wrapper):
        self._bases = tuple(bases)
        self._attr = attr
        self._make_wrapper = make_wrapper
        self._wrapped = []          # (weakref to class, original function)
        self._subclass_hooks = []   # (base, its own __init_subclass__ entry or None)

    @property
    def state(self):
        return _ON if self._subclass_hooks or self._wrapped else _OFF

    @state.setter
    def state(self, value):
        if value == _ON and self.state == _OFF:
            self._switch_on()
        elif value != _ON:
            self._switch_off()

    def patch(self, concern):
        """The registry record that switches this coverage on and off."""
        return Patch(concern, (self, "state"), lambda original: _ON)

    def _switch_on(self):
        for base in self._bases:
            self.wrap_class(base)
            for sub in tf_adapter.subclasses(base):
                self.wrap_class(sub)
        for base in self._bases:
            self._subclass_hooks.append((base, base.__dict__.get("__init_subclass__")))
            base.__init_subclass__ = self._subclass_hook(base)

    def _switch_off(self):
        for base, previous in reversed(self._subclass_hooks):
            if previous is None:
                del base.__init_subclass__
            else:
                base.__init_subclass__ = previous
        self._subclass_hooks = []
        for ref, original in reversed(self._wrapped):
            cls = ref()
            if cls is not None and _original_of(cls.__dict__.get(self._attr)) is original:
                setattr(cls, self._attr, original)
        self._wrapped = []

    def _subclass_hook(self, base):
        coverage = self
        previous = base.__dict__.get("__init_subclass__")

        def __init_subclass__(cls, **kwargs):  # noqa: N807 (Python's name)
            if previous is not None:
                previous.__get__(None, cls)(**kwargs)
            else:
                super(base, cls).__init_subclass__(**kwargs)
            coverage.wrap_class(cls)
        return classmethod(__init_subclass__)

    def wrap_class(self, cls):
        """Wrap ``cls``'s own definition of the method, if it has one (once)."""
        function = cls.__dict__.get(self._attr)
        if not inspect.isfunction(function) or _original_of(function) is not None:
            return
        wrapper = self._make_wrapper(function)
        wrapper.__epl_original__ = function
        setattr(cls, self._attr, wrapper)
        self._wrapped.append((weakref.ref(cls), function))


def _original_of(function):
    return getattr(function, "__epl_original__", None)


def _wrap_session_phase(original):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        view = _view()
        if view is None or view.phase == Phase.SESSION:
            return original(*args, **kwargs)
        with view.phase_scope(Phase.SESSION):
            return original(*args, **kwargs)
    return wrapper


def _wrap_saver_init(original):
    """Savers are built in the SESSION phase and remembered, so that a split model's
    checkpoints can cover every shard (epl.ops.checkpoint)."""
    in_phase = _wrap_session_phase(original)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        graph = tf_adapter.get_default_graph()
        in_phase(self, *args, **kwargs)
        if _view(graph) is not None:
            from epl.ops import checkpoint
            checkpoint.remember(self, graph)
    return __init__


def patches(provider):
    """Graph-construction patches; ``provider`` returns the current epl.Env."""
    return [
        Patch("graph", tf_adapter.OP_CREATION, _wrap_add_op),
        Patch("graph", tf_adapter.GRADIENTS, lambda original: _wrap_gradients(original, provider)),
        Patch("graph", tf_adapter.GRADIENT_OF_OP, _wrap_gradient_of_op),
        MethodCoverage(tf_adapter.OPTIMIZER_BASES, "apply_gradients",
                       lambda original: _wrap_apply_gradients(original, provider)).patch("graph"),
        Patch("graph", tf_adapter.SAVER_INIT, _wrap_saver_init),
    ] + [
        MethodCoverage(tf_adapter.KERAS_MODEL_BASES, method, _refuse_keras_training).patch("graph")
        for method in ("fit", "fit_generator", "train_on_batch")
    ] + [
        Patch("graph", tf_adapter.SCAFFOLD_FINALIZE, _wrap_session_phase),
    ]
