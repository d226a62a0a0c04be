"""Optimizers that wrap other optimizers: what EPL reads from them, and which it refuses.

Training code often hands EPL an optimizer that wraps the one doing the update:
``tf.contrib.opt.MovingAverageOptimizer``, the contrib and experimental
``LossScaleOptimizer``\\ s, tensor2tensor-style conditional or multi-optimizer
wrappers. Several never call ``tf.train.Optimizer.__init__`` and delegate every
call to an inner optimizer, so the base class's state does not exist and its
methods (``get_slot_names``, ``get_slot``) raise ``AttributeError``. EPL reads
optimizer state only through :func:`slot_variables`, which walks the chain of
wrapped optimizers and asks each one that can answer.

Two kinds of wrapper are refused (:func:`check_supported`) because they are a
data-parallel system of their own, and two at once would average gradients
twice or wait for workers that do not exist:

* Horovod's ``DistributedOptimizer`` (any optimizer class from a ``horovod``
  module) all-reduces gradients over the processes ``horovodrun`` started;
* ``tf.train.SyncReplicasOptimizer`` and tf.contrib's ``ElasticAverageOptimizer``,
  ``ModelAverageOptimizer`` and ``AGNOptimizer`` aggregate or average over
  parameter-server replicas.

TensorFlow's loss-scale optimizers are refused together with ``amp.level``: EPL's
AMP scales the loss too, and the two scales multiply.

Example::

    opt = tf.contrib.opt.MovingAverageOptimizer(tf.train.AdamOptimizer(1e-3))
    [o.__class__.__name__ for o in chain(opt)]   # ['MovingAverageOptimizer', 'AdamOptimizer']
"""

from epl import tf_adapter

_MAX_DEPTH = 8

# (module prefix, class name) -> what the class does, for the refusal message
_PARAMETER_SERVER = {
    "SyncReplicasOptimizer": "aggregates gradients of parameter-server replicas in "
                             "conditional accumulators and token queues",
    "ElasticAverageOptimizer": "averages local models through parameter servers",
    "ModelAverageOptimizer": "averages local models through parameter servers",
    "AGNOptimizer": "accumulates local gradients on parameter servers",
}


# loss-scale optimizers: refused together with EPL's AMP (amp.level)
_LOSS_SCALING = frozenset(["LossScaleOptimizer", "MixedPrecisionLossScaleOptimizer"])


class UnsupportedOptimizerError(ValueError):
    """An optimizer that brings a data-parallel system of its own."""


def inner(optimizer):
    """The optimizer ``optimizer`` delegates to, or None."""
    for candidate in tf_adapter.wrapped_optimizer_candidates(optimizer):
        if _is_optimizer(candidate):
            return candidate
    return None


def chain(optimizer):
    """``optimizer`` followed by the optimizers it wraps, outermost first."""
    result = []
    while optimizer is not None and len(result) < _MAX_DEPTH and \
            all(optimizer is not seen for seen in result):
        result.append(optimizer)
        optimizer = inner(optimizer)
    return result


def _is_optimizer(value):
    return callable(getattr(value, "apply_gradients", None))


def slot_names(optimizer):
    """Slot names ``optimizer`` can report, [] when it cannot (a wrapper that skipped
    ``Optimizer.__init__`` has no slot table)."""
    try:
        return list(optimizer.get_slot_names())
    except (AttributeError, TypeError, NotImplementedError):
        return []


def slot_variables(optimizer, var):
    """The slot variables of ``var`` held by ``optimizer`` or any optimizer it wraps."""
    found = []
    for member in chain(optimizer):
        for name in slot_names(member):
            try:
                slot = member.get_slot(var, name)
            except (AttributeError, TypeError, KeyError):
                slot = None
            if slot is not None and all(slot is not f for f in found):
                found.append(slot)
    return found


