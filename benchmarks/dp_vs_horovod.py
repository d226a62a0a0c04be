"""EPL vs Horovod data parallelism on this machine: 2 workers x 1 device, 1 thread each.

Usage::

    .venv/bin/python benchmarks/dp_vs_horovod.py            # full run, about 27 minutes
    .venv/bin/python benchmarks/dp_vs_horovod.py --quick    # reduced sweep, about 2 minutes
    .venv/bin/python benchmarks/dp_vs_horovod.py --batch 64,256 --models cnn --steps 30

For every model (dp_worker.py's MLP and CNN) and per-worker batch size it measures

1. the single process: plain TensorFlow, no EPL, no Horovod, 1 thread
   (``hvd_worker.py --mode plain``), the reference for scaling efficiency, and
   two such processes started together that never communicate: the machine's
   ceiling (shared caches and memory bandwidth), which no data-parallel setup
   can beat;
2. EPL default: ``dp_worker.py`` under ``python -m epl.launcher``, 2 workers,
   no ``EPL_*`` variables (1, 2 and 4 run twice, the faster run counts);
3. an EPL sweep over ``communication.max_splits`` x ``fp16`` x
   ``num_communicators`` (``EPL_COMMUNICATION_*`` per run); "EPL tuned" is the
   winner measured again in two runs of its own: the sweep's best number is
   the maximum of noisy runs, biased upward, so targets are never judged on it;
4. Horovod: ``hvd_worker.py --mode horovod`` (``hvd.DistributedOptimizer``,
   ``hvd.broadcast_global_variables(0)``) under ``horovodrun -np 2 -H
   localhost:2 --gloo``;

and reports samples/s, scaling efficiency = samples/s / (2 x single-process
samples/s), EPL / Horovod, and whether EPL meets its targets (>= 1.2x
Horovod, efficiency >= 0.9). Why it is built this way:

* Same model code, data, ConfigProto (intra = inter = 1) and timing (warm-up,
  then windows timed inside the worker, median with min-max) in all four
  setups, so differences come from gradient averaging alone.
* These CPU workloads are communication-bound at small batches (gradients do
  not grow with the batch), so several per-worker batches are measured, with
  windows of about the same number of samples (``--steps`` at batch 64).
* ``num_communicators`` only matters with several fusion buckets, so
  ``max_splits=1`` runs with one communicator only.
* Sequential runs with hard timeouts; a failure prints every worker's last
  log lines and exits 1 without writing results; a missing Horovod exits 2.

Writes <out>/dp_vs_horovod.json and <out>/dp_vs_horovod.md and prints the Markdown.
"""
import argparse
import itertools
import os
import shutil
import subprocess
import sys
import time

import common
from dp_vs_horovod_report import (DISTURBED_CPUS, KEYS, MIN_WINDOW_STEPS, TARGET_EFFICIENCY,
                                  TARGET_VS_HOROVOD, config_label, markdown, observations,
                                  scaled, targets, verdicts, _cpu)

NAME = "dp_vs_horovod"
EPL_WORKER = os.path.join(common.HERE, "dp_worker.py")
HVD_WORKER = os.path.join(common.HERE, "hvd_worker.py")
MODELS = ("mlp", "cnn")
WORKERS = 2
FULL_SWEEP = [c for c in itertools.product((1, 5, 20), (False, True), (1, 2))
              if not (c[0] == 1 and c[2] > 1)]
