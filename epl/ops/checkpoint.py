"""Checkpoints of split layers: every shard saved, as a slice of the unsplit variable.

A sharded variable is saved under its unsplit name and shape, each shard as
its slice (TF's partitioned-variable format). So a checkpoint written by the
split model restores into the unsplit one and back, and into a split over
another number of devices: users can change the device count between runs.

The savers of the graph (the user's, MonitoredTrainingSession's) are adapted
once the graph is parallelized (or when made later): their save and restore
ops are rebuilt over the same variables, with each sharded variable replaced
by one saveable per shard of replica 0. Restored shards reach the other
replicas through EPL's broadcast, which a restore re-arms.

When replica 0's shards live on several workers, worker 0 (the one that saves)
reads the others' shards through references to their variables (same device,
same shared name). Every worker restores its own shards from its checkpoint, if
it has one, and worker 0's restore reaches the other workers' shards after the
first-run broadcast (:func:`remote_restore`), so only worker 0 needs the
checkpoint. A worker whose shards worker 0 reads keeps its server up at exit
until worker 0 is done, so the checkpoint written after the last step is complete.
"""
import collections
import threading
import weakref

from epl import tf_adapter
from epl.ops.shards import shard_bounds
from epl.protocols.passes import LOWER, SYNC, Pass
from epl.tf_adapter import tf

_SAVERS = weakref.WeakKeyDictionary()    # tf.Graph -> WeakSet of savers
_ADAPTERS = weakref.WeakKeyDictionary()  # tf.Graph -> [function(saver)]
_REBUILDING = []                          # non-empty while EPL makes its own saver


class SplitCheckpointError(RuntimeError):
    """A checkpoint of split variables cannot be written as asked."""


def remember(saver, graph):
    """Record a saver of ``graph``; adapt it at once if the graph is parallelized."""
    if _REBUILDING:
        return
    _SAVERS.setdefault(graph, weakref.WeakSet()).add(saver)
    for adapt in _ADAPTERS.get(graph, ()):
        adapt(saver)


def add_saver_adapter(graph, adapt):
    """Call ``adapt(saver)`` for every saver of ``graph``, those made so far and later
    ones (a parallelized graph's savers must cover state the rewrite added or spread)."""
    def in_graph(saver):
        with graph.as_default():
            adapt(saver)
    _ADAPTERS.setdefault(graph, []).append(in_graph)
    for saver in list(_SAVERS.get(graph, ())):
        in_graph(saver)


def rebuild(saver, var_list):
    """Point ``saver``'s save and restore ops at ``var_list`` (variables and saveables),
    keeping its options."""
    _REBUILDING.append(saver)
    try:
        saver.saver_def = tf_adapter.rebuild_saver(saver, var_list)
    finally:
        _REBUILDING.pop()


RemoteState = collections.namedtuple("RemoteState", ["name", "slice_spec", "variable"])
RemoteState.__doc__ = """State another worker holds and worker 0 saves: its checkpoint
``name``, its ``slice_spec`` ("" for a whole variable) and ``variable``, worker 0's
reference to it (a variable op on the holder's device, see
``tf_adapter.remote_variable``)."""


def remote_restore(saver, host, remote):
    """Let ``saver``'s restores on worker 0 also reach ``remote`` state (after sync).

    A holder initializes its state in its own session, at a time worker 0 cannot
    see, so worker 0 cannot write that state when it restores. It does so after
    EPL's first-run broadcast, which every worker joins only after initializing
    or restoring: the op built here reads ``remote`` from the checkpoint the
    session restored last and assigns it (see :func:`barrier_after_sync`). So a
    job restores when only worker 0's directory holds checkpoints (``epl-launch``
    gives each worker its own)."""
    if not remote:
        return
    with tf.device(host), tf.name_scope("EPL_REMOTE_RESTORE"):
        path = tf.placeholder(tf.string, [], name="path")
        values = tf.raw_ops.RestoreV2(
            prefix=path, tensor_names=[state.name for state in remote],
            shape_and_slices=[state.slice_spec for state in remote],
            dtypes=[tf_adapter.variable_dtype(state.variable) for state in remote])
    assigns = []
    for state, value in zip(remote, values):
        with tf.device(state.variable.device), tf.name_scope("EPL_REMOTE_RESTORE"):
            assigns.append(tf_adapter.assign_any_shape(state.variable, value))
    with tf.device(host):
        saver._epl_remote_restore = (path, tf.group(*assigns, name="EPL_REMOTE_RESTORE/assign"))


