"""Tables, verdicts and observations of dp_vs_horovod.py.

Kept apart from the code that runs the jobs: everything here is a pure
function of the run records, so the report can change without touching how
anything is measured.
"""
import itertools

import common

REFERENCE_BATCH = 64            # --steps is the window length at this batch
MIN_WINDOW_STEPS = 3
TARGET_VS_HOROVOD = 1.2
TARGET_EFFICIENCY = 0.9
DISTURBED_CPUS = common.DISTURBED_CPUS
KEYS = ("max_splits", "fp16", "num_communicators")
MODEL_NOTES = {
    "mlp": "MLP: 784 -> 8 x dense(512, ReLU) -> 10 (2.25 M parameters)",
    "cnn": "CNN: 32x32x3 -> conv3x3(32)-maxpool-conv3x3(64)-maxpool-dense(128)-10",
}
KIND_TITLES = {"plain": "single process (plain TF)",
               "plain_pair": "2 independent plain processes at once (no communication)",
               "epl_default": "EPL default", "epl_tuned": "EPL tuned",
               "horovod": "Horovod (gloo)"}
# Communication ops that run once per session (variable broadcast, ring set-up), not per step.
SETUP_OPS = ("CollectiveBcastSend", "CollectiveBcastRecv", "EplRingListen", "EplRingConnect",
             "CollectiveGather")


def scaled(count, batch, minimum):
    """A step count given for batch 64, proportionally lower at bigger batches (windows
    then hold about as many samples; warm-up costs are per step), never below
    ``minimum``."""
    if batch <= REFERENCE_BATCH or count < minimum:
        return count
    return max(minimum, int(round(count * REFERENCE_BATCH / float(batch))))


def config_label(config):
    return "max_splits=%d fp16=%d comms=%d" % (config["max_splits"], config["fp16"],
                                               config["num_communicators"])


def find(runs, model, batch, role):
    return [r for r in runs if (r["model"], r["batch_per_worker"], r["role"])
            == (model, batch, role)]


def targets(runs, models, batches):
    """Per model and batch: EPL tuned (re-run) and EPL default against both targets."""
    result = []
    for model, batch in itertools.product(models, batches):
        row = {"model": model, "batch_per_worker": batch,
               "ceiling": find(runs, model, batch, "plain_pair")[0]["scaling_efficiency"]}
        for role in ("epl_tuned", "epl_default"):
            run = find(runs, model, batch, role)[0]
            row[role] = {"config": run["config"], "vs_horovod": run["vs_horovod"],
                         "scaling_efficiency": run["scaling_efficiency"],
                         "vs_horovod_met": run["vs_horovod"] >= TARGET_VS_HOROVOD,
                         "efficiency_met": run["scaling_efficiency"] >= TARGET_EFFICIENCY}
        result.append(row)
    return result


def _rate(bench):
    return "%.0f (%.0f-%.0f)" % (bench["samples_per_sec"], bench["samples_per_sec_min"],
                                 bench["samples_per_sec_max"])


def _cpu(run):
    other = run["other_process_cpus"]
    return "%s / %s" % ("/".join("%.2f" % b["cpu_per_wall"] for b in run["all_workers"]),
                        "?" if other is None else "%.2f" % other)


def summary_table(runs, model, batch):
    headers = ["setup", "EPL settings", "samples/s (min-max)", "other measurement",
               "step ms", "scaling efficiency", "x Horovod", "x 2 independent processes",
               "CPU/wall per worker / other processes' CPUs"]
    rows = []
    for role in ("plain", "plain_pair", "epl_default", "epl_tuned", "horovod"):
        run = find(runs, model, batch, role)[0]
        eff = run["scaling_efficiency"]
        other = run.get("other_samples_per_sec")
        other = None if other is None else "%.0f (slower run)%s" % (
            other, "; sweep: %.0f" % run["sweep_samples_per_sec"] if role == "epl_tuned" else "")
        reference = role.startswith("plain")
        rows.append([KIND_TITLES[role], config_label(run["config"]) if run["config"] else "-",
                     _rate(run["bench"]) + (" (sum of both)" if role == "plain_pair" else ""),
                     other or "-",
                     "%.1f" % run["bench"]["step_ms"],
                     "1.00 (reference, 1 process)" if eff is None else
                     "%.2f%s" % (eff, " (ceiling)" if role == "plain_pair" else ""),
                     "-" if reference else "%.2f" % run["vs_horovod"],
                     "-" if reference else "%.2f" % run["vs_plain_pair"], _cpu(run)])
    return common.markdown_table(headers, rows)


