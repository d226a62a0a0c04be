"""Grouped apply (``optimizer.num_apply_group`` = N > 1): update the weights in N
groups, one after the other, so that an optimizer's temporary buffers exist for
one group at a time.

An optimizer that computes its update with several ops (Adam on sparse
gradients, LAMB-like or user optimizers) allocates temporaries of each
variable's size for every variable at once when all updates may run together.
Here the (gradient, variable) pairs, in the order their gradients arrive, are
split into N runs of about equal bytes (:func:`contiguous_groups`,
deterministic), and each group is applied by
the optimizer's own ``apply_gradients`` inside ``tf.control_dependencies`` on
the previous group's completion, so group k+1 starts when group k is done and
its temporaries are freed.

State an optimizer shares between variables is updated exactly once per step:

* slots and non-slot variables are created once, for all variables, before the
  first group (so they are the same variables, with the same names and
  colocation, as without grouping);
* only the last group runs the optimizer's real ``_finish`` (Adam's beta-power
  updates); the others use the base class's, which only groups the updates.
  The last group's updates wait for every earlier group, so the beta powers
  advance after all variables used them;
* only the last group passes ``global_step``, which therefore advances once.

The op returned is the last group's (the step increment when ``global_step``
was given, else ``_finish``'s group, named as the user asked); it waits for every
group. Optimizers this cannot be done for safely (those that override
``apply_gradients``, Keras optimizers, whose ``iterations`` would advance per
group) are applied in one group, with a warning.

Example::

    epl.init(epl.Config({"optimizer.num_apply_group": 4}))
    train_op = tf.train.AdamOptimizer(1e-3).minimize(loss, global_step=step)
"""
import contextlib
import logging

from epl import tf_adapter
from epl.tf_adapter import tf

LOG = logging.getLogger("epl")
_WARNED = set()


def applies(config):
    return config.optimizer.num_apply_group > 1


def variable_bytes(var):
    """Bytes of a variable (0 when its shape is not fully known)."""
    elements = var.shape.num_elements()
    return (elements or 0) * var.dtype.base_dtype.size


def balanced_groups(sizes, count):
    """Split item indices into at most ``count`` non-empty groups of about equal size.

    Largest first, each to the lightest group (ties: lowest group index); each
    group keeps its items in their given order, and groups are ordered by their
    first item. Deterministic: the same sizes always give the same groups.

        >>> balanced_groups([4, 1, 1, 2], 2)
        [[0], [1, 2, 3]]
    """
    count = max(1, min(count, len(sizes)))
    load, members = [0] * count, [[] for _ in range(count)]
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        group = min(range(count), key=lambda g: (load[g], g))
        members[group].append(index)
        load[group] += sizes[index]
    groups = [sorted(m) for m in members if m]
    return sorted(groups, key=lambda g: g[0])


def contiguous_groups(sizes, count):
    """Split item indices, in their given order, into at most ``count`` non-empty
    runs of about equal size (a run ends once it reaches its share of the total).

    Grouped apply feeds variables in the order their gradients arrive (the reverse
    of creation: backprop reaches the last layers first), so group 0 can start as
    soon as the first gradients exist and each later group's gradients are ready
    about when its turn comes. Size-balanced groups that mix early and late layers
    would make every group wait for the end of backprop, holding every gradient.

        >>> contiguous_groups([4, 1, 1, 2], 2)
        [[0], [1, 2, 3]]
    """
    count = max(1, min(count, len(sizes)))
    total = float(sum(sizes))
    groups, current, done = [], [], 0.0
    for index, size in enumerate(sizes):
        current.append(index)
        done += size
        left_items = len(sizes) - index - 1
        left_groups = count - len(groups) - 1
        share = total * (len(groups) + 1) / count
        if left_groups and left_items >= left_groups and (done >= share
                                                          or left_items == left_groups):
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    return groups


