"""epl.profiler: the peak from RunMetadata, the memory and flops hooks, static estimates."""
import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from epl.profiler import alive_at_peak, device_memory_stats, profile_flops, profile_memory
from epl.profiler import flops as flops_lib
from epl.profiler import memory_profiler_hook as mem_lib
from epl.profiler.flops import FlopsProfilerHook
from epl.profiler.memory_profiler_hook import MemoryProfilerHook
from epl.profiler.run_metadata import bytes_in_use_timeline, fed_shapes, run_time_shapes
from epl.profiler.units import device_tag, format_bytes, format_flops
from epl.tf_adapter import tf

CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"
CPU1 = "/job:localhost/replica:0/task:0/device:CPU:1"


def _node(dev, name, records, start=0, persistent=0):
    node = dev.node_stats.add(node_name=name, all_start_micros=start)
    if records:
        memory = node.memory.add(allocator_name="cpu")
        for micros, num_bytes in records:
            memory.allocation_records.add(alloc_micros=micros, alloc_bytes=num_bytes)
    if persistent:
        node.memory_stats.persistent_memory_size = persistent
    return node


def _hand_built_metadata():
    """Two devices with known peaks, records out of time order, and a host-tracer entry."""
    metadata = tf.RunMetadata()
    dev_a = metadata.step_stats.dev_stats.add(device="/device:CPU:0")
    # In use: 10:+100 -> 100, 20:+50 -> 150, 25:+200 -> 350 (peak), 30:-100 -> 250,
    # 35:-200 -> 50, 40:-50 -> 0. The frees of one op interleave with the others' allocations.
    _node(dev_a, "a", [(10, 100), (30, -100)], start=5, persistent=64)
    _node(dev_a, "c", [(25, 200), (35, -200)], start=24)
    _node(dev_a, "b", [(20, 50), (40, -50)], start=19, persistent=36)
    dev_b = metadata.step_stats.dev_stats.add(device="/device:CPU:1")
    # 6:+8 -> 8, 7:+8 -> 16, 8:-8 -> 8, 9:+24 -> 32 (peak), 12:-32 -> 0.
    _node(dev_b, "x", [(6, 8), (8, -8)], start=6)
    _node(dev_b, "y", [(7, 8), (9, 24), (12, -32)], start=7, persistent=1000)
    host = metadata.step_stats.dev_stats.add(device="/host:CPU")
    host.node_stats.add(node_name="a:MatMul", all_start_micros=5)
    return metadata


def test_peak_of_hand_built_run_metadata():
    stats = device_memory_stats(_hand_built_metadata(), top_k=2)
    assert list(stats) == ["/device:CPU:0", "/device:CPU:1"]   # the host tracer entry is left out
    dev_a, dev_b = stats["/device:CPU:0"], stats["/device:CPU:1"]
    assert dev_a.peak_bytes == 350 and dev_a.peak_micros == 25 - 5
    assert dev_a.persistent_bytes == 100
    assert dev_a.num_allocations == 3
    assert [b for _, b in dev_a.timeline] == [100, 150, 350, 250, 50, 0]
    assert dev_a.timeline[0] == (10 - 5, 100)
    assert dev_a.top_ops == [("c", 200), ("a", 100)]
    assert dev_b.peak_bytes == 32 and dev_b.peak_micros == 9 - 5
    assert dev_b.persistent_bytes == 1000
    assert dev_b.top_ops == [("y", 32), ("x", 8)]


def test_alive_at_peak_names_what_fills_each_peak():
    metadata = _hand_built_metadata()
    # CPU:0 peaks at 25 (350): a, b and c all alive; CPU:1 at 9 (32): only y (x freed at 8).
    assert alive_at_peak(metadata, "CPU:0") == [("c", 200), ("a", 100), ("b", 50)]
    assert alive_at_peak(metadata, "device:CPU:1") == [("y", 32)]
    same_micros = tf.RunMetadata()
    dev = same_micros.step_stats.dev_stats.add(device="/device:CPU:0")
    _node(dev, "p", [(5, 10), (5, -10)])   # freed in the peak's microsecond, after the peak
    _node(dev, "q", [(5, 4)])
    assert alive_at_peak(same_micros, "CPU:0") == [("p", 10)]
    with pytest.raises(ValueError, match="CPU:7"):
        alive_at_peak(metadata, "CPU:7")


