"""TensorFlow's CPU allocators under EPL's modes: glibc malloc (TF's default) against BFC.

EPL asks TensorFlow for its BFC allocator on CPU jobs unless the user chose
(:mod:`epl.cluster.cpu_allocator`). This measures why: for each mode, one process
on each allocator (``TF_CPU_ALLOCATOR_USE_BFC=0`` / ``=1``), alive at once, asked
for single steps in turn (``paired.py``), with each one's minor page faults per
step and peak resident memory.

Model: the ``mid`` encoder of ``benchmarks/rewrite_cost.py`` (12 layers, hidden
384, seq 32, 12 heads, Adam), global batch 16 on 1 worker. Modes: ``plain`` (TF
alone, no EPL, 1 device), ``dp2`` (2 virtual CPU devices, batch 8 each),
``offload`` (dp2 with ``offload.level=v0``), ``ga4`` (1 device, 4 micro-batches
of 4), ``pipe4`` and ``pipe4u`` (2 stages, 4 micro-batches of 4, stage functions
and unrolled copies).

    .venv/bin/python benchmarks/cpu_allocator.py [--modes plain,dp2,...] [--pairs 20]

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

MODES = ("plain", "dp2", "offload", "ga4", "pipe4", "pipe4u")
CONFIGS = {"dp2": {}, "offload": {"offload.level": "v0"},
           "ga4": {"pipeline.num_micro_batch": 4},
           "pipe4": {"pipeline.num_micro_batch": 4,
                     "pipeline.micro_batching": "stage_functions"},
           "pipe4u": {"pipeline.num_micro_batch": 4, "pipeline.micro_batching": "unrolled"}}


def build(tf, mode):
    """The train op of ``mode`` (after epl.init where the mode uses EPL)."""
    import transformer
    size = dict(transformer.SIZES["mid"], layers=12)
    if mode == "plain":
        return transformer.build(tf, size, 16)[1]
    import epl
    from epl.cluster import Cluster
    devices = 1 if mode == "ga4" else 2
    epl.init(epl.Config(CONFIGS[mode]), cluster=Cluster(devices_per_worker=devices))
    if mode.startswith("pipe"):
        stages = [epl.replicate(1, name="stage_%d" % s) for s in range(2)]
        half = size["layers"] // 2
        return transformer.build(tf, size, 4, lambda layer: stages[min(layer // half, 1)])[1]
    epl.set_default_strategy(epl.replicate(1))
    return transformer.build(tf, size, 4 if mode == "ga4" else 8)[1]


def child(args):
    import tensorflow.compat.v1 as tf
    train = build(tf, args.mode)
    start = time.time()
    with tf.train.MonitoredTrainingSession(config=tf.ConfigProto(device_count={"CPU": 2})) \
            as sess:
        sess.run(train)
        paired.serve_steps(sess, train, args.warmup, time.time() - start)


def measure(args, mode):
    """One process per allocator, stepped in turn; their steps, faults and peak memory."""
    env = dict(os.environ, PYTHONPATH=common.REPO, TF_CPP_MIN_LOG_LEVEL="2")
    load = common.load_average()
    argv = [sys.executable, os.path.abspath(__file__), "--child", "--mode", mode,
            "--warmup", str(args.warmup)]
    starts = [(allocator, functools.partial(
        paired.StepServer, argv, paired.allocator_env(allocator, env),
        "%s (%s)" % (mode, allocator))) for allocator in paired.ALLOCATORS]
    steps, faults, servers = paired.run_pair(starts, args.pairs)
    return dict(steps=steps, faults=faults, load_before=load,
                max_rss_mb=dict((a, s.max_rss_mb) for a, s in servers))


def summary(result):
    """Median step and faults per allocator; median and quartiles of BFC / malloc
    over the pairs of adjacent steps."""
    malloc, bfc = (result["steps"][a] for a in paired.ALLOCATORS)
    ratios = [b / m for m, b in zip(malloc, bfc)]
    return dict(median=dict((a, statistics.median(s)) for a, s in result["steps"].items()),
                faults=dict((a, statistics.median(f)) for a, f in result["faults"].items()),
                ratio=statistics.median(ratios), quartiles=paired.quartiles(ratios),
                count=len(ratios))


def row(mode, result):
    s = summary(result)
    percent = lambda r: "%+.0f%%" % (round(100.0 * (r - 1)) or 0.0)  # never "-0%"
    rss = result["max_rss_mb"]
    return [mode, "%.2f" % s["median"]["malloc"], "%.2f" % s["median"]["bfc"],
            "%s (%s to %s)" % (percent(s["ratio"]), percent(s["quartiles"][0]),
                               percent(s["quartiles"][1])),
            "%.0fk / %.0f" % (s["faults"]["malloc"] / 1000.0, s["faults"]["bfc"]),
            "%.0f / %.0f" % (rss["malloc"], rss["bfc"]), s["count"],
            "%.1f" % result["load_before"][0] if result["load_before"] else "?"]


def markdown(results, info):
    lines = ["# TensorFlow's CPU allocator: malloc (TF's default) vs BFC (mid-12 encoder, "
             "1 worker, virtual CPU devices)", "",
             "- `%s`; %s; EPL git %s; %s, %s CPUs; %d warm-up steps per process" % (
                 info["command"], info["date"], info["git_revision"], info["cpu_model"],
                 info["cpu_count"], info["warmup"]),
             "- One process per allocator, alive at once, single steps alternated "
             "(A B B A ...); BFC vs malloc = BFC step / the malloc step next to it (median, "
             "interquartile range); page faults: median minor faults per step; peak RSS: "
             "each process's maximum resident memory (MB)", "",
             common.markdown_table(
                 ["mode", "malloc s", "BFC s", "BFC vs malloc (IQR)",
                  "page faults per step (malloc / BFC)", "peak RSS MB (malloc / BFC)",
                  "pairs of steps", "1-min load before"],
                 [row(mode, results[mode]) for mode in MODES if mode in results])]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--modes", type=common.csv_list(str, MODES), default=list(MODES))
    parser.add_argument("--pairs", type=common.positive_int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    results = {}
    for mode in args.modes:
        results[mode] = measure(args, mode)
        print(row(mode, results[mode]), flush=True)
    info = dict(common.environment_info(sys.argv), pairs=args.pairs, warmup=args.warmup)
    text = markdown(results, info)
    common.write_results(args.out, "cpu_allocator", dict(results=results, run=info), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