QUICK_SWEEP = [(1, False, 1), (1, True, 1), (20, False, 2), (20, True, 2)]
BENCH_DEPS_HINT = "Horovod is not usable from %s (%s); run `make bench-deps`"
# Communication op types -> the all-reduce backend EPL picked (dp_worker reports op types).
BACKEND_OPS = (("EplRingAllReduce", "EPL ring (shared-memory links on one host)"),
               ("EplNcclAllReduce", "NCCL"),
               ("CollectiveReduce", "TF collectives (gRPC)"),
               ("CollectiveGather", "TF collectives (gRPC)"))


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Compare EPL and Horovod data parallelism (2 workers x 1 CPU device).")
    parser.add_argument("--steps", type=common.positive_int, default=None,
                        help="timed steps per window at batch 64; larger batches get "
                             "proportionally fewer (min 3) (default 15, --quick 8)")
    parser.add_argument("--warmup", type=int, default=5,
                        help="untimed steps at batch 64, proportionally fewer above (min 2) "
                             "(default 5)")
    parser.add_argument("--repeats", type=common.positive_int, default=None,
                        help="timed windows per run, median reported (default 5, --quick 3)")
    parser.add_argument("--batch", type=common.csv_list(common.positive_int), default=None,
                        help="per-worker batch size(s), comma-separated "
                             "(default 64,512,2048; --quick 64)")
    parser.add_argument("--models", type=common.csv_list(str, MODELS), default=list(MODELS),
                        help="comma-separated models (default mlp,cnn)")
    parser.add_argument("--out", default=os.path.join(common.REPO, "benchmarks", "results"),
                        help="result directory (default benchmarks/results)")
    parser.add_argument("--quick", action="store_true",
                        help="reduced sweep (%d EPL configurations), fewer and shorter "
                             "windows, batch 64 only unless --batch is given" % len(QUICK_SWEEP))
    parser.add_argument("--timeout", type=float, default=90.0,
                        help="seconds allowed per job (default 90; a job normally takes "
                             "3-20 s)")
    parser.add_argument("--retries", type=int, default=1,
                        help="times a HUNG job (timeout, exit code 124 or 138) is started again; "
                             "every hang is reported. Crashes are never retried (default 1)")
    parser.add_argument("--rerun-disturbed", type=int, default=1,
                        help="times a job is run again when other processes used more than "
                             "%.2f CPUs (more for 1-process jobs on idle cores) while it was "
                             "timed; the least disturbed run is kept (default 1)"
                             % DISTURBED_CPUS)
    parser.add_argument("--verbose", action="store_true", help="echo every worker line")
    args = parser.parse_args(argv)
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    args.steps = args.steps or (8 if args.quick else 15)
    args.repeats = args.repeats or (3 if args.quick else 5)
    args.batch = args.batch or ([64] if args.quick else [64, 512, 2048])
    args.sweep = [dict(zip(KEYS, c)) for c in (QUICK_SWEEP if args.quick else FULL_SWEEP)]
    return args


def config_env(config):
    return {"EPL_COMMUNICATION_MAX_SPLITS": str(config["max_splits"]),
            "EPL_COMMUNICATION_FP16": "1" if config["fp16"] else "0",
            "EPL_COMMUNICATION_NUM_COMMUNICATORS": str(config["num_communicators"])}


def horovod_setup():
    """(horovodrun path, Horovod version), or raise SystemExit(2) with the fix.

    Checked in a subprocess before any job starts: the driver never imports
    TensorFlow, and a Horovod built against another TF fails only on import."""
    runner = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    runner = runner if os.path.exists(runner) else shutil.which("horovodrun")
    probe = ("import horovod, horovod.tensorflow as hvd; "
             "print('HVD', horovod.__version__, int(hvd.gloo_built()))")
    try:
        done = subprocess.run([sys.executable, "-c", probe], timeout=120, cwd=common.REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("HVD ")]
        problem = None if done.returncode == 0 and lines else \
            "import failed: " + (done.stderr.strip().splitlines() or ["?"])[-1]
    except subprocess.TimeoutExpired:
        problem, lines = "importing it took over 120 s", []
    if problem is None and lines[0].split()[2] != "1":
        problem = "it was built without gloo"
    if problem is None and not runner:
        problem = "horovodrun not found"
    if problem:
        sys.stderr.write("dp_vs_horovod: " + BENCH_DEPS_HINT % (sys.executable, problem) + "\n")
        raise SystemExit(2)
    return runner, lines[0].split()[1]


