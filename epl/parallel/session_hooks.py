"""Hooks at the session boundary: create, run, save, restore.

* Every session and server gets EPL's ConfigProto (virtual devices, soft
  placement, collective group leader) and, in a multi-worker job, this
  worker's server as target.
* A graph is parallelized at ``Graph.finalize`` or at its first ``run``, so
  plain ``tf.Session`` code is parallel too (the original EPL silently ran
  it serially).
* ``run``/``make_callable`` swap collected tensors for their merged values
  and add the other replicas' ops, so every replica runs in every step; the
  first run after initialization/restore broadcasts replica 0's variables
  (after the initializer's run, never before it: on a tf.train.Server
  variables outlive sessions, so a second graph's variables may already look
  initialized when its initializer starts).
* Only worker 0 writes checkpoints and summaries.

Each wrapper gets ``provider``, a function returning the current
``epl.Env`` (config, cluster, server), so this module never reads globals.
"""
import functools
import inspect
import logging
import weakref

from epl import tf_adapter
from epl.cluster.session_config import session_config
from epl.ir.graph import Graph
from epl.parallel import estimator, rewriter, step_check
from epl.protocols.hooks import Patch
from epl.runtime import zero, zero_checkpoint
from epl.session import roles, serving
from epl.session.runner import (ensure_synced, guarded, mark_initialized, mark_unsynced,
                                restoring)

LOG = logging.getLogger("epl")
_UNWRAPPED_RUN = []                      # BaseSession.run as TF defines it


def _view(graph):
    if graph is None or tf_adapter.is_function_graph(graph):
        return None
    return Graph.get(graph, create=False)


def program_for(graph, provider):
    """The graph's ParallelProgram, rewriting it first if needed (or None)."""
    view = _view(graph)
    if view is None:
        return None
    if rewriter.needs_rewrite(view):
        env = view.owner or provider()
        view.owner = env
        plan = rewriter.plan_for(view, env.config, env.cluster)
        if not plan.copies_of(env.cluster.worker_index):
            serving.serve(env, plan)
        rewriter.parallelize(view, env.config, env.cluster, plan)
    return view.parallel


def _plan(graph, env):
    """The plan of ``graph`` when it is built and will be parallelized, else None:
    a session made before the graph has strategies (or for a graph EPL leaves
    alone) gets no graph-specific settings."""
    view = _view(graph)
    if view is None:
        return None
    if view.parallel is not None:
        return view.parallel.plan
    if view.taskgraphs and _parallel(view):
        return rewriter.plan_for(view, env.config, env.cluster)
    return None


def _device_filters(view, plan, env):
    """Tasks this worker's graph touches; others need not be up for session creation."""
    if not env.cluster.distributed:
        return None
    workers = [env.cluster.worker_index]
    if plan is not None:
        workers = plan.workers_used_by(env.cluster.worker_index)
        if roles.writes_checkpoints(env.cluster):
            workers = sorted(set(workers) | set(_split_shard_workers(plan))
                             | set(_zero_slot_workers(view, plan)))
    return ["/job:worker/task:%d" % w for w in workers]


def _zero_slot_workers(view, plan):
    """Workers that may own ZeRO slots, which worker 0 saves and restores
    (epl.runtime.zero_checkpoint): every worker holding a device of the plan."""
    if zero.build_record(view) is None:
        return []
    return sorted(set(plan.worker_of[device] for tg in plan.taskgraphs
                      for replica in tg.devices for device in replica))


def _split_shard_workers(plan):
    """Workers holding a shard of replica 0 of a split TaskGraph: worker 0 reads
    those shards when it saves a checkpoint (epl/ops/checkpoint.py)."""
    from epl.parallel.mesh import SPLIT
    return [plan.worker_of[device] for tg in plan.taskgraphs if tg.kind == SPLIT
            for device in tg.devices[0]]


def _parallel(view):
    """True if ``view``'s graph is (or will be) parallelized; graphs EPL leaves alone
    (evaluation, prediction) reach only this worker, so their sessions never wait
    for a peer that has finished."""
    if view.parallel is not None:
        return True
    return view.has_training_step and not step_check.left_alone(view)


