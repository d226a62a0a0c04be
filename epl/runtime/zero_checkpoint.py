"""ZeRO checkpoints: worker 0 saves every optimizer slot and restores them on any layout.

Under ZeRO each worker keeps only the slots of the variables it owns, but only
worker 0 writes checkpoints. A checkpoint must still hold every slot, under the
names a job without ZeRO gives them, so that it restores on the same layout, on
another worker count, or without ZeRO at all.

* **What the others hold.** While the step is built, worker 0 also calls the
  optimizer for the variables it does not own, once per owner, with zero
  gradients and in EPL's own phase (:func:`describe_remote_slots`). The
  variables that call creates have the names, shapes and types the owner's call
  gives its slots (names come from the primary variable and the optimizer, not
  from the order of calls). They are taken out of every collection and never
  run: they only describe the owner's variables (*templates*). An optimizer that
  cannot be called twice leaves the saver to refuse with the reason.
* **Saving** (:class:`ZeroCheckpoints`, worker 0). Each template gets a
  reference to the variable of the same name on its owner's device (in a TF
  cluster that is the same variable) and a saveable that reads it onto worker
  0's CPU, so the slots land in worker 0's files. Every saver of everything (no
  ``var_list``) or of a list that holds worker 0's own slots gets them added.
* **Restoring.** Owners initialize their slots in their own session, at a moment
  worker 0 cannot see, so a restore on worker 0 writes the owners' slots only
  after EPL's first-run broadcast, which every worker joins after its
  initialization (``epl.ops.checkpoint.remote_restore``): worker 0 reads the
  remote slots from the checkpoint it restored and assigns them, then every
  worker passes a barrier before its first step. The other workers need no
  checkpoint of their own: ``epl-launch`` gives each worker its own directory,
  and only worker 0's holds checkpoints.

Every worker keeps its server up at exit until worker 0 is done, because worker
0's last checkpoint (written after the last step) reads the owners' slots.
"""
import collections
import threading

from epl import tf_adapter
from epl.ops import checkpoint
from epl.protocols.passes import LOWER, Pass
from epl.runtime.zero_error import ZeroError
from epl.tf_adapter import tf

RemoteSlot = collections.namedtuple("RemoteSlot", ["name", "owner", "template"])
RemoteSlot.__doc__ = """A variable the optimizer created on worker ``owner`` for a variable
it owns: its checkpoint ``name`` and the local, never-run ``template`` op that has its
type, dtype and shape."""

_SHADOW_SCOPE = "EPL_ZERO_SHADOW"


def describe_remote_slots(call, bound, pairs_arg, pairs, ranks, view, variable_types):
    """(RemoteSlots of the other owners, problem or None), built on worker 0.

    Calls ``call`` (the optimizer, as ZeRO's build-time hook received it) once
    per other owner with zero gradients for that owner's variables, in EPL's
    phase (never classified, copied or run); the variables this creates are the
    templates. ``variable_types`` are the op types of variables.
    """
    from epl.ir.phase import Phase
    graph = tf_adapter.get_default_graph()
    found = []
    for owner in sorted(set(ranks) - {0}):
        owned = [(tf.zeros(v.shape, v.dtype.base_dtype), v)
                 for (_, v), rank in zip(pairs, ranks) if rank == owner]
        start = len(graph.get_operations())
        try:
            with view.phase_scope(Phase.EPL), tf.name_scope(_SHADOW_SCOPE):
                call(_shadow_arguments(bound, pairs_arg, owned))
        except Exception as err:  # any optimizer: the saver names the reason instead
            return (), ("worker 0 could not learn the optimizer's slots of worker %d's "
                        "variables (%s: %s)" % (owner, type(err).__name__, err))
        created = graph.get_operations()[start:]
        _drop_from_collections(graph, set(created))
        found += [RemoteSlot(op.name, owner, op) for op in created
                  if op.type in variable_types]
    return tuple(found), None


def _shadow_arguments(bound, pairs_arg, pairs):
    arguments = bound.signature.bind_partial()
    arguments.arguments.update(bound.arguments)
    arguments.arguments[pairs_arg] = tuple(pairs)
    for name in ("global_step", "name"):
        if name in arguments.arguments:
            arguments.arguments[name] = None
    return arguments


def _drop_from_collections(graph, created):
    """Templates are no variables of this worker: not initialized, saved or listed."""
    for key in graph.get_all_collection_keys():
        items = graph.get_collection_ref(key)
        kept = [item for item in items if _op_of(item) not in created]
        if len(kept) != len(items):
            items[:] = kept


def _op_of(item):
    op = getattr(item, "op", None)
    if op is None and isinstance(item, tf.Operation):
        return item
    return op if isinstance(op, tf.Operation) else None


# ---- the rewrite -------------------------------------------------------------------
class ZeroCheckpoints(Pass):
    """Worker 0's savers cover every worker's slots; a restore reaches the owners."""

    name = "zero_checkpoints"
    phase = LOWER
    reads = ("view", "config", "cluster", "plan")
    writes = ("graph", "communicators", "program.after_sync")

    def applies(self, ctx):
        record = getattr(ctx.view, "zero", None)
        return record is not None and record.members > 1

    def run(self, ctx):
        record = ctx.view.zero
        if record.rank == 0 and record.remote_slots:
            host = ctx.host
            refs = [(slot, _remote_reference(ctx, slot)) for slot in record.remote_slots]
            saveables = [_RemoteSlot(slot.name, ref, host) for slot, ref in refs]
            states = [checkpoint.RemoteState(slot.name, "", ref) for slot, ref in refs]
            checkpoint.add_saver_adapter(
                ctx.tf_graph, lambda saver: _complete(saver, saveables, states, record, host))
            ctx.program.after_sync.append(_OwnersHoldTheirSlots(refs, host))
        elif record.rank != 0:
            _keep_slots_readable(ctx)
        checkpoint.barrier_after_sync(ctx)


