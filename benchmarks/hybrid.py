"""Hybrid layouts: the seeds' default placement against the colocated one, same devices.

One worker with ``--devices`` D virtual CPU devices trains a dense backbone
(``epl.replicate(k)``) and a ``--classes``-way classifier (``epl.split(k)``),
k = D / 2, with the same global batch in every row:

* **default**: no ``cluster.colocate_split_and_replicate``. Each TaskGraph has k devices of
  its own: one model replica on the D devices, the backbone's activations sent to the
  classifier's devices and its gradients back;
* **default, pipeline m=2**: the same with ``pipeline.num_micro_batch=2``;
* **colocated**: the key set: both TaskGraphs on the same k devices, so two replicas
  (data parallelism over them).

Reported per row: step time, and the bytes moved between devices per step, counted on
the rewritten graph in one run: the tensors an op reads from another compute device
(activations forward, gradients back: TF sends them) and the tensors entering collective
ops (split layers' gathers, gradient all-reduces).
The D virtual devices share this machine's cores; numbers are for comparing rows.

    .venv/bin/python benchmarks/hybrid.py [--devices 4] [--classes 5000,20000]
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402

LAYOUTS = (("default", False, 1), ("default, pipeline m=2", False, 2),
           ("colocated", True, 1))


def _model(tf, epl, args, width):
    import numpy as np
    rng = np.random.RandomState(0)
    rows = 4 * args.batch
    data = tf.data.Dataset.from_tensor_slices(
        (rng.rand(rows, args.features).astype(np.float32),
         rng.randint(0, args.classes, rows).astype(np.int64))).repeat().batch(args.batch_read)
    x, y = tf.data.make_one_shot_iterator(data).get_next()
    with epl.replicate(width):
        features = tf.layers.dense(x, args.features, activation=tf.nn.relu, name="backbone")
    with epl.split(width):
        logits = tf.layers.dense(features, args.classes, name="classifier")
        loss = tf.losses.sparse_softmax_cross_entropy(y, logits)
    return tf.train.AdamOptimizer(0.001).minimize(loss)


def crossing_tensors(graph, ran, collective_ops):
    """(tensors an op reads from another compute device, tensors entering collectives)
    among the ops a training step ran (``ran``: node names of a traced step;
    ``collective_ops``: EPL's collective op names): what moves between devices."""
    crossing, collective = {}, {}
    for op in graph.get_operations():
        if op.name not in ran:
            continue
        if op.name in collective_ops or op.type.startswith("Collective"):
            for tensor in op.inputs:
                collective[tensor.name] = tensor
            continue
        for tensor in op.inputs:
            if tensor.op.name in ran and op.device and tensor.op.device and \
                    _device(op) != _device(tensor.op):
                crossing[tensor.name] = tensor
    return list(crossing.values()), list(collective.values())


def _device(op):
    return op.device.lower().replace("/device:", "/").split("/replica:")[-1]


def byte_counts(tf, tensors):
    """One scalar per group of tensors: their total bytes in a run."""
    if not tensors:
        return tf.constant(0, tf.int64)
    sizes = []
    for tensor in tensors:
        with tf.device(tensor.device or tensor.op.device):
            sizes.append(tf.size(tensor, out_type=tf.int64) * tensor.dtype.size)
    return tf.add_n(sizes)


def child(args):
    common.install_deadline(args.timeout, "hybrid benchmark child")
    tf = common.graph_mode_tf()
    import epl
    from epl.cluster import Cluster
    _, colocate, micro_batches = LAYOUTS[args.child_layout]
    args.classes = args.classes[0]  # one size per child
    width = args.devices // 2
    replicas = 2 if colocate else 1
    args.batch_read = args.batch // (replicas * micro_batches)
    epl.init(epl.Config({"cluster.colocate_split_and_replicate": colocate,
                         "pipeline.num_micro_batch": micro_batches}),
             cluster=Cluster(devices_per_worker=args.devices))
    train = _model(tf, epl, args, width)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(args.warmup):
            sess.run(train)
        meta = tf.RunMetadata()
        sess.run(train, options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
                 run_metadata=meta)
        ran = set(node.node_name for dev in meta.step_stats.dev_stats
                  for node in dev.node_stats)
        program = epl.Graph.get().parallel
        crossing, collective = crossing_tensors(tf.get_default_graph(), ran,
                                                set(program.collective_ops))
        counts = [byte_counts(tf, crossing), byte_counts(tf, collective)]
        _, received, gathered = sess.run([train] + counts)
        start = time.time()
        for _ in range(args.steps):
            sess.run(train)
        step_ms = 1000.0 * (time.time() - start) / args.steps
    common.bench_line({"layout": LAYOUTS[args.child_layout][0], "step_ms": step_ms,
                       "recv_bytes": int(received), "collective_bytes": int(gathered),
                       "replicas": replicas, "width": width})


def run_child(args, index, classes):
    argv = [sys.executable, os.path.abspath(__file__), "--child-layout", str(index),
            "--classes", str(classes)]
    for name in ("devices", "features", "batch", "steps", "warmup", "timeout"):
        argv += ["--" + name, str(getattr(args, name))]
    payload = common.run_single(argv, args.timeout, "hybrid benchmark %s" % LAYOUTS[index][0],
                                extra_env={"TF_CPP_MIN_LOG_LEVEL": "2"},
                                drop_env=[k for k in os.environ if k.startswith("EPL_")])
    payload["classes"] = classes
    print("%s, %d classes: %.1f ms/step" % (payload["layout"], classes, payload["step_ms"]),
          flush=True)
    return payload


def report(args, results, seconds):
    mb = lambda b: "%.2f" % (b / 1e6)
    rows = [(r["classes"], r["layout"], r["replicas"], r["width"], "%.1f" % r["step_ms"],
             mb(r["recv_bytes"]), mb(r["collective_bytes"]),
             mb(r["recv_bytes"] + r["collective_bytes"])) for r in results]
    markdown = "\n".join([
        "# Hybrid layouts: default placement vs colocated (%d devices, global batch %d)"
        % (args.devices, args.batch), "",
        common.markdown_table(["classes", "layout", "replicas", "k", "step ms",
                               "sent MB (device to device)", "into collectives MB",
                               "moved MB/step"], rows), "",
        "Command: `%s`" % common.format_command(["benchmarks/hybrid.py"] + sys.argv[1:]),
        "", "Virtual CPU devices share the machine's cores; compare rows, not machines."])
    payload = {"results": results, "environment": common.environment_info(sys.argv),
               "devices": args.devices, "classes": args.classes, "batch": args.batch}
    return common.publish(args.out, "hybrid", payload, markdown, seconds)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--classes", type=common.csv_list(int), default=[5000, 20000],
                        help="classifier sizes (a child gets one)")
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64, help="global batch")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--child-layout", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_layout is not None:
        child(args)
        return 0
    start = time.time()
    results = [run_child(args, index, classes) for classes in args.classes
               for index in range(len(LAYOUTS))]
    return report(args, results, time.time() - start)


if __name__ == "__main__":
    sys.exit(main())
