"""Data-parallel scaling of EPL on this machine: 1 worker vs 2 workers, 1 device each.

Usage::

    .venv/bin/python benchmarks/dp_scaling.py [--steps 30] [--batch 64]
        [--models mlp,cnn] [--out benchmarks/results]

For every model it launches benchmarks/dp_worker.py through ``python -m
epl.launcher`` twice, with 1 and with 2 workers (1 device each, fixed
per-worker batch, so the global batch doubles), and reports

    scaling efficiency = samples/s(2 workers) / (2 x samples/s(1 worker)).

Why it is built this way:

* The 1-worker baseline also goes through the launcher, so both runs take the
  same start-up path (TF_CONFIG, gRPC server, EPL rewrite); the only difference
  is the second worker and the gradient all-reduce it brings.
* Each worker is limited to one compute thread, so on a 2-core machine the
  ideal is exactly 2x. A launcher job runs its ops in the worker's
  ``tf.train.Server``, whose thread pools are fixed by the ConfigProto the
  server was created with; EPL versions before b957185 created it without the
  user's ConfigProto, silently ignoring the thread limit. So every worker
  reports CPU time / wall time (about 1 when the limit holds) and the report
  flags a 1-worker baseline above 1.2. ``--server-modes epl,pinned`` adds a
  cross-check in which the worker script creates its server itself with the
  1-thread ConfigProto (``pinned``), independent of what EPL does.
* Timing happens inside the worker, after warm-up steps, so process start-up,
  graph rewriting and session creation are excluded.
* Runs are sequential, each with a hard timeout; a failed run prints the last
  lines of every worker's log and the script exits non-zero without touching
  existing result files.

Writes <out>/dp_scaling.json and <out>/dp_scaling.md and prints the Markdown.
"""
import argparse
import os
import sys
import time

import common

NAME = "dp_scaling"
WORKER = os.path.join(common.HERE, "dp_worker.py")
MODELS = ("mlp", "cnn")
WORKER_COUNTS = (1, 2)
DEVICES_PER_WORKER = 1
SERVER_MODES = ("epl", "pinned")
MODE_TITLES = {
    "epl": "EPL creates each worker's server (unchanged user script)",
    "pinned": "Cross-check: the worker script creates its server with the 1-thread ConfigProto",
}
# Other processes using more CPU than this while a run is timed make its row unreliable.
DISTURBED_CPUS = 0.25
MODEL_NOTES = {
    "mlp": "MLP: 784 -> 8 x dense(512, ReLU) -> 10",
    "cnn": "CNN: 32x32x3 -> conv3x3(32)-maxpool-conv3x3(64)-maxpool-dense(128)-10",
}


def _csv(choices):
    """argparse type for a comma-separated subset of ``choices`` (order kept)."""
    def parse(text):
        items = [item.strip() for item in text.split(",") if item.strip()]
        bad = [item for item in items if item not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                "expected a comma-separated list of %s, got %r" % ("/".join(choices), text))
        return items
    return parse


def _at_least(minimum):
    """argparse type: an int >= minimum, so bad values fail before any job starts."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError("invalid int value: %r" % text)
        if value < minimum:
            raise argparse.ArgumentTypeError("must be >= %d, got %r" % (minimum, text))
        return value
    return parse


_positive = _at_least(1)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Measure EPL data-parallel scaling (1 vs 2 workers) on this machine.")
    parser.add_argument("--steps", type=_positive, default=30,
                        help="timed steps per window (default 30)")
    parser.add_argument("--warmup", type=_at_least(0), default=5,
                        help="untimed steps before timing (default 5)")
    parser.add_argument("--repeats", type=_positive, default=5,
                        help="timed windows per run; the median is reported (default 5)")
    parser.add_argument("--batch", type=_positive, default=64,
                        help="per-worker batch size (default 64)")
    parser.add_argument("--models", type=_csv(MODELS), default=list(MODELS),
                        help="comma-separated models (default mlp,cnn)")
    parser.add_argument("--server-modes", type=_csv(SERVER_MODES), default=["epl"],
                        help="who creates each worker's tf.train.Server: epl (the normal "
                             "path) and/or pinned (the worker script, with the 1-thread "
                             "ConfigProto; a cross-check). Default: epl")
    parser.add_argument("--out", default=os.path.join(common.REPO, "benchmarks", "results"),
                        help="result directory (default benchmarks/results)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds allowed per launcher run (default 120)")
    parser.add_argument("--verbose", action="store_true",
                        help="echo every line the workers print")
    return parser.parse_args(argv)


def run_one(args, model, workers, mode, echo):
    """Launch one job and return worker 0's BENCH payload plus the other workers'.

    Raises BenchmarkError with the workers' last log lines if anything is off."""
    script_args = ["--model", model, "--batch", args.batch, "--steps", args.steps,
                   "--warmup", args.warmup, "--repeats", args.repeats, "--server", mode,
                   "--threads", 1, "--deadline", max(10.0, args.timeout - 10.0)]
    what = "%s with %d worker(s), server mode %s" % (model, workers, mode)
    result = common.launch(WORKER, script_args, workers, DEVICES_PER_WORKER, args.timeout,
                           echo=echo)
    bench = common.parse_bench(result.lines)
    if result.timed_out or result.returncode != 0 or 0 not in bench:
        raise common.BenchmarkError(common.failure_report(result, what, workers))
    if bench[0].get("workers") != workers:
        raise common.BenchmarkError("%s: worker 0 reports %r workers" % (what,
                                                                         bench[0].get("workers")))
    common.discard_logs(result)
    return {"model": model, "workers": workers, "devices_per_worker": DEVICES_PER_WORKER,
            "server": mode, "launch_seconds": result.seconds,
            "command": common.portable_command(result.argv), "bench": bench[0],
            "all_workers": [bench[w] for w in sorted(bench)]}