def test_timeline_edge_cases():
    assert bytes_in_use_timeline([]) == ([], 0, None)
    # Same microsecond: the given order is kept, so the allocation counts before the free.
    _, peak, _ = bytes_in_use_timeline([(5, 10), (5, -10), (5, 4)])
    assert peak == 10
    # A device that only frees (buffers from an earlier step) never goes above zero.
    assert bytes_in_use_timeline([(1, -8)])[1:] == (0, None)


def test_run_time_shapes_marks_conflicts():
    metadata = tf.RunMetadata()
    dev = metadata.step_stats.dev_stats.add(device="/device:CPU:0")
    for rows in (3, 3, 5):
        out = dev.node_stats.add(node_name="loop_body").output.add(slot=0)
        out.tensor_description.shape.dim.add(size=rows)
    out = dev.node_stats.add(node_name="mm").output.add(slot=1)
    for size in (2, 7):
        out.tensor_description.shape.dim.add(size=size)
    assert run_time_shapes(metadata) == {"loop_body": {0: None}, "mm": {1: (2, 7)}}


def test_fed_shapes_reads_the_feed_nodes():
    metadata = tf.RunMetadata()
    dev = metadata.step_stats.dev_stats.add(device="/device:CPU:0")
    for name, rows in (("_arg_x_0_0", 3), ("_arg_x_1_0_1", 4), ("_recv_y_0", 5)):
        dev.node_stats.add(node_name=name).output.add(slot=0).tensor_description.shape.dim.add(
            size=rows)
    assert fed_shapes(metadata, ["x:0", "x_1:0", "y:0", "z:0"]) == {
        "x:0": (3,), "x_1:0": (4,), "y:0": (5,)}


def test_units():
    assert format_bytes(12) == "12 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 2 ** 30) == "3.00 GiB"
    assert format_flops(512) == "512 FLOP"
    assert format_flops(3.2e9) == "3.20 GFLOP"
    assert device_tag(CPU0) == "job_localhost_replica_0_task_0_device_CPU_0"


def _matmul_graph(m_rows, k, n, device=None):
    """x[None, k] @ w[k, n] on ``device``; returns (x, y, loss)."""
    x = tf.placeholder(tf.float32, [None, k], name="x")
    with tf.device(device):
        w = tf.get_variable("w", [k, n])
        y = tf.matmul(x, w, name="mm")
        loss = tf.reduce_sum(y)
    return x, y, loss


def _session(hooks, num_cpus=1):
    config = tf.ConfigProto(device_count={"CPU": num_cpus})
    creator = tf.train.ChiefSessionCreator(config=config)
    return tf.train.MonitoredSession(session_creator=creator, hooks=hooks)


def test_memory_hook_writes_files_only_on_profiled_steps(tmp_path):
    bin_dir, text_dir = str(tmp_path / "bin"), str(tmp_path / "text")
    with tf.Graph().as_default():
        x, _, loss = _matmul_graph(8, 16, 8)
        train_op = tf.train.GradientDescentOptimizer(0.1).minimize(loss)
        hooks = [MemoryProfilerHook(save_steps=2, max_steps=5, output_dir=bin_dir,
                                    dump_metadata=True, visualize=False),
                 MemoryProfilerHook(3, 5, text_dir, False, dump_metadata=True,
                                    metadata_format="pbtxt")]
        with _session(hooks) as sess:
            for _ in range(7):
                sess.run(train_op, {x: np.ones((8, 16))})
    assert sorted(os.listdir(bin_dir)) == ["memory_step_2.json", "memory_step_4.json",
                                           "run_metadata_2.bin", "run_metadata_4.bin"]
    assert sorted(os.listdir(text_dir)) == ["memory_step_3.json", "run_metadata_3.pbtxt"]
    report = json.load(open(os.path.join(bin_dir, "memory_step_4.json")))
    assert report["step"] == 4
    device = report["devices"][CPU0]
    assert device["peak_bytes"] == max(b for _, b in device["timeline"]) > 0
    assert device["persistent_bytes"] >= 16 * 8 * 4   # the variable w
    metadata = tf.RunMetadata()
    metadata.ParseFromString(open(os.path.join(bin_dir, "run_metadata_4.bin"), "rb").read())
    assert device_memory_stats(metadata)[CPU0].peak_bytes == device["peak_bytes"]
    assert hooks[0].last_stats[0] == 4


