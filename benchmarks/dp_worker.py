"""One worker of the data-parallel scaling benchmark (run it with epl.launcher).

Usage (normally started by dp_scaling.py)::

    python -m epl.launcher --num_workers 2 --gpu_per_worker 1 benchmarks/dp_worker.py \
        --model mlp --batch 64 --steps 30 --warmup 5

It trains a synthetic-data model under ``epl.replicate(1)`` with ONE compute
thread per process, times ``--steps`` steps after ``--warmup`` steps, and
prints ``BENCH {json}`` (see common.bench_line). Why these choices:

* Synthetic data from numpy, repeated in-graph: the benchmark measures EPL's
  step (compute + gradient all-reduce), not an input pipeline.
* Each worker gets different data (seeded by its index), as in real data
  parallelism; the numbers do not depend on the values.
* One thread per worker: on a 2-core machine two workers can then each own a
  core, so ideal scaling is 2x and the efficiency is meaningful.
* ``--repeats`` windows of ``--steps`` steps, median reported: one window of
  30 short steps is easily disturbed on a 2-core machine; the spread is kept.
* Every worker prints a BENCH line; the driver uses worker 0's (the steps are
  synchronous, so all workers see the same step rate) and keeps the others
  for diagnosis. CPU time / wall time is reported too, because it shows how
  many cores a worker really used (> 1 means the thread limit did not hold),
  and so is the whole machine's busy CPU count over the same time, so the
  driver can tell how much CPU other processes took during the measurement.
"""
import argparse
import os
import sys
import time

import numpy as np

import common

MODELS = ("mlp", "cnn")
MLP_INPUT, MLP_WIDTH, MLP_LAYERS, CLASSES = 784, 512, 8, 10
CNN_INPUT = (32, 32, 3)
# Who creates the worker's tf.train.Server. It matters because in a launcher job the
# ops run in the server's thread pools, which are fixed by the ConfigProto the server
# was created with (EPL before b957185 created it without the user's ConfigProto).
SERVER_MODES = ("epl", "pinned")
# Op types that communicate: TF collectives, EPL's ring and NCCL kernels.
COMM_OP_PREFIXES = ("Collective", "EplRing", "Nccl", "EplNccl")
# EPL settings echoed in the BENCH line: the values in effect, whatever set them.
COMM_KEYS = ("communication.max_splits", "communication.fp16",
             "communication.num_communicators")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--batch", type=int, default=64, help="per-worker batch size")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per window")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed windows of --steps steps; the median window is reported")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before timing")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra- and inter-op threads in the session ConfigProto")
    parser.add_argument("--server", choices=SERVER_MODES, default="epl",
                        help="'epl': EPL creates this worker's tf.train.Server (the normal "
                             "user path); 'pinned': the script creates it first with the "
                             "thread-limited ConfigProto")
    parser.add_argument("--end-of-input", choices=("on", "off"), default="on",
                        help="'off': rewrite the graph without EPL's end-of-input agreement "
                             "(benchmarks/end_of_input.py measures what it costs)")
    parser.add_argument("--deadline", type=float, default=170.0,
                        help="hard-exit after this many seconds (never hang the benchmark)")
    args = parser.parse_args(argv)
    if min(args.batch, args.steps, args.repeats, args.threads) < 1 or args.warmup < 0:
        parser.error("--batch, --steps, --repeats and --threads must be >= 1, --warmup >= 0")
    return args


def synthetic_batch(model, batch, seed):
    """Fixed random inputs and labels for one worker."""
    rng = np.random.RandomState(seed)
    shape = (batch, MLP_INPUT) if model == "mlp" else (batch,) + CNN_INPUT
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.randint(0, CLASSES, batch).astype(np.int64)
    return x, y


def mlp(tf, x):
    """MLP_LAYERS ReLU layers of MLP_WIDTH, then the logits."""
    h = x
    for i in range(MLP_LAYERS):
        h = tf.layers.dense(h, MLP_WIDTH, activation=tf.nn.relu, name="dense_%d" % i)
    return tf.layers.dense(h, CLASSES, name="logits")


def cnn(tf, x):
    """conv3x3(32)-pool-conv3x3(64)-pool-dense(128)-logits."""
    h = tf.layers.conv2d(x, 32, 3, padding="same", activation=tf.nn.relu, name="conv1")
    h = tf.layers.max_pooling2d(h, 2, 2, name="pool1")
    h = tf.layers.conv2d(h, 64, 3, padding="same", activation=tf.nn.relu, name="conv2")
    h = tf.layers.max_pooling2d(h, 2, 2, name="pool2")
    h = tf.layers.flatten(h, name="flatten")
    h = tf.layers.dense(h, 128, activation=tf.nn.relu, name="fc")
    return tf.layers.dense(h, CLASSES, name="logits")