def other_cpus(run):
    """CPUs used by processes outside this job during worker 0's timed steps
    (machine busy CPUs minus the workers' own CPU/wall), or None if unknown.

    The workers' timed windows coincide (every step waits for the all-reduce),
    so worker 0's machine sample covers all of them."""
    busy = run["bench"].get("machine_busy_cpus")
    if busy is None:
        return None
    return max(0.0, busy - sum(b["cpu_per_wall"] for b in run["all_workers"]))


def add_efficiency(runs):
    """Set ``scaling_efficiency`` on each run relative to the 1-worker run of the
    same model and server mode (1.0 for the baseline itself)."""
    base = dict(((r["model"], r["server"]), r["bench"]["samples_per_sec"])
                for r in runs if r["workers"] == 1)
    for run in runs:
        one = base.get((run["model"], run["server"]))
        rate = run["bench"]["samples_per_sec"]
        run["scaling_efficiency"] = rate / (run["workers"] * one) if one else None
        run["other_process_cpus"] = other_cpus(run)


def table(runs):
    """The Markdown results table of one server mode."""
    headers = ["model", "workers x devices", "global batch", "samples/s (min-max)", "step ms",
               "scaling efficiency", "CPU/wall per worker", "other processes' CPUs"]
    rows = []
    for run in runs:
        bench = run["bench"]
        eff = run["scaling_efficiency"]
        rows.append([
            run["model"], "%d x %d" % (run["workers"], run["devices_per_worker"]),
            bench["global_batch"],
            "%.0f (%.0f-%.0f)" % (bench["samples_per_sec"], bench["samples_per_sec_min"],
                                  bench["samples_per_sec_max"]),
            "%.1f" % bench["step_ms"],
            "-" if eff is None else ("%.2f" % eff if run["workers"] > 1 else "1.00 (baseline)"),
            " / ".join("%.2f" % b["cpu_per_wall"] for b in run["all_workers"]),
            "?" if run["other_process_cpus"] is None else "%.2f" % run["other_process_cpus"]])
    return common.markdown_table(headers, rows)


def observations(runs):
    """Plain-language notes derived from the numbers, so they stay true on re-runs."""
    notes = []
    for run in runs:
        if run["workers"] == 1 or run["scaling_efficiency"] is None:
            continue
        eff = run["scaling_efficiency"]
        speedup = eff * run["workers"]
        label = "%s, server mode %s" % (run["model"], run["server"])
        if speedup < 1.0:
            notes.append("%s: %d workers are SLOWER than 1 in total throughput (%.2fx, "
                         "efficiency %.2f)." % (label, run["workers"], speedup, eff))
        else:
            notes.append("%s: %d workers give %.2fx the 1-worker throughput (efficiency "
                         "%.2f)." % (label, run["workers"], speedup, eff))
    for run in runs:
        if run["bench"]["samples_per_sec_max"] > 1.25 * run["bench"]["samples_per_sec_min"]:
            notes.append("%s, server mode %s, %d worker(s): windows differ by more than 25%% "
                         "(%.0f-%.0f samples/s): the step rate is unstable, compare medians "
                         "with care." % (run["model"], run["server"], run["workers"],
                                         run["bench"]["samples_per_sec_min"],
                                         run["bench"]["samples_per_sec_max"]))
        other = run["other_process_cpus"]
        if other is not None and other > DISTURBED_CPUS:
            notes.append("%s, server mode %s, %d worker(s): other processes used %.2f of the %s "
                         "CPUs while it was timed; this row is disturbed, re-run on a quiet "
                         "machine." % (run["model"], run["server"], run["workers"], other,
                                       os.cpu_count()))
        cpu = max(b["cpu_per_wall"] for b in run["all_workers"])
        if run["workers"] == 1 and cpu > 1.2:
            notes.append("%s, server mode %s, 1 worker: CPU/wall = %.2f > 1, so the 1-thread "
                         "ConfigProto did not limit the worker (its baseline used more than one "
                         "core)." % (run["model"], run["server"], cpu))
    by_key = dict(((r["model"], r["server"], r["workers"]), r) for r in runs)
    for run in runs:
        model, mode, workers = run["model"], run["server"], run["workers"]
        one = by_key.get((model, mode, 1))
        if workers == 1 or one is None:
            continue
        extra = run["bench"]["step_ms"] - one["bench"]["step_ms"]
        notes.append("%s, server mode %s: a step takes %.1f ms longer with %d workers "
                     "(%.1f -> %.1f ms) for %.2f MB of float32 gradients all-reduced per step."
                     % (model, mode, extra, workers, one["bench"]["step_ms"],
                        run["bench"]["step_ms"], run["bench"]["params"] * 4 / 1e6))
    return notes


