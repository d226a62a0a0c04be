"""What split layers ask for while the model is built: intents, lowered at rewrite time.

A split layer needs collectives over the devices of its model replica and
values that depend on which shard a copy holds. Neither is known while the
user builds the model (the plan is made later, and the model is built once
for every copy), so a layer records an *intent* and gets a stand-in tensor of
the right dtype and static shape:

* ``position()``: this copy's shard index (int32 scalar);
* ``all_gather(x)``: every member's ``x`` concatenated on axis 0 in shard order
  (its gradient is ``reduce_scatter``);
* ``reduce_scatter(x)``: the sum over members, this member's slice of axis 0;
* ``all_reduce(x)``: the sum over members (its gradient is ``all_reduce``);
* ``all_to_all(x)``: axis-0 chunk j goes to member j (its own gradient);
* ``per_copy(build, ...)``: ``build(position)`` evaluated for each copy (initial
  values of sharded variables).

The stand-in is a placeholder with a control input on the intent's inputs: if
it ever ran unlowered, TF would fail loudly ("must feed a value"), never
compute a wrong answer. :class:`epl.ops.lowering.SplitLowering` replaces every
stand-in with the real op for copy 0 and registers a builder for every other
copy and micro-batch (``Graph.specialize``).
"""
import collections

from epl.ops.state import state
from epl.tf_adapter import tf

POSITION, ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE, ALL_TO_ALL, PER_COPY = (
    "position", "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "per_copy")

Intent = collections.namedtuple("Intent", ["kind", "stand_in", "inputs", "width", "build",
                                           "index"])
Intent.__doc__ = """One recorded intent: ``stand_in`` is the placeholder tensor to replace,
``inputs`` the tensors it reads, ``width`` the split width (devices of a replica), ``build``
the per-copy value function (PER_COPY only), ``index`` its number in the graph (stable
across workers: every worker builds the same model in the same order)."""


def _record(kind, stand_in, inputs, width, build=None):
    intents = state(stand_in.graph).intents
    intents.append(Intent(kind, stand_in, list(inputs), width, build, len(intents)))
    return stand_in


def _stand_in(kind, inputs, dtype, shape):
    """A placeholder that depends on ``inputs`` (so it sits where the op will)."""
    with tf.control_dependencies([t.op for t in inputs]):
        return tf.placeholder(dtype, shape, name="EPL_SPLIT_%s" % kind.upper())


def position(width):
    """This copy's shard index among the ``width`` devices of its replica."""
    return _record(POSITION, _stand_in(POSITION, [], tf.int32, []), [], width)


def per_copy(build, dtype, shape, width):
    """A tensor whose value each copy computes with ``build(position)`` (a Python int)."""
    return _record(PER_COPY, _stand_in(PER_COPY, [], dtype, shape), [], width, build)


def _rows(shape, factor):
    shape = tf.TensorShape(shape)
    if shape.ndims is None or shape.ndims == 0:
        raise ValueError("split collectives need a tensor of rank >= 1, got shape %s" % shape)
    dims = shape.as_list()
    if dims[0] is not None:
        dims[0] = int(dims[0] * factor)
    return dims


def all_gather(x, width):
    """Every member's rows, in shard order; the gradient sums and scatters back."""
    @tf.custom_gradient
    def gather(value):
        result = _record(ALL_GATHER, _stand_in(ALL_GATHER, [value], value.dtype,
                                               _rows(value.shape, width)), [value], width)

        def grad(dy):
            return reduce_scatter(dy, width)
        return result, grad
    return gather(x)


def reduce_scatter(x, width):
    """The sum over members of ``x``; this member keeps its slice of axis 0."""
    @tf.custom_gradient
    def scatter(value):
        result = _record(REDUCE_SCATTER, _stand_in(REDUCE_SCATTER, [value], value.dtype,
                                                   _rows(value.shape, 1.0 / width)),
                         [value], width)

        def grad(dy):
            return all_gather(dy, width)
        return result, grad
    return scatter(x)


def all_reduce(x, width):
    """The sum of ``x`` over the members of the replica."""
    @tf.custom_gradient
    def reduce(value):
        result = _record(ALL_REDUCE, _stand_in(ALL_REDUCE, [value], value.dtype, value.shape),
                         [value], width)

        def grad(dy):
            return all_reduce(dy, width)
        return result, grad
    return reduce(x)


def all_to_all(x, width):
    """Axis-0 chunk j of every member goes to member j (chunks in member order)."""
    @tf.custom_gradient
    def exchange(value):
        result = _record(ALL_TO_ALL, _stand_in(ALL_TO_ALL, [value], value.dtype, value.shape),
                         [value], width)

        def grad(dy):
            return all_to_all(dy, width)
        return result, grad
    return exchange(x)