def _wrap_session_init(original, provider):
    """Sessions get EPL's ConfigProto for the graph's plan (session_config). Every
    pipelined plan gets ``ordered_sends``, whichever lowering repeats its step: the
    schedule barriers of unrolled copies are removed by grappler's dependency
    optimizer in distributed sessions as well as stage functions' send Identities
    (tests/multiworker/test_schedule_barriers_workers.py)."""
    @functools.wraps(original)
    def __init__(self, target="", graph=None, config=None):
        env = provider()
        graph_ = graph if graph is not None else tf_adapter.get_default_graph()
        plan = _plan(graph_, env)
        config = session_config(env.cluster, config, _device_filters(_view(graph_), plan, env),
                                calls_functions=plan is not None and plan.calls_functions,
                                ordered_sends=plan is not None and bool(plan.pipeline),
                                place_pruned=env.config.cluster.place_pruned_graph)
        if env.cluster.distributed and not target:
            target = env.get_or_create_server(config).target
        original(self, target, graph, config)
    return __init__


def _ops_of(elements):
    return [getattr(e, "op", e) for e in elements]


def _expand(graph, program, fetches):
    """(mapper, flat list to fetch, number of user elements)."""
    mapper = tf_adapter.fetch_mapper(graph, fetches)
    elements = mapper.unique_fetches()
    substitutes, extras, seen = [], [], set()
    for element in elements:
        substitute, more = program.map_element(element)
        substitutes.append(substitute)
        for op in more:
            if op.name not in seen:
                seen.add(op.name)
                extras.append(op)
    return mapper, substitutes + extras, len(substitutes)


def _wrap_session_run(original, provider):
    _UNWRAPPED_RUN[:] = [original]

    @functools.wraps(original)
    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        program = program_for(self.graph, provider)
        if program is None:
            return original(self, fetches, feed_dict, options, run_metadata)
        mapper, flat, count = _expand(self.graph, program, fetches)
        ops = _ops_of(flat)
        initializing = _initializes_variables(program, self.graph, ops)
        snapshots, training = _snapshots(self.graph, provider), False
        if not initializing:
            training = snapshots.before_run(self, program, original, ops, feed_dict)
            ensure_synced(self, program, original)
        values = guarded(program, ops,
                         lambda keyed: original(self, flat, feed_dict, keyed, run_metadata),
                         options)
        if initializing:
            mark_initialized(self, program)
        snapshots.after_run(self, program, original, training)
        return mapper.build_results(values[:count])
    return run


def _snapshots(graph, provider):
    """The resume and snapshot state of the Env that owns ``graph`` (epl.session.resume)."""
    view = _view(graph)
    return ((view.owner if view is not None else None) or provider()).snapshots


def _wrap_make_callable(original, provider):
    @functools.wraps(original)
    def make_callable(self, fetches, feed_list=None, accept_options=False):
        program = program_for(self.graph, provider)
        if program is None:
            return original(self, fetches, feed_list, accept_options)
        mapper, flat, count = _expand(self.graph, program, fetches)
        # options always accepted: a run crossing workers carries its collective graph key
        inner = original(self, flat, feed_list, True)
        ops = _ops_of(flat)
        initializing = _initializes_variables(program, self.graph, ops)

        def call(*args, **kwargs):
            run, training = _UNWRAPPED_RUN[0], False
            snapshots = _snapshots(self.graph, provider)
            if not initializing:
                training = snapshots.before_run(self, program, run, ops, None)
                ensure_synced(self, program, run)
            options = kwargs.pop("options", None) if accept_options else None
            values = guarded(program, ops,
                             lambda keyed: inner(*args, options=keyed, **kwargs), options)
            if initializing:
                mark_initialized(self, program)
            snapshots.after_run(self, program, run, training)
            return mapper.build_results(values[:count])
        return call
    return make_callable


_INIT_OPS = weakref.WeakKeyDictionary()   # program -> (initializer names, {op name: bool})


