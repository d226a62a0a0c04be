"""The restart policy of ``epl-launch --max_restarts N``: pure, testable without processes.

After an attempt of the job fails, :func:`decide` looks at the attempts so far and says
whether to start the job's processes again, and otherwise with which exit code the
launcher ends. How a fault is told apart from an error in the program:

* **By exit code**, the convention of Kubeflow's ``ExitCode`` restart policy, so that
  epl-launch and an outer engine retry the same things: a worker ended by SIGINT (130),
  SIGKILL (137: out of memory, preemption, ``kill -9``) or SIGTERM (143: preemption,
  shutdown) had a fault; 138 (Kubeflow's code for a retryable error a program reports
  itself) is what an EPL worker exits with when it loses a peer or a collective times
  out (:data:`FAULT_EXIT_CODE`). Every other code is permanent: 1 is an uncaught Python
  exception, an error in the program that would happen again on every attempt.
* **By progress.** A fault that comes back the same way (same worker, same exit code)
  :data:`REPEATS_WITHOUT_PROGRESS` times in a row, with no new snapshot in between, is
  not a passing fault either (an out-of-memory kill at the same step every time), so
  the launcher stops retrying it before ``--max_restarts`` is used up.

When workers fail together, the root cause is chosen by :func:`cause_of`: a worker
killed by a signal before one that exited on its own, and 138 (a consequence: that
worker's peer was lost) last.

Example::

    attempts = [Attempt([Failure(1, 137)], progress=40)]
    decide(attempts, max_restarts=2)   # Decision(restart=True, exit_code=137, ...)
"""
import collections
import signal

from epl.session.faults import FAULT_EXIT_CODE  # 138 = 128 + SIGUSR1: Kubeflow's "retryable"
RETRYABLE = {130: "interrupted by SIGINT", 137: "killed by SIGKILL",
             FAULT_EXIT_CODE: "EPL fault exit: a peer was lost or a collective timed out",
             143: "terminated by SIGTERM"}
REPEATS_WITHOUT_PROGRESS = 3

Failure = collections.namedtuple("Failure", ["worker", "code"])
Failure.__doc__ = """Worker ``worker`` ended with shell-style exit ``code`` (128+N for
signal N)."""

Attempt = collections.namedtuple("Attempt", ["failures", "progress"])
Attempt.__doc__ = """One failed attempt: its ``failures`` (every worker that had failed
when the launcher noticed) and ``progress``, the newest snapshot step in the job's
snapshot directory after it (None when the job writes no snapshots)."""

Decision = collections.namedtuple("Decision", ["restart", "exit_code", "cause", "reason"])
Decision.__doc__ = """What to do after an attempt: ``restart`` or end with ``exit_code``;
``cause`` is the root-cause Failure, ``reason`` one line for the terminal."""


def is_retryable(code):
    """True for the exit codes a restart may cure (see the module docstring)."""
    return code in RETRYABLE


def _rank(failure):
    """Sort key of :func:`cause_of`: external signals, then other codes, then 138."""
    if failure.code == FAULT_EXIT_CODE:
        return 2
    return 0 if is_retryable(failure.code) else 1


def cause_of(failures):
    """The root cause among workers that failed together (see the module docstring)."""
    if not failures:
        raise ValueError("an attempt failed without a failed worker")
    return sorted(failures, key=_rank)[0]


def describe(failure):
    """``worker 1 exited with code 137 (killed by SIGKILL)``."""
    code = failure.code
    what = RETRYABLE.get(code)
    if what is None and code > 128:
        try:
            what = "killed by %s" % signal.Signals(code - 128).name
        except ValueError:
            what = None
    if what is None and code == 1:
        what = "an uncaught error in the program"
    return "worker %d exited with code %d%s" % (failure.worker, code,
                                                " (%s)" % what if what else "")


def _repeats(attempts, cause):
    """How many attempts in a row, ending with the last, failed with ``cause`` and the
    same snapshot progress (0 when progress is unknown)."""
    last = attempts[-1]
    if last.progress is None:
        return 0
    count = 0
    for attempt in reversed(attempts):
        if cause_of(attempt.failures) != cause or attempt.progress != last.progress:
            break
        count += 1
    return count


def decide(attempts, max_restarts):
    """Restart after the last of ``attempts`` (all failed), or give up with which code."""
    cause = cause_of(attempts[-1].failures)
    used = len(attempts) - 1
    if not is_retryable(cause.code):
        return Decision(False, cause.code, cause,
                        "%s: an error in the program, not retried (only exit codes %s are)"
                        % (describe(cause), "/".join(str(c) for c in sorted(RETRYABLE))))
    if used >= max_restarts:
        return Decision(False, cause.code, cause,
                        "%s; no restarts left (--max_restarts %d)" % (describe(cause),
                                                                      max_restarts))
    if _repeats(attempts, cause) >= REPEATS_WITHOUT_PROGRESS:
        return Decision(False, cause.code, cause,
                        "%s for the %d. time in a row without a new snapshot (step %s): "
                        "it repeats, not retried further"
                        % (describe(cause), REPEATS_WITHOUT_PROGRESS, attempts[-1].progress))
    return Decision(True, cause.code, cause, describe(cause))


def summary(restarted):
    """One line per restart, with its cause: ``restarted`` are the attempts that were
    followed by one."""
    return ["restart %d after: %s" % (number, describe(cause_of(attempt.failures)))
            for number, attempt in enumerate(restarted, 1)]