def sweep_table(runs, model, batch):
    headers = ["max_splits", "fp16", "num_communicators", "gradient ops", "samples/s (min-max)",
               "step ms", "scaling efficiency", "x Horovod", "CPU/wall / other CPUs", ""]
    rows = []
    sweep = [r for r in runs if r.get("in_sweep") and (r["model"], r["batch_per_worker"])
             == (model, batch)]
    for run in sorted(sweep, key=lambda r: tuple(r["config"][k] for k in KEYS)):
        ops = dict((t, n) for t, n in (run["bench"].get("collective_ops") or {}).items()
                   if t not in SETUP_OPS)
        marks = [m for m, on in (("default", run is sweep[0]),
                                 ("**best -> EPL tuned**", run.get("best_in_sweep"))) if on]
        rows.append([run["config"]["max_splits"], int(run["config"]["fp16"]),
                     run["config"]["num_communicators"],
                     ", ".join("%s x%d" % (t.replace("Collective", ""), n)
                               for t, n in sorted(ops.items())) or "-",
                     _rate(run["bench"]), "%.1f" % run["bench"]["step_ms"],
                     "%.2f" % run["scaling_efficiency"], "%.2f" % run["vs_horovod"], _cpu(run),
                     ", ".join(marks)])
    return common.markdown_table(headers, rows)


def targets_table(rows):
    def verdict(value, target, met, fmt):
        return (fmt % value) + (" yes" if met else " **NO**") + (" (>= " + fmt % target + ")")
    headers = ["model", "batch/worker", "ceiling (2 independent processes)",
               "EPL tuned x Horovod", "EPL tuned efficiency",
               "EPL default x Horovod", "EPL default efficiency"]
    body = []
    for row in rows:
        cells = [row["model"], row["batch_per_worker"], "%.2f" % row["ceiling"]]
        for role in ("epl_tuned", "epl_default"):
            r = row[role]
            cells += [verdict(r["vs_horovod"], TARGET_VS_HOROVOD, r["vs_horovod_met"], "%.2f"),
                      verdict(r["scaling_efficiency"], TARGET_EFFICIENCY, r["efficiency_met"],
                              "%.2f")]
        body.append(cells)
    return common.markdown_table(headers, body)


def verdicts(rows, models):
    """One sentence per model: is each target met, at which batch sizes."""
    notes = []
    for model in models:
        mine = [r for r in rows if r["model"] == model]
        parts = []
        for key, title in (("vs_horovod_met", ">= %.1fx Horovod's samples/s" % TARGET_VS_HOROVOD),
                           ("efficiency_met", "scaling efficiency >= %.1f" % TARGET_EFFICIENCY)):
            met = [r["batch_per_worker"] for r in mine if r["epl_tuned"][key]]
            missed = [r["batch_per_worker"] for r in mine if not r["epl_tuned"][key]]
            parts.append("%s: %s" % (title, "MET at every measured batch" if not missed else
                                     "NOT MET at batch %s%s" % (
                                         ", ".join(map(str, missed)),
                                         " (met at %s)" % ", ".join(map(str, met)) if met
                                         else "")))
        notes.append("**%s** (EPL tuned): %s." % (model, "; ".join(parts)))
    return notes