def _initializes_variables(program, graph, ops):
    """True if running ``ops`` (re)initializes some of the user's variables.

    The copies are synchronized *after* such a run, never before it: on a
    tf.train.Server variables outlive sessions, so a new graph's variables can
    already be initialized (with an earlier graph's values) when its first run,
    the initializer, starts; a sync then would copy stale values that the
    initializer replaces on copy 0 only (a second Estimator.train in one process).
    """
    if program not in _INIT_OPS:
        names = set(program.variable_copies)
        inits = set(v.initializer.name for key in (tf_adapter.tf.GraphKeys.GLOBAL_VARIABLES,
                                                   tf_adapter.tf.GraphKeys.LOCAL_VARIABLES)
                    for v in graph.get_collection(key) if v.op.name in names)
        _INIT_OPS[program] = (inits, {})
    inits, seen = _INIT_OPS[program]
    return any(_reaches_initializer(op, inits, seen, 4) for op in ops)


def _reaches_initializer(op, inits, seen, depth):
    """``op`` is an initializer or a group (NoOp) of them, a few levels deep."""
    if op.name in seen:
        return seen[op.name]
    found = op.name in inits or (depth > 0 and op.type == "NoOp" and any(
        _reaches_initializer(c, inits, seen, depth - 1) for c in op.control_inputs))
    seen[op.name] = found
    return found


def _wrap_graph_finalize(original, provider):
    @functools.wraps(original)
    def finalize(self):
        program_for(self, provider)
        original(self)
    return finalize


def _wrap_saver_save(original, provider):
    @functools.wraps(original)
    def save(self, sess, save_path, *args, **kwargs):
        if not roles.writes_checkpoints(provider().cluster):
            LOG.debug("EPL: only worker 0 writes checkpoints; skipping save to %s", save_path)
            return None
        from epl.ops import checkpoint
        if checkpoint.refusal(self):
            raise checkpoint.SplitCheckpointError(checkpoint.refusal(self))
        _refuse_zero_save(self, sess)
        return original(self, sess, save_path, *args, **kwargs)
    return save


def _refuse_zero_save(saver, sess):
    """ZeRO keeps slots on their owners only: a checkpoint of them would be partial."""
    view = Graph.get(sess.graph, create=False)
    if view is None or zero.build_record(view) is None:
        return
    reason = zero_checkpoint.checkpoint_refusal(view, saver)
    if reason:
        raise zero.ZeroError(reason)


def _wrap_saver_restore(original, provider):
    del provider

    @functools.wraps(original)
    def restore(self, sess, save_path):
        with restoring(sess):
            result = original(self, sess, save_path)
        mark_unsynced(sess, (self, save_path))
        return result
    return restore


def _wrap_server_init(original, provider):
    @functools.wraps(original)
    def __init__(self, server_or_cluster_def, job_name=None, task_index=None, protocol=None,
                 config=None, start=True):
        env = provider()
        config = session_config(env.cluster, config,
                                place_pruned=env.config.cluster.place_pruned_graph)
        original(self, server_or_cluster_def, job_name, task_index, protocol, config, start)
        if env.server is None:
            env.server = self
    return __init__


def _wrap_monitored_training_session(original, provider):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def MonitoredTrainingSession(*args, **kwargs):  # noqa: N802 (TF's name)
        bound = signature.bind(*args, **kwargs)
        roles.monitored_session_arguments(provider().cluster, bound.arguments)
        return original(*bound.args, **bound.kwargs)
    return MonitoredTrainingSession


def patches(provider):
    """The session-boundary patches, bound to an Env provider."""
    bind = lambda make: (lambda original: make(original, provider))
    result = [
        Patch("session", tf_adapter.SESSION_INIT, bind(_wrap_session_init)),
        Patch("session", tf_adapter.SESSION_RUN, bind(_wrap_session_run)),
        Patch("session", tf_adapter.SESSION_MAKE_CALLABLE, bind(_wrap_make_callable)),
        Patch("session", tf_adapter.GRAPH_FINALIZE, bind(_wrap_graph_finalize)),
        Patch("session", tf_adapter.SERVER_INIT, bind(_wrap_server_init)),
        Patch("checkpoint", tf_adapter.SAVER_SAVE, bind(_wrap_saver_save)),
        Patch("checkpoint", tf_adapter.SAVER_RESTORE, bind(_wrap_saver_restore)),
    ]
    for target in tf_adapter.monitored_training_session_targets():
        result.append(Patch("session", target, bind(_wrap_monitored_training_session)))
    return result + estimator.patches(provider)