def _two_device_peaks(n_out):
    """Run a 2-layer model split over two virtual CPUs; return the hook's stats."""
    with tf.Graph().as_default():
        x = tf.placeholder(tf.float32, [None, 64])
        with tf.device("/cpu:0"):
            w0 = tf.get_variable("w0", [64, 128])
            hidden = tf.nn.relu(tf.matmul(x, w0))
        with tf.device("/cpu:1"):
            w1 = tf.get_variable("w1", [128, n_out])
            loss = tf.reduce_sum(tf.matmul(hidden, w1, name="big"))
        hook = MemoryProfilerHook(save_steps=1, max_steps=1, output_dir=None)
        with _session([hook], num_cpus=2) as sess:
            sess.run(loss, {x: np.ones((32, 64))})
    return hook.last_stats[1]


def test_memory_hook_reports_each_virtual_device():
    stats = _two_device_peaks(1024)
    assert {CPU0, CPU1} <= set(stats)
    # Variables are resident where they are placed.
    assert 64 * 128 * 4 <= stats[CPU0].persistent_bytes < 64 * 128 * 4 + 1024
    assert 128 * 1024 * 4 <= stats[CPU1].persistent_bytes < 128 * 1024 * 4 + 1024
    # The big matmul output [32, 1024] lives on CPU:1, the hidden layer [32, 128] on CPU:0.
    assert stats[CPU1].peak_bytes >= 32 * 1024 * 4
    assert 32 * 128 * 4 <= stats[CPU0].peak_bytes < 32 * 1024 * 4
    assert stats[CPU1].top_ops[0] == ("big", 32 * 1024 * 4)


def test_larger_matmul_gives_larger_peak():
    small, large = _two_device_peaks(64)[CPU1], _two_device_peaks(2048)[CPU1]
    assert large.peak_bytes > small.peak_bytes
    assert large.peak_bytes - small.peak_bytes >= 32 * (2048 - 64) * 4


def test_memory_hook_works_with_the_original_defaults(caplog):
    """MemoryProfilerHook() (save_steps=1, max_steps=5, output_dir="", visualize on when
    possible) logs steps 1 to 5 and writes nothing. It was a TypeError (three required
    arguments)."""
    hook = MemoryProfilerHook()
    with tf.Graph().as_default():
        x, _, loss = _matmul_graph(8, 16, 8)
        with caplog.at_level(logging.INFO, logger="epl.profiler"), _session([hook]) as sess:
            for _ in range(7):
                sess.run(loss, {x: np.ones((8, 16))})
    steps = sorted(set(int(r.getMessage().split()[2]) for r in caplog.records
                       if r.getMessage().startswith("memory step")))
    assert steps == [1, 2, 3, 4, 5] and hook.last_stats[0] == 5


