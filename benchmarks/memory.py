"""Memory benchmark: every memory saver measured against its formula, and EPL's estimate
(``epl.estimate_memory()``) against the measured peak.

Each configuration trains a transformer-shaped model (``transformer.py``'s layers:
self-attention, tanh-GELU feed-forward, layer norm; Adam unless said) for a few steps
under ``python -m epl.launcher`` (N workers x D virtual CPU devices) and traces one
step. Per device it records the step peak (maximum running sum of the RunMetadata
allocation records) and the persistent bytes of variables, split into weights and
optimizer slots (non-trainable variables colocated with a trainable one), plus the
estimate EPL printed before the session started.

Targets (from the issue), on the 12-layer model:

* gradient checkpointing: peak <= 0.5x without it, at <= 1.4x the step time;
* ZeRO v1 and v2: optimizer-state bytes and reduced-gradient bytes kept per device <= 1/N
  + 5% of the unpartitioned ones (N=2, 4 workers x 1 device; 1 worker x 4 devices; 2 x 2),
  and the step time against data parallelism without ZeRO on the same layout;
* offload: 0 weight bytes resident on the compute device;
* AMP O1: no float16 weight copy held (float16 casts of weights alive at once <= the
  largest weight's float16 size, and no float16 variable);
* grouped apply with N groups: optimizer temporaries about 1/N (a plain-op optimizer
  whose update allocates, 8 inter-op threads);
* the estimate within 25% of the measured step peak and persistent bytes.

Then the 24-layer model with no saver, each saver, and the best combinations, and
(estimate only) the largest model that fits a per-device budget.

    .venv/bin/python benchmarks/memory.py [--quick] [--only RUN,RUN] [--out DIR]

Timings on this 2-core machine are noisy (10-30% run to run); memory is exact.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402

SMALL = dict(hidden=256, heads=4, seq=64, intermediate=1024, vocab=2000, batch=16)
SMALL24 = dict(hidden=128, heads=4, seq=64, intermediate=512, vocab=2000, batch=16)
# AMP on CPU: float16 kernels are emulated (a warm-up step of the 12-layer model above
# takes minutes), so AMP's own check runs on a narrow 12-layer model, 1 step.
TINY = dict(hidden=64, heads=2, seq=16, intermediate=256, vocab=2000, batch=4)
GC = {"gradient_checkpoint.type": "auto"}
# (name, config, workers, devices per worker, optimizer, inter-op threads)
RUNS_12 = [
    ("none", {}, 1, 1, "adam", 2),
    ("gc", GC, 1, 1, "adam", 2),
    ("zero_v1_n2", {"zero.level": "v1"}, 2, 1, "adam", 1),
    ("zero_v1_n4", {"zero.level": "v1"}, 4, 1, "adam", 1),
    ("zero_v1_1x4", {"zero.level": "v1"}, 1, 4, "adam", 2),
    ("zero_v1_2x2", {"zero.level": "v1"}, 2, 2, "adam", 1),
    ("zero_v2_1x4", {"zero.level": "v2"}, 1, 4, "adam", 2),
    ("zero_v2_2x2", {"zero.level": "v2"}, 2, 2, "adam", 1),
    ("dp_1x4", {}, 1, 4, "adam", 2),
    ("dp_2x2", {}, 2, 2, "adam", 1),
    ("dp_1x2", {}, 1, 2, "adam", 2),
    ("offload_1x2", {"offload.level": "v0"}, 1, 2, "adam", 2),
    ("amp", {"amp.level": "O1"}, 1, 1, "adam", 2, TINY),
    ("plainop_g1", {}, 1, 1, "plainop", 8),
    ("plainop_g2", {"optimizer.num_apply_group": 2}, 1, 1, "plainop", 8),
    ("plainop_g4", {"optimizer.num_apply_group": 4}, 1, 1, "plainop", 8),
]
RUNS_24 = [
    ("none", {}, 1, 1, "adam", 2),
    ("gc", GC, 1, 1, "adam", 2),
    ("zero_v1_n2", {"zero.level": "v1"}, 2, 1, "adam", 1),
    ("offload_1x2", {"offload.level": "v0"}, 1, 2, "adam", 2),
    ("grouped_4", {"optimizer.num_apply_group": 4}, 1, 1, "adam", 2),
    ("gc+zero_v1+grouped_n2", dict(GC, **{"zero.level": "v1", "optimizer.num_apply_group": 4}),
     2, 1, "adam", 1),
    ("gc+offload_1x2", dict(GC, **{"offload.level": "v0"}), 1, 2, "adam", 2),
]
TOLERANCE = 0.25
SLACK = 64 << 10  # bytes: a few constants and counters are not worth a ratio


# ---------------------------------------------------------------------------------------
# worker side
# ---------------------------------------------------------------------------------------
class PlainOpOptimizer(object):
    """Factory of a tf.train.Optimizer whose dense update is written with plain ops
    (``lr * g / (sqrt(|g|) + eps)``): each variable's update allocates temporaries the
    size of the variable, which grouped apply bounds."""

    @staticmethod
    def make(tf):
        class PlainOp(tf.train.Optimizer):
            def __init__(self, learning_rate):
                tf.train.Optimizer.__init__(self, False, "PlainOp")
                self._lr = learning_rate

            def _apply_dense(self, grad, var):
                step = self._lr * grad / (tf.sqrt(tf.abs(grad)) + 1e-3)
                return tf.assign_sub(var, step).op

            def _apply_sparse(self, grad, var):
                return tf.scatter_sub(var, grad.indices, self._lr * grad.values).op
        return PlainOp(1e-4)


def build_model(tf, size, layers, optimizer):
    """transformer.py's encoder with a choice of optimizer; returns (loss, train op)."""
    import numpy as np
    import transformer
    size = dict(size, layers=layers)
    rng = np.random.RandomState(0)
    ids = rng.randint(0, size["vocab"], (size["batch"], size["seq"])).astype(np.int32)
    labels = rng.randint(0, 2, size["batch"]).astype(np.int64)
    data = tf.data.Dataset.from_tensors((ids, labels)).repeat()
    ids_t, labels_t = tf.data.make_one_shot_iterator(data).get_next()
    word = tf.get_variable("word_embeddings", [size["vocab"], size["hidden"]])
    position = tf.get_variable("position_embeddings", [size["seq"], size["hidden"]])
    x = transformer._layer_norm(tf, tf.gather(word, ids_t) + position[None], "embedding_norm")
    for index in range(layers):
        x = transformer._layer(tf, x, size, index)
    pooled = tf.layers.dense(x[:, 0], size["hidden"], activation=tf.tanh, name="pooler")
    logits = tf.layers.dense(pooled, 2, name="classifier")
    loss = tf.losses.sparse_softmax_cross_entropy(labels_t, logits)
    opt = tf.train.AdamOptimizer(1e-4) if optimizer == "adam" else PlainOpOptimizer.make(tf)
    return loss, opt.minimize(loss, global_step=tf.train.get_or_create_global_step())


