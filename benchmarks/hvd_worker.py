"""The non-EPL processes of the EPL-vs-Horovod benchmark: plain TF and Horovod.

Usage (normally started by dp_vs_horovod.py)::

    python benchmarks/hvd_worker.py --mode plain --model mlp --batch 64
    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/hvd_worker.py \
        --mode horovod --model mlp --batch 64

``--mode plain`` is the undistributed reference: one process, plain
TensorFlow, no EPL and no Horovod import, no tf.train.Server. Scaling
efficiency is measured against it, so it must be the best a single
1-thread process can do with the same model. ``--mode horovod`` is the
comparison point: the same graph with ``hvd.DistributedOptimizer`` around
the same MomentumOptimizer and ``hvd.broadcast_global_variables(0)``.

Why it looks like dp_worker.py: the models, synthetic data (seeded by the
worker index) and ConfigProto (1 intra-op and 1 inter-op thread) are
imported from or identical to dp_worker.py, and timing uses
``common.timed_windows`` with the same warm-up / windows / median scheme, so
EPL, Horovod and the single process differ only in how gradients are
averaged. The BENCH payload uses dp_worker.py's field names, so the driver
treats all three alike.
"""
import argparse
import os
import sys
import time

import numpy as np

import common
import dp_worker

MODES = ("plain", "horovod")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--model", choices=dp_worker.MODELS, required=True)
    parser.add_argument("--batch", type=int, default=64, help="per-worker batch size")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per window")
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed windows of --steps steps; the median window is reported")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before timing")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra- and inter-op threads in the session ConfigProto")
    parser.add_argument("--deadline", type=float, default=170.0,
                        help="hard-exit after this many seconds (never hang the benchmark)")
    args = parser.parse_args(argv)
    if min(args.batch, args.steps, args.repeats, args.threads) < 1 or args.warmup < 0:
        parser.error("--batch, --steps, --repeats and --threads must be >= 1, --warmup >= 0")
    return args


def build(tf, model, x_np, y_np, wrap):
    """dp_worker.build with a hook on the optimizer: ``wrap(optimizer)`` is
    where Horovod inserts its all-reduce (identity for the plain process)."""
    data = tf.data.Dataset.from_tensors((x_np, y_np)).repeat()
    x, y = tf.data.make_one_shot_iterator(data).get_next()
    logits = (dp_worker.mlp if model == "mlp" else dp_worker.cnn)(tf, x)
    loss = tf.losses.sparse_softmax_cross_entropy(labels=y, logits=logits)
    step = tf.train.get_or_create_global_step()
    optimizer = wrap(tf.train.MomentumOptimizer(0.01, 0.9))
    return loss, optimizer.minimize(loss, global_step=step)


def stage(message):
    print("hvd_worker: " + message, flush=True)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    common.install_deadline(args.deadline, "hvd_worker")
    tf = common.graph_mode_tf()

    tf.logging.set_verbosity(tf.logging.ERROR)
    hvd, horovod_version = None, None
    if args.mode == "horovod":
        import horovod
        import horovod.tensorflow as hvd
        hvd.init()
        horovod_version = horovod.__version__
    rank, size = (hvd.rank(), hvd.size()) if hvd else (0, 1)
    x_np, y_np = dp_worker.synthetic_batch(args.model, args.batch, seed=1000 + rank)
    loss, train_op = build(tf, args.model, x_np, y_np,
                           hvd.DistributedOptimizer if hvd else (lambda opt: opt))
    params = int(sum(np.prod(v.shape.as_list()) for v in tf.trainable_variables()))
    # Created before the session: MonitoredTrainingSession finalizes the graph.
    broadcast = hvd.broadcast_global_variables(0) if hvd else None
    config = tf.ConfigProto(intra_op_parallelism_threads=args.threads,
                            inter_op_parallelism_threads=args.threads)
    stage("graph built (%s, %d parameters, mode %s, rank %d of %d); creating the session"
          % (args.model, params, args.mode, rank, size))
    setup_start = time.perf_counter()
    with tf.train.MonitoredTrainingSession(config=config, log_step_count_steps=0,
                                           save_summaries_steps=None,
                                           save_summaries_secs=None) as sess:
        if broadcast is not None:
            sess.run(broadcast)
        setup = time.perf_counter() - setup_start
        stage("session ready after %.1f s; %d warm-up steps, then %d x %d timed steps"
              % (setup, args.warmup, args.repeats, args.steps))
        timing = common.timed_windows(lambda: sess.run(train_op), args.warmup, args.repeats,
                                      args.steps)
        final_loss = float(sess.run(loss))
        collectives = dp_worker.collective_op_counts(tf.get_default_graph())
    global_batch = args.batch * size
    payload = {
        "worker": rank, "workers": size, "devices_per_worker": 1, "model": args.model,
        "mode": args.mode, "batch_per_replica": args.batch, "global_batch": global_batch,
        "steps": args.steps, "repeats": args.repeats, "warmup_steps": args.warmup,
        "threads": common.thread_count(), "session_setup_seconds": setup,
        "final_loss": final_loss, "intra_op_threads": args.threads,
        "inter_op_threads": args.threads, "params": params,
        # One HorovodAllreduce per gradient: Horovod fuses at run time, not in the graph.
        "horovod_ops": dp_worker.op_type_counts(tf.get_default_graph(), ("Horovod",)),
        "collective_ops": collectives, "epl_imported": "epl" in sys.modules,
        "horovod_imported": any(m.split(".")[0] == "horovod" for m in sys.modules),
        "horovod_version": horovod_version,
        "horovod_env": dict((k, v) for k, v in os.environ.items()
                            if k.startswith("HOROVOD_") and k in TUNING_ENV),
        "tf_version": tf.__version__, "pid": os.getpid()}
    payload.update(timing)
    payload.update(common.window_rates(timing["window_seconds"], global_batch, args.steps))
    common.bench_line(payload)


# Horovod knobs that change its performance; echoed when set (all defaults otherwise).
TUNING_ENV = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY",
              "HOROVOD_HIERARCHICAL_ALLREDUCE", "HOROVOD_BATCH_D2D_MEMCOPIES",
              "HOROVOD_AUTOTUNE", "HOROVOD_GLOO_IFACE", "HOROVOD_NUM_STREAMS")


if __name__ == "__main__":
    main()
