"""Pipeline benchmark: step time and per-device activation memory vs micro-batches.

A 2-stage model (each stage a stack of dense layers) runs on 2 virtual CPU
devices of one worker, one core per stage (intra-op threads 1, inter-op
threads 2). For m in {1, 2, 4, 8} micro-batches of size B, the step time is
compared with the unpipelined time of the same work, m x the step time of one
micro-batch through both stages without pipelining, against the ideal speedup
p*m/(m+p-1), which assumes exactly that baseline. The unpipelined run uses one
inter-op thread: without pipelining only one stage works at a time, so only
one stage's core is in use (with two threads TF would also run independent ops
of one stage, such as a layer's two gradient matmuls, on both cores). Peak
activation memory per device comes from RunMetadata allocation records
(maximum running sum of allocations, see PLATFORM.md) for PreferBackward
(1F1B) and PreferForward (GPipe) at the largest m.

Targets (from the issue): at m=8 at least 90% of the ideal speedup; 1F1B peak
activations at most 0.4x GPipe's.

Schedules (issue 40): at each m of ``--schedule-micro-batches`` (default 4, 8, 16),
PreferBackward, PreferForward and ZeroBubble (ZB-H1) side by side: step time, speed-up
against the unpipelined time, the ideal speed-up of that schedule (its simulated step
with equal F, B and W times, ``epl.strategies.schedule.timed``; a fused backward costs
B + W), and the peak bytes per stage. Targets: ZeroBubble's step at most 0.90x
PreferBackward's at m = 4 (theory 0.867x), and at every m at least 85% of the gain
over PreferBackward that the simulator predicts.

    .venv/bin/python benchmarks/pipeline.py [--micro-batches 1,2,4,8] [--batch 64]
    .venv/bin/python benchmarks/pipeline.py --micro-batches 1 --schedule-micro-batches 4,8,16

Stages on their own cores (``--isolated``, :mod:`pipeline_isolated`): the pipeline spans
two worker processes pinned to one core each (``taskset``, one thread each), and
PreferForward, ZeroBubble and ZeroBubble with per-stage memory are each stepped in
turn with PreferBackward at m = 4, 8, 16; ``--quick``: ZeroBubble at m = 4 only::

    .venv/bin/python benchmarks/pipeline.py --isolated [--quick] [--pairs 16] \
        [--micro-batches 8] [--lowering unrolled]

``--lowering`` sets ``pipeline.micro_batching`` of every job (both sides of a pair).

Each configuration runs in a fresh child process with a hard timeout.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402
import paired as pairing  # noqa: E402
import pipeline_isolated  # noqa: E402

STAGES = 2
TARGET_SPEEDUP_FRACTION = 0.9
TARGET_MEMORY_RATIO = 0.4
# (row label, pipeline.strategy, pipeline.zero_bubble_memory)
SCHEDULES = (("PreferBackward", "PreferBackward", "pipeline"),
             ("PreferForward", "PreferForward", "pipeline"),
             ("ZeroBubble", "ZeroBubble", "pipeline"),
             ("ZeroBubble, memory per stage", "ZeroBubble", "stage"))
TARGET_ZB_STEP_AT_4 = 0.90     # ZeroBubble's step / PreferBackward's at m = 4
TARGET_ZB_GAIN_FRACTION = 0.85  # of the gain over PreferBackward the simulator predicts


def build_model(tf, epl, batch, width, layers, features=256, stages=STAGES):
    """Synthetic input (one pull per micro-batch) and ``stages`` stages (TaskGraphs) of
    ``layers`` dense layers each (pipeline_interleaved.py cuts the same layers finer)."""
    import numpy as np
    rng = np.random.RandomState(0)
    data = tf.data.Dataset.from_tensors(
        (rng.rand(batch, features).astype(np.float32),
         rng.randint(0, 10, batch).astype(np.int64))).repeat()
    x, y = tf.data.make_one_shot_iterator(data).get_next()
    hidden = x
    for stage in range(stages):
        with epl.replicate(1, name="stage_%d" % stage):
            for layer in range(layers):
                hidden = tf.layers.dense(hidden, width, activation=tf.nn.relu,
                                         name="s%d_l%d" % (stage, layer))
            if stage == stages - 1:
                logits = tf.layers.dense(hidden, 10, name="logits")
                loss = tf.losses.sparse_softmax_cross_entropy(y, logits)
    train = tf.train.GradientDescentOptimizer(0.01).minimize(
        loss, global_step=tf.train.get_or_create_global_step())
    return loss, train


def child(args):
    """Measure one configuration in this process; print one BENCH line (with
    ``--serve``: serve single steps to a paired driver, see paired.py)."""
    os.environ["EPL_NUM_VIRTUAL_DEVICES"] = str(args.devices_per_worker)
    tf = common.graph_mode_tf()
    import epl
    tf.logging.set_verbosity(tf.logging.ERROR)
    m = args.child_micro_batches
    batch = args.batch
    settings = {"pipeline.num_micro_batch": m, "pipeline.strategy": args.strategy,
                "pipeline.zero_bubble_memory": args.zero_bubble_memory,
                "pipeline.micro_batching": args.lowering}
    if args.child_chunks > 1:  # interleaved stages (pipeline_interleaved.py --isolated)
        settings["pipeline.num_virtual_stages"] = args.child_chunks
    epl.init(epl.Config(settings))
    # the same layers per device, cut into child_chunks TaskGraphs each
    _, train = build_model(tf, epl, batch, args.width, args.layers // args.child_chunks,
                           stages=STAGES * args.child_chunks)
    threads = 1 if m == 1 or args.devices_per_worker == 1 else STAGES  # a core per stage
    config = tf.ConfigProto(intra_op_parallelism_threads=1,
                            inter_op_parallelism_threads=threads)
    with tf.Session(config=config) as sess:
        sess.run(tf.global_variables_initializer())
        if args.serve and args.devices_per_worker == 1:  # a job of pipeline_isolated
            for _ in range(args.warmup):
                sess.run(train)
            traces = [tf.RunMetadata() for _ in range(pipeline_isolated.TRACED_STEPS)]
            for meta in traces:
                sess.run(train, options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
                         run_metadata=meta)
            pairing.serve_steps(sess, train, 0, 0.0,
                                ready_info={"action_ms": pipeline_isolated.action_ms(traces),
                                            "late_sends": pipeline_isolated.late_sends(traces)})
            return
        if args.serve:
            pairing.serve_steps(sess, train, args.warmup, 0.0)
            return
        for _ in range(args.warmup):
            sess.run(train)
        steps = []
        for _ in range(args.steps):
            start = time.time()
            sess.run(train)
            steps.append(time.time() - start)
        step = sum(steps) / len(steps)
        meta = tf.RunMetadata()
        sess.run(train, options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
                 run_metadata=meta)
    peaks = common.device_peaks(meta)
    print(common.bench_line({"micro_batches": m, "strategy": args.strategy,
                             "zero_bubble_memory": args.zero_bubble_memory,
                             "steps_seconds": steps, "min_step_seconds": min(steps),
                             "global_batch": batch * m, "step_seconds": step,
                             "peak_bytes": peaks}), flush=True)


def _child_argv(args, micro_batches, strategy, memory="pipeline", steps=None, devices=STAGES,
                chunks=1):
    return [sys.executable, os.path.abspath(__file__), "--child-micro-batches",
            str(micro_batches), "--strategy", strategy, "--batch", str(args.batch),
            "--width", str(args.width), "--layers", str(args.layers), "--steps",
            str(steps or args.steps), "--warmup", str(args.warmup),
            "--zero-bubble-memory", memory, "--devices-per-worker", str(devices),
            "--child-chunks", str(chunks), "--lowering", getattr(args, "lowering", "auto")]


def isolated_worker_argv(args, micro_batches, strategy, memory, chunks=1):
    """A worker of an isolated job: one device, steps served to the driver; ``chunks``
    > 1 cuts each device's layers into that many interleaved TaskGraphs."""
    return _child_argv(args, micro_batches, strategy, memory, steps=1, devices=1,
                       chunks=chunks) + ["--serve"]