def variable_kinds(graph):
    """{variable op name: "weight" | "slot"}: slots are non-trainable variables colocated
    with another variable (optimizer slots, Adam's beta powers)."""
    kinds = {}
    variables = [op for op in graph.get_operations() if op.type in ("VariableV2", "VarHandleOp")]
    names = set(op.name for op in variables)
    for op in variables:
        primaries = [g.decode()[5:] for g in op.colocation_groups()]
        kinds[op.name] = "slot" if any(p in names and p != op.name for p in primaries) \
            else "weight"
    return kinds


def fp16_weight_casts(graph):
    """Names of casts to float16 of values computed from variables only (weight copies)."""
    memo = {}

    def weight_like(op):
        if op.name not in memo:
            memo[op.name] = True
            memo[op.name] = op.type in ("VariableV2", "VarHandleOp", "Const") or (
                bool(op.inputs) and all(weight_like(t.op) for t in op.inputs))
        return memo[op.name]
    return set(op.name for op in graph.get_operations() if op.type == "Cast"
               and op.outputs[0].dtype.base_dtype.name == "float16" and weight_like(op))


def applied_gradient_bytes(graph):
    """{optimizer update op: bytes of the reduced dense gradient it applies} (the OpDef
    input named ``grad``). Summed over the update ops a device ran in the traced step,
    this is what that device keeps of the reduced gradients: all of them under data
    parallelism, its own variables' under ZeRO v1/v2. It is the reduced result, not the
    collective's buffer (on CPU TF 1.15 has no reduce-scatter, so EPL's CPU backends
    all-reduce a bucket and keep a slice). Sparse updates (scatter ops) are not counted."""
    found = {}
    for op in graph.get_operations():
        if "Apply" not in op.type:
            continue
        names = [arg.name for arg in op.op_def.input_arg]
        if "grad" in names:
            grad = op.inputs[names.index("grad")]
            if grad.shape.is_fully_defined():
                found[op.name] = grad.shape.num_elements() * grad.dtype.size
    return found


