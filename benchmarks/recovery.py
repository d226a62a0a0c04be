"""Self-healing: what a kill -9 costs per layout, and what snapshots cost per step.

Usage::

    .venv/bin/python benchmarks/recovery.py [--parts kills,overhead] [--layouts dp,ga,...]
        [--last-step 40] [--every 100] [--out benchmarks/results]

**Kills** (one row per layout of issue 34's item 5): the job is
tests/multiworker/scripts/resume_train.py (the eplutil MLP, Adam, shuffled tf.data
shards, the user's checkpoints every 3 steps, EPL snapshots every ``--kill-every``
steps) run twice through epl-launch: once uninterrupted, once with
``--max_restarts 2`` and a ``kill -9`` of one worker sent by this script when worker 0
has finished a seeded random number of training runs (two kills for the ``dp, two
kills`` row). Reported: the time from the kill to the next completed training run of
the restarted job, the job's own cold start (its first attempt's start to its first
completed run) and the difference; the steps trained again (the global step at the kill
minus the snapshot the job resumed from); the largest difference of any variable
(optimizer slots, AMP's loss scale and the global step included) from the uninterrupted
run.

**Overhead**: benchmarks/snapshot_worker.py (dp_worker.py's MLP on 2 workers x 1 device,
and transformer.py's 12-layer ``mid`` encoder as a 2-stage pipeline on 1 worker x 2
devices) with snapshots every ``--every`` steps: the median step, the mean time of a
snapshot write (the first, at the job's start, is part of its cold start), its size,
and the overhead ``write / (every x step)``; beside it, from the same run, the mean of
all timed steps against the mean of the steps that wrote no snapshot.

Writes <out>/recovery.json and <out>/recovery.md and prints the Markdown.
"""
import argparse
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

import common

NAME = "recovery"
SCRIPT = os.path.join(common.REPO, "tests", "multiworker", "scripts", "resume_train.py")
OVERHEAD_WORKER = os.path.join(common.HERE, "snapshot_worker.py")
# layout -> (resume_train layout, workers, devices per worker, workers killed in turn,
#            runs per global step)
LAYOUTS = {
    "dp 2x1": ("dp", 2, 1, (1,), 1),
    "dp 2x2": ("dp", 2, 2, (0,), 1),
    "dp 2x1 two kills": ("dp", 2, 1, (1, 0), 1),
    "pipeline across 2 workers": ("pipeline", 2, 1, (1,), 1),
    "gradient accumulation": ("ga", 2, 1, (0,), 2),
    "zero v0": ("zero_v0", 2, 1, (1,), 1),
    "zero v1": ("zero_v1", 2, 1, (0,), 1),
    "zero v2": ("zero_v2", 2, 1, (1,), 1),
    "split 2x2": ("split", 2, 2, (1,), 1),
    "amp O1": ("amp", 2, 1, (0,), 1),
    "estimator": ("estimator", 2, 1, (1,), 1),
}
STEP_DONE = re.compile(r"^\[worker (\d+)\] STEP_DONE ([0-9.]+) (\d+)$")
START = re.compile(r"^\[worker (\d+)\] START ([0-9.]+)$")
PID = re.compile(r"^\[worker (\d+)\] PID (\d+)$")
RESUMED = re.compile(r"^\[worker 0\] .*resuming from the snapshot of step (\d+) ")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", type=common.csv_list(str, ("kills", "overhead")),
                        default=["kills", "overhead"])
    parser.add_argument("--layouts", type=common.csv_list(str, tuple(LAYOUTS)),
                        default=list(LAYOUTS))
    parser.add_argument("--last-step", type=common.positive_int, default=40)
    parser.add_argument("--kill-every", type=common.positive_int, default=4,
                        help="snapshot_steps of the kill runs (short jobs need a small one)")
    parser.add_argument("--every", type=common.positive_int, default=200,
                        help="snapshot_steps of the overhead runs (the default key value)")
    parser.add_argument("--mlp-steps", type=common.positive_int, default=400)
    parser.add_argument("--encoder-steps", type=common.positive_int, default=200)
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out", default=os.path.join(common.HERE, "results"))
    parser.add_argument("--merge", action="store_true",
                        help="keep the rows of <out>/recovery.json that this run does not "
                             "measure again (layouts and models measured in separate runs)")
    return parser.parse_args(argv)


