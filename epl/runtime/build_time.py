"""Where memory savers hook into the two calls that make a training step.

``tf.gradients`` and ``optimizer.apply_gradients`` reach EPL through its hooks
(epl/parallel/graph_hooks.py), which call :func:`gradients` and :func:`apply`
here. Each saver that must act while the user builds the step is a module with
``applies(config)`` and ``wrap_gradients(compute, view, config)`` and/or
``wrap_apply(call, view, config, cluster)``: it receives the next step of the chain
(``compute(bound)`` / ``call(bound)``, ``bound`` being the call's
``inspect.BoundArguments``) and returns its own. Modules are imported only when
their keys are set, so an unused saver costs nothing.

Order (outermost first): AMP scales the loss around everything else; gradient
checkpointing replaces how gradients are computed; ZeRO keeps only this worker's
variables; grouped apply splits the optimizer's update of those.
"""
import importlib

# (module, is its key set?) in order, outermost first
_KEYS = {
    "epl.runtime.amp": lambda config: bool(config.amp.level),
    "epl.runtime.gradient_checkpoint": lambda config: bool(config.gradient_checkpoint.type),
    "epl.runtime.grouped_apply": lambda config: config.optimizer.num_apply_group > 1,
    "epl.runtime.zero": lambda config: bool(config.zero.level),
}
GRADIENT_SAVERS = ("epl.runtime.amp", "epl.runtime.gradient_checkpoint")
APPLY_SAVERS = ("epl.runtime.amp", "epl.runtime.zero", "epl.runtime.grouped_apply")


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


def gradients(view, config, original, bound):
    """``tf.gradients`` for ``bound`` with every active saver's wrapping."""
    def compute(arguments):
        return original(*arguments.args, **arguments.kwargs)
    if _needed(config):
        for module in reversed(_active(GRADIENT_SAVERS, config, "wrap_gradients")):
            compute = module.wrap_gradients(compute, view, config)
    return compute(bound)


def apply(view, config, cluster, original, bound):
    """``apply_gradients`` for ``bound`` with every active saver's wrapping; ``cluster``
    is the worker's, for savers that divide work among workers (ZeRO)."""
    def call(arguments):
        return original(*arguments.args, **arguments.kwargs)
    if _needed(config):
        for module in reversed(_active(APPLY_SAVERS, config, "wrap_apply")):
            call = module.wrap_apply(call, view, config, cluster)
    return call(bound)