def shard_followers(variables, sharded):
    """{variable name: name of the sharded variable it follows} for ``variables`` that
    hold one value per shard of a variable in ``sharded`` (names): colocated with it
    and built from a shard-shaped value (a dimension only known per shard), such as
    the slots of optimizers that cannot report them and moving averages
    (``tf.train.ExponentialMovingAverage``, ``MovingAverageOptimizer``). Scalars
    colocated with a variable (Adam's beta powers) are not followers."""
    found = {}
    for var in variables:
        if var.op.name in sharded:
            continue
        value = getattr(var, "initial_value", None)
        shape = value.shape if value is not None else var.shape
        if shape.ndims is None or shape.is_fully_defined():
            continue
        for group in var.op.colocation_groups():
            leader = group.decode("utf-8", "replace").partition("loc:@")[2]
            if leader in sharded:
                found[var.op.name] = leader
                break
    return found


def refusal(optimizer, amp_level=""):
    """Why EPL cannot train with ``optimizer`` (a message), or None when it can.
    ``amp_level``: the config's ``amp.level`` (EPL's AMP scales the loss itself)."""
    for member in chain(optimizer):
        for cls in type(member).__mro__:
            module = getattr(cls, "__module__", "") or ""
            if module.split(".")[0] == "horovod":
                return _horovod_message(member, optimizer)
            if module.startswith("tensorflow") and cls.__name__ in _PARAMETER_SERVER:
                return _parameter_server_message(member, cls.__name__, optimizer)
            if amp_level and module.startswith("tensorflow") and \
                    cls.__name__ in _LOSS_SCALING:
                return _loss_scaling_message(member, cls.__name__, optimizer, amp_level)
    return None


def check_supported(optimizer, amp_level=""):
    """Raise :class:`UnsupportedOptimizerError` for an optimizer EPL refuses."""
    message = refusal(optimizer, amp_level)
    if message is not None:
        raise UnsupportedOptimizerError(message)


def _loss_scaling_message(member, name, optimizer, amp_level):
    return (
        "EPL cannot train with tf %s%s while amp.level=%r: EPL's AMP scales the loss and "
        "skips non-finite steps itself, and two loss scales multiply (128 x 32768 overflows "
        "float16 on most steps). Use one of them: pass the optimizer it wraps (%s) and keep "
        "amp.level (amp.loss_scale sets a fixed scale), or set amp.level to \"\" and keep "
        "the loss-scale optimizer." % (name, _outer_text(member, optimizer), amp_level,
                                       _wrapped_name(member)))


def _outer_text(member, optimizer):
    if member is optimizer:
        return ""
    return " (wrapped in %s)" % type(optimizer).__name__


def _horovod_message(member, optimizer):
    return (
        "EPL cannot train with Horovod's DistributedOptimizer (%s)%s: it all-reduces the "
        "gradients over the processes horovodrun started, and EPL already averages them "
        "over its replicas, "
        "so two data-parallel systems would run at once (gradients averaged twice, "
        "collectives waiting for processes that do not exist). Pass the optimizer it "
        "wraps (%s) instead of hvd.DistributedOptimizer(...), drop hvd.init / "
        "BroadcastGlobalVariablesHook / hvd.size() learning-rate scaling (EPL broadcasts "
        "the initial variables itself; scale the learning rate by the number of replicas "
        "yourself if you did), and start the job with epl-launch instead of horovodrun."
        % (_qualified(type(member)), _outer_text(member, optimizer), _wrapped_name(member)))


def _qualified(cls):
    return "%s.%s" % (cls.__module__, cls.__name__)


def _parameter_server_message(member, name, optimizer):
    return (
        "EPL cannot train with tf %s%s: it %s, a data-parallel system of its own that "
        "needs parameter-server tasks, and EPL already runs the step synchronously on "
        "every replica with all-reduced gradients. Use the optimizer it wraps (%s) "
        "directly: epl.replicate gives synchronous data parallelism over every device, "
        "and pipeline.num_micro_batch accumulates the gradients of several batches "
        "before one update."
        % (name, _outer_text(member, optimizer), _PARAMETER_SERVER[name],
           _wrapped_name(member)))


def _wrapped_name(member):
    wrapped = inner(member)
    return type(wrapped).__name__ if wrapped is not None else "the inner optimizer"