def barrier_after_sync(ctx):
    """After each first-run broadcast: worker 0 runs the remote restore of the saver
    the session last restored with (:func:`remote_restore`), then every worker passes
    a barrier, so no holder starts a step before its state is restored. Call it on
    every worker of a program whose worker 0 may restore others' state, before the
    ``variable_sync`` pass (whose op sets up the communicators)."""
    if getattr(ctx.program, "_epl_restore_barrier", False):
        return
    ctx.program._epl_restore_barrier = True
    comm = ctx.communicator(ctx.plan.host_group, SYNC)
    with tf.device(ctx.host), tf.name_scope("EPL_REMOTE_RESTORE"):
        barrier = comm.all_reduce(tf.constant(1.0), ctx.host, "remote_restore_barrier",
                                  mean=False).op
    ctx.program.after_sync.append(_AfterSync(barrier))


class _AfterSync(object):
    """One step of ``program.after_sync`` (see :func:`barrier_after_sync`)."""

    def __init__(self, barrier):
        self._barrier = barrier

    def __call__(self, run, restored):
        pending = getattr(restored[0], "_epl_remote_restore", None) if restored else None
        if pending is not None:
            path, op = pending
            run(op, {path: restored[1]})
        run(self._barrier, None)


class ShardedCheckpoints(Pass):
    """Rebuild the graph's savers so that they write and read every shard."""

    name = "sharded_checkpoints"
    phase = LOWER
    reads = ("view", "cluster", "plan", "copies", "repetition")
    writes = ("graph",)

    def applies(self, ctx):
        return bool(ctx.sharded_variables)

    def run(self, ctx):
        _keep_shards_readable(ctx)
        saveables, problem = _saveables(ctx)
        host = ctx.host
        add_saver_adapter(ctx.tf_graph, lambda saver: _adapt(saver, saveables, problem, host))
        if _shards_elsewhere(ctx):
            barrier_after_sync(ctx)


def _keep_shards_readable(ctx):
    """On a worker other than 0 that holds shards of replica 0 (worker 0 saves them),
    keep the server up at exit until worker 0 is done: its last checkpoint, written
    after the last step, reads them. In-process workers (threads, as in tests) share
    the process, whose servers outlive every worker."""
    from epl.session import roles, serving
    if roles.writes_checkpoints(ctx.cluster) or not _shard_copies(ctx):
        return
    if threading.current_thread() is not threading.main_thread():
        return
    serving.linger_at_exit(ctx.cluster.hosts[0], ctx.config.communication.timeout)


def _shard_copies(ctx):
    """{position: local copy index} of replica 0's copies on this worker."""
    return dict((copy.position, index) for index, copy in enumerate(ctx.copies)
                if copy.replica == 0)


def _shards_elsewhere(ctx):
    """True on every worker when a worker other than 0 holds shards of replica 0 (which
    worker 0 saves, and restores for it)."""
    return any(copy.replica == 0 for worker in range(1, ctx.plan.worker_num)
               for copy in ctx.plan.copies_of(worker))


