"""Peak bytes per pipeline stage: ZeroBubble's two memory modes against PreferBackward.

The issue's memory goal for ZeroBubble is per stage: peak activations within 1.1x of
PreferBackward's (1F1B's). This measures, for 2 stages and ``--micro-batches``
micro-batches, each stage's peak bytes (the profiler's allocation records of a traced
step: activations, temporaries, received tensors) under PreferBackward, ZeroBubble
``pipeline`` (ZB-H1, the default) and ZeroBubble ``stage``, with both lowerings of the
repeated step, and divides by PreferBackward's.

One step's peak moves with the order the executor happens to run ready ops in (the
same graph measured 2.5 to 3.3 MB on one stage), so each number is the least over
``--traced`` traced steps of ``--sessions`` sessions: the schedule's own need. Bytes do
not depend on the machine's load, only on that order.

Models: ``relu`` (3 dense layers of 256 per stage, 256 rows per micro-batch: W reads
every activation B reads, the output gradients are as large as the activations; the
model of ``tests/graph/test_zero_bubble.py``) and shapes of ``benchmarks/shapes.py``
(``bert_mid``: a 12-layer encoder, hidden 384, seq 32, cut into 2 stages; ``resnet``).

    .venv/bin/python benchmarks/zero_bubble_memory.py [--models relu,bert_mid]
        [--micro-batches 8] [--sessions 3] [--traced 3]

Writes benchmarks/results/zero_bubble_memory.{json,md}.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402
import shapes  # noqa: E402

STAGES = 2
# (row label, pipeline.strategy, pipeline.zero_bubble_memory)
SCHEDULES = (("PreferBackward", "PreferBackward", "pipeline"),
             ("ZeroBubble pipeline (ZB-H1)", "ZeroBubble", "pipeline"),
             ("ZeroBubble stage", "ZeroBubble", "stage"))
LOWERINGS = ("stage_functions", "unrolled")
MODELS = ("relu",) + tuple(shapes.SHAPES)


def relu_stack_train(tf, settings, stages=STAGES):
    """The train op of a pipeline of ``stages`` stages of 3 dense ReLU layers of 256, 256
    rows per micro-batch, under EPL config ``settings``: its activations dwarf its
    weights, and W reads every activation B reads (also the model of the tests' peak
    measurements, tests/eplutil.stage_peak_bytes)."""
    import numpy as np
    import epl
    from epl.cluster import Cluster
    epl.init(epl.Config(settings), cluster=Cluster(devices_per_worker=stages))
    rng = np.random.RandomState(0)
    data = tf.data.Dataset.from_tensors((rng.rand(256, 32).astype(np.float32),
                                         rng.randint(0, 4, 256))).repeat()
    hidden, labels = tf.data.make_one_shot_iterator(data).get_next()
    for stage in range(stages):
        with epl.replicate(1, name="stage_%d" % stage):
            for layer in range(3):
                hidden = tf.layers.dense(hidden, 256, activation=tf.nn.relu,
                                         name="s%d_%d" % (stage, layer))
            if stage == stages - 1:
                loss = tf.losses.sparse_softmax_cross_entropy(
                    labels, tf.layers.dense(hidden, 4))
    return tf.train.GradientDescentOptimizer(0.01).minimize(loss)


def session_peaks(tf, model, settings, traced):
    """Each stage's least peak bytes over ``traced`` traced steps of one new session."""
    tf.reset_default_graph()
    if model == "relu":
        train = relu_stack_train(tf, settings)
    else:
        extra = dict((k, v) for k, v in settings.items() if k != "pipeline.num_micro_batch")
        train = shapes.train_op(tf, model, "pipe", settings["pipeline.micro_batching"],
                                settings["pipeline.num_micro_batch"], extra=extra).train
    peaks = [None] * STAGES
    with tf.train.MonitoredSession() as sess:  # runs the shapes' table initializers
        sess.run(train)
        for _ in range(traced):
            meta = tf.RunMetadata()
            sess.run(train, options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
                     run_metadata=meta)
            found = common.device_peaks(meta)
            for stage in range(STAGES):
                mine = [v for k, v in found.items() if k.endswith("CPU:%d" % stage)]
                if not mine:
                    raise common.BenchmarkError("no allocation records for CPU:%d" % stage)
                peaks[stage] = min(max(mine), peaks[stage] or max(mine))
    return peaks


def measure(args):
    """[{model, lowering, schedule, peaks, ratios}] for every row."""
    tf = common.graph_mode_tf()
    rows = []
    for model in args.models:
        for lowering in LOWERINGS:
            base = None
            for label, strategy, memory in SCHEDULES:
                settings = {"pipeline.num_micro_batch": args.micro_batches,
                            "pipeline.strategy": strategy,
                            "pipeline.micro_batching": lowering,
                            "pipeline.zero_bubble_memory": memory}
                found = [session_peaks(tf, model, settings, args.traced)
                         for _ in range(args.sessions)]
                peaks = [min(p[s] for p in found) for s in range(STAGES)]
                base = base or peaks
                ratios = [p / float(b) for p, b in zip(peaks, base)]
                rows.append(dict(model=model, lowering=lowering, schedule=label,
                                 peaks=peaks, ratios=ratios))
                print("%-8s %-15s %-28s %s %s" % (model, lowering, label, peaks,
                                                  " ".join("%.2fx" % r for r in ratios)),
                      flush=True)
    return rows


def markdown(rows, runs):
    table = common.markdown_table(
        ["model", "lowering", "schedule"]
        + ["stage %d MB (x 1F1B)" % s for s in range(STAGES)],
        [[r["model"], r["lowering"], r["schedule"]]
         + ["%.2f (%.2fx)" % (p / 1e6, q) for p, q in zip(r["peaks"], r["ratios"])]
         for r in rows])
    run = runs[-1]
    return "\n".join([
        "# ZeroBubble: peak bytes per stage against PreferBackward", "",
        "2 stages, %d micro-batches; each number is a stage's least peak over %d traced "
        "steps of %d sessions (bytes do not depend on load). Target: ZeroBubble `stage` "
        "within 1.1x of PreferBackward on every stage." % (
            run["micro_batches"], run["traced"], run["sessions"]), "",
        table, "",
        "Command: `%s`" % run.get("command", ""), ""])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=common.csv_list(str, MODELS), default=["relu"])
    parser.add_argument("--micro-batches", type=common.positive_int, default=8)
    parser.add_argument("--sessions", type=common.positive_int, default=3)
    parser.add_argument("--traced", type=common.positive_int, default=3)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    rows = measure(args)
    runs = [dict(common.environment_info(sys.argv), micro_batches=args.micro_batches,
                 sessions=args.sessions, traced=args.traced)]
    common.write_results(args.out, "zero_bubble_memory", dict(results=rows, runs=runs),
                         markdown(rows, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