def run_child(args, micro_batches, strategy, memory="pipeline", steps=None):
    argv = _child_argv(args, micro_batches, strategy, memory, steps)
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=args.timeout, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    lines = proc.stdout.decode(errors="replace").splitlines()
    for line in lines:
        if line.startswith(common.BENCH_TAG + " "):
            return json.loads(line[len(common.BENCH_TAG) + 1:])
    raise common.BenchmarkError("pipeline child m=%d %s failed (exit %d):\n%s"
                                % (micro_batches, strategy, proc.returncode,
                                   "\n".join(lines[-30:])))


def _stage_peaks(result):
    """Peak bytes of the two compute devices, stage order."""
    peaks = result["peak_bytes"]
    return [max(v for k, v in peaks.items() if k.endswith("CPU:%d" % i)) for i in range(STAGES)]


def measure(args):
    rows, records = [], []
    single = run_child(args, 1, "PreferBackward")
    for m in args.micro_batches:
        piped = run_child(args, m, "PreferBackward") if m > 1 else single
        unpipelined = m * single["step_seconds"]
        speedup = unpipelined / piped["step_seconds"]
        ideal = STAGES * m / float(m + STAGES - 1)
        records.append({"micro_batches": m, "unpipelined_seconds": unpipelined,
                        "one_micro_batch": single, "pipelined": piped,
                        "speedup": speedup, "ideal": ideal})
        rows.append([m, piped["global_batch"], "%.1f" % (unpipelined * 1e3),
                     "%.1f" % (piped["step_seconds"] * 1e3), "%.2fx" % speedup,
                     "%.2fx" % ideal, "%.0f%%" % (100 * speedup / ideal)])
        print("m=%d: unpipelined %.1f ms, 1F1B %.1f ms, speedup %.2f (ideal %.2f)"
              % (m, unpipelined * 1e3, piped["step_seconds"] * 1e3, speedup, ideal),
              flush=True)
    m = max(args.micro_batches)
    memory = {s: run_child(args, m, s) for s in ("PreferBackward", "PreferForward")}
    return rows, records, memory, single


