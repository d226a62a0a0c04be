"""The end of the input ends the step on every replica: an agreement before the model runs.

Each replica pulls its own batches. When one replica's iterator runs out before
the others (batches per epoch not divisible by the replicas, files of different
sizes per worker), a plain ``IteratorGetNext`` fails that replica's step alone,
and the other replicas wait in their gradient collectives for a member that never
comes: ``communication.timeout`` on one worker, an error on the others.

The rule (docs/data_parallelism.md, "The end of the input"): when any replica of
the job runs out of input, every replica stops at that same step, the step is
applied nowhere, and every worker's ``session.run`` raises ``OutOfRangeError``,
so MonitoredTrainingSession, Estimator and ``except OutOfRangeError`` loops end
as in plain TensorFlow. This pass lowers it:

1. every pull of the step (copies, micro-batches) becomes
   ``IteratorGetNextAsOptional`` plus ``OptionalHasValue``; pulls stay in the
   order :class:`epl.parallel.passes.input_order.InputOrder` gave them;
2. the flags are and-ed on this worker and, with several driver workers, summed
   over the plan's host group (one scalar all-reduce per step);
3. a guard on the host raises ``OutOfRangeError`` unless every replica has data;
   each pull's values (``OptionalGetValue``) wait for the guard, and so do the
   EPL state writes that do not depend on the input (``ctx.per_run_writes``:
   the accumulation counter). So no model op, no collective and no update of
   the step starts anywhere before every replica knows that all have data.

Reads: roles, copies, the repetition, the plan's host group. Writes: the guarded
pulls, the agreement collective, and ``program.fetches`` (substitutes and extras:
a fetch of a batch reads the guarded batches, it never pulls again).
"""
import collections
import logging

from epl import tf_adapter
from epl.ir.phase import Phase
from epl.parallel.context import INPUT
from epl.parallel.passes import LOWER, Pass
from epl.protocols.passes import END_OF_INPUT_STOP
from epl.ir.roles import GET_NEXT_TYPES
from epl.tf_adapter import tf

LOG = logging.getLogger("epl")
GUARDED_TYPES = frozenset(["IteratorGetNext", "IteratorGetNextSync"])
# Pulls the rule cannot guard (queues, readers: no optional form). A user's own
# IteratorGetNextAsOptional already sees the end itself.
UNGUARDED_TYPES = GET_NEXT_TYPES - GUARDED_TYPES - frozenset(["IteratorGetNextAsOptional"])

Pull = collections.namedtuple("Pull", ["user_op", "op"])


class EndOfInput(Pass):
    """Guard every pull of the step behind an end-of-input agreement of all replicas."""

    name = "end_of_input"
    phase = LOWER
    reads = ("view", "config", "cluster", "plan", "copies", "repetition", "roles",
             "per_run_writes")
    writes = ("graph", "communicators", "program.fetches")

    def applies(self, ctx):
        if not ctx.view.has_training_step:
            return False
        pulls = step_pulls(ctx, GUARDED_TYPES | UNGUARDED_TYPES)
        return bool(pulls) and (len(pulls) > 1 or ctx.plan.host_group.size > 1
                                or ctx.plan.gradient_accumulation)

    def run(self, ctx):
        _warn_unguarded(step_pulls(ctx, UNGUARDED_TYPES))
        pulls = step_pulls(ctx)
        if not pulls:
            return
        optionals = _optional_pulls(ctx, pulls)
        guard = _guard(ctx, [flag for _, flag in optionals.values()])
        batches = {}
        for pull in pulls:
            optional, _ = optionals[id(pull.op)]
            batches[id(pull.op)] = _values(pull.op, optional, guard)
            _replace(ctx, pull, batches[id(pull.op)], optionals)
        extras = ctx.program.fetches.extras
        for name, ops in extras.items():  # a fetch of a batch runs every copy's
            extras[name] = [batches[id(op)][0].op if id(op) in batches else op for op in ops]
        for op in ctx.per_run_writes:
            tf_adapter.add_control_inputs(op, [guard])