def test_default_visualize_draws_when_it_can(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (visualize needs it)")
    with tf.Graph().as_default():
        x, _, loss = _matmul_graph(8, 16, 8)
        with _session([MemoryProfilerHook(1, 1, str(tmp_path))]) as sess:
            sess.run(loss, {x: np.ones((8, 16))})
    assert (tmp_path / ("memory_step_1_%s.png" % device_tag(CPU0))).exists()
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    hook = MemoryProfilerHook(1, 1, str(tmp_path / "no_png"))  # no error: JSON only
    assert hook._visualize is False  # pylint: disable=protected-access


def test_memory_hook_rejects_bad_arguments():
    with pytest.raises(ValueError, match="save_steps"):
        MemoryProfilerHook(0, 10, None)
    with pytest.raises(ValueError, match="max_steps"):
        MemoryProfilerHook(1, -1, None)
    with pytest.raises(ValueError, match="output_dir"):
        MemoryProfilerHook(1, 10, None, dump_metadata=True)
    with pytest.raises(ValueError, match="metadata_format"):
        MemoryProfilerHook(1, 10, "/tmp", metadata_format="json")


def test_visualize_writes_png(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (visualize needs it)")
    with tf.Graph().as_default():
        x, _, loss = _matmul_graph(8, 16, 8)
        hook = MemoryProfilerHook(1, 1, str(tmp_path), visualize=True)
        with _session([hook]) as sess:
            sess.run(loss, {x: np.ones((8, 16))})
    png = tmp_path / ("memory_step_1_%s.png" % device_tag(CPU0))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_visualize_without_matplotlib_is_a_clear_error(monkeypatch):
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match="pip install"):
        MemoryProfilerHook(1, 1, "/tmp", visualize=True)


def test_import_does_not_import_matplotlib():
    code = ("import sys, epl.profiler as p; [getattr(p, n) for n in p.__all__]; "
            "assert 'matplotlib' not in sys.modules, 'imported'")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    subprocess.check_call([sys.executable, "-c", code], env=env)


def test_profile_flops_of_a_known_matmul():
    m_rows, k, n = 8, 32, 16
    with tf.Graph().as_default():
        x, y, _ = _matmul_graph(m_rows, k, n)
        result = profile_flops(batch_size=m_rows, fetches=y)
        assert dict(result) == {"mm": 2 * m_rows * n * k}
        assert result.total == 2 * m_rows * n * k and result.batch_size == m_rows
        assert result.per_op_type == {"MatMul": 2 * m_rows * n * k}
        assert result.unknown == []
        # The user's graph keeps its unknown batch dimension.
        assert x.shape.as_list() == [None, k] and y.shape.as_list() == [None, n]
        unknown = profile_flops(fetches=y)
        assert "mm" not in unknown and "mm" in unknown.unknown


def test_profile_flops_fills_tf_1_15_gaps():
    with tf.Graph().as_default():
        lhs = tf.placeholder(tf.float32, [None, 3, 4, 5])
        rhs = tf.placeholder(tf.float32, [3, 6, 5])
        product = tf.matmul(lhs, rhs, adjoint_b=True, name="bmm")   # BatchMatMulV2
        total = product + 1.0                                       # AddV2
        result = profile_flops(batch_size=2)
        assert result["bmm"] == 2 * 2 * 3 * 4 * 6 * 5
        assert result[total.op.name] == 2 * 3 * 4 * 6


def test_profile_flops_takes_the_batch_from_the_dataset():
    with tf.Graph().as_default():
        data = tf.data.Dataset.from_tensor_slices(np.zeros((100, 10), np.float32)).batch(10)
        x = tf.data.make_one_shot_iterator(data).get_next()
        tf.layers.dense(x, 16, name="dense1")
        result = profile_flops()
        assert result.batch_size == 10
        assert result["dense1/MatMul"] == 2 * 10 * 10 * 16
        assert result["dense1/BiasAdd"] == 10 * 16
        assert x.shape.as_list() == [None, 10]


def test_profile_memory_uses_each_dtype_size():
    with tf.Graph().as_default():
        half = tf.placeholder(tf.float16, [None, 8], name="half")
        single = tf.placeholder(tf.float32, [None, 8], name="single")
        mixed = tf.cast(half, tf.float32) + single
        tf.get_variable("v16", [10, 4], dtype=tf.float16)
        tf.get_variable("v32", [10, 4], dtype=tf.float32)
        result = profile_memory(batch_size=4)
        assert result["half:0"] == 4 * 8 * 2
        assert result["single:0"] == 4 * 8 * 4
        assert result[mixed.name] == 4 * 8 * 4
        assert result.persistent == 10 * 4 * 2 + 10 * 4 * 4
        assert result.total == sum(result.values())
        assert half.shape.as_list() == [None, 8]
        restricted = profile_memory(batch_size=4, fetches=mixed)
        assert set(restricted) == {"half:0", "single:0", "Cast:0", mixed.name}
        assert "half:0" in profile_memory().unknown


def test_flops_hook_counts_the_fetched_step(tmp_path):
    m_rows, k, n = 8, 32, 16
    with tf.Graph().as_default():
        x, y, _ = _matmul_graph(m_rows, k, n)
        hook = FlopsProfilerHook(every_n_steps=2, output_dir=str(tmp_path))
        with _session([hook]) as sess:
            for _ in range(5):
                sess.run(y, {x: np.ones((m_rows, k))})
        assert x.shape.as_list() == [None, k]
    assert hook.flops_per_step == 2 * m_rows * n * k
    assert hook.result.source == "static"
    assert [record["step"] for record in hook.history] == [2, 4, 5]   # 5: reported at end()
    assert all(record["flops_per_second"] > 0 for record in hook.history)
    report = json.load(open(str(tmp_path / "flops.json")))
    assert report["flops_per_step"] == 2 * m_rows * n * k
    assert report["profile"]["values"] == {"mm": 2 * m_rows * n * k}


def test_flops_hook_uses_run_time_shapes_when_static_ones_are_unknown():
    m_rows, k, n = 6, 20, 12
    with tf.Graph().as_default():
        x = tf.placeholder(tf.float32, [None, k])
        rows = tf.where(tf.reduce_sum(x, 1) > -1.0)   # data-dependent: [?, 1]
        picked = tf.gather(x, rows[:, 0])
        y = tf.matmul(picked, tf.get_variable("w", [k, n]), name="mm")
        hook = FlopsProfilerHook(every_n_steps=10)
        with _session([hook]) as sess:
            for _ in range(2):
                sess.run(y, {x: np.ones((m_rows, k))})
        assert picked.shape.as_list() == [None, k]
    assert hook.result.source == "run_metadata"
    assert hook.result["mm"] == 2 * m_rows * n * k
    assert hook.result.unknown == []


def test_flops_hook_counts_a_while_loop_from_the_trace():
    m_rows, k = 4, 8
    with tf.Graph().as_default():
        x = tf.placeholder(tf.float32, [None, k])
        w = tf.get_variable("w", [k, k])
        _, out = tf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, tf.matmul(h, w)), [0, x])
        hook = FlopsProfilerHook(every_n_steps=10)
        with _session([hook]) as sess:
            sess.run(out, {x: np.ones((m_rows, k))})
    # Static shapes stop at the loop's Merge; the trace gives them (grappler removes the
    # loop's Identity ops, whose shapes are carried over from their inputs).
    assert hook.result.source == "run_metadata"
    assert hook.result["while/MatMul"] == 3 * 2 * m_rows * k * k   # three iterations


