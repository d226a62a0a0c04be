"""Sparse gradients of a large embedding: gathered rows against dense reductions.

Two workers x 1 device on 127.0.0.1 (``epl-launch``) train one embedding table
(default 1M x 64 float32) looked up with ``embedding_lookup_sparse`` (``unique``
inside: one gradient row per distinct id), each worker its own random ids, at
several batch sizes, in three ways:

* ``gather``: EPL's default sparse path, the rows (values and int64 indices)
  all-gathered with each worker's own row count (``communication.sparse_reduction:
  gather``);
* ``all_reduce``: the rows added into a dense buffer with per-row touch counts,
  both all-reduced, the touched rows released: the optimizer still updates only
  them (``communication.sparse_reduction: all_reduce``);
* ``sparse_as_dense``: the gradient made dense before anything else, then
  all-reduced and applied densely (``communication.sparse_as_dense: true``).

Per row: the median step time and the bytes one worker receives per step as the
collectives' algorithms move them (the gather: the bucket of the larger row
count, from each other worker, 4 B of count each; the all-reduces: ring,
``2 (n - 1) / n`` of the buffer), with the row counts the workers had.

    .venv/bin/python benchmarks/sparse.py [--rows 1000000] [--dim 64]
        [--batches 256,4096,65536,262144] [--ids 4] [--steps 5]
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402

WORKERS = 2
TIMEOUT = 900
MODES = {
    "gather": {"EPL_COMMUNICATION_SPARSE_REDUCTION": "gather"},
    "all_reduce": {"EPL_COMMUNICATION_SPARSE_REDUCTION": "all_reduce"},
    "sparse_as_dense": {"EPL_COMMUNICATION_SPARSE_AS_DENSE": "true"},
}


def worker(args):
    """Train the table ``args.steps`` timed steps; worker 0 prints BENCH."""
    common.install_deadline(TIMEOUT - 60)
    import numpy as np
    tf = common.graph_mode_tf()
    import epl
    epl.init()
    epl.set_default_strategy(epl.replicate(1))
    index = epl.Env.get().cluster.worker_index
    ids = tf.placeholder(tf.int64, [None], name="ids")
    where = tf.placeholder(tf.int64, [None, 2], name="where")
    sparse = tf.SparseTensor(where, ids, [args.batch, args.ids])
    table = tf.get_variable("table", [args.rows, args.dim],
                            initializer=tf.random_uniform_initializer(-0.05, 0.05))
    looked_up = tf.nn.embedding_lookup_sparse(table, sparse, None, combiner="sum")
    loss = tf.reduce_mean(tf.square(looked_up - 0.1))
    train = tf.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=tf.train.get_or_create_global_step())
    rng = np.random.RandomState(index)
    positions = np.stack([np.repeat(np.arange(args.batch), args.ids),
                          np.tile(np.arange(args.ids), args.batch)], 1)
    feeds, counts = [], []
    for _ in range(args.steps + 2):
        batch_ids = rng.randint(0, args.rows, args.batch * args.ids)
        feeds.append({ids: batch_ids, where: positions})
        counts.append(len(np.unique(batch_ids)))
    with tf.train.MonitoredTrainingSession() as sess:
        for feed in feeds[:2]:
            sess.run(train, feed)
        times = []
        for feed in feeds[2:]:
            start = time.perf_counter()
            sess.run(train, feed)
            times.append(time.perf_counter() - start)
    if index == 0:
        print(common.bench_line({"step_ms": 1000.0 * sorted(times)[len(times) // 2],
                                 "rows": counts[2:]}), flush=True)
    else:
        print(common.bench_line({"rows": counts[2:]}), flush=True)


def bucket(rows):
    """The padded row count of EPL's gather through TF collectives (gather_v.BUCKETS)."""
    size = 16
    while size < rows:
        size *= 2
    return size


def bytes_received(mode, rows, args):
    """Bytes one worker receives per step (mean over steps), as the collectives move them."""
    table = args.rows * args.dim * 4
    ring = 2.0 * (WORKERS - 1) / WORKERS
    if mode == "sparse_as_dense":
        return ring * table
    if mode == "all_reduce":
        return ring * (table + args.rows * 4)
    row_bytes = args.dim * 4 + 8
    steps = list(zip(*rows))
    return sum((WORKERS - 1) * (bucket(max(step)) * row_bytes + 4) for step in steps) / len(steps)


def run(args, mode, batch):
    script_args = ["--worker", "--batch", batch]
    for name in ("rows", "dim", "ids", "steps"):
        script_args += ["--%s" % name, getattr(args, name)]
    result = common.launch(os.path.abspath(__file__), script_args, WORKERS, 1, TIMEOUT,
                           extra_env=MODES[mode])
    records = common.parse_bench(result.lines)
    if 0 not in records or 1 not in records:
        common.raise_failure(result, "sparse %s batch %d" % (mode, batch), WORKERS)
    common.discard_logs(result)
    rows = [records[w]["rows"] for w in range(WORKERS)]
    return {"mode": mode, "batch": batch, "step_ms": records[0]["step_ms"],
            "rows_per_worker": [sum(r) / float(len(r)) for r in rows],
            "mb_received": bytes_received(mode, rows, args) / 1e6}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1000000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batches", default="256,4096,65536,262144")
    parser.add_argument("--ids", type=int, default=4, help="ids per example")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    began = time.time()
    info = common.environment_info(sys.argv)
    records, table = [], []
    for batch in [int(b) for b in args.batches.split(",")]:
        for mode in args.modes.split(","):
            record = run(args, mode, batch)
            records.append(record)
            table.append([batch, batch * args.ids, "%.0f" % record["rows_per_worker"][0], mode,
                          "%.2f" % record["mb_received"], "%.0f" % record["step_ms"]])
            print("batch %d %s: %.1f MB, %.0f ms"
                  % (batch, mode, record["mb_received"], record["step_ms"]), flush=True)
    markdown = "\n".join([
        "# Sparse gradients of a %d x %d table: gathered rows against dense reductions"
        % (args.rows, args.dim), "",
        "- Command: `%s`" % info["command"],
        "- Date: %s; EPL git %s" % (info["date"], info["git_revision"]),
        "- %s, %s CPUs; load average at start %s" % (info["cpu_model"], info["cpu_count"],
                                                     info["loadavg_start"]),
        "- %d workers x 1 device on 127.0.0.1 (epl-launch), %d ids per example, SGD; median "
        "of %d steps after 2 warm-up steps, timed in worker 0"
        % (WORKERS, args.ids, args.steps),
        "- MB received: per worker per step, as the collectives move them (see the "
        "module docstring)", "",
        common.markdown_table(["batch", "ids", "distinct ids (rows) per worker", "mode",
                               "MB received", "step ms"], table), ""])
    payload = {"environment": info, "results": records,
               "settings": {"rows": args.rows, "dim": args.dim, "ids": args.ids,
                            "steps": args.steps, "workers": WORKERS}}
    return common.publish(args.out, "sparse", payload, markdown, time.time() - began)


if __name__ == "__main__":
    sys.exit(main())