def device_report(run_metadata, graph, view):
    """Per device: step peak, persistent weights/slots, apply-phase and fp16-cast peaks."""
    from epl.ir.phase import Phase
    from epl.profiler import device_memory_stats
    from epl.profiler.run_metadata import bytes_in_use_timeline
    kinds, casts = variable_kinds(graph), fp16_weight_casts(graph)
    applied = applied_gradient_bytes(graph)
    stats = device_memory_stats(run_metadata)
    out = {}
    for dev in run_metadata.step_stats.dev_stats:
        if dev.device not in stats:
            continue
        entry = out.setdefault(dev.device, {"weights": 0, "slots": 0, "gradients": 0,
                                            "apply": [], "casts": []})
        for node in dev.node_stats:
            kind = kinds.get(node.node_name)
            if kind is not None:
                entry[kind + "s"] += node.memory_stats.persistent_memory_size
            entry["gradients"] += applied.get(node.node_name, 0)
            info = view.info(node.node_name)
            records = [(r.alloc_micros, r.alloc_bytes) for m in node.memory
                       for r in m.allocation_records]
            if info is not None and info.phase == Phase.APPLY:
                entry["apply"] += records
            if node.node_name in casts:
                entry["casts"] += records
    for device, entry in out.items():
        # the profiler's rule, as for the step peak (stats[device].peak_bytes)
        entry["apply_peak"] = bytes_in_use_timeline(entry.pop("apply"))[1]
        entry["fp16_weight_casts_peak"] = bytes_in_use_timeline(entry.pop("casts"))[1]
        entry["peak"] = stats[device].peak_bytes
        entry["persistent"] = stats[device].persistent_bytes
    return out


def worker(args):
    common.install_deadline(args.deadline, "memory worker")
    tf = common.graph_mode_tf()
    import epl
    tf.logging.set_verbosity(tf.logging.ERROR)
    epl.init(epl.Config(json.loads(args.config)))
    epl.set_default_strategy(epl.replicate(1))
    size = json.loads(args.size)
    loss, train = build_model(tf, size, args.layers, args.optimizer)
    estimate = epl.estimate_memory()
    view = epl.Graph.get()
    largest = max(v.shape.num_elements() * 4 for v in tf.trainable_variables())
    fp16_vars = [v.op.name for v in tf.global_variables() if v.dtype.base_dtype == tf.float16]
    config = tf.ConfigProto(intra_op_parallelism_threads=1,
                            inter_op_parallelism_threads=args.threads)
    with tf.train.MonitoredTrainingSession(config=config, log_step_count_steps=0,
                                           save_summaries_steps=None,
                                           save_summaries_secs=None) as sess:
        for _ in range(args.warmup):
            sess.run(train)
        start = time.perf_counter()
        for _ in range(args.steps):
            sess.run(train)
        step = (time.perf_counter() - start) / args.steps
        meta = tf.RunMetadata()
        sess.run(train, options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
                 run_metadata=meta)
    measured = device_report(meta, tf.get_default_graph(), view)
    common.bench_line({"step_seconds": step, "measured": measured,
                       "estimate": estimate.to_dict()["devices"],
                       "largest_weight": largest, "fp16_variables": fp16_vars,
                       "worker": epl.Env.get().cluster.worker_index})


