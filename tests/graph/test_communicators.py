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


def _chained(names, device="/device:CPU:0"):
    """No-ops chained by control edges in ``names`` order (as a backend chains a
    member's collectives), plus an outside control input on the second."""
    with tf.device(device):
        outside = tf.no_op(name="outside")
        ops = []
        for name in names:
            with tf.control_dependencies(ops[-1:] + ([outside] if len(ops) == 1 else [])):
                ops.append(tf.no_op(name=name))
    return ops, outside


def _run_order(ops):
    """The chain's order read back from the control edges."""
    members = set(ops)
    preds = dict((op, [c for c in op.control_inputs if c in members]) for op in ops)
    order = [op for op in ops if not preds[op]]
    assert len(order) == 1, "one chain start"
    while len(order) < len(ops):
        order.append(next(op for op in ops if preds[op] == [order[-1]]))
    return [op.name for op in order]


def test_chains_follow_the_schedule_rank():
    """Build order F0 B0 F1 B1 (and an unranked op after B0) re-linked to the rank's
    F0 F1 B0 B1: unranked ops stay after their predecessor, other control inputs stay,
    the old and new last ops are returned; ranks of two owners leave a chain alone."""
    from epl.communicators import chains
    rank_of = {"f0": 0, "b0": 2, "f1": 1, "b1": 3}
    with tf.Graph().as_default() as graph:
        ops, outside = _chained(["f0", "b0", "x", "f1", "b1"])
        tails = chains.reorder(graph, [op.name for op in ops],
                               lambda op: ("s", rank_of[op.name]) if op.name in rank_of
                               else None)
        assert _run_order(ops) == ["f0", "f1", "b0", "x", "b1"]
        assert outside in ops[1].control_inputs
        assert [(old.name, new.name) for old, new in tails] == [("b1", "b1")]
        mixed, _ = _chained(["g0", "h1", "g1"], "/device:CPU:1")
        owners = {"g0": ("a", 1), "h1": ("b", 0), "g1": ("a", 0)}
        assert chains.reorder(graph, [op.name for op in mixed], owners.get) == []
        assert _run_order(mixed) == ["g0", "h1", "g1"]
