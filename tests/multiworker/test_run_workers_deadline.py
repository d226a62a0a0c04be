"""The helper that runs in-process workers gives up before pytest-timeout does.

pytest-timeout (thread method) ends a stuck test by ending its whole process, which
pytest-xdist reports only as "worker crashed" with the stacks lost in a long log. So
``eplutil.run_workers`` waits at most until the test's own deadline (its timeout minus
eplutil.DEADLINE_MARGIN) in all, not ``timeout`` per worker, and then fails the test
naming the stuck workers and where each one was."""
import threading
import time

import pytest

from eplutil import DEADLINE_MARGIN, PEER_ERROR_GRACE, TEST_DEADLINE, run_workers


def _fail_with_worker_0_stuck(worker_1):
    """Run two workers, worker 0 waiting 120 s and worker 1 running ``worker_1``;
    (run_workers' error message, seconds it took)."""
    release = threading.Event()

    def worker(index):
        if index == 1:
            return worker_1()
        release.wait(120)  # the stuck one: waits far beyond the test's limit
        return "late"

    start = time.time()
    with pytest.raises(AssertionError) as failure:
        run_workers(worker, 2, 1, timeout=120)
    waited = time.time() - start
    release.set()
    return str(failure.value), waited


@pytest.mark.timeout(DEADLINE_MARGIN + 8)
def test_stuck_workers_fail_the_test_before_its_timeout_with_their_stacks():
    message, waited = _fail_with_worker_0_stuck(lambda: "done")
    assert "workers [0] did not finish within" in message
    assert "release.wait(120)" in message  # the stuck worker's own line
    assert waited < 8 + 1  # the test's deadline, not 120 s and not 2 x 120 s


@pytest.mark.timeout(DEADLINE_MARGIN + 30)
def test_a_worker_error_is_reported_at_once_with_the_peers_still_waiting_for_it():
    """Worker 1 raises (as a rewrite refusal on one worker would); worker 0 waits for it
    (as in a collective). The test fails a few seconds later with worker 1's error
    first, not at its deadline with a hang."""
    def refuse():
        raise ValueError("zero.level='v1' refused on worker 1")

    message, waited = _fail_with_worker_0_stuck(refuse)
    assert message.startswith("worker 1 failed: ValueError: zero.level='v1' refused on worker 1")
    assert "workers [0] were still waiting for it" in message and "release.wait(120)" in message
    assert waited < PEER_ERROR_GRACE + 3


def test_a_test_without_a_marker_has_the_deadline_of_setup_cfg():
    left = TEST_DEADLINE[0] - time.time()  # set by conftest from setup.cfg's timeout = 300
    assert 300 - DEADLINE_MARGIN - 30 < left <= 300 - DEADLINE_MARGIN
