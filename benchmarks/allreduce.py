"""Transport microbenchmark: one all-reduce of N floats between 2 workers on 127.0.0.1.

Compares EPL's ring backend (its default same-host shared-memory links, and
TCP links with ``EPL_RING_SHARED_MEMORY=0``), TensorFlow's collective ops (as EPL uses them when
``EPL_COLLECTIVE_BACKEND=tf``) and, when installed (``make bench-deps``),
Horovod's gloo all-reduce, for several sizes, each worker single-threaded.
This isolates the communication cost that the end-to-end benchmarks
(dp_scaling, dp_vs_horovod) mix with compute.

    .venv/bin/python benchmarks/allreduce.py [--sizes 262144,2250000,9000000] [--repeats 30]
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402

TIMEOUT = 120


def worker(args):
    """One worker: build a graph of one all-reduce, time ``repeats`` runs, print BENCH."""
    import numpy as np
    tf = common.graph_mode_tf()
    config = tf.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    if args.backend == "horovod":
        import horovod.tensorflow as hvd
        hvd.init()
        rank = hvd.rank()
        value = tf.Variable(np.ones(args.size, np.float32))
        reduced = hvd.allreduce(value.read_value())
        session = tf.Session(config=config)
    else:
        import epl
        from epl.communicators import Communicator, KeyRegistry
        epl.init()
        cluster = epl.Env.get().cluster
        rank = cluster.worker_index
        devices = [cluster.device(w, 0) for w in range(cluster.worker_num)]
        context = {"hosts": [h.rsplit(":", 1)[0] for h in cluster.hosts], "timeout": 60}
        comm = Communicator("allreduce_bench", devices, KeyRegistry(), context=context)
        with tf.device(devices[rank]):
            value = tf.Variable(np.ones(args.size, np.float32))
            reduced = comm.all_reduce(value.read_value(), devices[rank], "x")
            setup = comm.setup_ops()
        server = epl.Env.get().get_or_create_server(config)
        config.device_filters.append("/job:worker/task:%d" % rank)
        session = tf.Session(server.target, config=config)
    with session:
        session.run(tf.global_variables_initializer())
        links = None
        if args.backend != "horovod":
            session.run(setup)
            connects = [op.outputs[0] for op in setup if op.type == "EplRingConnect"]
            links = int(session.run(connects)[0]) if connects else None
        for _ in range(3):
            session.run(reduced.op)
        start = time.time()
        for _ in range(args.repeats):
            session.run(reduced.op)
        seconds = (time.time() - start) / args.repeats
    if rank == 0:
        print(common.bench_line({"backend": args.backend, "floats": args.size,
                                 "ms": seconds * 1e3, "ring_links": links}), flush=True)


# EPL_* settings per measured backend; the EPL ring runs once per link transport.
BACKEND_ENV = {
    "ring": {"EPL_COLLECTIVE_BACKEND": "ring", "EPL_RING_SHARED_MEMORY": "1"},
    "ring_tcp": {"EPL_COLLECTIVE_BACKEND": "ring", "EPL_RING_SHARED_MEMORY": "0"},
    "tf": {"EPL_COLLECTIVE_BACKEND": "tf"},
}
# EplRingConnect's output: 1 = connected, +2/+4 = outgoing/incoming link in shared memory.
EXPECTED_LINKS = {"ring": 7, "ring_tcp": 1}


def run(args, backend, size):
    script = [os.path.abspath(__file__), "--worker", "--backend", backend, "--size", str(size),
              "--repeats", str(args.repeats)]
    if backend == "horovod":
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        argv = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable] + script
        pattern = common.HOROVOD_LINE
    else:
        argv = [sys.executable, "-m", "epl.launcher", "--num_workers", "2", "--gpu_per_worker",
                "1"] + script
        pattern = common.WORKER_LINE
    result = common.run_command(argv, TIMEOUT, extra_env=BACKEND_ENV.get(backend, {}))
    record = common.parse_bench(result.lines, pattern).get(0)  # only rank 0 reports
    if record is not None:
        if backend in EXPECTED_LINKS and record["ring_links"] != EXPECTED_LINKS[backend]:
            raise common.BenchmarkError("%s: ring link state %s, expected %s" % (
                backend, record["ring_links"], EXPECTED_LINKS[backend]))
        return record
    raise common.BenchmarkError("%s all-reduce of %d floats failed (exit %s):\n%s" % (
        backend, size, result.returncode, "\n".join(result.lines[-30:])))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="262144,2250000,9000000")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="ring", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    try:
        import horovod  # noqa: F401
        backends = ["ring", "ring_tcp", "tf", "horovod"]
    except ImportError:
        backends = ["ring", "ring_tcp", "tf"]
        print("allreduce: Horovod not installed (run `make bench-deps`); skipping it")
    rows, records = [], []
    for size in [int(s) for s in args.sizes.split(",")]:
        times = dict((b, run(args, b, size)["ms"]) for b in backends)
        records.append({"floats": size, "ms": times})
        row = [size, "%.1f" % (size * 4 / 1e6)] + ["%.2f" % times[b] for b in backends]
        rows.append(row)
        print("floats=%d: %s" % (size, ", ".join("%s %.2f ms" % kv for kv in times.items())),
              flush=True)
    info = common.environment_info(sys.argv)
    names = {"ring": "EPL ring, shared memory ms", "ring_tcp": "EPL ring, TCP ms",
             "tf": "TF collectives ms", "horovod": "Horovod gloo ms"}
    markdown = "\n".join([
        "# One all-reduce between 2 workers on 127.0.0.1 (1 thread each)", "",
        "- Command: `%s`" % info["command"], "- Date: %s; EPL git %s" % (
            info["date"], info["git_revision"]),
        "- %s, %s CPUs; load average at start %s" % (info["cpu_model"], info["cpu_count"],
                                                     info["loadavg_start"]),
        "- Mean over %d runs after 3 warm-up runs, float32, timed in worker 0" % args.repeats,
        "", common.markdown_table(["floats", "MB"] + [names[b] for b in backends], rows), ""])
    common.write_results(args.out, "allreduce", {"environment": info, "results": records},
                         markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
