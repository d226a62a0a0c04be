"""One worker of benchmarks/recovery.py's snapshot-overhead part (run it with epl.launcher).

Usage::

    EPL_CHECKPOINT_SNAPSHOT_STEPS=K python -m epl.launcher --num_workers W \\
        --gpu_per_worker D benchmarks/snapshot_worker.py --model mlp --steps 300

Trains ``--model`` (``mlp``: dp_worker.py's MLP, 8 x 512, batch 64, Momentum, one
thread, data parallel; ``encoder``: transformer.py's ``mid`` 12-layer encoder as 2
pipeline stages with 4 micro-batches of 4, Adam) for ``--warmup`` untimed and
``--steps`` timed steps, timing every step, and prints ``BENCH {json}`` with the step
times, the time of every snapshot EPL wrote (``epl.Env.get().snapshots.written``) and
the snapshot's size on disk. Snapshots are whatever the environment asks for
(EPL_CHECKPOINT_SNAPSHOT_STEPS; epl-launch sets the directory), so the same worker
measures a job with and without them.
"""
import argparse
import os
import sys
import time

import common


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("mlp", "encoder"), required=True)
    parser.add_argument("--steps", type=common.positive_int, default=300)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--deadline", type=float, default=1500.0)
    return parser.parse_args(argv)


def _build(tf, epl, model):
    if model == "mlp":
        import dp_worker
        epl.init()
        epl.set_default_strategy(epl.replicate(1))
        x, y = dp_worker.synthetic_batch("mlp", 64, epl.Env.get().cluster.worker_index)
        config = tf.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
        return dp_worker.build(tf, "mlp", x, y)[1], config
    import transformer
    epl.init(epl.Config({"pipeline.num_micro_batch": 4}))
    stages = [epl.replicate(1, name="stage_%d" % s) for s in range(2)]
    size = transformer.SIZES["mid"]
    stage_of = lambda layer: stages[min(layer // (size["layers"] // 2), 1)]
    return transformer.build(tf, size, 4, stage_of)[1], None


def _snapshot_bytes(directory):
    if not directory or not os.path.isdir(directory):
        return None
    steps = sorted(name for name in os.listdir(directory) if name.startswith("step-"))
    if not steps:
        return None
    newest = os.path.join(directory, steps[-1])
    return sum(os.path.getsize(os.path.join(newest, n)) for n in os.listdir(newest))


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    common.install_deadline(args.deadline, "snapshot_worker")
    tf = common.graph_mode_tf()
    import epl
    train, config = _build(tf, epl, args.model)
    steps = []
    with tf.train.MonitoredTrainingSession(config=config, log_step_count_steps=None,
                                           save_summaries_steps=None) as sess:
        for index in range(args.warmup + args.steps):
            start = time.perf_counter()
            sess.run(train)
            if index >= args.warmup:
                steps.append(time.perf_counter() - start)
    snapshots = epl.Env.get().snapshots
    common.bench_line({
        "model": args.model, "step_seconds": steps,
        "snapshot_seconds": [seconds for _, seconds in snapshots.written],
        "snapshot_steps": [step for step, _ in snapshots.written],
        "every": epl.Env.get().config.checkpoint.snapshot_steps,
        "snapshot_bytes": _snapshot_bytes(epl.Env.get().config.checkpoint.snapshot_dir)})


if __name__ == "__main__":
    main()
