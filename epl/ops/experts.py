"""Mixture-of-Experts inside ``epl.split``: expert variables and the einsum pattern.

Expert variables: inside ``epl.split(N)`` a variable made with
``tf.get_variable`` (other than a split dense layer's) holds experts on its
first axis: each of the N devices of a replica keeps E/N of them (E must be a
multiple of N). Its initial value is the copy's slice of the unsplit value.

The einsum pattern that MoE models written for the original EPL use (GShard
layout: E experts, G groups, C capacity, M model width)::

    x = einsum("GSEC,GSM->EGCM", dispatch, tokens)   # local: every expert's inputs
    h = einsum("EGCM,EMH->EGCH", x, w_in)            # w_in is an expert variable
    y = einsum("EGCH,EHM->EGCM", relu(h), w_out)     # expert-local
    out = einsum("GSEC,EGCM->GSM", combine, y)       # back to this copy's tokens

is lowered so that each device runs its own experts on every device's tokens:

* an einsum of a tensor with all E experts and an expert variable first sends
  each expert's rows to its owner (all-to-all on axis 0) and stacks the senders'
  rows on the capacity axis (axis 2): ``[E, G, C, M] -> [E/N, G, N*C, M]``;
* an einsum that reads an expert-local tensor (made from expert variables) and
  no expert variable undoes that (capacity chunks back to the expert axis) and
  sends every row back to the device whose tokens it holds.
"""
from epl.ops import intents, seeds, shards
from epl.ops.state import ShardInfo, split_width, state, view_of
from epl.tf_adapter import tf


class SplitExpertError(ValueError):
    """Experts cannot be split as asked."""


def expert_variable(original, scope, var_store, name, shape, dtype, initializer, kwargs):
    """``VariableScope.get_variable`` inside a split scope: shard axis 0 over the devices."""
    width = split_width()
    split = None if width is None else state(tf.get_default_graph())
    if width is None or split.creating or shape is None:
        return None
    full_shape = [int(d) for d in tf.TensorShape(shape).as_list()]
    if not full_shape or full_shape[0] % width:
        raise SplitExpertError(
            "epl.split(device_count=%d): variable %r of shape %s holds experts on its first "
            "axis, which must be a multiple of %d; give it a multiple of %d experts or create "
            "it outside the split scope" % (width, name, full_shape, width, width))
    dtype = tf.as_dtype(dtype or tf.float32)
    local = [full_shape[0] // width] + full_shape[1:]
    value = shards.variable_initial_value(initializer, full_shape, 0, width, dtype, local)
    kwargs = dict(kwargs, shape=None, initializer=value, dtype=dtype)
    variable = original(scope, var_store, name, **kwargs)
    state(variable.graph).sharded_variables[variable.op.name] = ShardInfo(
        name, full_shape, 0, width)
    split.experts[variable.op.name] = width
    return variable


def _expert_width(tensor):
    """Split width if ``tensor`` reads an expert variable directly (or is one), else None."""
    split = state(tensor.graph)
    op = tensor.op
    for _ in range(4):  # a variable's read: Identity / ReadVariableOp / cast
        if op.name in split.experts:
            return split.experts[op.name]
        if not op.inputs:
            return None
        op = op.inputs[0].op
    return None


def _expert_local_width(tensor, depth=12):
    """Split width if ``tensor`` is computed from expert-local tensors, else None."""
    split = state(tensor.graph)
    seen, frontier = set(), [tensor]
    for _ in range(depth):
        following = []
        for value in frontier:
            if value.name in split.expert_local:
                return split.expert_local[value.name]
            if value.op.name in seen:
                continue
            seen.add(value.op.name)
            following += [t for t in value.op.inputs if t.dtype.is_floating]
        frontier = following
        if not frontier:
            return None
    return None


def _to_owners(value, width):
    """[E, G, C, ...] (all experts) -> [E/N, G, N*C, ...] (own experts, all senders)."""
    with seeds.extra(value.graph):
        received = intents.all_to_all(value, width)
        return tf.concat(tf.split(received, width, axis=0), axis=2)


def _to_senders(value, width):
    """Inverse of _to_owners: [E/N, G, N*C, ...] -> [E, G, C, ...] on each sender."""
    with seeds.extra(value.graph):
        return intents.all_to_all(tf.concat(tf.split(value, width, axis=2), axis=0), width)


def einsum(original, equation, *inputs, **kwargs):
    """The split version of ``tf.einsum`` when an operand is an expert tensor, else None."""
    if len(inputs) != 2 or not all(hasattr(t, "op") and hasattr(t, "graph") for t in inputs):
        return None
    graph = inputs[0].graph
    split = state(graph)
    if split.active or not split.experts:
        return None
    first, second = inputs
    expert = _expert_width(second)
    first, second = tf.convert_to_tensor(first), tf.convert_to_tensor(second)
    local_first, local_second = _expert_local_width(first), _expert_local_width(second)
    if expert is None and local_second is None:
        return None
    with split.implementing(view_of(graph)):
        if expert is not None and local_first is None:
            result = original(equation, _to_owners(first, expert), second, **kwargs)
            split.expert_local[result.name] = expert
        elif expert is not None:
            result = original(equation, first, second, **kwargs)
            split.expert_local[result.name] = expert
        else:
            result = original(equation, first, _to_senders(second, local_second), **kwargs)
    return result