# ---------------------------------------------------------------------------------------
# driver side
# ---------------------------------------------------------------------------------------
def gc_pending():
    """Why gradient checkpointing cannot run yet, or None once it has landed."""
    from epl import availability
    if "gradient_checkpoint.type" in availability.NOT_BUILT:
        return "gradient checkpointing has not landed (epl/availability.py still refuses " \
               "gradient_checkpoint.type)"
    return None


def run(args, name, config, workers, devices, optimizer, threads, layers, size):
    quick = size == TINY  # one step is enough for a memory-only check
    script_args = ["--worker", "--config", json.dumps(config), "--size", json.dumps(size),
                   "--layers", layers, "--optimizer", optimizer, "--threads", threads,
                   "--steps", 1 if quick else args.steps, "--warmup", 1 if quick else args.warmup,
                   "--deadline", args.timeout]
    stray = [k for k in os.environ if k.startswith("EPL_")]
    result = common.launch(os.path.abspath(__file__), script_args, workers, devices,
                           args.timeout + 30, drop_env=stray)
    found = common.parse_bench(result.lines)
    if result.returncode != 0 or len(found) != workers:
        common.raise_failure(result, "memory run %s (L=%d)" % (name, layers), workers)
    common.discard_logs(result)
    merged = {"name": name, "config": config, "workers": workers, "devices": devices,
              "size": size,
              "optimizer": optimizer, "layers": layers, "measured": {}, "estimate": {},
              "step_seconds": max(p["step_seconds"] for p in found.values())}
    for payload in found.values():
        merged["largest_weight"] = payload["largest_weight"]
        merged["fp16_variables"] = payload["fp16_variables"]
        for device, values in payload["measured"].items():
            merged["measured"][device] = values
            merged["estimate"][device] = payload["estimate"].get(device)
    peaks = ", ".join(mib(m["peak"]) for m in merged["measured"].values())
    print("  %-24s L=%d %dx%d: %.2f s/step, peak %s MiB"
          % (name, layers, workers, devices, merged["step_seconds"], peaks), flush=True)
    return merged


def common_mib():
    return float(1 << 20)


def run_all(args, runs, layers, size):
    results, pending = {}, gc_pending()
    for spec in runs:
        name, config, workers, devices, optimizer, threads = spec[:6]
        shape = spec[6] if len(spec) > 6 else size
        if pending and "gradient_checkpoint.type" in config:
            results[name] = {"name": name, "pending": pending}
            print("  %-24s PENDING: %s" % (name, pending), flush=True)
            continue
        try:
            results[name] = run(args, name, config, workers, devices, optimizer, threads,
                                layers, shape)
        except common.BenchmarkError as err:  # reported in the tables, never hidden
            reason = str(err).splitlines()[0]
            results[name] = {"name": name, "failed": str(err)[-4000:]}
            print("  %-24s FAILED: %s\n%s" % (name, reason, str(err)[-3000:]), flush=True)
    return results


def compute_device(result):
    """The device a copy computes on: the last device (CPU:1 when CPU:0 is also the host)."""
    return sorted(result["measured"])[-1]


def total(result, device):
    m = result["measured"][device]
    return m["peak"] + m["persistent"]


def mib(value):
    return "-" if value is None else "%.1f" % (value / common_mib())


def _met(flag):
    return "met" if flag else "**NOT met**"


def _gc_row(r, base):
    gc = r["gc"]["measured"][compute_device(r["gc"])]
    ratio = gc["peak"] / float(base["peak"])
    slow = r["gc"]["step_seconds"] / r["none"]["step_seconds"]
    expected = r["gc"]["estimate"][compute_device(r["gc"])]["peak"]
    measured = "%s MiB (%.2fx); %.2fx time" % (mib(gc["peak"]), ratio, slow)
    return [("GC (auto)", "step peak; step time", "checkpoints + one layer", mib(expected),
             measured, "<= 0.5x, <= 1.4x", _met(ratio <= 0.5 and slow <= 1.4))]


