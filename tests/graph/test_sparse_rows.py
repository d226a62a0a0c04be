"""Variable-size all-gather and sparse row reduction on every backend.

Members hold different numbers of rows, and the counts change from step to step
(as an embedding gradient's do): TF's collectives and EPL's ring (whose gathers
are TF's) on local virtual CPUs, and the NCCL backend structurally (no GPU here).
Multi-worker variants are in tests/multiworker/test_sparse_workers.py.
"""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from epl.communicators import Communicator, KeyRegistry, TFCollectiveBackend, library
from epl.communicators.gather_v import BUCKETS, wire_rows
from epl.communicators.nccl import NcclBackend
from epl.communicators.ring import RingBackend
from epl.communicators.sparse import SparseReducer, pack_rows, unpack_rows

DEVICES = ["/job:localhost/replica:0/task:0/device:CPU:%d" % i for i in range(3)]
BACKENDS = ["tf", pytest.param("ring", marks=pytest.mark.skipif(
    library.load() is None, reason="EPL op library not built"))]
# rows per member in each step: uneven, an empty member, past the smallest bucket
STEPS = [(3, 0, 7), (1, 20, 2), (0, 0, 1), (17, 16, 40)]


def _comm(kind, members, name="rows"):
    context = {"hosts": ["127.0.0.1"], "timeout": 30}
    backend = TFCollectiveBackend() if kind == "tf" else RingBackend(context)
    return Communicator(name, DEVICES[:members], KeyRegistry(), backend=backend)


def _session(n):
    config = tf.ConfigProto(device_count={"CPU": n})
    config.operation_timeout_in_ms = 60000   # a stuck collective fails, never hangs
    return tf.Session(config=config)


def _rows(step, rank, count, width, dtype):
    """Distinct, recognizable rows: member, step and row number in the values."""
    base = np.arange(count * width).reshape(count, width) + 1000 * rank + 100 * step
    return base.astype(dtype)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("dtype,width", [(np.float32, 5), (np.int64, 1), (np.float64, 2)])
def test_all_gather_v_concatenates_each_members_rows_in_group_order(kind, dtype, width):
    members = 3
    with tf.Graph().as_default():
        comm = _comm(kind, members)
        feeds, outs = [], []
        for device in comm.devices:
            with tf.device(device):
                feed = tf.placeholder(dtype, [None, width])
            feeds.append(feed)
            outs.append(comm.all_gather_v(feed, device, "x"))
        assert all(out.shape.as_list() == [None, width] for out in outs)
        setup = comm.setup_ops()
        with _session(members) as sess:
            sess.run(setup)
            for step, counts in enumerate(STEPS):
                rows = [_rows(step, r, c, width, dtype) for r, c in enumerate(counts)]
                got = sess.run(outs, dict(zip(feeds, rows)))
                for value in got:
                    np.testing.assert_array_equal(value, np.concatenate(rows))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("fp16", [False, True])
def test_sparse_reducer_gathers_values_and_indices_of_uneven_members(kind, fp16):
    """Values [r, 2, 3] float32 and int64 indices travel as one int32 row buffer;
    the mean divides by the group size; fp16 sends the values as float16."""
    members, steps = 2, [(5, 2), (0, 9), (33, 1)]
    with tf.Graph().as_default():
        comm = _comm(kind, members, "sparse")
        reducer = SparseReducer(comm, mean=True, fp16=fp16, fp16_scale=64)
        feeds, outs = [], []
        for device in comm.devices:
            with tf.device(device):
                values = tf.placeholder(tf.float32, [None, 2, 3])
                indices = tf.placeholder(tf.int64, [None])
            feeds.append((values, indices))
            outs.append(reducer.gather(values, indices, device, "emb"))
        setup = comm.setup_ops()
        with _session(members) as sess:
            sess.run(setup)
            rng = np.random.RandomState(0)
            for counts in steps:
                data = [(rng.randn(c, 2, 3).astype(np.float32), rng.randint(0, 1 << 40, c))
                        for c in counts]
                feed = {}
                for (values, indices), (v, i) in zip(feeds, data):
                    feed.update({values: v, indices: i})
                got = sess.run(outs, feed)
                expected_values = np.concatenate([v for v, _ in data]) / members
                expected_indices = np.concatenate([i for _, i in data])
                for values, indices in got:
                    assert values.dtype == np.float32 and indices.dtype == np.int64
                    np.testing.assert_array_equal(indices, expected_indices)
                    np.testing.assert_allclose(values, expected_values,
                                               atol=2e-3 if fp16 else 0)