def test_original_epl_helpers():
    with tf.Graph().as_default() as graph:
        x, y, _ = _matmul_graph(4, 8, 2)
        with _session([]) as sess:
            metadata = tf.RunMetadata()
            options = tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE)
            sess.run(y, {x: np.ones((4, 8))}, options=options, run_metadata=metadata)
        # Whole graph (initializers too), shapes from the traced step, the feed included.
        total = flops_lib.profile_flops(sess, metadata)
        assert isinstance(total, int) and total == profile_flops(graph, batch_size=4).total
        assert total > 2 * 4 * 2 * 8
    stats = mem_lib.profile_memory(metadata)
    assert [entry["device"] for entry in stats] == [CPU0]
    assert stats[0]["peak_memory"] >= 4 * 2 * 4 and stats[0]["persist"] >= 8 * 2 * 4


def test_flops_hook_counts_every_epl_replica():
    import epl
    from epl.cluster import Cluster
    epl.init(cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1))
    x, y, loss = _matmul_graph(4, 8, 2)
    train_op = tf.train.GradientDescentOptimizer(0.1).minimize(loss)
    serial = profile_flops(batch_size=4, fetches=train_op)
    hook = FlopsProfilerHook(every_n_steps=10)
    with tf.train.MonitoredTrainingSession(hooks=[hook]) as sess:
        for _ in range(2):
            sess.run(train_op, {x: np.ones((4, 8))})
    # EPL runs both replicas in every step; each replica's matmuls are counted on its device.
    assert sorted(hook.result.per_device) == [CPU0, CPU1]
    assert hook.result.per_op_type["MatMul"] == 2 * serial.per_op_type["MatMul"]
