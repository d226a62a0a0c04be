"""Skipped AMP steps: the job still ends, and says loudly that it is skipping.

What the loss-scale optimizers EPL's users know do with a step whose gradients
overflow (checked in their sources):

* TF 1.15 ``tf.train.experimental.MixedPrecisionLossScaleOptimizer``: a fixed
  scale never checks (the update is applied, inf/NaN included); a dynamic one
  skips the update and does not advance ``global_step``;
* ``tf.contrib.mixed_precision.LossScaleOptimizer``: skips with either scale
  manager and does not advance ``global_step``, so a fixed scale that overflows
  every step keeps ``StopAtStepHook`` waiting forever;
* TF 2's Keras ``LossScaleOptimizer``: a fixed scale applies every step; a
  dynamic one skips and still increments ``iterations`` (so that learning-rate
  schedules and step counts move on);
* apex: a static scale applies every step; a dynamic one skips the step, halves
  the scale and prints "Gradient overflow. Skipping step"; the user's loop
  counts iterations, so it ends.

EPL skips a non-finite step with either scale (applying inf or NaN would ruin
the weights) and, like TF 2 and apex, still counts it: the ``global_step`` the
optimizer would have incremented advances on a skipped step too, so every
step-based hook ends. Each loss scale counts its skipped steps in a row
(``EPL_AMP/skipped_in_a_row``) and warns on stderr on the 1st, 2nd, 4th, 8th,
... of them, with the count and the scale, once per worker (local copy 0).
"""
import sys

from epl import tf_adapter
from epl.tf_adapter import tf


def always_advance(increments, finite):
    """Make ``increments`` (the optimizer's ``global_step`` updates and the ops they
    read) run on skipped steps too: their control inputs (the optimizer's finished
    updates, dead on a skipped step) are replaced by a merge of "those updates ran"
    and "the step was skipped", which is alive on every step."""
    for op in increments:
        controls = list(op.control_inputs)
        if not controls:
            continue
        skipped, applied = tf_adapter.switch(finite, finite)
        with tf.control_dependencies(controls):
            applied = tf.identity(applied, name="applied")
        merged = tf_adapter.merge([applied, tf.identity(skipped, name="skipped")])
        tf_adapter.remove_control_inputs(op)
        tf_adapter.add_control_inputs(op, [merged.op])


def step_increments(new_ops, global_step):
    """Ops among ``new_ops`` that write the ``global_step`` variable, and the new ops
    they read (``assign_add(step, 1)`` reads a constant made under the same control
    dependencies)."""
    target = getattr(global_step, "op", None)
    if target is None:
        return []
    created = set(new_ops)
    found = []
    stack = [op for op in new_ops if any(v is target for v in tf_adapter.written_variables(op))]
    while stack:
        op = stack.pop()
        if op in found:
            continue
        found.append(op)
        stack.extend(t.op for t in op.inputs if t.op in created and t.op is not target)
    return found


def first_copy_flag(view):
    """A bool tensor that is True in local copy 0 only (each copy builds its own)."""
    flag = tf.constant(True, name="first_copy")

    def build(copy, micro_batch, inputs):
        del inputs
        return tf.constant(copy == 0 and micro_batch == 0, name="first_copy").op
    view.specialize(flag.op, build, inputs=[])
    return flag


def warn_skipped(loss_scale, finite, after, first_copy):
    """An op, alive on every step, that prints a warning after ``after`` (the scale
    state's update) when this step was the 1st, 2nd, 4th, ... skipped in a row."""
    with tf.control_dependencies([after]):
        count = loss_scale.in_a_row_var.read_value()
        scale = loss_scale.scale_var.read_value() if loss_scale.dynamic else loss_scale.value
    power_of_two = tf.equal(tf.bitwise.bitwise_and(count, count - 1), 0)
    due = tf.logical_and(tf.logical_and(tf.logical_not(finite), first_copy),
                         tf.logical_and(count > 0, power_of_two))
    count, scale = [tf_adapter.switch(t, due)[1] for t in (count, scale)]
    if loss_scale.dynamic:
        items = ["EPL AMP: skipped a training step, its gradients are not finite (", count,
                 " skipped in a row). Weights and optimizer slots are unchanged; global_step "
                 "advances. Dynamic loss scale lowered to ", scale,
                 " (if it stays at 1, the model itself produces inf/NaN)."]
    else:
        items = ["EPL AMP: skipped a training step, its gradients are not finite (", count,
                 " skipped in a row) with the fixed amp.loss_scale ", scale,
                 ". Weights and optimizer slots are unchanged; global_step advances. A fixed "
                 "scale that overflows keeps skipping: set amp.loss_scale to \"dynamic\" or "
                 "lower it."]
    printed = tf.print(*items, sep="", output_stream=sys.stderr, name="warn_skipped")
    off, on = tf_adapter.switch(due, due)
    with tf.control_dependencies([printed]):
        on = tf.identity(on)
    return tf_adapter.merge([on, tf.identity(off)]).op
