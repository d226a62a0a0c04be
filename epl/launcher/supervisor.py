"""execute(): start the planned workers, stream their output, supervise them.

The only part of epl-launch that starts or signals processes. Each worker runs
in its own session (process group) so it can be stopped as a unit with its
children and never receives the terminal's Ctrl-C: only the launcher decides
when the job stops.
"""
import collections
import contextlib
import os
import signal
import subprocess
import sys
import termios
import threading
import time

from epl.launcher.console import Console, open_through_channel, pump_lines, pump_through
from epl.launcher.failure import OutputRecord, error_lines
from epl.launcher.plan import exit_code_for
from epl.launcher.restart import Failure, cause_of
from epl.launcher.settings import PROG

TAIL_LINES = 20
DEFAULT_GRACE_PERIOD = 10.0
POLL_INTERVAL = 0.2


class _Worker(object):
    """A started worker: its process, reader thread and recent output."""

    def __init__(self, spec, proc, thread, tail):
        self.spec, self.proc, self.thread, self.tail = spec, proc, thread, tail


def _open_log(path):
    """Open the worker's log before starting it, so an unwritable log dir fails
    loudly instead of leaving a worker blocked on an undrained pipe."""
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    return open(path, "ab")


def _start_prefixed(spec, console, log, tail):
    """A normal worker: no stdin, output piped and printed line by line with a prefix."""
    proc = subprocess.Popen(spec.argv, env=spec.env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    thread = threading.Thread(target=pump_lines, daemon=True, name="epl-worker-%d" % spec.index,
                              args=(proc.stdout, spec.index, log, console, tail))
    return proc, thread


def _start_through(spec, console, log, tail):
    """The debug worker: inherits the launcher's stdin (pdb reads the user's
    keys), its output passes through the Console unprefixed (see console.py)."""
    read_fd, write_fd = open_through_channel(console.out)
    try:
        proc = subprocess.Popen(spec.argv, env=spec.env, stdout=write_fd, stderr=write_fd,
                                start_new_session=True)
    except OSError:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)  # else the reader never sees the worker's output end
    thread = threading.Thread(target=pump_through, daemon=True,
                              name="epl-worker-%d" % spec.index,
                              args=(read_fd, log, console, tail))
    return proc, thread


def _start(spec, console):
    """Start one worker and its reader thread."""
    tail = OutputRecord(TAIL_LINES)
    if spec.task_dir:
        os.makedirs(spec.task_dir, exist_ok=True)  # the worker's own directory
    log = _open_log(spec.log_path)
    try:
        start = _start_through if spec.interactive else _start_prefixed
        proc, thread = start(spec, console, log, tail)
    except OSError:
        log.close()
        raise
    thread.start()
    return _Worker(spec, proc, thread, tail)