def test_row_packing_round_trips_every_width_and_dtype():
    with tf.Graph().as_default():
        tensors = [tf.constant(np.arange(12, dtype=np.float16).reshape(4, 3)),
                   tf.constant(np.arange(4, dtype=np.int64) * (1 << 33)),
                   tf.constant(np.linspace(-1, 1, 8).reshape(4, 2, 1)),
                   tf.constant(np.arange(4, dtype=np.int32))]
        words, layout = pack_rows(tensors)
        assert words.dtype == tf.int32 and words.shape.as_list() == [4, 2 + 2 + 4 + 1]
        back = unpack_rows(words, layout)
        with tf.Session() as sess:
            want, got = sess.run([tensors, back])
    for expected, value in zip(want, got):
        assert expected.dtype == value.dtype
        np.testing.assert_array_equal(expected, value)


def test_static_rows_are_gathered_without_counts():
    with tf.Graph().as_default():
        comm = _comm("tf", 2, "static")
        outs = []
        for rank, device in enumerate(comm.devices):
            with tf.device(device):
                outs.append(comm.all_gather_v(tf.ones([4, 3]) * rank, device, "s"))
        types = [tf.get_default_graph().get_operation_by_name(n).type for n in comm.op_names]
        with _session(2) as sess:
            got = sess.run(outs)
    assert types == ["CollectiveGather", "CollectiveGather"]   # no row counts exchanged
    np.testing.assert_array_equal(got[0], np.repeat([[0.0] * 3, [1.0] * 3], 4, axis=0))


def test_tf_collectives_get_one_gather_per_bucket_nccl_pads_to_the_largest_count():
    """TF fixes a collective instance's shape at its first run, so each bucket is its
    own instance; EPL's NCCL kernels size every call anew: one padded gather."""
    with tf.Graph().as_default():
        comm = _comm("tf", 2, "buckets")
        device = comm.devices[0]
        with tf.device(device):
            comm.all_gather_v(tf.placeholder(tf.float32, [None, 4]), device, "b")
        assert len(comm.op_names) == 1 + len(BUCKETS)   # the counts, then one per bucket
    if library.load() is None:
        pytest.skip("EPL op library not built: it holds the NCCL op definitions")
    gpus = ["/job:worker/replica:0/task:%d/device:GPU:0" % w for w in range(2)]
    with tf.Graph().as_default():
        comm = Communicator("grads/nccl", gpus, KeyRegistry(), backend=NcclBackend())
        outs = []
        for device in gpus:
            with tf.device(device):
                outs.append(comm.all_gather_v(tf.placeholder(tf.float32, [None, 4]), device,
                                              "emb"))
        graph = tf.get_default_graph()
        types = [graph.get_operation_by_name(n).type for n in comm.op_names]
    assert types == ["EplNcclAllGather"] * 4   # per member: the counts, the padded rows
    counts, rows = [graph.get_operation_by_name(n) for n in comm.op_names[:2]]
    assert counts.inputs[0].dtype == tf.int32 and rows.inputs[0].shape.as_list() == [None, 4]
    assert all(out.shape.as_list() == [None, 4] for out in outs)


def test_wire_rows_counts_padding():
    assert wire_rows([3, 0, 7], native=True) == [7, 10, 3]
    assert wire_rows([3, 0, 7], native=False) == [14, 14, 14]
    assert wire_rows([3, 0, 7], native=False, static_shapes=True) == [32, 32, 32]