def build(tf, model, x_np, y_np):
    """Input pipeline, model, loss and train op; returns (loss, train_op)."""
    data = tf.data.Dataset.from_tensors((x_np, y_np)).repeat()
    x, y = tf.data.make_one_shot_iterator(data).get_next()
    logits = (mlp if model == "mlp" else cnn)(tf, x)
    loss = tf.losses.sparse_softmax_cross_entropy(labels=y, logits=logits)
    step = tf.train.get_or_create_global_step()
    train_op = tf.train.MomentumOptimizer(0.01, 0.9).minimize(loss, global_step=step)
    return loss, train_op


def op_type_counts(graph, prefixes):
    """``{op type: count}`` of the ops in ``graph`` whose type starts with one of
    ``prefixes``."""
    counts = {}
    for op in graph.get_operations():
        if op.type.startswith(prefixes):
            counts[op.type] = counts.get(op.type, 0) + 1
    return counts


def collective_op_counts(graph):
    """``{op type: count}`` of the communication ops in the (rewritten) graph:
    TF collectives and EPL's own (ring, NCCL) kernels.

    Reported because they are what the communication settings change (one
    all-reduce or all-gather per fusion bucket) and they show which backend
    EPL picked, so a benchmark can check that a setting really took effect."""
    return op_type_counts(graph, COMM_OP_PREFIXES)


def without_end_of_input(epl):
    """Rewrite the default graph now, with every pass but the end-of-input agreement
    (the session then finds it rewritten). Only for measuring that pass's cost."""
    from epl.parallel import rewriter
    env, view = epl.Env.get(), epl.Graph.get()
    view.owner = env
    passes = tuple(p for p in rewriter.PASSES if p.name != "end_of_input")
    rewriter.parallelize(view, env.config, env.cluster, passes=passes)


def stage(message):
    print("dp_worker: " + message, flush=True)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    common.install_deadline(args.deadline, "dp_worker")
    tf = common.graph_mode_tf()
    import epl

    # Deprecation warnings would fill the log tail that a failure report shows.
    tf.logging.set_verbosity(tf.logging.ERROR)
    epl.init()
    cluster = epl.Env.get().cluster
    epl.set_default_strategy(epl.replicate(1))
    index = cluster.worker_index
    x_np, y_np = synthetic_batch(args.model, args.batch, seed=1000 + index)
    loss, train_op = build(tf, args.model, x_np, y_np)
    # Counted before EPL rewrites the graph (which may add per-device copies).
    params = int(sum(np.prod(v.shape.as_list()) for v in tf.trainable_variables()))
    config = tf.ConfigProto(intra_op_parallelism_threads=args.threads,
                            inter_op_parallelism_threads=args.threads)
    if args.server == "pinned" and cluster.distributed:
        # EPL's Server hook merges its settings (devices, collective leader) into this
        # config and registers the server, so the session below connects to it.
        tf.train.Server(tf.train.ClusterSpec(cluster.cluster_spec()), job_name="worker",
                        task_index=index, config=config, start=True)
    if args.end_of_input == "off":
        without_end_of_input(epl)
    # Stage lines: if a run hangs, the log tail shows where (e.g. waiting for a peer).
    stage("graph built (%s, %d parameters); creating the session" % (args.model, params))
    setup_start = time.perf_counter()
    with tf.train.MonitoredTrainingSession(config=config, log_step_count_steps=0,
                                           save_summaries_steps=None,
                                           save_summaries_secs=None) as sess:
        setup = time.perf_counter() - setup_start
        stage("session ready after %.1f s; %d warm-up steps, then %d x %d timed steps"
              % (setup, args.warmup, args.repeats, args.steps))
        timing = common.timed_windows(lambda: sess.run(train_op), args.warmup, args.repeats,
                                      args.steps)
        final_loss = float(sess.run(loss))
        collectives = collective_op_counts(tf.get_default_graph())
    global_batch = args.batch * cluster.total_gpu_num
    payload = {
        "worker": index, "workers": cluster.worker_num,
        "devices_per_worker": cluster.gpu_num_per_worker, "model": args.model,
        "batch_per_replica": args.batch, "global_batch": global_batch, "steps": args.steps,
        "repeats": args.repeats, "warmup_steps": args.warmup,
        "threads": common.thread_count(),
        "session_setup_seconds": setup, "final_loss": final_loss,
        "intra_op_threads": args.threads, "inter_op_threads": args.threads,
        "server": args.server, "distributed": cluster.distributed,
        "end_of_input": args.end_of_input,
        "params": params, "collective_ops": collectives,
        "communication": dict((key, epl.Env.get().config.get(key)) for key in COMM_KEYS),
        "tf_version": tf.__version__, "pid": os.getpid()}
    payload.update(timing)
    payload.update(common.window_rates(timing["window_seconds"], global_batch, args.steps))
    common.bench_line(payload)


if __name__ == "__main__":
    main()
