"""Checkpoints of split layers: every shard saved, as a slice of the unsplit variable.

A sharded variable is saved under its unsplit name and shape, each shard as
its slice (TF's partitioned-variable format). So a checkpoint written by the
split model restores into the unsplit one and back, and into a split over
another number of devices: users can change the device count between runs.

The savers of the graph (the user's, MonitoredTrainingSession's) are adapted
once the graph is parallelized (or when made later): their save and restore
ops are rebuilt over the same variables, with each sharded variable replaced
by one saveable over replica 0's shards. Restored shards reach the other
replicas through EPL's broadcast, which a restore re-arms.

A replica whose shards live on several workers cannot be written by worker 0
alone yet: saving then fails with a message instead of writing an incomplete
checkpoint.
"""
import weakref

from epl import tf_adapter
from epl.ops.shards import shard_bounds
from epl.parallel.passes import LOWER, Pass
from epl.tf_adapter import tf

_SAVERS = weakref.WeakKeyDictionary()    # tf.Graph -> WeakSet of savers
_ADAPTERS = weakref.WeakKeyDictionary()  # tf.Graph -> function(saver)
_REBUILDING = []                          # non-empty while EPL makes its own saver


class SplitCheckpointError(RuntimeError):
    """A checkpoint of split variables cannot be written as asked."""


def remember(saver, graph):
    """Record a saver of ``graph``; adapt it at once if the graph is parallelized."""
    if _REBUILDING:
        return
    _SAVERS.setdefault(graph, weakref.WeakSet()).add(saver)
    adapt = _ADAPTERS.get(graph)
    if adapt is not None:
        adapt(saver)


class ShardedCheckpoints(Pass):
    """Rebuild the graph's savers so that they write and read every shard."""

    name = "sharded_checkpoints"
    phase = LOWER
    reads = ("sharded variables", "copies", "the graph's savers")
    writes = ("savers' save and restore ops",)

    def applies(self, ctx):
        return bool(ctx.sharded_variables)

    def run(self, ctx):
        saveables, problem = _saveables(ctx)
        graph = ctx.tf_graph

        def adapt(saver):
            with graph.as_default():
                _adapt(saver, saveables, problem)
        _ADAPTERS[graph] = adapt
        for saver in list(_SAVERS.get(graph, ())):
            adapt(saver)


def _shard_copies(ctx):
    """{position: local copy index} of replica 0's copies on this worker."""
    return dict((copy.position, index) for index, copy in enumerate(ctx.copies)
                if copy.replica == 0)


def _saveables(ctx):
    """({variable name: [saveable of each of replica 0's shards]}, problem or None)."""
    local = _shard_copies(ctx)
    saveables, problem = {}, None
    for name, info in sorted(ctx.sharded_variables.items()):
        if sorted(local) != list(range(info.width)):
            problem = ("variable %r is split over %d devices and this worker holds shards %s "
                       "of replica 0; saving split variables whose shards span workers is not "
                       "supported yet" % (name, info.width, sorted(local)))
            continue
        var_op = ctx.tf_graph.get_operation_by_name(name)
        saveables[name] = [_Shard(name, info, p, ctx.instance(var_op, local[p]))
                           for p in range(info.width)]
    return saveables, problem


class _Shard(tf_adapter.SaveableObject):
    """One shard of a split variable, saved as its slice of the unsplit tensor.

    One saveable per shard (as TF does for partitioned variables), each on its
    shard's device: a sharded ``tf.train.Saver`` (MonitoredTrainingSession's
    default) groups saveables by device and refuses one that spans devices."""

    def __init__(self, name, info, position, var_op):
        start, size = shard_bounds(info.full_shape[info.axis], info.width, position)
        offset = [0] * len(info.full_shape)
        offset[info.axis] = start
        shape = list(info.full_shape)
        shape[info.axis] = size
        spec = tf.Variable.SaveSliceInfo(name, info.full_shape, offset, shape).spec
        with tf.device(var_op.device):
            value = tf_adapter.read_variable(var_op)
        self._var_op = var_op
        # The checkpoint name (the spec's) is the unsplit variable's; the saveable's own
        # name only keys the Saver's list, so each shard needs its own.
        super(_Shard, self).__init__(var_op.outputs[0], [tf_adapter.SaveSpec(value, spec, name)],
                                     "%s/epl_shard_%d" % (name, position))

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        with tf.device(self._var_op.device):
            return tf_adapter.assign_any_shape(self._var_op, restored_tensors[0])


def _adapt(saver, saveables, problem):
    """Point ``saver``'s save/restore at ops over the same variables and every shard."""
    if getattr(saver, "_epl_adapted", False):
        return
    saver._epl_adapted = True
    entries = _var_list(saver)
    if problem is not None:
        saver._epl_refuse = problem
        return
    replaced = []
    for entry in entries:
        replaced.extend(saveables.get(_op_name(entry), [entry]))
    _REBUILDING.append(saver)
    try:
        saver.saver_def = tf_adapter.rebuild_saver(saver, replaced)
    finally:
        _REBUILDING.pop()


def _var_list(saver):
    found = tf_adapter.saver_var_list(saver)
    if found is None:
        found = tf_adapter.all_saveable_objects()
    if isinstance(found, dict):
        return list(found.values())
    return list(found)


def _op_name(value):
    op = getattr(value, "op", None)
    return op.name if op is not None else None


def refusal(saver):
    """Why ``saver`` may not write a checkpoint here, or None."""
    return getattr(saver, "_epl_refuse", None)