ZERO_RUNS = (("zero_v1_n2", 2, "2x1", None), ("zero_v1_n4", 4, "4x1", None),
             ("zero_v1_1x4", 4, "1x4", "dp_1x4"), ("zero_v1_2x2", 4, "2x2", "dp_2x2"),
             ("zero_v2_1x4", 4, "1x4", "dp_1x4"), ("zero_v2_2x2", 4, "2x2", "dp_2x2"))


def _zero_rows(r, base):
    rows = []
    for name, n, layout, plain in ZERO_RUNS:
        if name not in r:
            continue
        level = name.split("_")[1]
        cost = ""
        if plain in r and not r[plain].get("failed"):
            cost = "; step time %.2fx of DP %s without ZeRO" % (
                r[name]["step_seconds"] / r[plain]["step_seconds"], layout)
        for kind, label, symbol in (("slots", "optimizer slots", "S"),
                                    ("gradients", "reduced gradients kept", "G")):
            if not base.get(kind):
                continue  # a result file from before gradients were counted
            worst = max(m.get(kind, 0) for m in r[name]["measured"].values())
            share = worst / float(base[kind])
            rows.append(("ZeRO %s, %s (N=%d)" % (level, layout, n), "%s per device" % label,
                         "%s/N" % symbol, mib(base[kind] / n),
                         "%s MiB (%.3f of %s)%s" % (mib(worst), share, symbol, cost),
                         "<= 1/N + 5%", _met(share <= 1.0 / n + 0.05)))
    return rows


def _offload_row(r, base):
    off = r["offload_1x2"]["measured"][compute_device(r["offload_1x2"])]
    dp = r["dp_1x2"]["measured"][compute_device(r["dp_1x2"])]
    held, without = off["weights"] + off["slots"], dp["weights"] + dp["slots"]
    return [("offload v0", "variables resident on the compute device", "0", "0",
             "%s MiB (without offload: %s MiB)" % (mib(held), mib(without)),
             "0", _met(held == 0))]


def _amp_row(r, base):
    amp = r["amp"]
    casts = max(m["fp16_weight_casts_peak"] for m in amp["measured"].values())
    return [("AMP O1", "float16 weight copies alive at once", "<= one use's copy",
             "<= %s" % mib(amp["largest_weight"] / 2),
             "%s MiB; float16 variables: %d" % (mib(casts), len(amp["fp16_variables"])),
             "<= largest weight, no fp16 variable",
             _met(casts <= amp["largest_weight"] and not amp["fp16_variables"]))]


def _grouped_rows(r, base):
    g1 = r["plainop_g1"]["measured"][compute_device(r["plainop_g1"])]["apply_peak"]
    rows = []
    for name, n in (("plainop_g2", 2), ("plainop_g4", 4)):
        gn = r[name]["measured"][compute_device(r[name])]["apply_peak"]
        rows.append(("grouped apply, N=%d" % n, "optimizer temporaries (apply-phase peak)",
                     "T/N", mib(g1 / n), "%s MiB (%.2f of T)" % (mib(gn), gn / float(g1)),
                     "<= 1.25/N", _met(gn <= 1.25 * g1 / n)))
    return rows


def saver_targets(r):
    """[(saver, quantity, formula, expected, measured, target, met)] on the 12-layer runs;
    a saver whose runs failed or are pending gets a row that says so."""
    base = r["none"]["measured"][compute_device(r["none"])]
    rows = []
    for label, build, needs in (
            ("GC (auto)", _gc_row, ["gc"]),
            ("ZeRO", _zero_rows, [z[0] for z in ZERO_RUNS if z[0] in r]),
            ("offload v0", _offload_row, ["offload_1x2", "dp_1x2"]), ("AMP O1", _amp_row, ["amp"]),
            ("grouped apply", _grouped_rows, ["plainop_g1", "plainop_g2", "plainop_g4"])):
        if not needs or any(n not in r for n in needs):
            continue  # not run (--only)
        missing = [(n, r[n].get("pending") or "run failed, see memory.json") for n in needs
                   if r[n].get("pending") or r[n].get("failed")]
        if missing:
            why = "; ".join("%s: %s" % item for item in missing)
            rows.append((label, "-", "-", "-", "-", "-", why))
        else:
            rows.extend(build(r, base))
    return rows