def _remote_reference(ctx, slot):
    """The owner's variable of ``slot``'s name, on the owner's device."""
    return tf_adapter.remote_variable(
        slot.template, _owner_device(ctx, slot), tf_adapter.variable_shape(slot.template),
        "EPL_ZERO_REMOTE/%s" % slot.name)


def _owner_device(ctx, slot):
    """Where the owner placed the slot: where this worker placed the variable the template
    is colocated with (optimizers colocate slots with their variable), on the owner;
    else the owner's device of the TaskGraph."""
    root = tf_adapter.colocation_root(slot.template)
    local = ""
    if root is not None:
        try:
            local = ctx.tf_graph.get_operation_by_name(root).device
        except KeyError:
            local = ""
    if not local:
        return ctx.plan.copies_of(slot.owner)[0].devices[0]
    spec = tf.DeviceSpec.from_string(local)
    spec.task = slot.owner
    return spec.to_string()


class _OwnersHoldTheirSlots(object):
    """After the first-run broadcast (every owner has initialized): each slot worker 0
    learned of exists on its owner. An optimizer that names its variables by creation
    order would make worker 0 name slots the owner does not have; a checkpoint of
    them would fail much later, or restore into nothing."""

    def __init__(self, refs, host):
        self._slots = [slot for slot, _ in refs]
        checks = []
        for _, ref in refs:
            with tf.device(ref.device):
                checks.append(tf_adapter.is_variable_initialized(ref))
        with tf.device(host), tf.name_scope("EPL_ZERO_REMOTE"):
            self._op = tf.stack(checks, name="owners_hold_slots")

    def __call__(self, run, restored):
        del restored
        missing = [slot for slot, held in zip(self._slots, run(self._op, None)) if not held]
        if missing:
            raise ZeroError(
                "zero.level: worker 0 expected these optimizer variables on their owners, "
                "which do not have them: %s. The optimizer names its variables by the order "
                "of its calls, so worker 0 cannot name another worker's; save only the model "
                "variables (tf.train.Saver(var_list=tf.trainable_variables())) or run without "
                "ZeRO" % ", ".join("%s (worker %d)" % (s.name, s.owner) for s in missing[:5]))


class _RemoteSlot(tf_adapter.SaveableObject):
    """Another worker's slot, saved from worker 0 (read onto its CPU, so it lands in
    worker 0's files); restored after the first-run broadcast, not by the saver."""

    def __init__(self, name, ref, host):
        with tf.device(ref.device):
            value = tf_adapter.read_variable(ref)
        with tf.device(host):
            value = tf.identity(value, name="EPL_ZERO_REMOTE/read")
        super(_RemoteSlot, self).__init__(ref.outputs[0], [tf_adapter.SaveSpec(value, "", name)],
                                          name)

    def restore(self, restored_tensors, restored_shapes):
        del restored_tensors, restored_shapes
        return tf.no_op()


def _complete(saver, saveables, states, record, host):
    """Add the remote slots to ``saver`` if it saves worker 0's own slots."""
    var_list = tf_adapter.saver_var_list(saver)
    if var_list is not None and not _saved_names(var_list) & record.local_variables:
        return  # the model alone, or another subset without slots
    if isinstance(var_list, dict):
        saver._epl_zero_refuse = (
            "a Saver with a {name: variable} var_list holding optimizer slots: EPL cannot "
            "name the other workers' slots in it; pass a list (or no var_list)")
        return
    entries = list(var_list) if var_list is not None else list(
        tf_adapter.all_saveable_objects())
    checkpoint.rebuild(saver, entries + list(saveables))
    checkpoint.remote_restore(saver, host, states)
    saver._epl_zero_complete = True


def _saved_names(var_list):
    values = var_list.values() if isinstance(var_list, dict) else var_list
    return set(getattr(v, "op", v).name for v in values if hasattr(getattr(v, "op", v), "name"))


def checkpoint_refusal(view, saver):
    """Why ``saver`` would write a checkpoint without the other workers' slots, or None.

    Savers are completed when the graph is rewritten; this is what remains: an
    optimizer worker 0 could not call for the others' variables, a dict var_list."""
    record = getattr(view, "zero", None) if view is not None else None
    if record is None or record.members < 2 or getattr(saver, "_epl_zero_complete", False):
        return None
    reason = getattr(saver, "_epl_zero_refuse", None) or record.remote_problem
    var_list = tf_adapter.saver_var_list(saver)
    if reason is None or (var_list is not None
                          and not _saved_names(var_list) & record.local_variables):
        return None
    return ("zero.level=%r partitions optimizer states over %d workers and this checkpoint "
            "would miss the other workers' slots: %s. Save only the model variables "
            "(tf.train.Saver(var_list=tf.trainable_variables())) or run without ZeRO"
            % (record.level, record.members, reason))


def _keep_slots_readable(ctx):
    """Worker 0's last checkpoint (after the last step) reads this worker's slots: keep
    the server up at exit until worker 0 is done. In-process workers (threads) share
    the process, whose servers outlive every worker."""
    from epl.session import serving
    if threading.current_thread() is not threading.main_thread():
        return
    serving.linger_at_exit(ctx.cluster.hosts[0], ctx.config.communication.timeout,
                           "ZeRO optimizer slots")
