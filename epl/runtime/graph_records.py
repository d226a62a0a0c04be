"""Records a build-time saver keeps per EPL graph view.

AMP and gradient checkpointing record what they did while the user builds the
step (conversions, loss scales, checkpoints) so that later hooks, passes and
tests can read it, each in its FeatureSlot (:mod:`epl.ir.features`): records live
on the graph's EPL view and die with it.

One record is shared: which ops a build-time rewrite *replaced* (AMP's float16
twins take over every forward consumer of the float32 op). A tensor the user
holds, such as an entry of the ``checkpoints`` collection, is followed to the op
that now plays its part with :func:`current_tensor`, so savers compose without
importing each other.
"""
from epl.ir.features import FeatureSlot

# {op name: the op that replaced it for its forward consumers}
_REPLACED = FeatureSlot("build_time_replacements", dict)


def record_replacement(view, original, replacement):
    """``replacement`` (same outputs, in order) now feeds ``original``'s forward consumers."""
    _REPLACED.of(view)[original.name] = replacement


def current_tensor(view, tensor):
    """The tensor that plays ``tensor``'s part after the build-time rewrites so far."""
    table = _REPLACED.get(view)
    seen = set()
    while table and tensor.op.name in table and tensor.op.name not in seen:
        seen.add(tensor.op.name)
        tensor = table[tensor.op.name].outputs[tensor.value_index]
    return tensor
