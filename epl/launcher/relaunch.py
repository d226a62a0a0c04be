"""``epl-launch --max_restarts N``: run the job again on the same layout after a fault.

Each attempt is one :func:`epl.launcher.supervisor.run_attempt` (start every worker,
supervise, stop them all when one fails). After a failed attempt the pure policy
:func:`epl.launcher.restart.decide` says whether to start the same worker specs again;
the workers of attempt n get ``EPL_RESTART_COUNT=n``. A restarted job resumes from its
newest snapshot (``epl.init`` and the session do that, docs/fault_tolerance.md), so the
launcher passes nothing else on. The snapshot directory is read only to see whether an
attempt made progress (its newest complete snapshot step).
"""
from epl.launcher.restart import Attempt, decide, summary
from epl.launcher.settings import PROG
from epl.launcher.supervisor import (DEFAULT_GRACE_PERIOD, POLL_INTERVAL, launch_streams,
                                     run_attempt)
from epl.session.snapshot_store import SNAPSHOT_DIR_VARIABLE, newest_step

RESTART_COUNT_VARIABLE = "EPL_RESTART_COUNT"


def with_restart_count(worker_specs, count):
    """The specs of attempt ``count`` (0 for the first)."""
    return [spec._replace(env=dict(spec.env, **{RESTART_COUNT_VARIABLE: str(count)}))
            for spec in worker_specs]


def _snapshot_dir(worker_specs):
    for spec in worker_specs:
        if spec.env.get(SNAPSHOT_DIR_VARIABLE):
            return spec.env[SNAPSHOT_DIR_VARIABLE]
    return None


def _write(err, lines):
    for line in lines:
        err.write("%s: %s\n" % (PROG, line))
    err.flush()


def execute_with_restarts(worker_specs, max_restarts, grace_period=DEFAULT_GRACE_PERIOD,
                          poll_interval=POLL_INTERVAL, stdout=None, stderr=None):
    """Run the job, restarting it after faults up to ``max_restarts`` times; returns the
    launcher's exit code (0, or the root cause's code when it gives up)."""
    snapshots = _snapshot_dir(worker_specs)
    with launch_streams(worker_specs, stdout, stderr) as streams:
        attempts = []
        while True:
            outcome = run_attempt(with_restart_count(worker_specs, len(attempts)), streams,
                                  grace_period, poll_interval)
            if outcome.code == 0 or not outcome.failures:
                if attempts:
                    _write(streams.err, ["job %s after %d restart(s)" % (
                        "finished" if outcome.code == 0 else "ended with exit code %d"
                        % outcome.code, len(attempts))] + summary(attempts))
                return outcome.code
            attempts.append(Attempt(outcome.failures, newest_step(snapshots)))
            decision = decide(attempts, max_restarts)
            if not decision.restart:
                _write(streams.err, ["giving up after %d restart(s) of %d: %s"
                                     % (len(attempts) - 1, max_restarts, decision.reason)]
                       + summary(attempts[:-1]))
                return decision.exit_code
            _write(streams.err, ["restart %d of %d: %s; starting every worker again "
                                 "(resumes from the newest snapshot%s)"
                                 % (len(attempts), max_restarts, decision.reason,
                                    ", step %s" % attempts[-1].progress
                                    if attempts[-1].progress is not None else "")])