def simulated(strategy, micro_batches, memory="pipeline"):
    """(simulated step in units of one F, ideal speed-up) with equal F, B and W times."""
    from epl.strategies.schedule import get_schedule, timed
    options = {"memory": memory} if strategy == "ZeroBubble" else {}
    schedule = get_schedule(strategy, STAGES, micro_batches, **options)
    return timed.makespan(schedule), timed.ideal_speedup(schedule)


def measure_schedules(args, single):
    """{m: {row label: child result with the simulator's numbers}} for the schedules.
    Times are the fastest of ``--schedule-steps`` steps (the least disturbed by other
    processes), against the fastest step of one unpipelined micro-batch."""
    found = {}
    unit = min(single["steps_seconds"])
    for m in args.schedule_micro_batches:
        found[m] = {}
        for label, strategy, memory in SCHEDULES:
            result = run_child(args, m, strategy, memory, steps=args.schedule_steps)
            result["step_seconds"] = result["min_step_seconds"]
            result["unpipelined_seconds"] = m * unit
            result["speedup"] = result["unpipelined_seconds"] / result["step_seconds"]
            result["simulated_units"], result["ideal"] = simulated(strategy, m, memory)
            found[m][label] = result
            print("m=%d %s: %.1f ms, speed-up %.2f (ideal %.2f)" % (
                m, label, result["step_seconds"] * 1e3, result["speedup"],
                result["ideal"]), flush=True)
    return found