def arrival_order(pairs):
    """``pairs`` in the order their gradients are expected: reverse creation."""
    return list(reversed(pairs))


def unsupported_reason(optimizer):
    """Why ``optimizer`` cannot be applied in groups, or None when it can.

    Grouping needs the ``tf.compat.v1.train.Optimizer`` protocol: the base class's
    ``apply_gradients`` creating slots with ``_create_slots`` and sharing state
    only in ``_finish``. A subclass that overrides ``apply_gradients`` may
    update shared state in it (BERT's AdamWeightDecayOptimizer bumps the step
    itself), and a Keras optimizer advances ``iterations`` in every call.
    """
    base = tf.train.Optimizer
    if not isinstance(optimizer, base):
        return "%s is not a tf.compat.v1.train.Optimizer" % type(optimizer).__name__
    for cls in type(optimizer).__mro__:
        if "apply_gradients" in cls.__dict__:
            if cls is base:
                return None
            return "%s overrides apply_gradients" % cls.__name__
    return None  # pragma: no cover - the base class defines it


def wrap_apply(call, build):
    """Build-time saver hook (see :mod:`epl.runtime.build_time`)."""
    count = build.config.optimizer.num_apply_group

    def apply(record):
        optimizer, live = record.optimizer, list(record.grads_and_vars)
        reason = unsupported_reason(optimizer)
        if reason is not None:
            _warn_once(optimizer, count, reason)
            return call(record)
        if min(count, len(live)) < 2:
            return call(record)
        live = arrival_order(live)
        groups = [[live[i] for i in members] for members in
                  contiguous_groups([variable_bytes(v) for _, v in live], count)]
        return apply_in_groups(call, record, groups)
    return apply


def apply_in_groups(call, record, groups):
    """Call ``call`` once per group, each after the previous one completed; the last
    group's call takes the step, the name and the pairs without a gradient."""
    optimizer = record.optimizer
    _create_all_slots(optimizer, [v for group in groups for g, v in group])
    base_name = record.name or optimizer.get_name()
    done, result = None, None
    for index, group in enumerate(groups):
        last = index == len(groups) - 1
        with tf.control_dependencies([done] if done is not None else []):
            if last:
                result = call(record._replace(grads_and_vars=group))
            else:
                with _plain_finish(optimizer):
                    done = call(record._replace(
                        grads_and_vars=group, global_step=None, skipped=(),
                        name="%s_group_%d" % (base_name, index)))
                _forget_train_op(done)
    return result


def _create_all_slots(optimizer, variables):
    """Create the slots of every variable once, as an ungrouped call does, so that
    non-slot variables are placed alike: Adam colocates its beta powers with the
    first variable by name of the whole list, not of one group. Later calls find
    them (``_zeros_slot`` and ``_create_non_slot_variable`` create only what is
    missing)."""
    with tf.init_scope():
        tf_adapter.create_slots(optimizer, variables)


def _group_only(update_ops, name_scope):
    """tf.train.Optimizer's own ``_finish``: the updates as one op, nothing shared."""
    return tf.group(*update_ops, name=name_scope)


@contextlib.contextmanager
def _plain_finish(optimizer):
    """Inside, ``optimizer._finish`` only groups the updates, so shared state (Adam's
    beta powers) is left to the last group's real ``_finish``."""
    with tf_adapter.finishing_with(optimizer, _group_only):
        yield


def _forget_train_op(op):
    """apply_gradients adds its result to TRAIN_OP; only the last group's belongs there."""
    train_ops = tf.get_collection_ref(tf.GraphKeys.TRAIN_OP)
    if op in train_ops:
        train_ops.remove(op)


def _warn_once(optimizer, count, reason):
    key = type(optimizer)
    if key in _WARNED:
        return
    _WARNED.add(key)
    LOG.warning("EPL: optimizer.num_apply_group=%d is not applied to %s: %s; its "
                "variables are updated in one group.", count, type(optimizer).__name__, reason)