def _signal_groups(workers, signum):
    """Signal each worker's process group, even if its leader already exited,
    so orphaned grandchildren die too. Never looks processes up by name."""
    for worker in workers:
        try:
            os.killpg(worker.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def _group_alive(pgid):
    """True while the group has a member that is not a zombie. Zombies are
    ignored because orphaned grandchildren may never be reaped when PID 1 is
    not a real init (common in containers), and waiting on them is pointless."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        names = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return True  # no /proc (macOS): trust kill(0)
    for name in names:
        try:
            with open("/proc/%s/stat" % name) as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def stop_workers(workers, grace_period, hurry=lambda: False):
    """SIGTERM (and SIGCONT, for stopped processes) the process groups, wait up to
    `grace_period` seconds (less if `hurry()` turns true, e.g. a second Ctrl-C), then
    SIGKILL what is left.

    Workers that already exited 0 are left alone: their pid may be long reaped,
    and signalling a recycled process-group id could hit an unrelated job."""
    for worker in workers:
        worker.proc.poll()
    targets = [w for w in workers if w.proc.returncode != 0]
    _signal_groups(targets, signal.SIGTERM)
    _signal_groups(targets, signal.SIGCONT)  # a stopped (hung) worker handles it now
    deadline = time.monotonic() + grace_period
    while time.monotonic() < deadline and not hurry():
        for worker in targets:
            worker.proc.poll()  # reap leaders so zombies do not count as alive
        if not any(_group_alive(w.proc.pid) for w in targets):
            break
        time.sleep(0.05)
    _signal_groups(targets, signal.SIGKILL)
    for worker in targets:
        worker.proc.wait()


def _install_handlers(received):
    """Route SIGINT/SIGTERM into `received` (a list) and return the previous
    handlers. Only possible in the main thread; elsewhere we skip it."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, lambda s, _frame: received.append(s))
    return previous


@contextlib.contextmanager
def _terminal_restored(active):
    """Put the launcher's terminal (stdin) back as it was when `active` (debug
    mode): pdb's readline switches it to no-echo mode, and a worker killed at
    the prompt would otherwise leave the user's shell typing blind."""
    saved = None
    if active:
        try:
            if os.isatty(0):
                saved = termios.tcgetattr(0)
        except (OSError, termios.error):
            saved = None
    try:
        yield
    finally:
        if saved is not None:
            try:
                termios.tcsetattr(0, termios.TCSADRAIN, saved)
            except (OSError, termios.error):
                pass


def _supervise(workers, received, poll_interval):
    """Poll until all workers succeed (None), some fail (the failed _Workers, every one
    that had failed when the first was seen) or the launcher gets a signal (its number)."""
    while True:
        if received:
            return received[0]
        running = False
        for worker in workers:
            code = worker.proc.poll()
            if code is None:
                running = True
            elif code != 0:
                return [w for w in workers if w.proc.poll() not in (None, 0)]
        if not running:
            return None
        time.sleep(poll_interval)


def _report_failure(worker, err):
    """Name the failed worker, lead with the error it printed (failure.py: a TF
    error's message is far above its last lines), then show its last lines: the
    root cause is there, and the other workers' logs only show the teardown."""
    code = exit_code_for(worker.proc.returncode)
    note = ""
    if worker.proc.returncode < 0:
        note = " (killed by %s)" % signal.Signals(-worker.proc.returncode).name
    err.write("%s: worker %d failed with exit code %d%s\n" % (PROG, worker.spec.index, code, note))
    lead = error_lines(worker.tail.error())
    if lead:
        err.write("--- error of worker %d ---\n%s\n" % (worker.spec.index, "\n".join(lead)))
    err.write("--- last %d lines of %s ---\n" % (len(worker.tail), worker.spec.log_path))
    for line in worker.tail:
        err.write(line + "\n")
    err.flush()
    return code


def _start_all(worker_specs, console, err, grace_period):
    """Start every worker; on failure stop the ones already started and return
    (None, 127) instead of the list."""
    workers = []
    for spec in worker_specs:
        try:
            workers.append(_start(spec, console))
        except OSError as exc:
            err.write("%s: cannot start worker %d: %s\n" % (PROG, spec.index, exc))
            stop_workers(workers, grace_period)
            return None, 127
    return workers, None


Outcome = collections.namedtuple("Outcome", ["code", "failures", "interrupted"])
Outcome.__doc__ = """How one attempt of the job ended: the launcher's exit ``code``,
``failures`` ([restart.Failure] of every worker that had failed when the launcher
noticed, root cause first; empty on success, on a signal or when a worker could not
start) and ``interrupted`` (the launcher received SIGINT/SIGTERM)."""


def _finish(workers, outcome, received, grace_period, err):
    """Stop whatever still runs after `outcome` (see _supervise), wait for the
    output readers and return the attempt's Outcome."""
    if outcome is None:
        result = Outcome(0, [], False)
    elif isinstance(outcome, list):
        stop_workers(workers, grace_period, hurry=lambda: bool(received))
        failures = [Failure(w.spec.index, exit_code_for(w.proc.returncode)) for w in outcome]
        cause = cause_of(failures)
        result = Outcome(cause.code, [cause] + [f for f in failures if f != cause], False)
    else:
        err.write("%s: received %s, stopping workers\n" % (PROG, signal.Signals(outcome).name))
        err.flush()
        stop_workers(workers, grace_period, hurry=lambda: len(received) > 1)
        result = Outcome(128 + outcome, [], True)
    for worker in workers:
        worker.thread.join(timeout=5.0)
    if result.failures:
        _report_failure(next(w for w in outcome if w.spec.index == result.failures[0].worker),
                        err)
    return result


class Streams(object):
    """What every attempt of one launch shares: the console, the error stream and the
    signals received (see :func:`launch_streams`)."""

    def __init__(self, console, err, received):
        self.console, self.err, self.received = console, err, received


@contextlib.contextmanager
def launch_streams(worker_specs, stdout=None, stderr=None):
    """Around all attempts of a launch: one Console, SIGINT/SIGTERM routed to the
    launcher (a signal between two attempts still stops the job), the terminal
    restored at the end in debug mode."""
    received = []
    previous = _install_handlers(received)
    try:
        with _terminal_restored(any(spec.interactive for spec in worker_specs)):
            yield Streams(Console(stdout or sys.stdout), stderr or sys.stderr, received)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_attempt(worker_specs, streams, grace_period=DEFAULT_GRACE_PERIOD,
                poll_interval=POLL_INTERVAL):
    """Start all workers, stream their output and supervise them until the attempt
    ends; returns its Outcome (see :func:`execute` for the codes)."""
    if streams.received:
        return Outcome(128 + streams.received[0], [], True)
    workers, failed = _start_all(worker_specs, streams.console, streams.err, grace_period)
    if workers is None:
        return Outcome(failed, [], False)
    outcome = _supervise(workers, streams.received, poll_interval)
    return _finish(workers, outcome, streams.received, grace_period, streams.err)


def execute(worker_specs, grace_period=DEFAULT_GRACE_PERIOD, poll_interval=POLL_INTERVAL,
            stdout=None, stderr=None):
    """Start all workers, stream their output and supervise them.

    Returns 0 if every worker exits 0; the failed worker's code (128+N if killed
    by signal N) after stopping the rest if any fails (of workers that failed
    together, the root cause of :func:`epl.launcher.restart.cause_of`); 130/143 after
    stopping everyone on SIGINT/SIGTERM; 127 if a worker cannot be started. A partially
    failed job is always torn down, because TF workers would otherwise block
    forever waiting for the lost peer."""
    with launch_streams(worker_specs, stdout, stderr) as streams:
        return run_attempt(worker_specs, streams, grace_period, poll_interval).code
