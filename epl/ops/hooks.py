"""The TF API EPL intercepts for split layers.

* ``Dense.build`` (Keras and ``tf.layers``): a dense layer first built inside
  ``epl.split(N)`` becomes its split twin (:mod:`epl.ops.dense`);
* ``VariableScope.get_variable`` inside ``epl.split``: expert variables, and
  ``tf.einsum`` on them: the MoE pattern (:mod:`epl.ops.experts`);
* sparse softmax cross-entropy (``tf.losses`` and ``tf.nn``), ``tf.argmax``,
  ``tf.math.top_k`` and ``tf.equal``: when an input is sharded logits (or,
  for ``equal``, covers the replica's batch), the split implementation runs;
  otherwise TF's own function does, unchanged.

Functions are patched wherever a module exposes them (``tf.argmax`` and
``tf.math.argmax`` are one function under two names). Inside a split
implementation nothing is intercepted again.
"""
import functools
import inspect

from epl import tf_adapter
from epl.ops import dense, experts, losses, metrics, seeds
from epl.ops.state import is_replica_level, is_sharded, peek, shard_info, split_width
from epl.protocols.hooks import Patch
from epl.tf_adapter import tf


def _targets(functions):
    """For each of ``functions``, every (module, attribute) of TensorFlow whose value it
    is (one scan of TensorFlow's modules for all of them)."""
    return tf_adapter.targets_of_values(
        functions, ("sparse_softmax_cross_entropy", "sparse_softmax_cross_entropy_with_logits",
                    "argmax", "top_k", "equal", "einsum"), ("tensorflow", "tensorflow_core"))


def _busy(tensor):
    """True inside a split implementation (its own calls are TF's)."""
    return peek(tensor.graph).active


def _wrap_build(original):
    @functools.wraps(original)
    def build(self, input_shape):
        width = split_width()
        if width is not None and not isinstance(self, dense.SplitDenseMixin):
            dense.make_split(self, width)
        return original(self, input_shape)
    return build


def _wrap_get_variable(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def get_variable(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        arguments = dict(bound.arguments)
        scope, store, name = (arguments.pop(k) for k in ("self", "var_store", "name"))
        shape, dtype = arguments.pop("shape", None), arguments.pop("dtype", None)
        initializer = arguments.pop("initializer", None)
        made = experts.expert_variable(original, scope, store, name, shape, dtype, initializer,
                                       arguments)
        return original(*args, **kwargs) if made is None else made
    return get_variable


def _wrap_einsum(original):
    @functools.wraps(original)
    def einsum(equation, *inputs, **kwargs):
        result = experts.einsum(original, equation, *inputs, **kwargs)
        return original(equation, *inputs, **kwargs) if result is None else result
    return einsum


def _dispatch(original, split_version, tensor_args, check):
    """A wrapper that calls ``split_version`` when ``check`` holds for an input."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)
        values = [bound.arguments.get(name) for name in tensor_args]
        tensors = [v for v in values if isinstance(v, tf.Tensor)]
        if not tensors or _busy(tensors[0]) or not any(check(t) for t in tensors):
            return original(*args, **kwargs)
        plain = seeds.plain_op_count(original, bound.arguments, _unsplit_shapes(bound))
        with seeds.replacing(tensors[0].graph, plain):
            result = split_version(bound.arguments)
        if result is None:
            return original(*args, **kwargs)
        return result
    return wrapper


def _unsplit_shapes(bound):
    """{argument: a static shape plain TF's tensor has} for tensor arguments: the rank,
    and the unsplit size of a sharded axis (rows differ: sharded logits cover the
    replica's batch)."""
    shapes = {}
    for name, value in bound.arguments.items():
        if not isinstance(value, tf.Tensor) or value.shape.ndims is None:
            continue
        dims = [None] * value.shape.ndims
        info = shard_info(value)
        if info is not None:
            dims[info.axis] = info.full_shape[info.axis]
        shapes[name] = dims
    return shapes


def _losses_call(arguments):
    return losses.sparse_softmax_cross_entropy(
        arguments["labels"], arguments["logits"], arguments.get("weights", 1.0),
        arguments.get("scope"), arguments.get("loss_collection", tf.GraphKeys.LOSSES),
        arguments.get("reduction", tf.losses.Reduction.SUM_BY_NONZERO_WEIGHTS))


def _nn_call(arguments):
    return losses.sparse_softmax_cross_entropy_with_logits(
        arguments["labels"], arguments["logits"], arguments.get("name"))


def _argmax_call(arguments):
    axis = arguments.get("axis")
    if axis is None:
        axis = arguments.get("dimension")
    if axis not in (None, 1, -1):
        raise metrics.SplitMetricError("tf.argmax on sharded logits supports the class axis "
                                       "(1 or -1), got axis=%r" % (axis,))
    return metrics.argmax(arguments["input"], arguments.get("output_type", tf.int64),
                          arguments.get("name"))


def _top_k_call(arguments):
    return metrics.top_k(arguments["input"], arguments.get("k", 1),
                         arguments.get("sorted", True), arguments.get("name"))


def _equal_call(arguments):
    return metrics.equal(arguments["x"], arguments["y"], arguments.get("name"))


_FUNCTIONS = [
    (tf.losses.sparse_softmax_cross_entropy, _losses_call, ("logits",), is_sharded),
    (tf.nn.sparse_softmax_cross_entropy_with_logits, _nn_call, ("logits",), is_sharded),
    (tf.argmax, _argmax_call, ("input",), is_sharded),
    (tf.math.top_k, _top_k_call, ("input",), is_sharded),
    (tf.equal, _equal_call, ("x", "y"), is_replica_level),
]


def patches(provider):
    """Patches of the "ops" concern, bound to an Env provider."""
    del provider
    result = [Patch("ops", (tf.keras.layers.Dense, "build"), _wrap_build),
              Patch("ops", tf_adapter.GET_SEED, seeds.wrap_get_seed),
              Patch("ops", (tf.VariableScope, "get_variable"), _wrap_get_variable)]
    found = _targets([tf.einsum] + [function for function, _, _, _ in _FUNCTIONS])
    for target in found[0]:
        result.append(Patch("ops", target, _wrap_einsum))
    for (_, call, tensor_args, check), targets in zip(_FUNCTIONS, found[1:]):
        make = (lambda original, call=call, tensor_args=tensor_args, check=check:
                _dispatch(original, call, tensor_args, check))
        for target in targets:
            result.append(Patch("ops", target, make))
    return result
