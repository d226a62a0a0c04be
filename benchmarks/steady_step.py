"""Steady step of a pipeline: stage functions against unrolled copies, paired A/B.

Issue 17 asks that calling each stage as a function per micro-batch leaves the
steady step within 5% of one graph copy per micro-batch (no loop or call
overhead). Timing the two lowerings in separate processes one after the other
cannot tell 5%: on a shared 2-core VM the same configuration's median step
moved by 10-30% between processes and over minutes. So both lowerings run at
once as two long-lived processes (built one after the other, so that builds do
not overlap), and the driver asks them for single steps in turn, in the order
A B B A A B ...: each step of one lowering has a step of the other right before
or after it, under the same machine state. The comparison is the median over
all pairs of (stage-functions step / unrolled step), with its interquartile
range; ``--repeats`` starts fresh process pairs (a process-level effect, such as
memory layout, would show as repeats that disagree).

Only one process computes at a time: the other waits on its stdin, so each step
has the machine to itself, as a user's single job would.

``--allocator`` picks TensorFlow's CPU allocator for both processes: ``malloc``
(TF's default, glibc; ``TF_CPU_ALLOCATOR_USE_BFC=0``) or ``bfc`` (TF's own best-fit
allocator, ``TF_CPU_ALLOCATOR_USE_BFC=1``, which ``epl.init`` selects for CPU jobs
when the variable is unset: :mod:`epl.cluster.cpu_allocator`). Under glibc, the
stage functions' allocation pattern makes its thread arenas create and drop 64 MB
heaps many times per step
(at m = 4 about 70 heaps per step against 4 for unrolled copies, seen with
``strace``), and every page of a new heap is faulted in again: the report gives
each lowering's minor page faults per step, so that a gap that comes from the
allocator is told apart from one that comes from the calls.

Models: the shapes of ``benchmarks/shapes.py`` (default ``mid``, the 12-layer
encoder of ``benchmarks/rewrite_cost.py``; ``bert``, ``resnet``, ``moe``), as a
pipeline (``pipe``: 2 stages on 1 worker x 2 virtual CPU devices, m micro-batches)
or as 2 local replicas (``dp``, whose repeated step is lowered the same two ways; m
sets its global batch, m micro-batches' rows).

    .venv/bin/python benchmarks/steady_step.py [--micro-batches 4,16,32]
        [--shapes mid,bert,resnet,moe] [--modes pipe,dp]
        [--pairs 12] [--repeats 2] [--warmup 2] [--allocator malloc|bfc] [--merge]

Writes benchmarks/results/steady_step.{json,md}. ``--merge`` keeps the rows of the
micro-batch counts not run this time from the JSON already there (an unrolled
m = 32 process alone takes minutes to build, so rows may be measured in separate
runs); each row names the run it comes from.
"""
import argparse
import functools
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402
import paired as pairing  # noqa: E402
import shapes as corpus  # noqa: E402
from paired import ALLOCATORS, BFC_VARIABLE, quartiles  # noqa: E402,F401

LOWERINGS = ("stage_functions", "unrolled")


# ---- the child: one lowering, one long-lived process -----------------------------
def child(args):
    """Build, first step, warm-up, then one timed step per line read from stdin
    (a BENCH line each), until stdin closes."""
    tf = common.graph_mode_tf()
    import shapes
    built = shapes.train_op(tf, args.shape, args.mode, args.lowering, args.micro_batches)
    config = tf.ConfigProto(device_count={"CPU": built.devices})
    start = time.time()
    with tf.train.MonitoredTrainingSession(config=config) as sess:
        sess.run(built.train)
        pairing.serve_steps(sess, built.train, args.warmup, time.time() - start)


def child_env(allocator):
    """The environment of a child process with TF's CPU allocator ``allocator``."""
    return pairing.allocator_env(
        allocator, dict(os.environ, PYTHONPATH=common.REPO, TF_CPP_MIN_LOG_LEVEL="2"))


def step_server(args, row, lowering):
    shape, mode, micro_batches = row
    argv = [sys.executable, os.path.abspath(__file__), "--child", "--shape", shape,
            "--mode", mode, "--micro-batches-one", str(micro_batches), "--lowering", lowering,
            "--warmup", str(args.warmup)]
    return pairing.StepServer(argv, child_env(args.allocator),
                              "%s %s %s m=%d" % (shape, mode, lowering, micro_batches))


