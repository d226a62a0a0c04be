"""EPL's TCP ring backend on local virtual CPU devices: results, fp16 wire, timeouts."""
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from epl.communicators import Communicator, KeyRegistry, library
from epl.communicators.ring import RingBackend

pytestmark = pytest.mark.skipif(library.load() is None, reason="EPL op library not built")
DEVICES = ["/job:localhost/replica:0/task:0/device:CPU:%d" % i for i in range(3)]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _ring(n, timeout=30, name="ring_test"):
    comm = Communicator(name, DEVICES[:n], KeyRegistry(),
                        context={"hosts": ["127.0.0.1"], "timeout": timeout})
    assert isinstance(comm.backend, RingBackend)
    return comm


def _session(n):
    return tf.Session(config=tf.ConfigProto(device_count={"CPU": n}))


@pytest.mark.parametrize("members,count", [(2, 10), (3, 100003), (3, 2), (2, 1500001)])
def test_ring_all_reduce_matches_numpy_and_is_identical_everywhere(members, count):
    """Sizes include a 3-member ring with empty chunks and 3 MB chunks, which wrap around
    the 2 MB shared-memory queues at unaligned offsets."""
    rng = np.random.RandomState(members)
    values = [rng.randn(count).astype(np.float32) for _ in range(members)]
    with tf.Graph().as_default():
        comm = _ring(members)
        means = [comm.all_reduce(tf.constant(v), d, "mean") for v, d in zip(values, comm.devices)]
        sums = [comm.all_reduce(tf.constant(v), d, "sum", mean=False)
                for v, d in zip(values, comm.devices)]
        halves = [comm.all_reduce_fp16_wire(tf.constant(v), d, "half", True, 64.0)
                  for v, d in zip(values, comm.devices)]
        setup = comm.setup_ops()
        with _session(members) as sess:
            sess.run(setup)
            got_mean, got_sum, got_half = sess.run([means, sums, halves])
    np.testing.assert_allclose(got_mean[0], np.mean(values, axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_sum[0], np.sum(values, axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_half[0], np.mean(values, axis=0), atol=2e-3)
    for group in (got_mean, got_sum, got_half):
        for other in group[1:]:
            np.testing.assert_array_equal(group[0], other)


def test_integer_and_double_types():
    with tf.Graph().as_default():
        comm = _ring(2, name="ring_types")
        ints = [comm.all_reduce(tf.constant([1, 2, 3]) * (r + 1), d, "ints", mean=False)
                for r, d in enumerate(comm.devices)]
        doubles = [comm.all_reduce(tf.constant([0.5], tf.float64), d, "doubles")
                   for d in comm.devices]
        setup = comm.setup_ops()
        with _session(2) as sess:
            sess.run(setup)
            got_ints, got_doubles = sess.run([ints, doubles])
    assert list(got_ints[1]) == [3, 6, 9] and got_doubles[0][0] == 0.5


def test_a_missing_member_is_an_error_not_a_hang():
    with tf.Graph().as_default():
        comm = _ring(2, timeout=2, name="ring_lonely")
        reduces = [comm.all_reduce(tf.constant([1.0]), d, "lonely") for d in comm.devices]
        setup = comm.setup_ops()
        with _session(2) as sess:
            sess.run(setup)
            start = time.time()
            with pytest.raises(tf.errors.DeadlineExceededError, match="no progress for 2 s"):
                sess.run(reduces[0])  # member 1 never runs its part
            assert time.time() - start < 20
            with pytest.raises(tf.errors.DeadlineExceededError, match="ring not connected"):
                sess.run(reduces[0])  # fails fast now instead of reading stale bytes


def _connect_states(setup):
    return [op.outputs[0] for op in setup if op.type == "EplRingConnect"]


@pytest.mark.parametrize("shared_memory,expected", [("1", 7), ("0", 1)])
def test_links_use_shared_memory_on_one_host_unless_turned_off(monkeypatch, shared_memory,
                                                               expected):
    """Connect reports 1 (connected) + 2/4 (outgoing/incoming link in shared memory);
    both transports give bit-identical sums, and no segment name outlives setup."""
    monkeypatch.setenv("EPL_RING_SHARED_MEMORY", shared_memory)
    values = [np.arange(50001, dtype=np.float32) * (r + 1) for r in range(3)]
    with tf.Graph().as_default():
        comm = _ring(3, name="ring_links_" + shared_memory)
        sums = [comm.all_reduce(tf.constant(v), d, "links", mean=False)
                for v, d in zip(values, comm.devices)]
        setup = comm.setup_ops()
        with _session(3) as sess:
            states = sess.run(_connect_states(setup))
            got = sess.run(sums)
    assert states == [expected] * 3
    for result in got:
        np.testing.assert_array_equal(result, np.arange(50001, dtype=np.float32) * 6)
    if os.path.isdir("/dev/shm"):
        mine = "epl-ring-%d-" % os.getpid()
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(mine)]


def test_bad_shared_memory_setting_is_named(monkeypatch):
    monkeypatch.setenv("EPL_RING_SHARED_MEMORY", "maybe")
    with tf.Graph().as_default():
        comm = _ring(2, name="ring_bad_env")
        comm.all_reduce(tf.constant([1.0]), comm.devices[0], "x")
        with pytest.raises(ValueError, match="EPL_RING_SHARED_MEMORY='maybe': expected 1 or 0"):
            comm.setup_ops()


# ------------------------------------------------- shared memory unavailable: fall back, say why

FALLBACK_LINE = re.compile(r"EPL ring (\S+)@\d+: link rank (\d+) \(127\.0\.0\.1:\d+\) -> "
                           r"rank (\d+) \(127\.0\.0\.1:\d+\) uses TCP instead of shared "
                           r"memory: (.*)$", re.M)
SEGMENT_BYTES = 256 + (2 << 20)  # header + data of one queue (shm_queue.cc, ring_transport.cc)


@contextlib.contextmanager
def _file_size_limit(max_bytes):
    """Lower RLIMIT_FSIZE, as an unprivileged process may, and restore it afterwards.

    Sizing a shared-memory segment past the limit fails with EFBIG ("File too large"),
    so the ring meets a real failure of ShmQueue::Create, the same path a full /dev/shm
    takes, without root and without a test switch in the kernel. SIGXFSZ, which would
    kill the process, is ignored meanwhile."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def _sum_on_ring(name, members, setups=1):
    """Link states and all-reduce sums of a fresh ring; setup runs `setups` times."""
    values = [np.arange(30001, dtype=np.float32) * (r + 1) for r in range(members)]
    with tf.Graph().as_default():
        comm = _ring(members, name=name)
        sums = [comm.all_reduce(tf.constant(v), d, "sum", mean=False)
                for v, d in zip(values, comm.devices)]
        setup = comm.setup_ops()
        with _session(members) as sess:
            for _ in range(setups):
                states = sess.run(_connect_states(setup))
            got = sess.run(sums)
    expected = np.sum(values, axis=0)
    return {"states": [int(s) for s in states],
            "correct": all(np.array_equal(g, expected) for g in got)}


def _sum_on_mixed_ring(name):
    """Rank 0 asks for shared memory and rank 1 does not, as when workers start with
    different EPL_RING_SHARED_MEMORY: rank 0's offer is refused, and rank 1 says why."""
    ops = library.load()
    values = [np.arange(1001, dtype=np.float32) * (r + 1) for r in range(2)]
    attrs = dict(communicator=name, size=2, timeout_seconds=30.0)
    with tf.Graph().as_default():
        ports = []
        for rank in range(2):
            with tf.device(DEVICES[rank]):
                ports.append(ops.epl_ring_listen(rank=rank, **attrs))
        states, sums = [], []
        for rank in range(2):
            with tf.device(DEVICES[rank]):
                states.append(ops.epl_ring_connect(tf.stack(ports), rank=rank,
                                                   hosts=["127.0.0.1"] * 2,
                                                   shared_memory=rank == 0, **attrs))
                with tf.control_dependencies([states[-1]]):
                    sums.append(ops.epl_ring_all_reduce(tf.constant(values[rank]), rank=rank,
                                                        instance_key=1, mean=False, **attrs))
        with _session(2) as sess:
            got_states, got = sess.run([states, sums])
    expected = np.sum(values, axis=0)
    return {"states": [int(s) for s in got_states],
            "correct": all(np.array_equal(g, expected) for g in got)}


def _fallback_child():
    """Runs in a child process (TF caches its log level at start, and RLIMIT_FSIZE is
    process-wide): a ring whose segments cannot be created, one with shared memory
    turned off, one where it works. Prints one RESULT line."""
    result = {}
    with _file_size_limit(SEGMENT_BYTES // 2):
        result["fails"] = _sum_on_ring("ring_shm_fails", 3, setups=2)
    os.environ["EPL_RING_SHARED_MEMORY"] = "0"
    result["off"] = _sum_on_ring("ring_shm_off", 2)
    os.environ["EPL_RING_SHARED_MEMORY"] = "1"
    result["works"] = _sum_on_ring("ring_shm_works", 2)
    result["mixed"] = _sum_on_mixed_ring("ring_shm_mixed@1")
    print("RESULT " + json.dumps(result), flush=True)
    return 0


@pytest.mark.timeout(240)
@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ") or not os.path.isdir("/dev/shm"),
                    reason="needs POSIX file size limits and /dev/shm")
def test_shared_memory_fallback_says_why_once_per_link_and_the_sum_is_right():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--fallback-child"],
                          env=env, cwd=REPO, timeout=200, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert result["fails"] == {"states": [1, 1, 1], "correct": True}  # TCP, right sums
    assert result["off"] == {"states": [1, 1], "correct": True}
    assert result["works"] == {"states": [7, 7], "correct": True}
    assert result["mixed"] == {"states": [1, 1], "correct": True}
    reasons = {}
    for communicator, source, target, reason in FALLBACK_LINE.findall(proc.stderr):
        reasons.setdefault((communicator, int(source), int(target)), []).append(reason)
    # Every link of the failing ring is explained once, though its setup ran twice.
    # Turning shared memory off is a choice, not a fallback, and says nothing, unless
    # the other end of the link asked for it.
    assert sorted(reasons) == [("ring_shm_fails", 0, 1), ("ring_shm_fails", 1, 2),
                               ("ring_shm_fails", 2, 0), ("ring_shm_mixed", 0, 1)], \
        proc.stderr[-3000:]
    assert all(len(said) == 1 for said in reasons.values()), reasons
    for (communicator, _, _), (reason,) in reasons.items():
        if communicator == "ring_shm_fails":
            assert re.match(r"reserving %d bytes in /epl-ring-\d+-[0-9a-f]+: File too large$"
                            % SEGMENT_BYTES, reason), reason
        else:
            assert re.match(r"shared memory is turned off on rank 1 \(127\.0\.0\.1:\d+\)$",
                            reason), reason


if __name__ == "__main__" and sys.argv[1:] == ["--fallback-child"]:
    # The child runs this file as a script, without conftest.py: graph mode as there
    # (TF 2.x starts eager; nothing changes on TF 1.15).
    tf.disable_v2_behavior()
    sys.exit(_fallback_child())