def markdown(info, args, runs, modes):
    """The full report: provenance, one table per server mode, notes, definitions."""
    bench = runs[0]["bench"]
    lines = ["# EPL data-parallel scaling (CPU)", "",
             "- Command: `%s`" % info["command"],
             "- Date: %s" % info["date"],
             "- TensorFlow %s, Python %s, EPL git %s"
             % (bench["tf_version"], info["python"], info["git_revision"]),
             "- CPUs: %s (usable: %s), %s" % (info["cpu_count"], info["cpus_usable"],
                                              info["cpu_model"]),
             "- Per worker: 1 device (virtual CPU), batch %d, intra/inter-op threads 1, "
             "MomentumOptimizer, synthetic data" % args.batch,
             "- Timing: %d warm-up steps, then %d windows of %d steps in worker 0; samples/s "
             "is the median window (min-max over windows)" % (args.warmup, args.repeats,
                                                              args.steps),
             "- Scaling efficiency = samples/s(2 workers) / (2 x samples/s(1 worker)); both "
             "started with `python -m epl.launcher`",
             "- CPU/wall: a worker's CPU time over its timed steps divided by their wall time "
             "(about 1 when the 1-thread limit holds); other processes' CPUs: busy CPUs of the "
             "whole machine meanwhile minus the workers' own",
             "- Models: " + "; ".join(MODEL_NOTES[m] for m in args.models),
             "- Load average (1/5/15 min) at start %s, at end %s (includes this benchmark's own "
             "workers); total run time %.0f s"
             % (info["loadavg_start"], info["loadavg_end"], info["total_seconds"]), ""]
    for mode in modes:
        lines += ["## %s" % MODE_TITLES[mode], "",
                  table([r for r in runs if r["server"] == mode]), ""]
    lines += ["## Observations", ""] + ["- " + note for note in observations(runs)]
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    info = common.environment_info()
    echo = (lambda line: print("    " + line, flush=True)) if args.verbose else None
    plan = [(mode, model, workers) for mode in args.server_modes for model in args.models
            for workers in WORKER_COUNTS]
    runs, start = [], time.monotonic()
    for number, (mode, model, workers) in enumerate(plan, 1):
        try:
            run = run_one(args, model, workers, mode, echo)
        except common.BenchmarkError as err:
            sys.stderr.write("dp_scaling: FAILED: %s\n" % err)
            sys.stderr.write("dp_scaling: no results written\n")
            return 1
        runs.append(run)
        bench = run["bench"]
        other = other_cpus(run)
        print("[%d/%d] %s %dx%d server=%s: %.0f samples/s, %.1f ms/step, CPU/wall %s, other "
              "processes %s CPUs (job %.1f s)"
              % (number, len(plan), model, workers, DEVICES_PER_WORKER, mode,
                 bench["samples_per_sec"], bench["step_ms"],
                 "/".join("%.2f" % b["cpu_per_wall"] for b in run["all_workers"]),
                 "?" if other is None else "%.2f" % other, run["launch_seconds"]), flush=True)
    add_efficiency(runs)
    info["total_seconds"] = time.monotonic() - start
    info["tf_version"] = runs[0]["bench"]["tf_version"]
    info["loadavg_end"] = common.load_average()
    settings = {"steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
                "batch_per_worker": args.batch, "models": args.models,
                "server_modes": args.server_modes, "timeout": args.timeout,
                "intra_op_threads": 1, "inter_op_threads": 1}
    report = markdown(info, args, runs, args.server_modes)
    return common.publish(args.out, NAME, {
        "benchmark": NAME, "environment": info, "settings": settings, "runs": runs,
        "observations": observations(runs)}, report, info["total_seconds"])


if __name__ == "__main__":
    sys.exit(main())