def paired(args, row):
    """One process pair: {lowering: [step s]} for ``args.pairs`` rounds, order A B, B A, ..."""
    load = common.load_average()
    steps, faults, servers = pairing.run_pair(
        [(lowering, functools.partial(step_server, args, row, lowering))
         for lowering in LOWERINGS], args.pairs)
    return dict(steps=steps, faults=faults, load_before=load,
                cpu=dict((low, server.cpu) for low, server in servers),
                first_step=dict((low, server.first_step) for low, server in servers))


# ---- summary and report -----------------------------------------------------------
def summary(result):
    """Median step per lowering, and the median and quartiles of the per-pair
    ratio stage functions / unrolled, over all process pairs of a row."""
    per_pair, steps = [], dict((low, []) for low in LOWERINGS)
    for pair in result["pairs"]:
        functions, unrolled = (pair["steps"][low] for low in LOWERINGS)
        per_pair.append([f / u for f, u in zip(functions, unrolled)])
        for low in LOWERINGS:
            steps[low] += pair["steps"][low]
    ratios = [r for pair in per_pair for r in pair]
    pair_ratios = [statistics.median(pair) for pair in per_pair]
    faults = dict((low, [f for pair in result["pairs"]
                         for f in pair.get("faults", {}).get(low, [])]) for low in LOWERINGS)
    cpu = [dict(pair["cpu"]) for pair in result["pairs"] if pair.get("cpu")]
    return dict(median=dict((low, statistics.median(s)) for low, s in steps.items()),
                ratio=statistics.median(ratios), quartiles=quartiles(ratios),
                pair_ratios=pair_ratios, count=len(ratios),
                faults=dict((low, statistics.median(f)) for low, f in faults.items() if f),
                cpu=pairing.cpu_ratio(*[[c for pair in cpu for c in pair[low]]
                                        for low in LOWERINGS]) if cpu else None)


def row(key, result):
    s = summary(result)
    micro_batches, allocator = parse_key(key)
    percent = lambda r: "%+.0f%%" % (round(100.0 * (r - 1)) or 0.0)  # never "-0%"
    faults = ("%.0fk / %.0fk" % tuple(s["faults"][low] / 1000.0 for low in LOWERINGS)
              if len(s["faults"]) == len(LOWERINGS) else "not recorded")
    return list(parse_shape(key)) + [
        micro_batches, allocator,
        "%.2f" % s["median"][LOWERINGS[0]], "%.2f" % s["median"][LOWERINGS[1]],
        "%s (%s to %s)" % (percent(s["ratio"]), percent(s["quartiles"][0]),
                           percent(s["quartiles"][1])),
        " ".join(percent(r) for r in s["pair_ratios"]), faults, s["count"],
        result["run"] + 1, " ".join("%.1f" % p["load_before"][0] for p in result["pairs"]),
        "%s (%s to %s)" % (percent(s["cpu"][0]), percent(s["cpu"][1][0]),
                           percent(s["cpu"][1][1])) if s["cpu"] else "not recorded"]


def result_key(micro_batches, allocator, shape="mid", mode="pipe"):
    """A row's key in the JSON: ``<shape>/<mode>/`` (not for the mid encoder's
    pipeline, the rows from before the corpus), the micro-batch count, then ``:bfc``
    under TF's BFC allocator (rows of TF's default allocator keep the plain count,
    as before the allocator was a choice)."""
    head = "" if (shape, mode) == ("mid", "pipe") else "%s/%s/" % (shape, mode)
    return head + (str(micro_batches) if allocator == "malloc"
                   else "%d:%s" % (micro_batches, allocator))


def parse_key(key):
    """(micro-batches, allocator) of a :func:`result_key`."""
    count, _, allocator = key.rpartition("/")[2].partition(":")
    return int(count), allocator or "malloc"


def parse_shape(key):
    """(shape, mode) of a :func:`result_key`."""
    parts = key.split("/")
    return (parts[0], parts[1]) if len(parts) == 3 else ("mid", "pipe")