# ---- kills ---------------------------------------------------------------------------
class Killer(object):
    """Watches the job's output; after worker 0's ``runs[i]``-th finished run of attempt
    i, sends SIGKILL to worker ``victims[i]`` and records (time, global step)."""

    def __init__(self, victims, runs):
        self.victims, self.runs = list(victims), list(runs)
        self.pids, self.done, self.kills, self.lock = {}, 0, [], threading.Lock()

    def __call__(self, line):
        with self.lock:
            found = PID.match(line)
            if found:
                self.pids[int(found.group(1))] = int(found.group(2))
                if int(found.group(1)) == 0:
                    self.done = 0  # a new attempt starts counting
                return
            found = STEP_DONE.match(line)
            if not found or found.group(1) != "0" or len(self.kills) == len(self.victims):
                return
            self.done += 1
            index = len(self.kills)
            if self.done == self.runs[index] and self.victims[index] in self.pids:
                os.kill(self.pids[self.victims[index]], signal.SIGKILL)
                self.kills.append((time.time(), int(found.group(3))))


def _launch(layout, workers, devices, last_step, every, timeout, restarts=0, echo=None):
    out = tempfile.mkdtemp(prefix="epl_recovery_")
    args = [out, layout, last_step]
    extra = {"EPL_CHECKPOINT_SNAPSHOT_STEPS": str(every)}
    argv = [sys.executable, "-m", "epl.launcher", "--num_workers", str(workers),
            "--gpu_per_worker", str(devices), "--log_dir", os.path.join(out, "logs")]
    if restarts:
        argv += ["--max_restarts", str(restarts)]
    env = {"PYTHONPATH": common.REPO}
    env.update(extra)
    result = common.run_command(argv + [SCRIPT] + [str(a) for a in args], timeout,
                                extra_env=env, echo=echo, log_dir=os.path.join(out, "logs"))
    if result.returncode != 0:
        common.raise_failure(result, "recovery %s" % layout, workers)
    with np.load(os.path.join(out, "worker_0.npz")) as data:
        return result, dict(data.items())


def _times(pattern, lines, start=0):
    """[(worker, time)] of the lines matching ``pattern`` (START or STEP_DONE)."""
    return [(int(m.group(1)), float(m.group(2))) for m in map(pattern.match, lines[start:]) if m]


def kill_row(name, args):
    layout, workers, devices, victims, runs_per_step = LAYOUTS[name]
    reference_result, reference = _launch(layout, workers, devices, args.last_step,
                                          args.kill_every, args.timeout)
    starts = _times(START, reference_result.lines)
    steps = _times(STEP_DONE, reference_result.lines)
    cold_start = steps[0][1] - min(t for w, t in starts if w == 0)
    rng = random.Random("%s %s" % (args.seed, name))
    high = args.last_step * runs_per_step // (len(victims) + 1)
    runs = [rng.randint(3, max(3, high - 1)) for _ in victims]
    killer = Killer(victims, runs)
    result, resumed = _launch(layout, workers, devices, args.last_step, args.kill_every,
                              args.timeout, restarts=2, echo=killer)
    if len(killer.kills) != len(victims):
        raise common.BenchmarkError("%s: %d of %d kills happened" % (
            name, len(killer.kills), len(victims)))
    return _kill_record(name, result, killer, runs, runs_per_step, cold_start,
                        reference, resumed)


def _kill_record(name, result, killer, runs, runs_per_step, cold_start, reference, resumed):
    """One row: per kill the time to the next completed run and the steps trained again
    (global step at the kill minus the snapshot the next attempt resumed from)."""
    del runs_per_step
    lines = result.lines
    recoveries = []
    for kill_time, _ in killer.kills:
        after = [t for _, t in _times(STEP_DONE, lines) if t > kill_time + 0.5]
        recoveries.append(min(after) - kill_time)
    resumed_from = [int(m.group(1)) for m in map(RESUMED.match, lines) if m]
    redone = [step - start for (_, step), start in zip(killer.kills, resumed_from)]
    diff = max(float(np.abs(reference[k] - resumed[k]).max()) for k in reference)
    return {"layout": name, "kill_after_runs": runs, "kill_to_next_step": recoveries,
            "cold_start": cold_start, "steps_at_kill": [step for _, step in killer.kills],
            "resumed_from": resumed_from, "steps_redone": redone, "max_abs_diff": diff,
            "log_excerpt": [line for line in lines if line.startswith("epl-launch")
                            or "resuming from the snapshot" in line][:8]}


# ---- overhead ------------------------------------------------------------------------
def overhead_run(model, every, steps, timeout):
    """One snapshot_worker.py job with snapshots every ``every`` steps; its BENCH line."""
    workers, devices = (2, 1) if model == "mlp" else (1, 2)
    result = common.launch(OVERHEAD_WORKER, ["--model", model, "--steps", steps], workers,
                           devices, timeout, extra_env={"EPL_CHECKPOINT_SNAPSHOT_STEPS":
                                                        str(every)})
    if result.returncode != 0:
        common.raise_failure(result, "snapshot overhead %s every %d" % (model, every), workers)
    common.discard_logs(result)
    return common.parse_bench(result.lines)[0]


