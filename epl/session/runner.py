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
            "communication.timeout=%s s. Start every worker of TF_CONFIG (epl-launch does) or "
            "raise EPL_COMMUNICATION_TIMEOUT." % (program.worker_label, ", ".join(missing),
                                                  program.timeout))
    _PREFLIGHT_DONE[program] = True


def guarded(program, ops, run_fn):
    """Run ``run_fn()`` under the collective watchdog if ``ops`` reach collectives."""
    groups = program.groups_reached(ops)
    if not groups:
        return run_fn()
    preflight(program)
    # A little later than the ring's own timeout, so that its clean error wins.
    deadline = program.timeout * 1.1 + 5
    with WATCHDOG.guard(deadline, lambda elapsed: program.timeout_message(groups, elapsed)):
        return run_fn()


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
                guarded(program, [program.setup_op], lambda: run(session, program.setup_op))
        else:
            program.build_sync()  # deferred until a restore (or an unknown state) needs it
            if program.init_check is not None and not run(session, program.init_check):
                return
            if program.sync_op is not None:
                guarded(program, [program.sync_op], lambda: run(session, program.sync_op))
                LOG.info("EPL synchronized replica variables with worker 0's replica 0")
        restored = _RESTORED.get(session)
        for step in program.after_sync:
            step(lambda fetches, feed: guarded(program, [getattr(fetches, "op", fetches)],
                                               lambda: run(session, fetches, feed)), restored)
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