def step_pulls(ctx, types=GUARDED_TYPES):
    """Every :class:`Pull` this worker makes in a step, in pull order (micro-batch
    major): instances of the step's get-next ops of ``types`` (default: tf.data's)
    that something consumes (copies reading a slice of their replica's batch do
    not pull)."""
    result, seen = [], set()
    for user_op in ctx.roles.cloned:
        if user_op.type not in types or user_op.name not in ctx.roles.step:
            continue
        for micro_batch in range(ctx.num_micro_batch):
            for copy in range(len(ctx.copies)):
                op = ctx.instance(user_op, copy, micro_batch)
                if id(op) in seen or not any(t.consumers() for t in op.outputs):
                    continue
                seen.add(id(op))
                result.append(Pull(user_op, op))
    return result


def _warn_unguarded(pulls):
    names = sorted(set("%s (%s)" % (p.user_op.name, p.user_op.type) for p in pulls))
    if names:
        LOG.warning(
            "EPL: the training step reads %s, which EPL cannot guard at the end of the input "
            "(the end-of-input rule covers tf.data iterators). If one replica's input ends "
            "before the others', that replica stops alone and the others wait for it in "
            "their collectives until communication.timeout. Read the input with tf.data, or "
            "repeat it and stop after a number of steps.", ", ".join(names))


def _optional_pulls(ctx, pulls):
    """{id(pull op): (optional, has-value flag)}; each new pull waits for the new
    pulls its old one waited for (the input order) and for the user's own control
    inputs, never for EPL's (schedule barriers wait for the pulls' values)."""
    result = {}
    for pull in pulls:
        old = pull.op
        before = [result[id(c)][0].op for c in old.control_inputs if id(c) in result]
        before += [c for c in old.control_inputs if id(c) not in result and _users(ctx, c)]
        with tf.device(old.device), tf.name_scope("EPL_END_OF_INPUT"), \
                tf.control_dependencies(before):
            optional = tf.raw_ops.IteratorGetNextAsOptional(
                iterator=old.inputs[0], output_types=old.get_attr("output_types"),
                output_shapes=old.get_attr("output_shapes"), name="pull")
            flag = tf.raw_ops.OptionalHasValue(optional=optional, name="has_input")
        result[id(old)] = (optional, flag)
    return result


def _users(ctx, op):
    info = ctx.view.info(op)
    return info is None or info.phase != Phase.EPL


def _guard(ctx, flags):
    """An op on the host that raises OutOfRangeError unless every replica of the job
    has a batch for this step."""
    group = ctx.plan.host_group
    with tf.device(ctx.host), tf.name_scope("EPL_END_OF_INPUT"):
        agreed = tf.reduce_all(tf.stack(flags), name="local")
        if group.size > 1:
            comm = ctx.communicator(group, INPUT)
            total = comm.all_reduce(tf.cast(agreed, tf.float32), ctx.host, "has_input",
                                    mean=False)
            agreed = tf.greater(total, group.size - 0.5, name="everyone")
        with tf.name_scope(END_OF_INPUT_STOP):
            stop = tf.data.make_one_shot_iterator(tf.data.Dataset.range(0))
        return tf.cond(agreed, lambda: tf.constant(0, tf.int64), stop.get_next,
                       name="check").op


def _values(old, optional, guard):
    """The pull's batch, read once the guard passed."""
    with tf.device(old.device), tf.name_scope("EPL_END_OF_INPUT"), \
            tf.control_dependencies([guard]):
        values = tf.raw_ops.OptionalGetValue(
            optional=optional, output_types=old.get_attr("output_types"),
            output_shapes=old.get_attr("output_shapes"), name="batch")
    for value, tensor in zip(values, old.outputs):
        value.set_shape(tensor.shape)
    return values


def _replace(ctx, pull, values, optionals):
    """Readers of the old pull read the guarded batch; ops that waited for the old
    pull wait for the batch (the old pulls are left without readers and never run)."""
    old = pull.op
    for tensor, value in zip(old.outputs, values):
        ctx.rewire(tensor, value, list(tensor.consumers()))
        if old is pull.user_op:
            ctx.program.fetches.substitutes[tensor.name] = value
    for op in tf_adapter.control_outputs(old):
        if id(op) not in optionals:
            tf_adapter.replace_control_input(op, old, values[0].op)