def measure_pairs(args):
    """{m: {row label: (median, lower quartile, upper quartile) of the ratio of its step
    to PreferBackward's adjacent step}}: both alive at once, single steps alternated
    (paired.py), so both sides of a ratio ran under the same machine state."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    found = {}
    for m in args.schedule_micro_batches:
        found[m] = {}
        for label, strategy, memory in SCHEDULES[2:]:
            starts = [(name, lambda s=s_, mem=mem_: pairing.StepServer(
                _child_argv(args, m, s, mem) + ["--serve"], env, "m=%d %s" % (m, s)))
                for name, s_, mem_ in (("base", "PreferBackward", "pipeline"),
                                       ("other", strategy, memory))]
            steps, _, _ = pairing.run_pair(starts, args.pairs)
            ratios = [a / b for a, b in zip(steps["other"], steps["base"])]
            found[m][label] = (statistics.median(ratios),) + pairing.quartiles(ratios)
            print("m=%d %s / PreferBackward: %.3f" % (m, label, found[m][label][0]),
                  flush=True)
    return found


def pairs_report(pairs, found, count):
    """Markdown lines of the paired ratios beside the simulator's."""
    rows = []
    for m, by_label in sorted(pairs.items()):
        base = found[m]["PreferBackward"]["simulated_units"] if m in found else \
            simulated("PreferBackward", m)[0]
        for label, strategy, memory in SCHEDULES[2:]:
            median, low, high = by_label[label]
            predicted = simulated(strategy, m, memory)[0] / float(base)
            rows.append([label, m, "%.3f" % median, "%.3f-%.3f" % (low, high),
                         "%.3f" % predicted, common.share_of_gain(median, predicted)])
    return ["## ZeroBubble against PreferBackward, paired steps", "",
            "Both schedules alive as two processes, single steps alternated (A B B A ...), "
            "%d pairs; the median ratio of adjacent steps, robust to the machine's load, "
            "against the simulator's ratio with equal F, B and W." % count, "",
            common.markdown_table(["schedule", "m", "step / PreferBackward (median)",
                                   "quartiles", "simulated", "of predicted gain"], rows),
            ""]