def estimate_rows(results, layers):
    """[(run, device, est peak, meas peak, ratio, est persistent, meas persistent, ratio, ok)]."""
    rows = []
    for name, result in results.items():
        if result.get("pending") or result.get("failed"):
            continue
        for device in sorted(result["measured"]):
            m, e = result["measured"][device], result["estimate"].get(device)
            if e is None:
                continue
            short = device.split("/")[-1].replace("device:", "")
            worker = device.split("task:")[1].split("/")[0] if "task:" in device else "0"
            peak = e["peak"] / float(max(1, m["peak"]))
            pers = e["persistent"] / float(m["persistent"]) if m["persistent"] > SLACK else None
            pers_ok = abs(e["persistent"] - m["persistent"]) <= max(
                SLACK, TOLERANCE * m["persistent"])
            ok = abs(peak - 1) <= TOLERANCE and pers_ok
            rows.append(["L=%d %s" % (layers, name), "w%s %s" % (worker, short),
                         mib(e["peak"]), mib(m["peak"]), "%.2f" % peak,
                         mib(e["persistent"]), mib(m["persistent"]),
                         "-" if pers is None else "%.2f" % pers, "yes" if ok else "**no**"])
    return rows


def formula_total(size, layers, values, devices):
    """Estimated total of the last device of a 1-worker job, from the transformer formula
    (for configurations too slow to measure on CPU: AMP's emulated float16 kernels)."""
    from epl.cluster import Cluster
    from epl.config import Config
    from epl.parallel.plan import TaskGraphSpec, make_plan
    from epl.profiler import memory_estimate as me
    config = Config(values)
    plan = make_plan(config, Cluster(None, 0, devices), [TaskGraphSpec("m", "replicate", 1)])
    estimate = me.estimate(me.profile_for_config(dict(size, layers=layers), config),
                           plan, config)
    return estimate.devices[sorted(estimate.devices)[-1]].total


def budget_rows(budget_gib, workers):
    """Largest BERT-large-wide model (layers) fitting the budget, per saver (estimate only)."""
    from epl.cluster import Cluster
    from epl.config import Config
    from epl.parallel.plan import TaskGraphSpec, make_plan
    from epl.profiler import memory_estimate as me
    shape = dict(hidden=1024, heads=16, seq=512, intermediate=4096, vocab=30522, batch=8)
    hosts = ["worker%d:2222" % i for i in range(workers)]
    choices = [("none", {}), ("gc", GC), ("zero v1", {"zero.level": "v1"}),
               ("offload v0", {"offload.level": "v0"}), ("amp O1", {"amp.level": "O1"}),
               ("grouped apply 4", {"optimizer.num_apply_group": 4}),
               ("gc + zero v1 + grouped 4",
                dict(GC, **{"zero.level": "v1", "optimizer.num_apply_group": 4})),
               ("gc + amp + offload", dict(GC, **{"amp.level": "O1", "offload.level": "v0"}))]
    rows = []
    for label, values in choices:
        config = Config(values)
        plan = make_plan(config, Cluster(hosts, 0, 1), [TaskGraphSpec("model", "replicate", 1)])

        def build(layers):
            return me.estimate(me.profile_for_config(dict(shape, layers=layers), config),
                               plan, config)
        fit = me.largest_fitting(budget_gib * me.GIB, build, 1, 1024)
        at24 = build(24)
        rows.append([label, mib(at24.max_total), fit])
    return shape, rows


