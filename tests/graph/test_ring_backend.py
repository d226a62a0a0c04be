"""EPL's TCP ring backend on local virtual CPU devices: results, fp16 wire, timeouts."""
import os
import time

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from epl.communicators import Communicator, KeyRegistry, library
from epl.communicators.ring import RingBackend

pytestmark = pytest.mark.skipif(library.load() is None, reason="EPL op library not built")
DEVICES = ["/job:localhost/replica:0/task:0/device:CPU:%d" % i for i in range(3)]


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
