"""A column-sharded dense layer: ``tf.layers.dense`` inside ``epl.split``.

Shard j of a layer with C units holds columns ``shard_bounds(C, N, j)`` of the
kernel and bias. Its input is all-gathered from the N devices of the replica
first, so every shard sees the replica's whole batch and produces its columns
of the logits for all of it. The layer keeps ``tf.layers.Dense``'s naming
(``dense/kernel``, ``dense_1/kernel``, ...) so checkpoints line up with the
unsplit model. Variables have an unknown static size along the sharded axis:
the model is built once and copied to every shard, whose widths differ by at
most one column.
"""
from epl.ops import intents, seeds, shards
from epl.ops.state import ShardInfo, state, view_of
from epl.tf_adapter import tf


class SplitDenseError(ValueError):
    """A dense layer cannot be split as asked."""


class SplitDenseMixin(object):
    """Sharded weights and an all-gathered input for a Dense layer (tf.layers or Keras).

    EPL turns a Dense layer built inside ``epl.split`` into this by giving the
    instance a subclass with this mixin first (see epl/ops/hooks.py), so every
    way of making a dense layer is covered.
    """

    split_width = None

    def _check_split(self):
        for name in ("kernel_regularizer", "bias_regularizer", "activity_regularizer",
                     "kernel_constraint", "bias_constraint"):
            if getattr(self, name, None) is not None:
                raise SplitDenseError("epl.split: dense layer %r: %s is not supported for a "
                                      "split layer; apply it outside the split scope"
                                      % (self.name, name))
        if self.units < self.split_width:
            raise SplitDenseError(
                "epl.split(device_count=%d): dense layer %r has %d units, fewer than the %d "
                "shards; use at most %d devices for it or more units"
                % (self.split_width, self.name, self.units, self.split_width, self.units))

    def add_weight(self, name, shape, dtype=None, initializer=None, trainable=None,
                   **kwargs):
        """Kernel and bias are sharded on their last axis; each copy's initial value is
        its slice (see epl.ops.shards)."""
        del kwargs
        self._check_split()
        full_shape = [int(d) for d in tf.TensorShape(shape).as_list()]
        dtype = tf.as_dtype(dtype or self.dtype or tf.float32)
        axis = len(full_shape) - 1
        width = self.split_width
        value = shards.variable_initial_value(initializer, full_shape, axis, width, dtype,
                                              full_shape[:axis] + [None])
        trainable = True if trainable is None else trainable
        split = state(value.graph)
        split.creating = True
        try:
            variable = tf.get_variable(name, initializer=value, dtype=dtype,
                                       trainable=trainable, validate_shape=False)
        finally:
            split.creating = False
        variable.set_shape(full_shape[:axis] + [None])
        state(variable.graph).sharded_variables[variable.op.name] = ShardInfo(
            self.name, full_shape, axis, width)
        if trainable:
            self._trainable_weights.append(variable)
        else:
            self._non_trainable_weights.append(variable)
        return variable

    def call(self, inputs):
        graph = inputs.graph
        split = state(graph)
        with split.implementing(view_of(graph)):
            with seeds.extra(graph):
                gathered = intents.all_gather(inputs, self.split_width)
            outputs = super(SplitDenseMixin, self).call(gathered)
        split.sharded[outputs.name] = ShardInfo(self.name, [None, self.units], -1,
                                                self.split_width)
        return outputs


_CLASSES = {}


def make_split(layer, width):
    """Turn an unbuilt Dense layer into its split twin (same object, same name)."""
    base = type(layer)
    if base not in _CLASSES:
        _CLASSES[base] = type("Split" + base.__name__, (SplitDenseMixin, base), {})
    layer.__class__ = _CLASSES[base]
    layer.split_width = width
    return layer