def observations(runs, models, batches):
    """Step-time decomposition and noise warnings, derived from the numbers."""
    notes = []
    for model, batch in itertools.product(models, batches):
        plain = find(runs, model, batch, "plain")[0]["bench"]
        extra = []
        for role in ("plain_pair", "horovod", "epl_default", "epl_tuned"):
            step = find(runs, model, batch, role)[0]["bench"]["step_ms"]
            extra.append("%s %.1f ms (+%.1f)" % (KIND_TITLES[role], step,
                                                 step - plain["step_ms"]))
        notes.append("%s, batch %d: single-process step %.1f ms; 2-process steps: %s; %.2f MB "
                     "of float32 gradients averaged per step." % (
                         model, batch, plain["step_ms"], ", ".join(extra),
                         plain["params"] * 4 / 1e6))
        pair = find(runs, model, batch, "plain_pair")[0]["scaling_efficiency"]
        if pair < TARGET_EFFICIENCY:
            notes.append("%s, batch %d: two plain processes that never communicate reach only "
                         "%.2f of twice the single process: the two cores share caches and "
                         "memory bandwidth, so no data-parallel setup can exceed that "
                         "efficiency here." % (model, batch, pair))
    spreads = []
    for run in runs:
        if run.get("other_samples_per_sec"):
            spreads.append((run["bench"]["samples_per_sec"] / run["other_samples_per_sec"] - 1,
                            "%s/%d %s" % (run["model"], run["batch_per_worker"], run["role"])))
    if spreads:
        spread, label = max(spreads)
        notes.append("Run-to-run noise: two runs of the same setup differed by up to %.0f%% "
                     "(%s; median %.0f%% over %d pairs). Differences between single runs "
                     "smaller than that, e.g. between most sweep rows, are not significant."
                     % (100 * spread, label, 100 * sorted(s for s, _ in spreads)[len(spreads) // 2],
                        len(spreads)))
    for model, batch in itertools.product(models, batches):
        tuned = find(runs, model, batch, "epl_tuned")[0]
        default = find(runs, model, batch, "epl_default")[0]
        if tuned["config"] != default["config"] and \
                tuned["bench"]["samples_per_sec"] < default["bench"]["samples_per_sec"]:
            notes.append("%s, batch %d: EPL tuned (%s, best in the sweep) measured slower in "
                         "its own runs than EPL default: the sweep's winner won by noise."
                         % (model, batch, config_label(tuned["config"])))
    unstable, disturbed, reruns = [], [], 0
    for run in runs:
        label = "%s/%d %s%s" % (run["model"], run["batch_per_worker"], run["role"],
                                " (" + config_label(run["config"]) + ")" if run["config"]
                                else "")
        bench = run["bench"]
        reruns += len(run.get("discarded_disturbed_runs", ()))
        if bench["samples_per_sec_max"] > 1.25 * bench["samples_per_sec_min"]:
            unstable.append("%s %.0f-%.0f" % (label, bench["samples_per_sec_min"],
                                              bench["samples_per_sec_max"]))
        if (run["other_process_cpus"] or 0.0) > run["disturbance_limit"]:
            disturbed.append("%s %.2f" % (label, run["other_process_cpus"]))
    notes.append("%d run(s) were repeated because other processes used more than %.2f CPUs "
                 "(%.2f for the 1-process runs) while they were timed; the least disturbed run "
                 "is kept." % (reruns, DISTURBED_CPUS, common.disturbance_limit(1)))
    if disturbed:
        notes.append("Still disturbed (other processes' CPUs while timed), compare these rows "
                     "with care: " + "; ".join(disturbed) + ".")
    if unstable:
        notes.append("Windows differ by more than 25%% (samples/s min-max): %s."
                     % "; ".join(unstable))
    return notes


def markdown(info, args, runs, target_rows, hangs):
    """The report: provenance, targets, one section per (batch, model), notes."""
    plain = runs[0]["bench"]
    backends = sorted(set(r["backend"] for r in runs if r["kind"] == "epl"))
    changes = info.get("epl_uncommitted_changes")
    horovod = [r for r in runs if r["kind"] == "horovod"][0]["bench"]
    lines = [
        "# EPL vs Horovod: data parallelism on CPU (2 workers x 1 device, 1 thread each)", "",
        "- Command: `%s`" % info["command"],
        "- Date: %s; total run time %.0f s" % (info["date"], info["total_seconds"]),
        "- TensorFlow %s, Horovod %s (gloo), Python %s, EPL git %s"
        % (plain["tf_version"], horovod["horovod_version"], info["python"],
           info["git_revision"]),
        "- CPUs: %s (usable: %s), %s; load average (1/5/15 min) at start %s, at end %s "
        "(includes this benchmark)" % (info["cpu_count"], info["cpus_usable"],
                                       info["cpu_model"], info["loadavg_start"],
                                       info["loadavg_end"]),
        "- **Per-worker batch sizes measured: %s** (the 2-worker global batch is twice that); "
        "MomentumOptimizer(0.01, 0.9), synthetic data, intra/inter-op threads 1 in every "
        "process" % ", ".join(map(str, args.batch)),
        "- Models: " + "; ".join(MODEL_NOTES[m] for m in args.models),
        "- Timing, inside the workers: warm-up steps, then %d timed windows (per-worker "
        "batch: warm-up steps + window steps: %s); samples/s is the median window (min-max "
        "over windows), from worker 0" % (args.repeats, ", ".join(
            "%d: %d + %d" % (b, scaled(args.warmup, b, 2), scaled(args.steps, b, MIN_WINDOW_STEPS))
            for b in args.batch)),
        "- Single process: `hvd_worker.py --mode plain`, plain TF in one process (no EPL, no "
        "Horovod, no tf.train.Server)",
        "- EPL: `python -m epl.launcher --num_workers 2 --gpu_per_worker 1 "
        "benchmarks/dp_worker.py`; EPL default has no `EPL_*` variables (settings as reported "
        "by the workers); the sweep sets `EPL_COMMUNICATION_MAX_SPLITS`, `_FP16`, "
        "`_NUM_COMMUNICATORS` per run (%d configurations%s); **EPL tuned** is the sweep's "
        "fastest configuration measured again in two runs of its own (the faster one "
        "counts); the targets are judged on those runs, never on the sweep's own best number"
        % (len(args.sweep), ", --quick" if args.quick else ""),
        "- EPL all-reduce backend used (from the op types in the workers' graphs): **%s**; "
        "uncommitted changes to epl/ and csrc/ at the end of the run: %s"
        % (", ".join(backends), "none" if not changes else "%d files (%s)" % (
            len(changes), ", ".join(c[3:] for c in changes))),
        "- Horovod: `horovodrun -np 2 -H localhost:2 --gloo python benchmarks/hvd_worker.py "
        "--mode horovod`: `hvd.DistributedOptimizer(MomentumOptimizer)`, "
        "`hvd.broadcast_global_variables(0)`, Horovod's default fusion/cycle settings "
        "(HOROVOD_* set by horovodrun: %s)" % (horovod.get("horovod_env") or "none"),
        "- Scaling efficiency = samples/s / (2 x single-process samples/s); x Horovod = "
        "samples/s / Horovod's samples/s at the same batch. **Ceiling**: two plain processes "
        "started together by the launcher, each training alone (no communication); their "
        "summed samples/s / (2 x single process) is the best efficiency any data-parallel "
        "setup can reach on this machine, and x 2 independent processes = samples/s / that "
        "sum. The single process, the pair, Horovod and "
        "EPL default each run twice (before and after the sweep); the faster run is used",
        "- CPU/wall: a worker's CPU time over its timed windows / wall time (1 thread "
        "computing is about 1; communication threads add to it); other processes' CPUs: the "
        "machine's busy CPUs meanwhile minus the job's own", ""]
    lines += ["## Targets (EPL >= %.1fx Horovod's samples/s, scaling efficiency >= %.1f)"
              % (TARGET_VS_HOROVOD, TARGET_EFFICIENCY), ""]
    lines += ["- " + note for note in verdicts(target_rows, args.models)]
    lines += ["", targets_table(target_rows), ""]
    for batch in args.batch:
        for model in args.models:
            lines += ["## %s, batch %d per worker" % (model, batch), "",
                      summary_table(runs, model, batch), "",
                      "EPL sweep (`communication.*`):", "", sweep_table(runs, model, batch), ""]
    lines += ["## Observations", ""]
    lines += ["- " + note for note in observations(runs, args.models, args.batch)]
    lines += ["- %d job(s) hung and were started again (--retries %d)%s" % (
        len(hangs), args.retries, ":" if hangs else ".")]
    for hang in hangs:
        lines.append("  - %s, batch %d, %s%s, attempt %d: %s" % (
            hang["model"], hang["batch_per_worker"], hang["kind"],
            " " + config_label(hang["config"]) if hang["config"] else "", hang["attempt"],
            hang["report"].splitlines()[0]))
        for worker, stack in enumerate(hang["stacks"]):
            lines.append("    - worker %d stuck in: %s" % (
                worker, " <- ".join("`%s`" % f for f in stack) if stack else "(no stack)"))
    return "\n".join(lines) + "\n"
