"""TensorFlow's CPU allocators under EPL's modes: glibc malloc (TF's default) against BFC.

EPL asks TensorFlow for its BFC allocator on CPU jobs unless the user chose
(:mod:`epl.cluster.cpu_allocator`). This measures why: for each mode, one process
on each allocator (``TF_CPU_ALLOCATOR_USE_BFC=0`` / ``=1``), alive at once, asked
for single steps in turn (``paired.py``), with each one's minor page faults per
step and peak resident memory.

Models: the shapes of ``benchmarks/shapes.py`` (default ``mid``, the 12-layer
encoder of ``benchmarks/rewrite_cost.py``; ``bert``, ``resnet``, ``moe``), at the
same global batch in every mode (4 micro-batches' rows; 16 for ``mid``), on 1
worker. Modes: ``plain`` (TF alone, no EPL, 1 device), ``dp2`` (2 virtual CPU
devices, half the batch each), ``offload`` (dp2 with ``offload.level=v0``),
``ga4`` (1 device, 4 micro-batches accumulated: a step is their 4 runs; before
2026-11-28 a row timed one run), ``pipe4`` and ``pipe4u`` (2 stages, 4
micro-batches, stage functions and unrolled copies).

    .venv/bin/python benchmarks/cpu_allocator.py [--shapes mid,bert,resnet,moe]
        [--modes plain,dp2,...] [--pairs 20]

Writes benchmarks/results/cpu_allocator.{json,md}.
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
import paired  # noqa: E402
import shapes as corpus  # noqa: E402

MODES = ("plain", "dp2", "offload", "ga4", "pipe4", "pipe4u")
# mode -> (shapes.py mode, lowering, more EPL config)
CORPUS_MODES = {"plain": ("plain", None, None), "dp2": ("dp", None, None),
                "offload": ("dp", None, {"offload.level": "v0"}), "ga4": ("ga", None, None),
                "pipe4": ("pipe", "stage_functions", None), "pipe4u": ("pipe", "unrolled", None)}


def child(args):
    tf = common.graph_mode_tf()
    import shapes
    mode, lowering, extra = CORPUS_MODES[args.mode]
    built = shapes.train_op(tf, args.shape, mode, lowering, extra=extra)
    start = time.time()
    with tf.train.MonitoredTrainingSession(config=tf.ConfigProto(device_count={"CPU": 2})) \
            as sess:
        sess.run(built.train)
        paired.serve_steps(sess, built.train, args.warmup, time.time() - start,
                           built.runs_per_step)


def result_key(shape, mode):
    """A row's key in the JSON: the mode, after ``<shape>/`` for shapes other than mid
    (whose rows came before the corpus)."""
    return mode if shape == "mid" else "%s/%s" % (shape, mode)


def measure(args, shape, mode):
    """One process per allocator, stepped in turn; their steps, faults and peak memory."""
    env = dict(os.environ, PYTHONPATH=common.REPO, TF_CPP_MIN_LOG_LEVEL="2")
    load = common.load_average()
    argv = [sys.executable, os.path.abspath(__file__), "--child", "--shape", shape,
            "--mode", mode, "--warmup", str(args.warmup)]
    starts = [(allocator, functools.partial(
        paired.StepServer, argv, paired.allocator_env(allocator, env),
        "%s %s (%s)" % (shape, mode, allocator))) for allocator in paired.ALLOCATORS]
    steps, faults, servers = paired.run_pair(starts, args.pairs)
    return dict(steps=steps, faults=faults, load_before=load,
                cpu=dict((a, s.cpu) for a, s in servers),
                max_rss_mb=dict((a, s.max_rss_mb) for a, s in servers))


def summary(result):
    """Median step and faults per allocator; median and quartiles of BFC / malloc
    over the pairs of adjacent steps."""
    malloc, bfc = (result["steps"][a] for a in paired.ALLOCATORS)
    ratios = [b / m for m, b in zip(malloc, bfc)]
    return dict(median=dict((a, statistics.median(s)) for a, s in result["steps"].items()),
                faults=dict((a, statistics.median(f)) for a, f in result["faults"].items()),
                ratio=statistics.median(ratios), quartiles=paired.quartiles(ratios),
                count=len(ratios),
                cpu=paired.cpu_ratio(*[result["cpu"][a] for a in ("bfc", "malloc")])
                if result.get("cpu") else None)


def row(key, result):
    s = summary(result)
    percent = lambda r: "%+.0f%%" % (round(100.0 * (r - 1)) or 0.0)  # never "-0%"
    rss = result["max_rss_mb"]
    shape, _, mode = key.rpartition("/")
    return [shape or "mid", mode, "%.2f" % s["median"]["malloc"], "%.2f" % s["median"]["bfc"],
            "%s (%s to %s)" % (percent(s["ratio"]), percent(s["quartiles"][0]),
                               percent(s["quartiles"][1])),
            "%.0fk / %.0f" % (s["faults"]["malloc"] / 1000.0, s["faults"]["bfc"]),
            "%.0f / %.0f" % (rss["malloc"], rss["bfc"]), s["count"],
            "%.1f" % result["load_before"][0] if result["load_before"] else "?",
            "%s (%s to %s)" % (percent(s["cpu"][0]), percent(s["cpu"][1][0]),
                               percent(s["cpu"][1][1])) if s["cpu"] else "not recorded"]


def row_order(key):
    """Rows by shape (corpus order), then mode (MODES order)."""
    shape, _, mode = key.rpartition("/")
    return list(corpus.SHAPES).index(shape or "mid"), MODES.index(mode)


def merged(out, results, runs):
    """``results`` with the JSON's rows (in ``out``) of the keys not run this time, and
    the runs they came from."""
    return paired.merge_rows(common.read_results(out, "cpu_allocator"), results, runs)


def markdown(results, runs):
    lines = ["# TensorFlow's CPU allocator: malloc (TF's default) vs BFC (shapes of "
             "benchmarks/shapes.py, 1 worker, virtual CPU devices)", ""]
    lines += paired.run_lines(runs)
    lines += [
        "- One process per allocator, alive at once, single steps alternated "
        "(A B B A ...); BFC vs malloc = BFC step / the malloc step next to it (median, "
        "interquartile range); page faults: median minor faults per step; peak RSS: "
        "each process's maximum resident memory (MB); a ga4 step is its 4 runs", "",
        common.markdown_table(
            ["shape", "mode", "malloc s", "BFC s", "BFC vs malloc (IQR)",
             "page faults per step (malloc / BFC)", "peak RSS MB (malloc / BFC)",
             "pairs of steps", "1-min load before", "CPU s per step, BFC vs malloc (IQR)",
             "run"],
            [row(key, results[key]) + [results[key].get("run", 0) + 1]
             for key in sorted(results, key=row_order)])]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--shape", default="mid", help=argparse.SUPPRESS)
    parser.add_argument("--modes", type=common.csv_list(str, MODES), default=list(MODES))
    parser.add_argument("--shapes", type=common.csv_list(str), default=["mid"],
                        help="shapes of benchmarks/shapes.py")
    parser.add_argument("--merge", action="store_true",
                        help="keep the JSON's rows of shapes and modes not run this time")
    parser.add_argument("--pairs", type=common.positive_int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    results = paired.measure_rows(args.shapes, args.modes, result_key,
                                  lambda shape, mode: measure(args, shape, mode), row)
    info = dict(common.environment_info(sys.argv), pairs=args.pairs, warmup=args.warmup)
    runs = [info]
    if args.merge:
        results, runs = merged(args.out, results, runs)
    text = markdown(results, runs)
    common.write_results(args.out, "cpu_allocator", dict(results=results, run=info, runs=runs),
                         text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
