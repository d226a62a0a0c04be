"""How a dimension is cut into shards, and each shard's initial value.

Shards are balanced: ``total`` columns over ``width`` shards give the first
``total % width`` shards one column more, so any count >= width works (odd and
prime class counts included) and no shard is empty.

Initial values, so that a split model and its unsplit twin can be compared:

* under a graph-level seed (``tf.set_random_seed``) the unsplit value is drawn
  where plain TF would draw it, when the variable is created: TF derives an
  unseeded op's seed from the number of ops made so far, so the random op gets
  plain TF's seed, and each shard is its slice of plain TF's value, whatever is
  built later (:func:`variable_initial_value`);
* a constant initializer (an array) gives each shard exactly its slice;
* a seeded random initializer draws the unsplit value and slices it;
* an unseeded variance-scaling initializer (Glorot, the default) draws the
  shard directly with the fan-in/fan-out of the unsplit layer, which is the
  unsplit layer's distribution without materializing the whole matrix;
* anything else (zeros, ones, ...) is evaluated at the shard's shape.
"""
import numpy as np

from epl.ops import intents, seeds
from epl.tf_adapter import tf


def shard_bounds(total, width, position):
    """(start, size) of shard ``position`` when ``total`` is cut into ``width`` shards."""
    base, extra = divmod(total, width)
    size = base + (1 if position < extra else 0)
    start = position * base + min(position, extra)
    return start, size


def shard_shape(full_shape, axis, width, position):
    shape = list(full_shape)
    shape[axis] = shard_bounds(full_shape[axis], width, position)[1]
    return shape


def _slice(value, axis, start, size):
    index = [slice(None)] * len(value.shape)
    index[axis] = slice(start, start + size)
    return value[tuple(index)]


def _constant_value(initializer, full_shape, dtype):
    """The full array of a constant initializer, or None if it is not one."""
    if not isinstance(initializer, tf.constant_initializer):
        return None
    value = np.asarray(initializer.value, dtype=tf.as_dtype(dtype).as_numpy_dtype)
    if value.shape == ():
        return np.full(full_shape, value)
    if list(value.shape) != list(full_shape):
        value = np.reshape(value, full_shape)
    return value


def _variance_scaling_for_shard(initializer, full_shape, shard):
    """A copy of a VarianceScaling initializer whose scale makes the shard's fans act
    like the unsplit layer's."""
    fan_in, fan_out = _fans(full_shape)
    shard_in, shard_out = _fans(shard)
    mode = initializer.mode
    full = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2.0}[mode]
    own = {"fan_in": shard_in, "fan_out": shard_out,
           "fan_avg": (shard_in + shard_out) / 2.0}[mode]
    return tf.variance_scaling_initializer(scale=initializer.scale * own / full, mode=mode,
                                           distribution=initializer.distribution)


def _fans(shape):
    if len(shape) < 1:
        return 1.0, 1.0
    if len(shape) == 1:
        return float(shape[0]), float(shape[0])
    receptive = float(np.prod(shape[:-2])) if len(shape) > 2 else 1.0
    return shape[-2] * receptive, shape[-1] * receptive


def _instance(initializer):
    initializer = initializer if initializer is not None else tf.glorot_uniform_initializer()
    return initializer() if isinstance(initializer, type) else initializer


def variable_initial_value(initializer, full_shape, axis, width, dtype, shard_static_shape):
    """The value a sharded variable is created with: a stand-in of ``shard_static_shape``
    that each copy replaces with its shard's initial value when split layers are lowered
    (see the module docstring).

    Under a graph-level seed the unsplit value is drawn first, exactly where
    ``tf.get_variable`` would call the initializer, so its random op gets plain TF's
    seed; each copy takes its slice. The stand-in is an op plain TF does not make, so
    it is reported to :mod:`epl.ops.seeds` (ops built later keep plain TF's seeds)."""
    initializer = _instance(initializer)
    graph = tf.get_default_graph()
    if graph.seed is not None:
        full = initializer(list(full_shape), dtype=dtype)
        build = lambda position: _shard_of(full, full_shape, axis, width, position)  # noqa
    else:
        build = lambda position: initial_value(  # noqa: E731
            initializer, full_shape, axis, width, position, dtype)
    with seeds.extra(graph):
        return intents.per_copy(build, dtype, shard_static_shape, width)


def _shard_of(full, full_shape, axis, width, position):
    start = shard_bounds(full_shape[axis], width, position)[0]
    begin = [0] * len(full_shape)
    begin[axis] = start
    return tf.slice(full, begin, shard_shape(full_shape, axis, width, position))


def initial_value(initializer, full_shape, axis, width, position, dtype):
    """This shard's initial value (a tensor) under the rules of the module docstring."""
    initializer = _instance(initializer)
    start, size = shard_bounds(full_shape[axis], width, position)
    shard = shard_shape(full_shape, axis, width, position)
    constant = _constant_value(initializer, full_shape, dtype)
    if constant is not None:
        return tf.constant(_slice(constant, axis, start, size), dtype=dtype)
    if getattr(initializer, "seed", None) is not None:
        full = initializer(list(full_shape), dtype=dtype)
        return _shard_of(full, full_shape, axis, width, position)
    if isinstance(initializer, tf.keras.initializers.VarianceScaling) or \
            type(initializer).__name__ == "VarianceScaling" or hasattr(initializer, "mode"):
        return _variance_scaling_for_shard(initializer, full_shape, shard)(shard, dtype=dtype)
    return initializer(shard, dtype=dtype)
