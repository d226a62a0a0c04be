"""Which user ops the step repeats per micro-batch, and which every micro-batch shares."""
import collections

from epl import tf_adapter
from epl.ir.phase import Phase
from epl.ir.roles import is_variable
from epl.ir.traverse import CONTROL_FLOW_TYPES

TrainingItem = collections.namedtuple("TrainingItem", ["var", "grad"])


def micro_batch_candidates(ctx):
    """The forward and backward ops of the training step that micro-batches repeat
    (not variables, not what only initializes them), in creation order."""
    phases = (Phase.FORWARD, Phase.BACKWARD)
    return [op for op in ctx.roles.cloned
            if ctx.view.info(op).phase in phases and not is_variable(op)
            and op.name in ctx.roles.step]


def constant_expressions(ops, per_copy=()):
    """Names of the ops in ``ops`` whose value is the same in every micro-batch:
    constants and stateless ops computed from constants only (no control inputs),
    except the ops named in ``per_copy`` (built per copy and micro-batch: a split
    layer's position) and what is computed from them.

    They are a quarter of a typical model's ops (shapes, permutations and their
    inverses, broadcast arguments in the backward pass); sharing them keeps them
    on their stage's device as before and saves TensorFlow folding the same
    expression once per micro-batch when the session starts.
    """
    names = set(op.name for op in ops)
    shared = set()
    pending = [op for op in ops if _may_be_constant(op) and op.name not in per_copy]
    while pending:  # a fixed point: each round adds the ops whose inputs are now known
        later = []
        for op in pending:
            if all(t.op.name in shared for t in op.inputs):
                shared.add(op.name)
            elif all(t.op.name in names and _may_be_constant(t.op)
                     and t.op.name not in per_copy for t in op.inputs):
                later.append(op)
        if len(later) == len(pending):
            break
        pending = later
    return shared


def _may_be_constant(op):
    return (not op.control_inputs and op.type not in _NEVER_CONSTANT
            and not tf_adapter.touches_state(op) and (op.type == "Const" or bool(op.inputs)))


# Control flow, and placeholders, whose value a feed can change per run.
_NEVER_CONSTANT = CONTROL_FLOW_TYPES | frozenset(["Placeholder", "PlaceholderWithDefault"])


def training_items(view, clip_after_allreduce):
    """{variable op name: TrainingItem(var, grad)} of every trained variable, in apply
    order; with ``communication.clip_after_allreduce`` the gradient is the one
    ``tf.gradients`` returned (the user's clipping reads its reduced value)."""
    items = collections.OrderedDict()
    for call in view.apply_calls:
        for grad, var in call:
            raw = view.raw_gradient(var.op.name) if clip_after_allreduce else None
            items[var.op.name] = TrainingItem(var, raw if raw is not None else grad)
    return items


def gradient_parts(grad):
    """The tensors of a dense or sparse gradient."""
    return [grad.values, grad.indices] if isinstance(grad, tf_adapter.tf.IndexedSlices) \
        else [grad]