def schedule_report(found, steps):
    """(markdown lines, targets, gains) of the schedules' table."""
    rows, gains, step_at_4 = [], {}, None
    for m, by_strategy in sorted(found.items()):
        base = by_strategy["PreferBackward"]
        for label, _, _ in SCHEDULES:
            r = by_strategy[label]
            rows.append([label, m, "%.1f" % (r["step_seconds"] * 1e3),
                         "%.2f" % (r["step_seconds"] / base["step_seconds"]),
                         "%.2fx" % r["speedup"], "%.2fx" % r["ideal"],
                         "%.0f%%" % (100 * r["speedup"] / r["ideal"]),
                         "%g / %g" % (r["simulated_units"], base["simulated_units"])]
                        + ["%.2f" % (p / 1e6) for p in _stage_peaks(r)])
        zb = by_strategy["ZeroBubble"]
        predicted = 1 - zb["simulated_units"] / float(base["simulated_units"])
        measured = 1 - zb["step_seconds"] / base["step_seconds"]
        gains[m] = {"predicted": predicted, "measured": measured,
                    "fraction": measured / predicted if predicted else None}
        if m == 4:
            step_at_4 = zb["step_seconds"] / base["step_seconds"]
    targets = {"zero_bubble_step_at_4": None if step_at_4 is None
               else step_at_4 <= TARGET_ZB_STEP_AT_4,
               "zero_bubble_gain": all(g["fraction"] is not None and
                                       g["fraction"] >= TARGET_ZB_GAIN_FRACTION
                                       for g in gains.values())}
    gain_rows = [[m, "%.1f%%" % (100 * g["predicted"]), "%.1f%%" % (100 * g["measured"]),
                  "%.0f%%" % (100 * g["fraction"]) if g["fraction"] is not None else "-"]
                 for m, g in sorted(gains.items())]
    lines = [
        "## Schedules: PreferBackward (1F1B), PreferForward (GPipe), ZeroBubble (ZB-H1)", "",
        "Step: the fastest of %d steps (the least disturbed by other processes); speed-up "
        "against m x the fastest unpipelined micro-batch. Ideal: the schedule's simulated "
        "speed-up with equal F, B and W times (a fused backward costs B + W); simulated: "
        "its step in units of one F, against PreferBackward's. Peak: bytes allocated per "
        "stage in one traced step." % steps, "",
        common.markdown_table(["schedule", "m", "step ms", "/ PreferBackward", "speed-up",
                               "ideal", "of ideal", "simulated", "peak stage 0 MB",
                               "peak stage 1 MB"], rows), "",
        common.markdown_table(["m", "predicted gain over 1F1B", "measured gain",
                               "of predicted"], gain_rows), "",
        "Targets: ZeroBubble's step at most %.2fx PreferBackward's at m = 4: **%s**%s; at "
        "every m at least %d%% of the predicted gain: **%s**." % (
            TARGET_ZB_STEP_AT_4, {None: "not measured", True: "met", False: "NOT met"}[
                targets["zero_bubble_step_at_4"]],
            "" if step_at_4 is None else " (%.3fx)" % step_at_4,
            100 * TARGET_ZB_GAIN_FRACTION,
            "met" if targets["zero_bubble_gain"] else "NOT met"), ""]
    return lines, targets, gains


def report(args, rows, records, memory, schedules, pairs):
    m = max(args.micro_batches)
    one_f, gpipe = _stage_peaks(memory["PreferBackward"]), _stage_peaks(memory["PreferForward"])
    ratio = [a / float(b) for a, b in zip(one_f, gpipe)]
    last = records[-1]
    speed_ok = last["speedup"] / last["ideal"] >= TARGET_SPEEDUP_FRACTION
    memory_ok = max(ratio) <= TARGET_MEMORY_RATIO
    info = common.environment_info(sys.argv)
    mem_rows = [["stage %d" % i, "%.2f" % (one_f[i] / 1e6), "%.2f" % (gpipe[i] / 1e6),
                 "%.2f" % ratio[i]] for i in range(STAGES)]
    markdown = "\n".join([
        "# Pipeline parallelism on CPU (2 stages, 2 virtual devices, one core per stage)", "",
        "- Command: `%s`" % info["command"], "- Date: %s; EPL git %s" % (
            info["date"], info["git_revision"]),
        "- %s, %s CPUs; load average at start %s" % (info["cpu_model"], info["cpu_count"],
                                                     info["loadavg_start"]),
        "- Model: per stage %d dense layers of width %d; micro-batch %d; GradientDescent; "
        "%d timed steps after %d warm-up steps" % (args.layers, args.width, args.batch,
                                                   args.steps, args.warmup),
        "- Unpipelined = m x the step time of one micro-batch (m=1, one inter-op thread) "
        "through both stages: the same work with no overlap between stages, the baseline of "
        "p*m/(m+p-1)", "",
        "## Step time (PreferBackward)", "",
        common.markdown_table(["micro-batches m", "global batch", "unpipelined ms",
                               "pipelined ms", "speedup", "ideal p*m/(m+p-1)",
                               "of ideal"], rows), "",
        "Target: at m=%d at least %d%% of the ideal speedup: **%s** (%.0f%%)." % (
            m, 100 * TARGET_SPEEDUP_FRACTION, "met" if speed_ok else "NOT met",
            100 * last["speedup"] / last["ideal"]), "",
        "## Peak activation memory per device at m=%d (RunMetadata allocation records)" % m,
        "", common.markdown_table(["device", "1F1B MB", "GPipe MB", "1F1B / GPipe"],
                                  mem_rows), "",
        "Target: 1F1B peak at most %.1fx GPipe's: **%s** (worst stage %.2fx)." % (
            TARGET_MEMORY_RATIO, "met" if memory_ok else "NOT met", max(ratio)), ""])
    targets = {"speedup_fraction": speed_ok, "memory_ratio": memory_ok}
    gains = {}
    if schedules:
        lines, schedule_targets, gains = schedule_report(schedules, args.schedule_steps)
        markdown += "\n" + "\n".join(lines)
        targets.update(schedule_targets)
    if pairs:
        markdown += "\n" + "\n".join(pairs_report(pairs, schedules, args.pairs))
    if args.label:
        markdown = markdown.replace("\n", "\n\n**%s**\n" % args.label, 1)
    settings = dict(vars(args), out=common.portable_path(args.out))
    payload = {"environment": info, "settings": settings, "speed": records,
               "memory": memory, "memory_ratio": ratio, "targets": targets,
               "schedules": dict((str(m), v) for m, v in schedules.items()),
               "zero_bubble_gains": dict((str(m), v) for m, v in gains.items()),
               "paired_ratios": dict((str(m), v) for m, v in pairs.items())}
    common.write_results(args.out, "pipeline", payload, markdown)
    print(markdown)


