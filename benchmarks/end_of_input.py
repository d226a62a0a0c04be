"""What EPL's end-of-input agreement costs per step when the data does not end.

Usage::

    .venv/bin/python benchmarks/end_of_input.py [--pairs 3] [--steps 30]
        [--batch 64] [--layouts 1x2,2x1] [--out benchmarks/results]

Every step of a job with several replicas pulls its batches as optionals, ands
their has-value flags and, with several workers, sums them in one scalar
all-reduce before the model runs (epl/parallel/passes/end_of_input.py). This
script runs benchmarks/dp_worker.py (MLP, synthetic data repeated forever, one
thread per worker) through epl-launch with the agreement (``on``) and with the
graph rewritten without it (``off``), and reports the step time of each and the
difference.

Why it is built this way: runs alternate on/off in ``--pairs`` pairs and the
median of each side is reported, because a 2-core machine shared with other
work drifts more between minutes than the cost being measured; each run's
``other processes' CPUs`` is kept so a disturbed pair can be spotted. The MLP at
batch 64 has a short step (a few ms), where a fixed per-step cost shows most.

Writes <out>/end_of_input.json and <out>/end_of_input.md and prints the Markdown.
"""
import argparse
import os
import statistics
import sys
import time

import common

NAME = "end_of_input"
WORKER = os.path.join(common.HERE, "dp_worker.py")
MODES = ("on", "off")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=common.positive_int, default=3,
                        help="on/off run pairs per layout (medians reported)")
    parser.add_argument("--steps", type=common.positive_int, default=30)
    parser.add_argument("--repeats", type=common.positive_int, default=3)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=common.positive_int, default=64,
                        help="per-replica batch")
    parser.add_argument("--layouts", type=common.csv_list(str), default=["1x2", "2x1"],
                        help="workers x devices per worker")
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--out", default=os.path.join(common.HERE, "results"))
    return parser.parse_args(argv)


def run_one(args, workers, devices, mode):
    result = common.launch(WORKER, [
        "--model", "mlp", "--batch", args.batch, "--steps", args.steps,
        "--repeats", args.repeats, "--warmup", args.warmup, "--end-of-input", mode],
        workers, devices, args.timeout)
    if result.returncode != 0:
        common.raise_failure(result, "end_of_input %dx%d %s" % (workers, devices, mode),
                             workers)
    common.discard_logs(result)
    payloads = common.parse_bench(result.lines)
    if sorted(payloads) != list(range(workers)):
        common.raise_failure(result, "end_of_input %dx%d %s: BENCH lines of workers %s"
                             % (workers, devices, mode, sorted(payloads)), workers)
    ordered = [payloads[w] for w in range(workers)]
    return {"workers": workers, "devices": devices, "mode": mode,
            "bench": ordered[0], "other_cpus": common.foreign_cpus(ordered)}


def summarize(runs, layouts):
    rows = []
    for workers, devices in layouts:
        side = {}
        for mode in MODES:
            steps = [r["bench"]["step_ms"] for r in runs
                     if (r["workers"], r["devices"], r["mode"]) == (workers, devices, mode)]
            side[mode] = (statistics.median(steps), min(steps), max(steps))
        cost = side["on"][0] - side["off"][0]
        rows.append({"layout": "%dx%d" % (workers, devices), "on_ms": side["on"],
                     "off_ms": side["off"], "cost_ms": cost,
                     "cost_percent": 100.0 * cost / side["off"][0]})
    return rows


def markdown(info, args, rows, runs):
    lines = ["# The end-of-input agreement's cost per step (CPU)", "",
             "- Command: `%s`" % info["command"],
             "- Date: %s; EPL git %s" % (info["date"], info["git_revision"]),
             "- %s, %s CPUs; load average at start %s, at the end %s"
             % (info["cpu_model"], info["cpu_count"], info["loadavg_start"],
                info["loadavg_end"]),
             "- dp_worker.py MLP, batch %d per replica, 1 thread per worker; %d warm-up steps, "
             "%d windows of %d steps per run, median window per run; %d alternating on/off "
             "pairs per layout, median (min-max) over runs"
             % (args.batch, args.warmup, args.repeats, args.steps, args.pairs), ""]
    lines.append(common.markdown_table(
        ["layout", "with agreement ms/step", "without ms/step", "cost ms/step", "cost %"],
        [[r["layout"], "%.2f (%.2f-%.2f)" % r["on_ms"], "%.2f (%.2f-%.2f)" % r["off_ms"],
          "%+.3f" % r["cost_ms"], "%+.1f" % r["cost_percent"]] for r in rows]))
    lines += ["", "Runs in order (other processes' CPUs during the timed windows):", ""]
    lines += ["- %dx%d %s: %.2f ms/step, other CPUs %s" % (
        r["workers"], r["devices"], r["mode"], r["bench"]["step_ms"],
        "?" if r["other_cpus"] is None else "%.2f" % r["other_cpus"]) for r in runs]
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    info = common.environment_info()
    layouts = [tuple(int(n) for n in text.split("x")) for text in args.layouts]
    runs, start = [], time.monotonic()
    try:
        for workers, devices in layouts:
            for pair in range(args.pairs):
                for mode in (MODES if pair % 2 == 0 else MODES[::-1]):
                    run = run_one(args, workers, devices, mode)
                    runs.append(run)
                    print("%dx%d %s: %.2f ms/step" % (workers, devices, mode,
                                                      run["bench"]["step_ms"]), flush=True)
    except common.BenchmarkError as err:
        sys.stderr.write("end_of_input: FAILED: %s\nend_of_input: no results written\n" % err)
        return 1
    rows = summarize(runs, layouts)
    info["total_seconds"] = time.monotonic() - start
    info["loadavg_end"] = common.load_average()
    report = markdown(info, args, rows, runs)
    settings = dict(vars(args), out=os.path.relpath(args.out, os.path.dirname(common.HERE)))
    return common.publish(args.out, NAME, {
        "benchmark": NAME, "environment": info, "settings": settings, "rows": rows,
        "runs": runs}, report, info["total_seconds"])


if __name__ == "__main__":
    sys.exit(main())
