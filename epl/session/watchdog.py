"""No silent hangs: a deadline on every session.run that contains collectives.

TensorFlow 1.15 cannot cancel a collective that waits for a missing member:
neither ``RunOptions.timeout_in_ms`` nor closing the session releases it (we
checked both on this platform). So one monitor thread per process watches the
runs that contain collectives; when a run passes its deadline it writes an
error naming the collective groups and this worker, then ends the process
with exit code 138 (a fault: :mod:`epl.session.faults`), which ``epl-launch``
reports (and stops the other workers, or restarts the job with
``--max_restarts``). Waiting forever is never the outcome.
"""
import logging
import threading
import time

from epl.session.faults import FAULT_EXIT_CODE, exit_for_fault

LOG = logging.getLogger("epl")
TIMEOUT_EXIT_CODE = FAULT_EXIT_CODE


def exit_process(message):
    """Default action on a timeout: report and end the process."""
    exit_for_fault(message)


class Watchdog(object):
    """Tracks deadlines of active runs; calls ``on_timeout(message)`` when one passes."""

    def __init__(self, on_timeout=exit_process, poll=0.25):
        self._on_timeout = on_timeout
        self._poll = poll
        self._active = {}
        self._lock = threading.Lock()
        self._thread = None

    def _ensure_thread(self):
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="epl-watchdog", daemon=True)
            self._thread.start()

    def guard(self, timeout, describe):
        """Context manager: ``describe(elapsed)`` builds the message if the run hangs."""
        return _Guard(self, timeout, describe)

    def _add(self, token, deadline, describe):
        with self._lock:
            self._active[token] = (deadline, describe)
            self._ensure_thread()

    def _remove(self, token):
        with self._lock:
            self._active.pop(token, None)

    def _loop(self):
        while True:
            time.sleep(self._poll)
            now = time.time()
            with self._lock:
                expired = [(t, d) for t, d in self._active.items() if d[0] <= now]
                for token, _ in expired:
                    del self._active[token]
            for token, (_, describe) in expired:
                self._on_timeout(describe(token.elapsed()))


class _Guard(object):
    def __init__(self, watchdog, timeout, describe):
        self._watchdog, self._timeout, self._describe = watchdog, timeout, describe
        self._start = None

    def elapsed(self):
        return time.time() - self._start

    def __enter__(self):
        self._start = time.time()
        self._watchdog._add(self, self._start + self._timeout, self._describe)
        return self

    def __exit__(self, *exc):
        self._watchdog._remove(self)
        return False


WATCHDOG = Watchdog()
