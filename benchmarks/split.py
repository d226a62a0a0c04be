"""Operator split benchmark: a large classifier and an MoE layer, 1 device vs split over 2 and 4.

Two models, each measured on one worker with N virtual CPU devices:

* **classifier**: a replicated backbone (one dense layer, width ``--features``) and a
  classifier of ``--classes`` classes with a sparse softmax cross-entropy, Adam. The
  classifier is split over N devices (``epl.split(N)``, colocated with ``epl.replicate(N)``),
  or replicated on all N (``epl.replicate(N)`` alone: data parallelism, the classifier's
  gradient all-reduced), or unsplit on 1 device (plain TensorFlow). Reported: step time, the
  classifier's weight and optimizer-slot bytes on each device (from the variables each device
  holds after the rewrite) and each device's peak memory during a step (RunMetadata
  allocation records, ``epl.profiler.run_metadata.device_memory_stats``).
* **moe**: ``epl.ops.moe.moe_layer`` with ``--experts`` experts (top-1 gating), the gate
  replicated and the experts split over N devices (``epl.set_default_strategy(
  epl.replicate(N))`` + ``epl.split(N)``, tokens exchanged by all-to-all), or the same layer
  replicated on all N devices, or unsplit on 1 device. Reported: tokens/s and per-device
  bytes as above.

Every configuration has the same global batch (the N devices of a model replica share it),
so rows of one model do the same arithmetic. The N virtual devices share this machine's
cores: split does not add compute here, it divides the weights (and their optimizer slots)
over devices and adds collectives.

    .venv/bin/python benchmarks/split.py [--classes 100000] [--devices 2,4]
        [--models classifier,moe] [--no-replicated]

Each configuration runs in a fresh child process with a hard timeout (``--timeout``).
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402

SINGLE, SPLIT, REPLICATE = "single", "split", "replicate"


# ----------------------------------------------------------------------------
# Child: one configuration
# ----------------------------------------------------------------------------

def _classifier(tf, epl, args, layout, devices):
    """(train op, global batch, work units per step, weight-name prefix of the split part)."""
    import numpy as np
    rng = np.random.RandomState(0)
    rows = 4 * args.batch
    data = tf.data.Dataset.from_tensor_slices(
        (rng.rand(rows, args.features).astype(np.float32),
         rng.randint(0, args.classes, rows).astype(np.int64))).repeat().batch(args.batch)
    x, y = tf.data.make_one_shot_iterator(data).get_next()
    backbone = epl.replicate(devices) if layout != SINGLE else _Nothing()
    head = epl.split(devices) if layout == SPLIT else backbone
    with backbone:
        features = tf.layers.dense(x, args.features, activation=tf.nn.relu, name="backbone")
    with head:
        logits = tf.layers.dense(features, args.classes, name="classifier")
        loss = tf.losses.sparse_softmax_cross_entropy(y, logits)
    train = tf.train.AdamOptimizer(1e-3).minimize(loss)
    return train, args.batch, args.batch, "classifier/"


def _moe(tf, epl, args, layout, devices):
    import numpy as np
    from epl.ops.moe import moe_layer
    rng = np.random.RandomState(0)
    rows = 4 * args.groups
    shape = (rows, args.tokens, args.width)
    data = tf.data.Dataset.from_tensor_slices(
        (rng.rand(*shape).astype(np.float32) - 0.5,
         rng.rand(*shape).astype(np.float32))).repeat().batch(args.groups)
    tokens, targets = tf.data.make_one_shot_iterator(data).get_next()
    if layout != SINGLE:
        epl.set_default_strategy(epl.replicate(devices))
    output, aux = moe_layer(tokens, args.experts, args.hidden,
                            split=epl.split(devices) if layout == SPLIT else None,
                            capacity_factor=1.25)
    loss = tf.reduce_mean(tf.square(output - targets)) + 0.01 * aux
    train = tf.train.AdamOptimizer(1e-3).minimize(loss)
    return train, args.groups, args.groups * args.tokens, "moe/w_"


class _Nothing(object):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _variable_bytes(tf, sess, prefix):
    """{device: {"weights": bytes, "slots": bytes, "other": bytes}} of every variable
    instance in the graph; ``prefix`` names the split part's weights (their slots are the
    variables under ``<weight>/``)."""
    import epl
    view = epl.Graph.get(sess.graph)
    program = getattr(view, "parallel", None) if view is not None else None
    if program is not None and program.variable_copies:
        names = sorted(program.variable_copies)
        ops = [(name, op) for name in names for op in program.variable_copies[name]]
    else:
        ops = [(v.op.name, v.op) for v in tf.global_variables()]
    values = sess.run([op.outputs[0] for _, op in ops])
    result = {}
    for (name, op), value in zip(ops, values):
        kind = "other"
        if name.startswith(prefix):
            kind = "slots" if name.count("/") > prefix.count("/") else "weights"
        device = _short(op.device)
        bucket = result.setdefault(device, {"weights": 0, "slots": 0, "other": 0})
        bucket[kind] += int(value.nbytes)
    return result


def _short(device):
    """"/job:worker/replica:0/task:0/device:CPU:1" -> "CPU:1"."""
    return device.rsplit("device:", 1)[-1] if device else "?"


def child(args):
    """Measure one configuration in this process; print one BENCH line."""
    common.install_deadline(args.timeout - 10, "split benchmark child")
    devices, layout = args.child_devices, args.child_layout
    os.environ["EPL_NUM_VIRTUAL_DEVICES"] = str(devices)
    tf = common.graph_mode_tf()
    import epl
    from epl.profiler.run_metadata import device_memory_stats
    tf.logging.set_verbosity(tf.logging.ERROR)
    build = _classifier if args.child_model == "classifier" else _moe
    if layout == SINGLE:
        context = epl.paused()
    else:
        epl.init(epl.Config({"cluster.colocate_split_and_replicate": layout == SPLIT}))
        context = _Nothing()
    with context:
        start = time.time()
        train, batch, units, prefix = build(tf, epl, args, layout, devices)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            sess.run(train)
            first = time.time() - start
            timing = common.timed_windows(lambda: sess.run(train), args.warmup, args.repeats,
                                          args.steps)
            meta = tf.RunMetadata()
            sess.run(train, options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
                     run_metadata=meta)
            variables = _variable_bytes(tf, sess, prefix)
    memory = dict((_short(device), {"peak_bytes": stats.peak_bytes,
                                    "persistent_bytes": stats.persistent_bytes})
                  for device, stats in device_memory_stats(meta).items())
    rates = common.window_rates(timing["window_seconds"], units, args.steps)
    payload = {"model": args.child_model, "layout": layout, "devices": devices,
               "global_batch": batch, "units_per_step": units,
               "first_step_seconds": first, "step_ms": rates["step_ms"],
               "units_per_sec": rates["samples_per_sec"],
               "units_per_sec_min": rates["samples_per_sec_min"],
               "units_per_sec_max": rates["samples_per_sec_max"],
               "cpu_per_wall": timing["cpu_per_wall"],
               "machine_busy_cpus": timing["machine_busy_cpus"],
               "variables": variables, "memory": memory}
    common.bench_line(payload)


# ----------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------

def _child_argv(args, model, layout, devices):
    argv = [sys.executable, os.path.abspath(__file__), "--child-model", model,
            "--child-layout", layout, "--child-devices", str(devices)]
    for name in ("classes", "features", "batch", "experts", "tokens", "width", "hidden",
                 "groups", "steps", "repeats", "warmup", "timeout"):
        argv += ["--" + name, str(getattr(args, name))]
    return argv


def run_child(args, model, layout, devices):
    argv = _child_argv(args, model, layout, devices)
    payload = common.run_single(
        argv, args.timeout, "split benchmark %s %s x%d" % (model, layout, devices),
        extra_env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        drop_env=[k for k in os.environ if k.startswith("EPL_")])
    print("%s %s x%d: %.1f ms/step, %.0f units/s" % (model, layout, devices,
                                                     payload["step_ms"],
                                                     payload["units_per_sec"]), flush=True)
    return payload


def configurations(args):
    for model in args.models:
        yield model, SINGLE, 1
        for devices in args.devices:
            yield model, SPLIT, devices
            if args.replicated:
                yield model, REPLICATE, devices


def _mb(value):
    return "%.1f" % (value / 1e6)


def _per_device(result):
    """(max weight bytes, max slot bytes, max peak bytes, max persistent) over the
    compute devices (the host CPU of a single-device run is its only device)."""
    variables = result["variables"]
    weights = max(v["weights"] for v in variables.values())
    slots = max(v["slots"] for v in variables.values())
    peaks = [m["peak_bytes"] for m in result["memory"].values()]
    return weights, slots, max(peaks) if peaks else 0


def _row(result, baseline):
    weights, slots, peak = _per_device(result)
    layout = {SINGLE: "unsplit, 1 device", SPLIT: "split over %d devices",
              REPLICATE: "replicated on %d devices (data parallel)"}[result["layout"]]
    if "%d" in layout:
        layout = layout % result["devices"]
    speed = result["units_per_sec"] / baseline["units_per_sec"]
    return [layout, "%.1f" % result["step_ms"], "%.0f" % result["units_per_sec"],
            "%.2fx" % speed, _mb(weights), _mb(slots), _mb(weights + slots), _mb(peak),
            "%.1f" % result["cpu_per_wall"], _others(result),
            "%.1f" % result["first_step_seconds"]]


def _others(result):
    """CPUs other processes kept busy while this run was timed (noise on a shared host)."""
    busy = result.get("machine_busy_cpus")
    return "?" if busy is None else "%.1f" % max(0.0, busy - result["cpu_per_wall"])


def report(args, results):
    info = common.environment_info(sys.argv)
    headers = ["layout", "step ms", "%s/s", "vs 1 device", "weights MB / device",
               "optimizer slots MB / device", "weights + slots MB / device",
               "peak step memory MB / device", "CPU / wall", "other CPUs busy",
               "first step s"]
    sections = []
    names = {"classifier": ("Classifier: %d classes, features %d, global batch %d, Adam"
                            % (args.classes, args.features, args.batch), "samples"),
             "moe": ("MoE layer: %d experts, top-1 gating, capacity factor 1.25, %d groups x %d "
                     "tokens of width %d, expert hidden %d, Adam"
                     % (args.experts, args.groups, args.tokens, args.width, args.hidden),
                     "tokens")}
    for model in args.models:
        rows = [r for r in results if r["model"] == model]
        baseline = [r for r in rows if r["layout"] == SINGLE][0]
        title, unit = names[model]
        table_headers = list(headers)
        table_headers[2] = headers[2] % unit
        sections += ["## " + title, "",
                     common.markdown_table(table_headers, [_row(r, baseline) for r in rows]),
                     ""]
    part = "classifier" if "classifier" in args.models else "expert"
    markdown = "\n".join([
        "# Operator split on CPU (1 worker, N virtual devices)", "",
        "- Command: `%s`" % info["command"],
        "- Date: %s; EPL git %s" % (info["date"], info["git_revision"]),
        "- %s, %s CPUs; load average at start %s" % (info["cpu_model"], info["cpu_count"],
                                                     info["loadavg_start"]),
        "- Median of %d windows of %d steps after %d warm-up steps; each configuration in "
        "its own process. All N virtual devices share the machine's cores, so split cannot "
        "make a step faster here; it divides the weights over devices and adds collectives."
        % (args.repeats, args.steps, args.warmup),
        "- Weights / slots: bytes of the %s weights (and of their Adam slots) held by the "
        "busiest device, from the variables each device holds after the rewrite. Peak step "
        "memory: the largest per-device maximum of RunMetadata allocation records in one "
        "traced step (memory allocated during the step: activations, gradients, "
        "collective buffers; variables are not included)." % part,
        "- The 1-device rows are plain TensorFlow (the same model without EPL). CPU / wall: "
        "this process's CPU time over wall time while timed (cores kept busy); other CPUs "
        "busy: what other processes on this machine used meanwhile (noise).", ""]
        + sections)
    settings = dict(vars(args), out=common.portable_path(args.out))
    for key in list(settings):
        if key.startswith("child_"):
            settings.pop(key)
    payload = {"environment": info, "settings": settings, "results": results}
    common.write_results(args.out, "split", payload, markdown)
    print(markdown)


def _ints(text):
    return [int(v) for v in text.split(",") if v]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=lambda t: t.split(","), default=["classifier", "moe"])
    parser.add_argument("--devices", type=_ints, default=[2, 4])
    parser.add_argument("--no-replicated", dest="replicated", action="store_false",
                        help="skip the data-parallel rows")
    parser.add_argument("--classes", type=int, default=100000)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32, help="classifier global batch")
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--groups", type=int, default=8, help="MoE sequences per step")
    parser.add_argument("--tokens", type=int, default=128, help="MoE tokens per sequence")
    parser.add_argument("--width", type=int, default=256, help="MoE model width")
    parser.add_argument("--hidden", type=int, default=1024, help="MoE expert hidden width")
    parser.add_argument("--steps", type=int, default=5, help="steps per timed window")
    parser.add_argument("--repeats", type=int, default=3, help="timed windows")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--child-model", help=argparse.SUPPRESS)
    parser.add_argument("--child-layout", help=argparse.SUPPRESS)
    parser.add_argument("--child-devices", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_model:
        child(args)
        return 0
    start = time.time()
    results = [run_child(args, *config) for config in configurations(args)]
    report(args, results)
    print("total %.0f s" % (time.time() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