def run_job(args, runner, kind, model, batch, config, echo):
    """Run one job (kind: plain, horovod or epl) and return its record.

    Raises BenchmarkError with the workers' last lines when the job fails,
    a worker's BENCH line is missing, or a worker did not run what was asked
    (wrong worker count, EPL settings not in effect, EPL or Horovod imported
    by the single process)."""
    steps = scaled(args.steps, batch, MIN_WINDOW_STEPS)
    wargs = ["--model", model, "--batch", batch, "--steps", steps,
             "--warmup", scaled(args.warmup, batch, 2),
             "--repeats", args.repeats, "--threads", 1,
             "--deadline", max(10.0, args.timeout - 10.0)]
    dropped = sorted(k for k in os.environ if k.startswith("EPL_"))
    what = "%s, %s, batch %d%s" % (model, kind, batch,
                                   ", " + config_label(config) if config else "")
    if kind == "plain":
        workers, pattern = 1, common.SINGLE_LINE
        result = common.run_command([sys.executable, HVD_WORKER, "--mode", "plain"] + wargs,
                                    args.timeout, echo=echo, drop_env=dropped)
    elif kind == "plain_pair":  # the launcher only starts them; each trains on its own
        workers, pattern = WORKERS, common.WORKER_LINE
        result = common.launch(HVD_WORKER, ["--mode", "plain"] + wargs, WORKERS, 1,
                               args.timeout, echo=echo, drop_env=dropped)
    elif kind == "horovod":
        workers, pattern = WORKERS, common.HOROVOD_LINE
        argv = [runner, "-np", WORKERS, "-H", "localhost:%d" % WORKERS, "--gloo",
                sys.executable, HVD_WORKER, "--mode", "horovod"] + wargs
        result = common.run_command(argv, args.timeout, echo=echo, drop_env=dropped)
    else:
        workers, pattern = WORKERS, common.WORKER_LINE
        result = common.launch(EPL_WORKER, wargs + ["--server", "epl"], WORKERS, 1,
                               args.timeout, extra_env=config_env(config) if config else None,
                               echo=echo, drop_env=dropped)
    bench = common.parse_bench(result.lines, pattern)
    if result.timed_out or result.returncode != 0 or sorted(bench) != list(range(workers)):
        common.raise_failure(result, what, workers, pattern)
    first = bench[0]
    problems = []
    expected = 1 if kind.startswith("plain") else workers
    if first.get("workers") != expected:
        problems.append("worker 0 reports %r workers, expected %d" % (first.get("workers"),
                                                                      expected))
    if kind.startswith("plain") and any(b.get("epl_imported") or b.get("horovod_imported")
                                        for b in bench.values()):
        problems.append("a plain process imported EPL or Horovod")
    if kind == "plain_pair":
        first = pair_totals([bench[w] for w in sorted(bench)])
    if kind == "epl":
        effective = dict((k, first["communication"]["communication." + k]) for k in KEYS)
        if config is not None and effective != config:
            problems.append("EPL ran with %s, not the requested %s" % (effective, config))
        config = effective
    if problems:
        raise common.BenchmarkError("%s: %s\ncommand: %s" % (
            what, "; ".join(problems), common.format_command(result.argv)))
    common.discard_logs(result)
    all_workers = [bench[w] for w in sorted(bench)]
    return {"kind": kind, "model": model, "batch_per_worker": batch, "workers": workers,
            "window_steps": steps, "config": config, "launch_seconds": result.seconds,
            "command": common.portable_command(result.argv), "bench": first,
            "all_workers": all_workers,
            "other_process_cpus": common.foreign_cpus(all_workers),
            "disturbance_limit": common.disturbance_limit(workers)}


def pair_totals(benches):
    """Two independent processes: samples/s (median, min, max) summed over both."""
    total = dict(benches[0])
    for key in ("samples_per_sec", "samples_per_sec_min", "samples_per_sec_max"):
        total[key] = sum(b[key] for b in benches)
    return total


def run_robust(args, runner, kind, model, batch, config, echo, hangs):
    """run_job, started again when it hangs (``--retries``; every hang is
    recorded in ``hangs`` and reported) or when other processes disturbed its
    timing (``--rerun-disturbed``; the least disturbed run is kept).

    Why: a rare hang would otherwise throw away minutes of measurements, and
    on a 2-core machine shared with other work (test runs, builds) single
    runs would rank configurations by who was unlucky. Crashes are never
    retried."""
    def on_hang(attempt, err):
        hangs.append({"model": model, "batch_per_worker": batch, "kind": kind,
                      "config": config, "attempt": attempt, "report": str(err),
                      "stacks": err.stacks})
        sys.stderr.write("dp_vs_horovod: HUNG (attempt %d of %d): %s\n"
                         % (attempt, args.retries + 1, err))

    def attempt():
        return common.retry_hangs(
            lambda: run_job(args, runner, kind, model, batch, config, echo),
            args.retries, on_hang)
    return common.rerun_while_disturbed(attempt, args.rerun_disturbed)


def backend_of(run):
    """The all-reduce backend an EPL run used, from its communication op types."""
    ops = run["bench"].get("collective_ops") or {}
    for op_type, name in BACKEND_OPS:
        if ops.get(op_type):
            return name
    return "unknown"