def main(argv=None):
    common.measure_tensors_not_chunks()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--micro-batches", type=lambda t: [int(v) for v in t.split(",")],
                        default=None,
                        help="m values of the main table (default 1,2,4,8); with --isolated, "
                             "the m values of its rows (default: --schedule-micro-batches, "
                             "or 4 with --quick)")
    parser.add_argument("--batch", type=int, default=2048, help="micro-batch size")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8, help="dense layers per stage")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--schedule-micro-batches",
                        type=lambda t: [int(v) for v in t.split(",") if v],
                        default=[4, 8, 16],
                        help="m values of the schedules' table (empty: no table)")
    parser.add_argument("--pairs", type=int, default=16,
                        help="paired steps per ZeroBubble row against PreferBackward (0: none)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--schedule-steps", type=int, default=10,
                        help="timed steps per schedule row (the fastest is reported)")
    parser.add_argument("--label", default="",
                        help="a note printed under the title, e.g. 'measured under load'")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--strategy", default="PreferBackward", help=argparse.SUPPRESS)
    parser.add_argument("--zero-bubble-memory", default="pipeline", help=argparse.SUPPRESS)
    parser.add_argument("--child-micro-batches", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--devices-per-worker", type=int, default=STAGES, help=argparse.SUPPRESS)
    parser.add_argument("--child-chunks", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--isolated", action="store_true",
                        help="only the table with each stage in its own worker process on "
                             "its own core (pipeline_isolated.py)")
    parser.add_argument("--quick", action="store_true",
                        help="with --isolated: ZeroBubble against PreferBackward only, at "
                             "m = 4 unless --micro-batches says otherwise")
    parser.add_argument("--lowering", default="auto",
                        choices=("auto", "stage_functions", "unrolled"),
                        help="pipeline.micro_batching of every job (auto: stage functions)")
    args = parser.parse_args(argv)
    args.isolated_micro_batches = args.micro_batches
    if args.micro_batches is None:
        args.micro_batches = [1, 2, 4, 8]
    if args.child_micro_batches:
        child(args)
        return 0
    if args.isolated:
        pipeline_isolated.run(args, lambda m, s, mem: isolated_worker_argv(args, m, s, mem),
                              simulated)
        return 0
    start = time.time()
    rows, records, memory, single = measure(args)
    schedules = measure_schedules(args, single)
    pairs = measure_pairs(args) if args.pairs else {}
    report(args, rows, records, memory, schedules, pairs)
    print("total %.0f s" % (time.time() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