def _remote_copies(ctx):
    """{position: Copy record on its worker} of replica 0's copies other workers hold.

    Every worker builds its copies with the same structure (copy j of any worker
    has the same op names), so this worker's copy j names the variables of another
    worker's copy j."""
    me = ctx.cluster.worker_index
    found = {}
    for worker in range(ctx.plan.worker_num):
        if worker == me:
            continue
        for copy in ctx.plan.copies_of(worker):
            if copy.replica == 0:
                found[copy.position] = copy
    return found


def _saveables(ctx):
    """({variable name: [saveable of each of replica 0's shards]}, problem or None).

    Shards this worker holds are saved and restored here; shards another worker
    holds are read through a reference to that worker's variable (saving) and
    restored by that worker itself (every worker restores its own shards)."""
    from epl.session import roles
    local, remote = _shard_copies(ctx), _remote_copies(ctx)
    writes = roles.writes_checkpoints(ctx.cluster)
    saveables, problem = {}, None
    for name, info in sorted(ctx.sharded_variables.items()):
        var_op = ctx.tf_graph.get_operation_by_name(name)
        taskgraph = ctx.view.info(var_op).taskgraph
        shards = []
        for position in range(info.width):
            if position in local:
                shards.append(_Shard(name, info, position,
                                     ctx.instance(var_op, local[position])))
                continue
            if not writes:   # only worker 0 saves; another worker restores its own shards
                continue
            copy = remote.get(position)
            if copy is None or copy.index >= len(ctx.copies):
                problem = ("variable %r is split over %d devices and no copy of this worker "
                           "names shard %d of replica 0" % (name, info.width, position))
                break
            template = ctx.instance(var_op, copy.index)
            remote_op = tf_adapter.remote_variable(
                template, copy.devices[taskgraph], _shard_shape(info, position),
                "EPL_REMOTE_SHARD/%s/%d" % (name, position))
            shards.append(_Shard(name, info, position, remote_op, restores=False))
        saveables[name] = shards
    return saveables, problem


def _shard_shape(info, position):
    shape = list(info.full_shape)
    shape[info.axis] = shard_bounds(info.full_shape[info.axis], info.width, position)[1]
    return shape


class _Shard(tf_adapter.SaveableObject):
    """One shard of a split variable, saved as its slice of the unsplit tensor.

    One saveable per shard (as TF does for partitioned variables), each on its
    shard's device: a sharded ``tf.train.Saver`` (MonitoredTrainingSession's
    default) groups saveables by device and refuses one that spans devices."""

    def __init__(self, name, info, position, var_op, restores=True):
        start, size = shard_bounds(info.full_shape[info.axis], info.width, position)
        offset = [0] * len(info.full_shape)
        offset[info.axis] = start
        shape = list(info.full_shape)
        shape[info.axis] = size
        spec = tf.Variable.SaveSliceInfo(name, info.full_shape, offset, shape).spec
        with tf.device(var_op.device):
            value = tf_adapter.read_variable(var_op)
        self._var_op, self._restores = var_op, restores
        self.checkpoint_name, self.slice_spec = name, spec
        # The checkpoint name (the spec's) is the unsplit variable's; the saveable's own
        # name only keys the Saver's list, so each shard needs its own.
        super(_Shard, self).__init__(var_op.outputs[0], [tf_adapter.SaveSpec(value, spec, name)],
                                     "%s/epl_shard_%d" % (name, position))

    @property
    def restores(self):
        """False for another worker's shard: its holder restores it from its own
        checkpoint, and worker 0 after the first-run broadcast (:func:`remote_restore`)."""
        return self._restores

    @property
    def variable(self):
        return self._var_op

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        if not self._restores:
            return tf.no_op()
        with tf.device(self._var_op.device):
            return tf_adapter.assign_any_shape(self._var_op, restored_tensors[0])


def _adapt(saver, saveables, problem, host):
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
    rebuild(saver, replaced)
    remote_restore(saver, host, [
        RemoteState(entry.checkpoint_name, entry.slice_spec, entry.variable)
        for entry in replaced if isinstance(entry, _Shard) and not entry.restores])


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
