"""ZeRO checkpoints: worker 0 saves every optimizer slot and restores them on any layout.

Under ZeRO each slot lives on its owner's device only (:mod:`epl.runtime.zero`
takes slots out of the graph's collections, so the user's savers do not see
them), and only worker 0 writes checkpoints. A checkpoint must still hold every
slot, under the name a job without ZeRO gives it (the slot's op name, which
every copy's instance shares as its origin), so that it restores on the same
layout, on another number of devices, or without ZeRO at all.

* **Saving** (:class:`ZeroCheckpoints`, worker 0). Each slot gets a reference to
  its owner's instance: the copy's own op when the owner is a local device, else
  a variable op on the owner's device that names the same variable (in a TF
  cluster that is the same variable; the owner's worker names it like this
  worker's copy of the same index). A saveable reads it onto worker 0's CPU, so
  the slots land in worker 0's files. Every saver of everything (no
  ``var_list``), or of a list holding the optimizer's own variables (Adam's beta
  powers) or the global step, gets them added.
* **Restoring.** Owners initialize their slots with EPL's set-up op, which runs
  at the first step after an initialization or a restore; so a restore writes
  the slots after it, following EPL's first-run broadcast, which every worker
  joins (``epl.ops.checkpoint.remote_restore``): worker 0 reads the slots from
  the checkpoint it restored and assigns them, then every worker passes a barrier
  before its first step. The other workers need no checkpoint of their own.

Every worker keeps its server up at exit until worker 0 is done, because worker
0's last checkpoint (written after the last step) reads the owners' slots.
"""
import threading

from epl import tf_adapter
from epl.ops import checkpoint
from epl.protocols.passes import LOWER, Pass
from epl.runtime.zero import build_record
from epl.runtime.zero_error import ZeroError
from epl.session import roles
from epl.tf_adapter import tf


class ZeroCheckpoints(Pass):
    """Worker 0's savers cover every slot; a restore reaches the owners."""

    name = "zero_checkpoints"
    phase = LOWER
    reads = ("view", "config", "cluster", "plan", "worker", "copies", "repetition", "zero")
    writes = ("graph", "communicators", "program.after_sync")

    def applies(self, ctx):
        return getattr(ctx, "zero", None) is not None and bool(ctx.zero.slots)

    def run(self, ctx):
        record = build_record(ctx.view)
        if roles.writes_checkpoints(ctx.cluster):
            host = ctx.host
            refs = [(name, owner_instance(ctx, name)) for name in sorted(ctx.zero.slots)]
            saveables = [_Slot(name, ref, host) for name, ref in refs]
            states = [checkpoint.RemoteState(name, "", ref) for name, ref in refs]
            wanted = set(record.shared_variables)
            step = tf_adapter.global_step_tensor(ctx.tf_graph)
            if step is not None:
                wanted.add(step.op.name)
            checkpoint.add_saver_adapter(
                ctx.tf_graph, lambda saver: _complete(saver, saveables, states, wanted, host))
        elif any(ctx.zero.owned):
            _keep_slots_readable(ctx)
        checkpoint.barrier_after_sync(ctx)


def owner_instance(ctx, slot_name):
    """The variable op of slot ``slot_name`` on its owner's device, as seen from here."""
    slot = ctx.tf_graph.get_operation_by_name(slot_name)
    var_op = ctx.tf_graph.get_operation_by_name(ctx.zero.slots[slot_name])
    taskgraph = ctx.taskgraph_of(var_op)
    owner = ctx.zero.owner.get(var_op.name)
    if owner is None:
        return slot  # every copy updates this variable: copy 0's slot is the one
    key = tf.DeviceSpec.from_string(owner).to_string()
    for index, copy in enumerate(ctx.copies):
        if tf.DeviceSpec.from_string(copy.devices[taskgraph]).to_string() == key:
            return ctx.instance(slot, index)
    worker = ctx.plan.worker_of[owner]
    theirs = ctx.plan.copies_of(worker)
    index = [c.devices[taskgraph] for c in theirs].index(owner)
    if index >= len(ctx.copies):
        raise ZeroError("zero.level: worker %d cannot name slot %s on worker %d's copy %d "
                        "(it has fewer copies); use the same devices per worker"
                        % (ctx.worker, slot_name, worker, index))
    template = ctx.instance(slot, index)
    return tf_adapter.remote_variable(template, owner, tf_adapter.variable_shape(slot),
                                      "EPL_ZERO_REMOTE/%s" % slot_name)


class _Slot(tf_adapter.SaveableObject):
    """A slot on its owner's device, saved from worker 0 (read onto its CPU, so it lands
    in worker 0's files); restored after the first-run broadcast, not by the saver."""

    def __init__(self, name, ref, host):
        with tf.device(ref.device):
            value = tf_adapter.read_variable(ref)
        with tf.device(host):
            value = tf.identity(value, name="EPL_ZERO_SAVE/read")
        super(_Slot, self).__init__(ref.outputs[0], [tf_adapter.SaveSpec(value, "", name)],
                                    name)

    def restore(self, restored_tensors, restored_shapes):
        del restored_tensors, restored_shapes
        return tf.no_op()


def _complete(saver, saveables, states, wanted, host):
    """Add every slot to ``saver`` if it saves the optimizer's state."""
    var_list = tf_adapter.saver_var_list(saver)
    if var_list is not None and not _saved_names(var_list) & wanted:
        return  # the model alone, or another subset without the optimizer's state
    if isinstance(var_list, dict):
        saver._epl_zero_refuse = (
            "a Saver with a {name: variable} var_list holding the optimizer's state: EPL "
            "cannot name the slots ZeRO keeps on their owners in it; pass a list (or no "
            "var_list)")
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
    """Why ``saver`` would write a checkpoint without ZeRO's slots, or None."""
    record = build_record(view) if view is not None else None
    if record is None or getattr(saver, "_epl_zero_complete", False):
        return None
    reason = getattr(saver, "_epl_zero_refuse", None)
    if reason is None:
        return None
    return ("zero.level=%r keeps optimizer slots on their owners and this checkpoint would "
            "miss them: %s. Save only the model variables "
            "(tf.train.Saver(var_list=tf.trainable_variables())) or run without ZeRO"
            % (record.level, reason))


def _keep_slots_readable(ctx):
    """Worker 0's last checkpoint (after the last step) reads this worker's slots: keep
    the server up at exit until worker 0 is done. In-process workers (threads) share
    the process, whose servers outlive every worker."""
    from epl.session import serving
    if threading.current_thread() is not threading.main_thread():
        return
    serving.linger_at_exit(ctx.cluster.hosts[0], ctx.config.communication.timeout,
                           "ZeRO optimizer slots")
