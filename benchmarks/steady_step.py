"""Steady step of a pipeline: stage functions against unrolled copies, A/B.

Issue 17 asks that calling each stage as a function per micro-batch leaves the
steady step within 5% of one graph copy per micro-batch (no loop or call
overhead). A single process's mean of 3 steps is not enough to tell: on a
shared 2-core VM the same configuration differed by 30% either way between
processes. So each lowering runs in ``--repeats`` fresh processes, alternated
(A B A B ...) so that a slow period of the machine hits both, each timing
``--steps`` steps after ``--warmup`` untimed ones; a process reports its median
step, and the report gives, per lowering, the median of those medians with
their range, plus the machine's load before each process.

Model: the ``mid`` encoder of ``benchmarks/rewrite_cost.py`` (12 layers, hidden
384, seq 32, 12 heads, micro-batch 4, Adam), 2 stages on 1 worker x 2 virtual
CPU devices.

    .venv/bin/python benchmarks/steady_step.py [--micro-batches 4,16] [--repeats 3]
        [--steps 8] [--warmup 2] [--merge]

Writes benchmarks/results/steady_step.{json,md}. ``--merge`` keeps the rows of the
micro-batch counts not run this time from the JSON already there (an unrolled
m = 32 process alone takes minutes, so rows are measured in separate runs); each
row names the run it comes from.
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402

LOWERINGS = ("stage_functions", "unrolled")
TIMEOUT = 1800


def child(args):
    """One process: build, first step, warm-up, timed steps; prints a BENCH line."""
    import tensorflow.compat.v1 as tf
    import epl
    import transformer
    from epl.cluster import Cluster
    size = dict(transformer.SIZES["mid"], layers=12)
    epl.init(epl.Config({"pipeline.num_micro_batch": args.micro_batches,
                         "pipeline.micro_batching": args.lowering}),
             cluster=Cluster(devices_per_worker=2))
    stages = [epl.replicate(1, name="stage_%d" % s) for s in range(2)]
    half = size["layers"] // 2
    loss, train = transformer.build(tf, size, 4, lambda layer: stages[min(layer // half, 1)])
    config = tf.ConfigProto(device_count={"CPU": 2})
    start = time.time()
    with tf.train.MonitoredTrainingSession(config=config) as sess:
        sess.run(train)
        first = time.time() - start
        for _ in range(args.warmup):
            sess.run(train)
        steps = []
        for _ in range(args.steps):
            start = time.time()
            sess.run(train)
            steps.append(time.time() - start)
    common.bench_line(dict(first_step=first, steps=steps, median=statistics.median(steps)))


def run_child(args, micro_batches, lowering):
    argv = [sys.executable, os.path.abspath(__file__), "--child",
            "--micro-batches-one", str(micro_batches), "--lowering", lowering,
            "--steps", str(args.steps), "--warmup", str(args.warmup)]
    load = common.load_average()
    payload = common.run_single(argv, TIMEOUT, " ".join(argv[2:]),
                                extra_env={"PYTHONPATH": common.REPO})
    return dict(payload, load_before=load)


def summary(runs):
    """Median of the processes' median steps, and their range."""
    medians = [run["median"] for run in runs]
    return dict(median=statistics.median(medians), low=min(medians), high=max(medians))


def row(micro_batches, result):
    functions, unrolled = (summary(result[low]) for low in LOWERINGS)
    span = lambda s: "%.2f (%.2f-%.2f)" % (s["median"], s["low"], s["high"])
    return [micro_batches, span(functions), span(unrolled),
            "%+.0f%%" % (100.0 * (functions["median"] / unrolled["median"] - 1)),
            len(result[LOWERINGS[0]]), result["run"] + 1,
            " ".join("%.1f" % run["load_before"][0] for low in LOWERINGS
                     for run in result[low])]


def merged(out, results, runs):
    """``results`` and ``runs`` with the rows of the JSON in ``out`` for the
    micro-batch counts not in ``results`` (and the runs they come from)."""
    old = common.read_results(out, "steady_step")
    if old is None:
        return results, runs
    old_runs = old.get("runs") or [dict(old["environment"], steps=old["steps"],
                                        warmup=old["warmup"])]
    kept = dict((int(m), r) for m, r in old["results"].items() if int(m) not in results)
    used = sorted(set(r.get("run", 0) for r in kept.values()))
    renumber = dict((index, len(runs) + position) for position, index in enumerate(used))
    for result in kept.values():
        result["run"] = renumber[result.get("run", 0)]
    results = dict(results)
    results.update(kept)
    return results, runs + [old_runs[index] for index in used]


def markdown(results, runs):
    lines = ["# Steady step: stage functions vs unrolled copies (mid-12 encoder, 2 stages, "
             "1 worker x 2 virtual CPU devices)", ""]
    for index, info in enumerate(runs):
        lines.append("- Run %d: `%s`; %s; EPL git %s; %s, %s CPUs; each process times %d "
                     "steps after %d warm-up steps" % (
                         index + 1, info["command"], info["date"], info["git_revision"],
                         info["cpu_model"], info["cpu_count"], info["steps"], info["warmup"]))
    lines += ["- Fresh processes per lowering, alternated; each reports its median step; "
              "the table gives the median of those medians and their range (s per step)", "",
              common.markdown_table(
                  ["micro-batches", "stage functions s", "unrolled s", "functions vs unrolled",
                   "processes per lowering", "run", "1-min load before each process"],
                  [row(m, r) for m, r in sorted(results.items())])]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--micro-batches-one", type=int, dest="micro_batches_one",
                        help=argparse.SUPPRESS)
    parser.add_argument("--lowering", choices=LOWERINGS, help=argparse.SUPPRESS)
    parser.add_argument("--micro-batches", type=common.csv_list(common.positive_int),
                        default=[4, 16])
    parser.add_argument("--repeats", type=common.positive_int, default=3)
    parser.add_argument("--steps", type=common.positive_int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--merge", action="store_true",
                        help="keep the JSON's rows of micro-batch counts not run this time")
    args = parser.parse_args(argv)
    if args.child:
        args.micro_batches = args.micro_batches_one
        return child(args)
    results = {}
    for micro_batches in args.micro_batches:
        result = results[micro_batches] = dict((low, []) for low in LOWERINGS)
        result["run"] = 0
        for _ in range(args.repeats):
            for lowering in LOWERINGS:
                result[lowering].append(run_child(args, micro_batches, lowering))
        print(row(micro_batches, result), flush=True)
    runs = [dict(common.environment_info(sys.argv), steps=args.steps, warmup=args.warmup)]
    if args.merge:
        results, runs = merged(args.out, results, runs)
    payload = dict(results=dict((str(m), r) for m, r in results.items()), runs=runs)
    text = markdown(results, runs)
    common.write_results(args.out, "steady_step", payload, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