def row_order(key):
    """Rows by shape (corpus order), mode, micro-batch count, TF's default allocator
    first."""
    shape, mode = parse_shape(key)
    count, allocator = parse_key(key)
    return (list(corpus.SHAPES).index(shape), mode != "pipe", count,
            ALLOCATORS.index(allocator))


def merged(out, results, runs):
    """``results`` and ``runs`` with the rows of the JSON in ``out`` for the
    (micro-batch count, allocator) keys not in ``results`` (and the runs they come
    from). Rows of the earlier, unpaired method are dropped: they do not compare."""
    old = common.read_results(out, "steady_step")
    if old is None:
        return results, runs
    kept = dict((key, r) for key, r in old["results"].items()
                if key not in results and "pairs" in r)
    used = sorted(set(r["run"] for r in kept.values()))
    renumber = dict((index, len(runs) + position) for position, index in enumerate(used))
    for result in kept.values():
        result["run"] = renumber[result["run"]]
    results = dict(results)
    results.update(kept)
    return results, runs + [old["runs"][index] for index in used]


def markdown(results, runs):
    lines = ["# Steady step: stage functions vs unrolled copies (shapes of benchmarks/shapes.py; "
             "pipe = 2 stages, dp = 2 local replicas; 1 worker x 2 virtual CPU devices)", ""]
    for index, info in enumerate(runs):
        lines.append("- Run %d: `%s`; %s; EPL git %s; %s, %s CPUs; %d warm-up steps per "
                     "process" % (index + 1, info["command"], info["date"], info["git_revision"],
                                  info["cpu_model"], info["cpu_count"], info["warmup"]))
    lines += ["- Both lowerings alive at once, single steps alternated (A B B A ...); "
              "ratio = stage-functions step / the unrolled step next to it; the table gives "
              "each lowering's median step (s), the median ratio with its interquartile "
              "range, and the median ratio of each process pair; page faults: each "
              "lowering's median minor page faults per step (stage functions / unrolled); "
              "CPU allocator: TF's default (malloc) or its BFC allocator "
              "(`TF_CPU_ALLOCATOR_USE_BFC=1`)", "",
              common.markdown_table(
                  ["shape", "mode", "micro-batches", "CPU allocator", "stage functions s",
                   "unrolled s",
                   "functions vs unrolled (IQR)", "per process pair", "page faults per step",
                   "pairs of steps", "run", "1-min load before each process pair",
                   "CPU s per step, functions vs unrolled (IQR)"],
                  [row(key, results[key]) for key in sorted(results, key=row_order)])]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--micro-batches-one", type=int, dest="micro_batches_one",
                        help=argparse.SUPPRESS)
    parser.add_argument("--lowering", choices=LOWERINGS, help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--micro-batches", type=common.csv_list(common.positive_int),
                        default=[4, 16, 32])
    parser.add_argument("--shapes", type=common.csv_list(str), default=["mid"],
                        help="shapes of benchmarks/shapes.py")
    parser.add_argument("--modes", type=common.csv_list(str, ("pipe", "dp")), default=["pipe"])
    parser.add_argument("--pairs", type=common.positive_int, default=12,
                        help="steps of each lowering per process pair")
    parser.add_argument("--repeats", type=common.positive_int, default=2,
                        help="process pairs per micro-batch count")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--allocator", choices=ALLOCATORS, default="malloc",
                        help="TF's CPU allocator in both processes (see the module docstring)")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--merge", action="store_true",
                        help="keep the JSON's rows of micro-batch counts not run this time")
    args = parser.parse_args(argv)
    if args.child:
        args.micro_batches = args.micro_batches_one
        return child(args)
    results = {}
    for shape in args.shapes:
        for mode in args.modes:
            for micro_batches in args.micro_batches:
                key = result_key(micro_batches, args.allocator, shape, mode)
                results[key] = dict(run=0, pairs=[paired(args, (shape, mode, micro_batches))
                                                  for _ in range(args.repeats)])
                print(row(key, results[key]), flush=True)
    runs = [dict(common.environment_info(sys.argv), pairs=args.pairs, warmup=args.warmup)]
    if args.merge:
        results, runs = merged(args.out, results, runs)
    payload = dict(results=results, runs=runs)
    text = markdown(results, runs)
    common.write_results(args.out, "steady_step", payload, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