def measure(args, runner, echo, progress, hangs):
    """All runs of every (batch, model), in a fixed order; returns the run list."""
    runs = []
    for batch, model in itertools.product(args.batch, args.models):
        def go(kind, config=None, role=None):
            run = run_robust(args, runner, kind, model, batch, config, echo, hangs)
            if kind == "epl":
                run["backend"] = backend_of(run)
            run["role"] = role or kind
            runs.append(run)
            progress(run)
            return run
        pairs = {"plain": [go("plain")], "plain_pair": [go("plain_pair")],
                 "horovod": [go("horovod")]}
        default = go("epl", role="epl_default")
        sweep = [default]
        for config in args.sweep:
            if config != default["config"]:
                sweep.append(go("epl", config, role="epl_sweep"))
        for run in sweep:
            run["in_sweep"] = True
        best = max(sweep, key=lambda r: r["bench"]["samples_per_sec"])
        best["best_in_sweep"] = True
        # The sweep's best number is the maximum of noisy runs, so the winner is measured
        # again twice; the references and EPL default also run twice (before and after
        # the sweep), and in each pair the faster run counts.
        pairs["epl_tuned"] = [go("epl", best["config"], role="epl_tuned")]
        pairs["epl_default"] = [default]
        for kind in ("plain", "plain_pair", "horovod", "epl_default", "epl_tuned"):
            pairs[kind].append(go(kind) if kind in ("plain", "plain_pair", "horovod") else
                               go("epl", None if kind == "epl_default" else best["config"],
                                  role=kind))
            pairs[kind].sort(key=lambda r: -r["bench"]["samples_per_sec"])
            pairs[kind][0]["other_samples_per_sec"] = pairs[kind][1]["bench"]["samples_per_sec"]
            pairs[kind][1]["role"] = kind + "_other"
        tuned = pairs["epl_tuned"][0]
        tuned["sweep_samples_per_sec"] = best["bench"]["samples_per_sec"]
        plain, horovod = pairs["plain"][0], pairs["horovod"][0]
        pair = pairs["plain_pair"][0]
        for run in sum(pairs.values(), []) + sweep[1:]:
            rate = run["bench"]["samples_per_sec"]
            run["scaling_efficiency"] = rate / (WORKERS * plain["bench"]["samples_per_sec"])
            run["vs_horovod"] = rate / horovod["bench"]["samples_per_sec"]
            run["vs_plain_pair"] = rate / pair["bench"]["samples_per_sec"]
        plain["scaling_efficiency"] = None
    return runs


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    runner, horovod_version = horovod_setup()
    info = common.environment_info()
    info["horovodrun"] = common.portable_path(runner)
    echo = (lambda line: print("    " + line, flush=True)) if args.verbose else None
    start = time.monotonic()
    count = [0]

    def progress(run):
        count[0] += 1
        bench = run["bench"]
        print("[%d] %s batch %d %s%s: %.0f samples/s, %.1f ms/step, CPU/wall %s (job %.1f s, "
              "%.0f s so far)" % (count[0], run["model"], run["batch_per_worker"], run["role"],
                                  " " + config_label(run["config"]) if run["config"] else "",
                                  bench["samples_per_sec"], bench["step_ms"], _cpu(run),
                                  run["launch_seconds"], time.monotonic() - start), flush=True)

    hangs = []
    try:
        runs = measure(args, runner, echo, progress, hangs)
    except common.BenchmarkError as err:
        sys.stderr.write("dp_vs_horovod: FAILED: %s\n" % err)
        sys.stderr.write("dp_vs_horovod: no results written\n")
        return 1
    info["total_seconds"] = time.monotonic() - start
    info["loadavg_end"] = common.load_average()
    info["tf_version"] = runs[0]["bench"]["tf_version"]
    info["horovod_version"] = horovod_version
    info["epl_uncommitted_changes"] = common.git_changes()
    target_rows = targets(runs, args.models, args.batch)
    settings = dict((k, v) for k, v in vars(args).items() if k not in ("out", "verbose"))
    settings.update({"warmup_and_window_steps": dict(
        (str(b), [scaled(args.warmup, b, 2), scaled(args.steps, b, MIN_WINDOW_STEPS)])
        for b in args.batch), "workers": WORKERS, "intra_op_threads": 1, "inter_op_threads": 1,
        "targets": {"vs_horovod": TARGET_VS_HOROVOD, "scaling_efficiency": TARGET_EFFICIENCY}})
    report = markdown(info, args, runs, target_rows, hangs)
    return common.publish(args.out, NAME, {
        "benchmark": NAME, "environment": info, "settings": settings, "runs": runs,
        "hangs": hangs, "targets": target_rows, "verdicts": verdicts(target_rows, args.models),
        "observations": observations(runs, args.models, args.batch)}, report,
        info["total_seconds"])


if __name__ == "__main__":
    sys.exit(main())