def overhead_row(model, args):
    """The snapshot cost of one job: each write's time (the first, at the job's start,
    is part of its cold start and left out), the median step, and the overhead twice:
    ``write / (every x median step)`` and, from the same run, the mean of all timed steps
    against the mean of the steps that wrote no snapshot."""
    steps = args.mlp_steps if model == "mlp" else args.encoder_steps
    warmup = 5
    on = overhead_run(model, args.every, steps, args.timeout)
    times = on["step_seconds"]
    step = statistics.median(times)
    writes = on["snapshot_seconds"][1:] or on["snapshot_seconds"]
    write = statistics.mean(writes) if writes else None
    # timed step i is training run warmup + i + 1; runs that are multiples of every wrote
    plain = [t for i, t in enumerate(times) if (warmup + i + 1) % args.every]
    return {"model": model, "every": args.every, "steps": steps, "median_step": step,
            "snapshot_writes": on["snapshot_seconds"], "snapshot_write": write,
            "snapshot_bytes": on["snapshot_bytes"],
            "overhead": write / (args.every * step) if write else None,
            "overhead_in_run": statistics.mean(times) / statistics.mean(plain) - 1,
            "snapshots_in_timed_steps": len(times) - len(plain)}


# ---- report ----------------------------------------------------------------------------
def markdown(payload):
    runs = sorted(set(row["run"] for part in ("kills", "overhead")
                      for row in payload.get(part, []) if row.get("run")))
    parts = ["# Self-healing: recovery from kill -9 and snapshot overhead", "",
             "Measured on a shared 2-core machine (other jobs running: times are under "
             "load) by:", ""] + ["- %s" % run for run in runs] + [""]
    if payload.get("kills"):
        rows = [[r["layout"], ", ".join("%.1f" % t for t in r["kill_to_next_step"]),
                 "%.1f" % r["cold_start"],
                 ", ".join("%.1f" % (t - r["cold_start"]) for t in r["kill_to_next_step"]),
                 ", ".join(str(n) for n in r["steps_redone"]), "%.1e" % r["max_abs_diff"]]
                for r in payload["kills"]]
        parts += ["## kill -9 of a worker, epl-launch --max_restarts 2", "",
                  common.markdown_table(["layout", "kill -> next completed step (s)",
                                         "cold start (s)", "beyond cold start (s)",
                                         "steps redone", "max abs diff"], rows), "",
                  "Cold start: the uninterrupted job's first attempt from its start to its "
                  "first completed step. Steps redone: global step at the kill minus the "
                  "snapshot step the next attempt resumed from (snapshots every %s steps "
                  "in these runs)." % payload.get("kill_every", "?"), ""]
    if payload.get("overhead"):
        rows = [[r["model"], r["every"], "%.3f" % r["median_step"],
                 "%.2f" % r["snapshot_write"], "%.1f" % (r["snapshot_bytes"] / 1e6),
                 "%.2f%%" % (100 * r["overhead"]),
                 "%+.2f%% (%d)" % (100 * r["overhead_in_run"], r["snapshots_in_timed_steps"])]
                for r in payload["overhead"]]
        parts += ["## Snapshot overhead", "",
                  common.markdown_table(["model", "every k steps", "median step (s)",
                                         "snapshot write (s)", "snapshot MB",
                                         "overhead write/(k x step)",
                                         "mean step / mean step without a write - 1 "
                                         "(writes timed)"], rows), ""]
    return "\n".join(parts)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.time()
    payload = dict(common.environment_info(sys.argv), command=common.format_command(
        [os.path.relpath(sys.argv[0], common.REPO)] + sys.argv[1:]),
        load_average=common.load_average(), kills=[], overhead=[],
        kill_every=args.kill_every)
    if "kills" in args.parts:
        for name in args.layouts:
            print("kills: %s" % name, flush=True)
            payload["kills"].append(kill_row(name, args))
    if "overhead" in args.parts:
        for model in ("mlp", "encoder"):
            print("overhead: %s" % model, flush=True)
            payload["overhead"].append(overhead_row(model, args))
    run = "`%s` (%s, load average %s)" % (payload["command"], payload["date"],
                                          payload["load_average"])
    for row in payload["kills"] + payload["overhead"]:
        row["run"] = run
    if args.merge:
        _merge(payload, common.read_results(args.out, NAME) or {})
    return common.publish(args.out, NAME, payload, markdown(payload), time.time() - started)


def _merge(payload, earlier):
    """Add ``earlier``'s rows that ``payload`` does not measure, in the table's order; each
    row names the run (command, date, load) that measured it."""
    for part, key, order in (("kills", "layout", list(LAYOUTS)), ("overhead", "model",
                                                                  ["mlp", "encoder"])):
        measured = set(row[key] for row in payload[part])
        for row in earlier.get(part, []):
            if row[key] not in measured:
                payload[part].append(row)
        payload[part].sort(key=lambda row: order.index(row[key]))


if __name__ == "__main__":
    sys.exit(main())
