"""How an EPL worker ends when it fails because of a fault it did not cause.

A worker whose peer died sees its collectives fail (TF's gRPC runtime: Unavailable or
Aborted; EPL's ring: DeadlineExceeded), finds a peer unreachable before its first step
(:class:`PeerLostError`), or has a collective that never returns (the watchdog). Such a
worker exits with :data:`FAULT_EXIT_CODE`, 138, which Kubeflow's ``ExitCode`` restart
policy reserves for errors a program reports as retryable (128 + SIGUSR1), and which
``epl-launch --max_restarts`` retries like a kill (docs/fault_tolerance.md). Any other
uncaught error keeps Python's exit code 1: an error in the program, which a restart
would only repeat.

No TensorFlow is imported here at module level: the launcher reads the exit code.
"""
import logging
import os
import sys

from epl.protocols.hooks import Patch

LOG = logging.getLogger("epl")
FAULT_EXIT_CODE = 138


class PeerLostError(RuntimeError):
    """A collective peer of this worker is gone (its server does not answer)."""


class ResumeMismatchError(RuntimeError):
    """Workers resumed from different snapshots (checked after the first broadcast)."""


def is_fault(error):
    """True if ``error`` means a peer or the network failed, not this program."""
    if isinstance(error, (PeerLostError, ResumeMismatchError)):
        return True
    from epl.tf_adapter import tf
    return isinstance(error, (tf.errors.UnavailableError, tf.errors.AbortedError,
                              tf.errors.DeadlineExceededError))


def exit_for_fault(message):
    """Report ``message`` and end the process with FAULT_EXIT_CODE, at once (a TF 1.15
    process whose peer is gone can hang in its exit handlers)."""
    LOG.error("%s", message)
    sys.stderr.write(message + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(FAULT_EXIT_CODE)


def _wrap_excepthook(original):
    def excepthook(kind, value, traceback):
        original(kind, value, traceback)
        if is_fault(value):
            exit_for_fault("EPL: this worker stops because of a fault outside it (%s); exit "
                           "code %d tells epl-launch --max_restarts and engines with an "
                           "ExitCode restart policy to restart the job"
                           % (kind.__name__, FAULT_EXIT_CODE))
    return excepthook


def patches():
    """Uncaught fault errors end the process with FAULT_EXIT_CODE."""
    return [Patch("faults", (sys, "excepthook"), _wrap_excepthook)]
