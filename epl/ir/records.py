"""Build-time records of the calls that make a training step.

EPL's hooks record every ``tf.gradients`` call and every ``apply_gradients``
call as the user made them, so that a rewrite pass can find the training step,
scale a loss, rebuild gradients or call an optimizer again (AMP loss scaling,
gradient checkpointing, ZeRO) without re-deriving them from the graph.
"""
import collections


class GradientCall(collections.namedtuple("GradientCall", ["ys", "xs", "grad_ys", "grads",
                                                           "stop_gradients"],
                                          defaults=((),))):
    """One ``tf.gradients(ys, xs, grad_ys, stop_gradients=...)`` call and the gradients
    it returned (after ``communication.sparse_as_dense``); lists, aligned with ``xs``.
    Build-time savers receive it with ``grads`` None and return it filled
    (:mod:`epl.runtime.build_time`)."""

    __slots__ = ()

    def gradient_of(self, var_op_name):
        """The gradient this call returned for the variable op ``var_op_name``, or None."""
        for x, grad in zip(self.xs, self.grads):
            if getattr(x, "op", None) is not None and x.op.name == var_op_name:
                return grad
        return None


class ApplyCall(collections.namedtuple(
        "ApplyCall", ["optimizer", "grads_and_vars", "global_step", "name", "skipped"],
        defaults=((),))):
    """One ``optimizer.apply_gradients`` call; ``grads_and_vars`` keeps only the
    pairs with a gradient (None gradients do not train), ``skipped`` the others,
    which the optimizer still receives as they came (it reports them)."""

    __slots__ = ()

    def __iter__(self):
        """Iterating a call yields its (gradient, variable) pairs."""
        return iter(self.grads_and_vars)

    def __len__(self):
        return len(self.grads_and_vars)

    def _replace(self, **changes):
        """A copy with ``changes`` (the namedtuple's own would iterate the pairs)."""
        values = dict(zip(self._fields, tuple.__iter__(self)))
        values.update(changes)
        return ApplyCall(**values)

    @property
    def variables(self):
        return [v for _, v in self.grads_and_vars]


def as_list(value):
    """``tf.gradients`` takes a tensor or a list; records always hold lists."""
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]
