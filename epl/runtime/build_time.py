"""Where memory savers hook into the two calls that make a training step.

``tf.gradients`` and ``optimizer.apply_gradients`` reach EPL through its hooks
(epl/parallel/graph_hooks.py), which call :func:`gradients` and :func:`apply`
here with a :class:`BuildContext` (the IR view, config, cluster, and the plan on
demand). Each saver that must act while the user builds the step is a module with
``applies(config)`` and ``wrap_gradients(compute, build)`` and/or
``wrap_apply(call, build)``. Savers see typed records of the IR
(:mod:`epl.ir.records`), never TF's call arguments:

* ``compute(GradientCall) -> GradientCall``: the call's ``ys``, ``xs``, ``grad_ys``
  and ``stop_gradients`` in, the same record with ``grads`` filled out;
* ``call(ApplyCall) -> op``: the optimizer, its (gradient, variable) pairs that have
  a gradient, the pairs without one (``skipped``, handed to the optimizer as they
  came), ``global_step`` and ``name``.

A saver returns its own ``compute``/``call``, wrapping the next step of the
chain. The seam alone maps records back to the call's arguments, so no saver
guesses which argument holds the pairs, and none reads the Env. Modules are
imported only when their keys are set, so an unused saver costs nothing.

Order (outermost first): AMP scales the loss around everything else; gradient
checkpointing replaces how gradients are computed; ZeRO records which of the
optimizer's ops and variables belong to one variable (the rewrite decides their
owners from the plan, :mod:`epl.runtime.zero_partition`); grouped apply splits
the optimizer's update.
"""
import collections
import importlib

from epl.ir.records import ApplyCall, GradientCall, as_list

# (module, is its key set?) in order, outermost first
_KEYS = {
    "epl.runtime.amp": lambda config: bool(config.amp.level),
    "epl.runtime.gradient_checkpoint": lambda config: bool(config.gradient_checkpoint.type),
    "epl.runtime.grouped_apply": lambda config: config.optimizer.num_apply_group > 1,
    "epl.runtime.zero": lambda config: bool(config.zero.level),
}
GRADIENT_SAVERS = ("epl.runtime.amp", "epl.runtime.gradient_checkpoint")
APPLY_SAVERS = ("epl.runtime.amp", "epl.runtime.zero", "epl.runtime.grouped_apply")


class BuildContext(collections.namedtuple("BuildContext", ["view", "config", "cluster",
                                                           "plan_of"])):
    """What a saver may know while the step is built: the IR view of the graph, the
    config, this worker's cluster, and ``plan`` (the plan of the TaskGraphs built so
    far, computed when first asked; ``plan_of(view)`` makes it)."""

    __slots__ = ()

    @property
    def plan(self):
        return self.plan_of(self.view)


def _active(names, config, attribute):
    modules = []
    for name in names:
        if not _KEYS[name](config):
            continue
        module = importlib.import_module(name)
        if module.applies(config) and hasattr(module, attribute):
            modules.append(module)
    return modules


def _needed(config):
    """Any saver key set? (keeps the common case from importing anything)."""
    return any(is_set(config) for is_set in _KEYS.values())


def gradient_record(bound):
    """The GradientCall of ``tf.gradients``' bound arguments (``grads`` still None)."""
    args = bound.arguments
    return GradientCall(as_list(args["ys"]), as_list(args["xs"]), as_list(args.get("grad_ys")),
                        None, as_list(args.get("stop_gradients")))


def gradients(build, original, bound):
    """``tf.gradients`` for ``bound`` with every active saver's wrapping; returns the
    gradients (a list aligned with ``xs``)."""
    def compute(record):
        arguments = _rebound(bound)
        arguments.arguments.update(ys=record.ys, xs=record.xs, grad_ys=record.grad_ys or None,
                                   stop_gradients=record.stop_gradients or None)
        return record._replace(grads=list(original(*arguments.args, **arguments.kwargs)))
    if _needed(build.config):
        for module in reversed(_active(GRADIENT_SAVERS, build.config, "wrap_gradients")):
            compute = module.wrap_gradients(compute, build)
    return compute(gradient_record(bound)).grads


def apply_record(bound, pairs_arg):
    """The ApplyCall of ``apply_gradients``' bound arguments; ``pairs_arg`` names the
    argument that holds the pairs (the hooks read it from the signature)."""
    args = bound.arguments
    pairs = list(args[pairs_arg])
    return ApplyCall(args[list(args)[0]], [p for p in pairs if p[0] is not None],
                     args.get("global_step"), args.get("name"),
                     [p for p in pairs if p[0] is None])


def apply(build, original, bound, pairs_arg):
    """``apply_gradients`` for ``bound`` with every active saver's wrapping."""
    def call(record):
        arguments = _apply_arguments(bound, pairs_arg, record)
        return original(*arguments.args, **arguments.kwargs)
    if _needed(build.config):
        for module in reversed(_active(APPLY_SAVERS, build.config, "wrap_apply")):
            call = module.wrap_apply(call, build)
    return call(apply_record(bound, pairs_arg))


def _rebound(bound):
    arguments = bound.signature.bind_partial()
    arguments.arguments.update(bound.arguments)
    return arguments


def _apply_arguments(bound, pairs_arg, record):
    """``bound`` with the record's pairs, global step and name."""
    optimizer = bound.arguments[list(bound.arguments)[0]]
    if record.optimizer is not optimizer:
        raise RuntimeError("EPL internal error: a saver changed the optimizer of an "
                           "apply_gradients call")
    arguments = _rebound(bound)
    arguments.arguments[pairs_arg] = tuple(record.grads_and_vars) + tuple(record.skipped)
    parameters = bound.signature.parameters
    for name in ("global_step", "name"):
        if name in parameters:
            arguments.arguments[name] = getattr(record, name)
    return arguments
