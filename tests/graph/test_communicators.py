"""The collective interface on local virtual CPU devices (TF collective backend)."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from epl.communicators import Communicator, KeyRegistry
from epl.communicators.fusion import pack, plan_buckets, unpack

DEVICES = ["/job:localhost/replica:0/task:0/device:CPU:%d" % i for i in range(12)]


def _run(n, build):
    """Build one op per member with ``build(comm, rank, device)``; run all in one step."""
    with tf.Graph().as_default():
        comm = Communicator("test", DEVICES[:n], KeyRegistry())
        outs = []
        for rank, device in enumerate(comm.devices):
            with tf.device(device):
                outs.append(build(comm, rank, device))
        with tf.Session(config=tf.ConfigProto(device_count={"CPU": n})) as sess:
            return sess.run(outs)


def test_all_reduce_mean_and_sum():
    mean = _run(3, lambda c, r, d: c.all_reduce(tf.constant([1.0, 2.0]) * (r + 1), d, "m"))
    total = _run(3, lambda c, r, d: c.all_reduce(tf.constant([1.0]) * (r + 1), d, "s", False))
    for value in mean:
        np.testing.assert_allclose(value, [2.0, 4.0])
    assert all(v[0] == 6.0 for v in total)


def test_all_gather_is_in_group_order_even_past_ten_devices():
    outs = _run(12, lambda c, r, d: c.all_gather(tf.constant([r]), d, "g"))
    for value in outs:
        assert list(value) == list(range(12))


def test_broadcast_from_any_root():
    def build(comm, rank, device):
        if rank == 1:
            return comm.broadcast_send(tf.constant([7.0, 8.0]), device, "b")
        return comm.broadcast_recv(tf.TensorShape([2]), tf.float32, device, "b")
    for value in _run(3, build):
        np.testing.assert_allclose(value, [7.0, 8.0])


def test_reduce_scatter_gives_each_member_its_slice():
    outs = _run(2, lambda c, r, d: c.reduce_scatter(tf.constant([1.0, 2.0, 3.0, 4.0]), d,
                                                    "rs", mean=False))
    np.testing.assert_allclose(outs[0], [2.0, 4.0])
    np.testing.assert_allclose(outs[1], [6.0, 8.0])


def test_alltoall_exchanges_chunks():
    # member r sends [10r, 10r+1, 10r+2]: chunk j = element j goes to member j
    outs = _run(3, lambda c, r, d: c.alltoall(tf.constant([10 * r, 10 * r + 1, 10 * r + 2]),
                                              d, "a2a"))
    assert [list(o) for o in outs] == [[0, 10, 20], [1, 11, 21], [2, 12, 22]]


def test_membership_is_checked():
    with tf.Graph().as_default():
        comm = Communicator("test", DEVICES[:2], KeyRegistry())
        with pytest.raises(ValueError, match="not a member"):
            comm.all_reduce(tf.constant(1.0), DEVICES[5], "x")


def test_pack_unpack_round_trip():
    values = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([7.0], np.float32),
              np.float32(9.0)]
    with tf.Graph().as_default():
        tensors = [tf.constant(v) for v in values]
        packed = pack(tensors)
        back = unpack(packed, [t.shape for t in tensors])
        with tf.Session() as sess:
            flat, *restored = sess.run([packed] + back)
    np.testing.assert_array_equal(flat, [0, 1, 2, 3, 4, 5, 7, 9])
    for original, value in zip(values, restored):
        np.testing.assert_array_equal(original, value)


@pytest.mark.parametrize("sizes,dtypes,splits,expected", [
    ([4] * 10, ["f"] * 10, 5, [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]),
    ([4, 4, 8, 8], ["f", "f", "h", "h"], 1, [[0, 1], [2, 3]]),
    ([100, 1, 1, 1, 1, 1], ["f"] * 6, 3, [[0], [1, 2, 3, 4], [5]]),
    ([4], ["f"], 5, [[0]]),
    ([], [], 3, []),
])
def test_plan_buckets(sizes, dtypes, splits, expected):
    assert plan_buckets(sizes, dtypes, splits) == expected


def test_plan_buckets_invariants():
    rng = np.random.RandomState(0)
    for _ in range(200):
        n = rng.randint(1, 30)
        sizes = list(rng.randint(1, 1000, n))
        dtypes = list(rng.choice(["f", "h"], n))
        splits = rng.randint(1, 8)
        buckets = plan_buckets(sizes, dtypes, splits)
        runs = 1 + sum(dtypes[i] != dtypes[i - 1] for i in range(1, n))
        assert [i for b in buckets for i in b] == list(range(n))
        assert len(buckets) <= max(splits, runs)
        assert all(len({dtypes[i] for i in b}) == 1 for b in buckets)
