"""Microbenchmark: EPL's fused pack/unpack C++ ops vs TensorFlow's concat/split path.

Gradient fusion packs a list of tensors into one buffer before a collective
and unpacks it after. The pure-TF path needs one Reshape per tensor plus a
ConcatV2 to pack, and a SplitV plus one Reshape per tensor to unpack; the
C++ ops (csrc/ops/fused_buffer.cc) do each direction in one kernel. This
times one pack+unpack round trip for several tensor counts and sizes, in one
process and one thread, and checks that both paths give identical bytes.

    .venv/bin/python benchmarks/fusion_ops.py [--repeats 200] [--out benchmarks/results]
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

CASES = [(4, 256), (16, 4096), (64, 16384), (256, 4096), (16, 262144)]  # (tensors, floats each)


def _graph(count, size, fused):
    """A graph doing one pack + unpack of ``count`` tensors of ``size`` floats."""
    tf = common.graph_mode_tf()
    from epl.communicators import fusion
    os.environ["EPL_DISABLE_OP_LIBRARY"] = "0" if fused else "1"
    fusion.library._STATE.clear()  # pylint: disable=protected-access
    graph = tf.Graph()
    with graph.as_default():
        rng = np.random.RandomState(0)
        tensors = [tf.Variable(rng.rand(size // 4, 4).astype(np.float32)) for _ in range(count)]
        reads = [t.read_value() for t in tensors]
        packed = fusion.pack(reads)
        parts = fusion.unpack(packed, [r.shape for r in reads])
        # A reduction forces every output to be materialized without a big fetch.
        checksum = tf.add_n([tf.reduce_sum(p) for p in parts])
        init = tf.global_variables_initializer()
    kinds = sorted(set(op.type for op in graph.get_operations()))
    return graph, init, checksum, packed, kinds


def _time(count, size, fused, repeats):
    tf = common.graph_mode_tf()
    graph, init, checksum, packed, kinds = _graph(count, size, fused)
    config = tf.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    with tf.Session(graph=graph, config=config) as sess:
        sess.run(init)
        for _ in range(10):
            sess.run(checksum)
        start = time.time()
        for _ in range(repeats):
            sess.run(checksum)
        elapsed = (time.time() - start) / repeats
        return elapsed * 1e6, sess.run(packed), len(graph.get_operations()), kinds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", default=os.path.join(common.HERE, "results"))
    args = parser.parse_args(argv)
    from epl.communicators import library
    if library.load() is None:
        print("fusion_ops: the EPL op library is not built; run `make setup` first")
        return 2
    rows, records = [], []
    for count, size in CASES:
        fused_us, fused_bytes, fused_ops, _ = _time(count, size, True, args.repeats)
        tf_us, tf_bytes, tf_ops, _ = _time(count, size, False, args.repeats)
        identical = bool(np.array_equal(fused_bytes, tf_bytes))
        records.append({"tensors": count, "floats_each": size, "fused_us": fused_us,
                        "tf_us": tf_us, "fused_graph_ops": fused_ops, "tf_graph_ops": tf_ops,
                        "identical": identical})
        rows.append([count, size, "%.1f" % (count * size * 4 / 1e6), "%.0f" % tf_us,
                     "%.0f" % fused_us, "%.2fx" % (tf_us / fused_us), tf_ops, fused_ops,
                     "yes" if identical else "NO"])
        print("tensors=%d floats=%d: concat/split %.0f us, pack/unpack %.0f us"
              % (count, size, tf_us, fused_us), flush=True)
    tf = common.graph_mode_tf()
    info = common.environment_info(sys.argv)
    info["tensorflow"] = tf.__version__
    table = common.markdown_table(
        ["tensors", "floats each", "MB", "concat/split us", "pack/unpack us", "speedup",
         "graph ops (TF)", "graph ops (fused)", "identical"], rows)
    markdown = "\n".join([
        "# Fused pack/unpack vs concat/split (one round trip, 1 thread)", "",
        "- Command: `%s`" % info["command"], "- Date: %s" % info["date"],
        "- TensorFlow %s; %s (%s CPUs); load average %s" % (
            info["tensorflow"], info["cpu_model"], info["cpu_count"], info["loadavg_start"]),
        "- Mean time of one pack + unpack (+ a checksum) over %d runs after 10 warm-up runs; "
        "graph ops counts every op in the benchmark graph" % args.repeats, "", table, ""])
    common.write_results(args.out, "fusion_ops", {"environment": info, "cases": records},
                         markdown)
    print(markdown)
    return 0 if all(r["identical"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