def report(args, r12, r24, info, seconds):
    target_rows = saver_targets(r12)
    est_rows = estimate_rows(r12, 12) + estimate_rows(r24, 24)
    within = sum(1 for row in est_rows if row[-1] == "yes")
    rows24 = []
    for name, result in r24.items():
        if result.get("pending") or result.get("failed"):
            state = "pending" if result.get("pending") else "failed (see memory.json)"
            rows24.append([name, state, "-", "-", "-", "-", "-"])
            continue
        device = compute_device(result)
        m, e = result["measured"][device], result["estimate"][device]
        rows24.append([name, device.split("/")[-1].replace("device:", ""), mib(m["peak"]),
                       mib(m["persistent"]), mib(total(result, device)), mib(e["total"]),
                       "%.2f" % result["step_seconds"]])
    for label, values, devices in (("amp", {"amp.level": "O1"}, 1),
                                   ("gc+amp+offload_1x2", dict(GC, **{
                                       "amp.level": "O1", "offload.level": "v0"}), 2)):
        rows24.append([label + " (estimate only)", "CPU:%d" % (devices - 1), "-", "-", "-",
                       mib(formula_total(SMALL24, 24, values, devices)), "-"])
    shape, fits = budget_rows(args.budget, 4)
    md = [
        "# Memory savers and the memory estimate (CPU, virtual devices)", "",
        "- Command: `%s`" % info["command"],
        "- Date: %s; EPL git %s; %s, %s CPUs; load average at start %s" % (
            info["date"], info["git_revision"], info["cpu_model"], info["cpu_count"],
            info["loadavg_start"]),
        "- Model: benchmarks/transformer.py layers; 12-layer runs %s; 24-layer runs %s; "
        "Adam unless noted; %d warm-up + %d timed steps, then one traced step" % (
            json.dumps(SMALL, sort_keys=True), json.dumps(SMALL24, sort_keys=True),
            args.warmup, args.steps),
        "- Step peak: maximum running sum of a device's RunMetadata allocation records "
        "(activations, gradients, temporaries); persistent: variables "
        "(`persistent_memory_size`). Virtual CPUs share one allocator, so the numbers are "
        "what each device's ops allocate. Step times are noisy on 2 shared cores.",
        "- Total benchmark time: %.0f s" % seconds, "",
        "## Savers against their formulas (12 layers)", "",
        common.markdown_table(["saver", "quantity", "formula", "expected MiB", "measured",
                               "target", "result"], target_rows), "",
        "## Estimate (`epl.estimate_memory()`, before the session) vs measured", "",
        common.markdown_table(["run", "device", "est. peak MiB", "meas. peak MiB", "ratio",
                               "est. persistent MiB", "meas. persistent MiB", "ratio",
                               "within 25%"], est_rows), "",
        "%d of %d device rows within 25%%." % (within, len(est_rows)), "",
        "## 24 layers: per-device memory, each saver and combinations", "",
        common.markdown_table(["configuration", "compute device", "step peak MiB",
                               "persistent MiB", "total MiB", "estimated total MiB",
                               "s/step"], rows24), "",
        "## Largest model within %g GiB per device (estimate; 4 workers x 1 device)"
        % args.budget, "",
        "Shape %s; layers varied." % json.dumps(shape, sort_keys=True), "",
        common.markdown_table(["savers", "total per device at 24 layers (MiB)",
                               "largest layer count that fits"], fits), ""]
    markdown = "\n".join(md)
    settings = dict(vars(args), out=common.portable_path(args.out))
    payload = {"environment": info, "settings": settings, "runs_12": r12, "runs_24": r24,
               "targets": target_rows, "estimate_vs_measured": est_rows,
               "budget": {"gib": args.budget, "shape": shape, "rows": fits}}
    common.write_results(args.out, "memory_only" if args.only else "memory", payload, markdown)
    print(markdown)


def main(argv=None):
    common.measure_tensors_not_chunks()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="12-layer runs only")
    parser.add_argument("--only", default="", help="comma-separated 12-layer runs (with "
                        "'none', the base); implies --quick; writes memory_only.json/.md")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--budget", type=float, default=16.0, help="GiB per device")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--size", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, default=12, help=argparse.SUPPRESS)
    parser.add_argument("--optimizer", default="adam", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, default=400, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    info = common.environment_info(sys.argv)
    start = time.time()
    print("12-layer runs", flush=True)
    runs = RUNS_12
    if args.only:
        wanted = set(args.only.split(",")) | {"none"}
        runs = [spec for spec in RUNS_12 if spec[0] in wanted]
    r12 = run_all(args, runs, 12, SMALL)
    r24 = {}
    if not args.quick and not args.only:
        print("24-layer runs", flush=True)
        r24 = run_all(args, RUNS_24, 24, SMALL24)
    report(args, r12, r24, info, time.time() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
