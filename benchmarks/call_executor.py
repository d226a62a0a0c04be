"""Stage functions' calls on TF's default executor against its single-threaded one, paired.

EPL gives each call of a CPU stage function whose body TF's single-threaded executor
accepts that executor (``pipeline.call_executor: auto``,
:mod:`epl.parallel.repeat.executors`). This measures the choice itself: the same
pipeline lowered as stage functions, one process with ``pipeline.call_executor:
default`` (every call on TF's default executor, as before) and one with ``auto``, both
alive, single steps alternated (``paired.py``; each process is ``steady_step.py``'s
child, TF's BFC allocator as ``epl.init`` picks for CPU jobs). The CPU seconds a step
costs (all threads) move far less with other processes' load than its wall time.

    .venv/bin/python benchmarks/call_executor.py [--shapes resnet,moe,mid]
        [--micro-batches 4] [--pairs 16] [--repeats 2] [--first default|auto]

Writes benchmarks/results/call_executor.{json,md}.
"""
import argparse
import functools
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402
import paired  # noqa: E402
import shapes as corpus  # noqa: E402

EXECUTORS = ("default", "auto")  # pipeline.call_executor of the two processes


def measure(args, shape):
    """One process per executor choice, stepped in turn."""
    load = common.load_average()
    argv = [sys.executable, os.path.join(HERE, "steady_step.py"), "--child", "--shape", shape,
            "--mode", "pipe", "--micro-batches-one", str(args.micro_batches),
            "--lowering", "stage_functions", "--warmup", str(args.warmup)]
    env = paired.allocator_env("bfc", dict(os.environ, PYTHONPATH=common.REPO,
                                           TF_CPP_MIN_LOG_LEVEL="2"))
    starts = [(choice, functools.partial(
        paired.StepServer, argv, dict(env, EPL_PIPELINE_CALL_EXECUTOR=choice),
        "%s pipe m=%d call_executor=%s" % (shape, args.micro_batches, choice)))
        for choice in (EXECUTORS if args.first == EXECUTORS[0] else EXECUTORS[::-1])]
    steps, _, servers = paired.run_pair(starts, args.pairs)
    return dict(steps=steps, load_before=load, micro_batches=args.micro_batches,
                cpu=dict((c, s.cpu) for c, s in servers),
                first_step=dict((c, s.first_step) for c, s in servers))


def row(key, result):
    default, auto = (result["steps"][c] for c in EXECUTORS)
    ratios = [a / d for d, a in zip(default, auto)]
    cpu = paired.cpu_ratio(*[result["cpu"][c] for c in ("auto", "default")])
    percent = lambda r: "%+.0f%%" % (round(100.0 * (r - 1)) or 0.0)  # never "-0%"
    span = lambda r, q: "%s (%s to %s)" % (percent(r), percent(q[0]), percent(q[1]))
    median_cpu = lambda c: statistics.median(result["cpu"][c])
    return [key, result["micro_batches"],
            "%.3f / %.3f" % (median_cpu("default"), median_cpu("auto")), span(*cpu),
            "%.2f / %.2f" % (statistics.median(default), statistics.median(auto)),
            span(statistics.median(ratios), paired.quartiles(ratios)),
            "%.1f / %.1f" % tuple(result["first_step"][c] for c in EXECUTORS),
            len(ratios), "%.1f" % result["load_before"][0], result.get("run", 0) + 1]


def _order(key):
    """Rows by shape (corpus order), then process pair."""
    shape, _, repeat = key.partition(" #")
    return list(corpus.SHAPES).index(shape), int(repeat or 0)


def markdown(results, runs):
    lines = ["# Stage functions' calls: TF's default executor vs the single-threaded one "
             "where EPL picks it (pipeline.call_executor default / auto; 2 stages on 1 "
             "worker x 2 virtual CPU devices, BFC allocator)", ""]
    lines += paired.run_lines(runs)
    lines += ["- One process per choice, alive at once, single steps alternated (A B B A "
              "...); auto vs default = the auto step / the default step next to it (median, "
              "interquartile range); CPU s: all threads of the process; first step: session "
              "creation and first run, s", "",
              common.markdown_table(
                  ["shape", "micro-batches", "CPU s per step (default / auto)",
                   "CPU, auto vs default (IQR)", "wall s (default / auto)",
                   "wall, auto vs default (IQR)", "first step s (default / auto)",
                   "pairs of steps", "1-min load before", "run"],
                  [row(key, results[key]) for key in sorted(results, key=_order)])]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", type=common.csv_list(str), default=["resnet", "moe", "mid"],
                        help="shapes of benchmarks/shapes.py")
    parser.add_argument("--micro-batches", type=common.positive_int, default=4)
    parser.add_argument("--pairs", type=common.positive_int, default=16)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--first", choices=EXECUTORS, default=EXECUTORS[0],
                        help="the process built (and stepped) first in each pair")
    parser.add_argument("--repeats", type=common.positive_int, default=2,
                        help="process pairs per shape")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    results = paired.measure_rows(
        args.shapes, range(1, args.repeats + 1), lambda shape, pair: "%s #%d" % (shape, pair),
        lambda shape, _: measure(args, shape), row)
    runs = [dict(common.environment_info(sys.argv), pairs=args.pairs, warmup=args.warmup)]
    text = markdown(results, runs)
    common.write_results(args.out, "call_executor", dict(results=results, runs=runs), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
