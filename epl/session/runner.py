"""Running a parallelized graph: the first-run broadcast and guarded runs.

* ``ensure_synced``: once per session, after the user's variables are
  initialized or restored, replica 0's values are broadcast to every copy;
* ``guarded``: a run that reaches collectives first checks that the peers'
  servers are up (a missing worker is named, not waited for forever) and runs
  under the watchdog.
"""
import contextlib
import logging
import threading
import weakref

from epl.session.faults import PeerLostError
from epl.session.reachability import wait_until_reachable
from epl.tf_adapter import tf
from epl.session.watchdog import WATCHDOG

LOG = logging.getLogger("epl")
# session -> True (copies equal replica 0), _INITIALIZED (the user's initializers ran
# and set the copies too) or _NEEDS_BROADCAST; absent: unknown, broadcast when initialized
_SYNCED = weakref.WeakKeyDictionary()
_INITIALIZED, _NEEDS_BROADCAST = "initialized", "needs broadcast"
_RESTORED = weakref.WeakKeyDictionary()  # session -> (saver, path) of its last restore
_RESTORING = weakref.WeakKeyDictionary()  # session -> number of restores under way
_SYNC_LOCKS = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
_PREFLIGHT_DONE = weakref.WeakKeyDictionary()  # program -> True once peers answered


def preflight(program):
    """Fail fast, naming them, when collective peers never come up."""
    if not program.peer_hosts or _PREFLIGHT_DONE.get(program):
        return
    missing = wait_until_reachable(program.peer_hosts, program.timeout)
    if missing:
        raise PeerLostError(
            "EPL: %s cannot start its collectives: worker(s) at %s did not come up within "
            "communication.timeout=%s s: a worker that failed before its first step (an "
            "error in its program or its graph rewrite) never starts its server, so read "
            "its log first. Start every worker of TF_CONFIG (epl-launch does, and ends the "
            "job with the first worker's error) or raise EPL_COMMUNICATION_TIMEOUT."
            % (program.worker_label, ", ".join(missing), program.timeout))
    _PREFLIGHT_DONE[program] = True


def guarded(program, ops, run_fn, options=None):
    """Run ``run_fn(options)`` under the collective watchdog if ``ops`` reach collectives.

    ``options`` (the user's RunOptions or None) gain the run's collective graph key
    when it reaches groups spanning workers (:func:`keyed_options`)."""
    groups = program.groups_reached(ops)
    if not groups:
        return run_fn(options)
    preflight(program)
    options = keyed_options(program.collective_graph_key(ops), options)
    # A little later than the ring's own timeout, so that its clean error wins.
    deadline = program.timeout * 1.1 + 5
    with WATCHDOG.guard(deadline, lambda elapsed: program.timeout_message(groups, elapsed)):
        return run_fn(options)


def keyed_options(graph_key, options):
    """RunOptions carrying ``graph_key`` as the collective graph key (a copy of the
    user's ``options``; theirs wins when they set one).

    TF numbers the steps of collectives that cross workers per graph key, and by
    default derives that key from every collective instance key the run reaches,
    its worker-local groups included. Those differ between workers when each
    worker's copies form their own local group (``split(k)`` inside each of two
    workers' model replicas: split group replica 0 on worker 0, replica 1 on
    worker 1), so the workers' step numbers never meet and the run hangs. The key
    EPL gives is the same on every worker (:meth:`ParallelProgram.collective_graph_key`).
    """
    if graph_key is None:
        return options
    keyed = tf.RunOptions()
    if options is not None:
        keyed.CopyFrom(options)
    if not keyed.experimental.collective_graph_key:
        keyed.experimental.collective_graph_key = graph_key
    return keyed


def ensure_synced(session, program, run):
    """Broadcast replica 0's variables once they are initialized (once per session);
    after the user's initializers set the copies too (``program.linked_init``), only
    EPL's set-up runs. Never from inside a restore (:func:`restoring`): the broadcast
    follows it."""
    if not program.needs_sync or _SYNCED.get(session) is True or _RESTORING.get(session):
        return
    with _LOCK:
        lock = _SYNC_LOCKS.setdefault(session, threading.Lock())
    with lock:  # per session: workers in one process sync concurrently
        state = _SYNCED.get(session)
        if state is True:
            return
        if state == _INITIALIZED:
            if program.setup_op is not None:
                guarded(program, [program.setup_op],
                        lambda options: run(session, program.setup_op, None, options))
        else:
            program.build_sync()  # deferred until a restore (or an unknown state) needs it
            if program.init_check is not None and not run(session, program.init_check):
                return
            if program.sync_op is not None:
                guarded(program, [program.sync_op],
                        lambda options: run(session, program.sync_op, None, options))
                LOG.info("EPL synchronized replica variables with worker 0's replica 0")
        restored = _RESTORED.get(session)
        for step in program.after_sync:
            step(lambda fetches, feed: guarded(
                program, [getattr(fetches, "op", fetches)],
                lambda options: run(session, fetches, feed, options)), restored)
        _SYNCED[session] = True


@contextlib.contextmanager
def restoring(session):
    """A saver restores ``session``'s variables inside: its runs broadcast nothing.

    A restore on initialized variables would otherwise broadcast before it, and a
    worker that does not restore (only worker 0's directory holds checkpoints)
    would join that broadcast and not the one after it."""
    _RESTORING[session] = _RESTORING.get(session, 0) + 1
    try:
        yield
    finally:
        _RESTORING[session] -= 1


def mark_unsynced(session, restored=None):
    """The user's variables changed on replica 0 only (a restore by ``restored`` =
    (saver, path)): the next run broadcasts them again first."""
    _SYNCED[session] = _NEEDS_BROADCAST
    _RESTORED[session] = restored


def mark_initialized(session, program):
    """The user's initializers ran: with ``program.linked_init`` they set every local
    copy as well, unless a restore since the last broadcast still needs one."""
    if program.linked_init and _SYNCED.get(session) != _NEEDS_BROADCAST:
        _SYNCED[session] = _INITIALIZED
    else:
        _SYNCED[session] = _NEEDS_BROADCAST
    _RESTORED[session] = None
