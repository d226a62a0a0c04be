"""Steady step of a one-task job: in this process (local session) vs through a server.

Since 2026-11-28 a job of one task runs in-process: TF's DirectSession, no
``tf.train.Server`` (:attr:`epl.cluster.Cluster.distributed`). Before, every one-task
job made a server for itself and ran each session through it (TF's master session and
a gRPC worker in the same process). The first step got faster; a corpus run under load
(``benchmarks/startup.py --baseline``) showed some steady steps slower. This measures
the steady step of the same EPL graph both ways, paired (``paired.py``: both processes
alive, single steps alternated A B B A ...): the ``local`` process is what EPL does
today; the ``server`` process builds the same graph with the same EPL code, then starts
a ``tf.train.Server`` for the one task (job ``localhost``, so the graph's device names
are unchanged; EPL's server hook gives it the session config a one-task job gets) and
opens its session on the server's target. Only the session kind differs.

Rows: the shapes of ``benchmarks/shapes.py`` under ``pipe4`` / ``pipe4u`` (2 stages, 4
micro-batches, stage functions / unrolled copies), ``dp2`` / ``dp2u`` (2 local replicas,
the repeated step lowered both ways) and ``ga4`` (4 accumulated runs per step).

    .venv/bin/python benchmarks/session_kind.py [--shapes resnet,moe] [--modes pipe4,...]
        [--pairs 12] [--merge]

Writes benchmarks/results/session_kind.{json,md}.
"""
import argparse
import functools
import os
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402
import paired  # noqa: E402
import shapes as corpus  # noqa: E402

KINDS = ("local", "server", "unpruned")  # the last: a diagnosis, see child()
MODES = ("pipe4", "pipe4u", "dp2", "dp2u", "ga4")
CORPUS_MODES = {"pipe4": ("pipe", "stage_functions"), "pipe4u": ("pipe", "unrolled"),
                "dp2": ("dp", "stage_functions"), "dp2u": ("dp", "unrolled"),
                "ga4": ("ga", None)}


def _free_port():
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def _place_whole_graph():
    """Diagnosis only: a local session as EPL makes it, but without
    ``place_pruned_graph`` (which EPL sets on local sessions; with it TF 1.15 runs no
    grappler on the main graph), to tell grappler's part in a local/server gap."""
    from epl.parallel import session_hooks
    original = session_hooks.session_config

    def session_config(*args, **kwargs):
        config = original(*args, **kwargs)
        config.graph_options.place_pruned_graph = False
        return config
    session_hooks.session_config = session_config


def child(args):
    """Build one mode of one shape; open its session locally or on a one-task server."""
    tf = common.graph_mode_tf()
    import shapes
    mode, lowering = CORPUS_MODES[args.mode]
    built = shapes.train_op(tf, args.shape, mode, lowering)
    config = tf.ConfigProto(device_count={"CPU": built.devices})
    master = ""
    if args.kind == "unpruned":
        _place_whole_graph()
    if args.kind == "server":
        spec = tf.train.ClusterSpec({"localhost": ["localhost:%d" % _free_port()]})
        server = tf.train.Server(spec, job_name="localhost", task_index=0, config=config)
        master = server.target
    start = time.time()
    with tf.train.MonitoredTrainingSession(master=master, config=config) as sess:
        sess.run(built.train)
        paired.serve_steps(sess, built.train, args.warmup, time.time() - start,
                           built.runs_per_step)


def measure(args, shape, mode):
    """One process per session kind, stepped in turn."""
    env = dict(os.environ, PYTHONPATH=common.REPO, TF_CPP_MIN_LOG_LEVEL="2")
    load = common.load_average()
    starts = []
    for kind in args.kinds:
        argv = [sys.executable, os.path.abspath(__file__), "--child", "--shape", shape,
                "--mode", mode, "--kind", kind, "--warmup", str(args.warmup)]
        starts.append((kind, functools.partial(paired.StepServer, argv, env,
                                               "%s %s (%s)" % (shape, mode, kind))))
    steps, _, servers = paired.run_pair(starts, args.pairs)
    return dict(kinds=list(args.kinds), steps=steps, load_before=load,
                load_after=common.load_average(),
                cpu=dict((k, s.cpu) for k, s in servers),
                max_rss_mb=dict((k, s.max_rss_mb) for k, s in servers))


def summary(result):
    """Median step per kind; median and quartiles of the first kind's step / the
    second's (local / server unless the row says) over adjacent pairs."""
    kinds = result.get("kinds", KINDS[:2])
    first, second = (result["steps"][k] for k in kinds)
    ratios = [a / b for a, b in zip(first, second)]
    return dict(median=dict((k, statistics.median(s)) for k, s in result["steps"].items()),
                ratio=statistics.median(ratios), quartiles=paired.quartiles(ratios),
                count=len(ratios), cpu=paired.cpu_ratio(*[result["cpu"][k] for k in kinds]),
                cpu_median=dict((k, statistics.median(c)) for k, c in result["cpu"].items()))


def percent(ratio):
    return "%+.0f%%" % (round(100.0 * (ratio - 1)) or 0.0)  # never "-0%"


def row(key, result):
    s = summary(result)
    shape, mode = key.split("/")[:2]
    kinds = result.get("kinds", KINDS[:2])
    load = lambda name: "%.1f" % result[name][0] if result.get(name) else "?"
    return [shape, mode, " vs ".join(kinds),
            "%.3f / %.3f" % tuple(s["median"][k] for k in kinds),
            "%s (%s to %s)" % (percent(s["ratio"]), percent(s["quartiles"][0]),
                               percent(s["quartiles"][1])),
            "%.2f / %.2f" % tuple(s["cpu_median"][k] for k in kinds),
            "%s (%s to %s)" % (percent(s["cpu"][0]), percent(s["cpu"][1][0]),
                               percent(s["cpu"][1][1])),
            s["count"], "%s / %s" % (load("load_before"), load("load_after")),
            result.get("run", 0) + 1]


def result_key(shape, mode, kinds):
    """``shape/mode``, then ``/first-second`` for a pair other than local and server."""
    key = "%s/%s" % (shape, mode)
    return key if tuple(kinds) == KINDS[:2] else "%s/%s" % (key, "-".join(kinds))


def row_order(key):
    shape, mode = key.split("/")[:2]
    return list(corpus.SHAPES).index(shape), MODES.index(mode), key


def markdown(results, runs):
    title = ("# Steady step of a one-task job: local session (today) vs through a "
             "one-task server (before 2026-11-28); same EPL graph, paired")
    lines = [title, ""] + paired.run_lines(runs) + [
        "- Both processes alive, single steps alternated (A B B A ...); A vs B = "
        "A's step / B's step next to it (median, interquartile range); local = EPL's "
        "session today, server = through a one-task server, unpruned = local without "
        "`place_pruned_graph` (a diagnosis: TF 1.15 then runs grappler on the main graph); CPU s = "
        "the process's CPU seconds per step (all threads), medians; the machine is shared "
        "(1-min load before / after each row): read the paired ratios, not the seconds", "",
        common.markdown_table(
            ["shape", "mode", "A vs B", "step s (A / B)", "A vs B, wall (IQR)",
             "CPU s per step (A / B)", "A vs B, CPU s (IQR)",
             "pairs of steps", "load before / after", "run"],
            [row(key, results[key]) for key in sorted(results, key=row_order)])]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--kind", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--shape", default="resnet", help=argparse.SUPPRESS)
    parser.add_argument("--shapes", type=common.csv_list(str), default=["resnet", "moe"])
    parser.add_argument("--modes", type=common.csv_list(str, MODES), default=["pipe4"])
    parser.add_argument("--kinds", type=common.csv_list(str, KINDS), default=list(KINDS[:2]),
                        help="the two session kinds to pair (default local,server)")
    parser.add_argument("--pairs", type=common.positive_int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--merge", action="store_true",
                        help="keep the JSON's rows of shapes and modes not run this time")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    results = paired.measure_rows(
        args.shapes, args.modes, lambda shape, mode: result_key(shape, mode, args.kinds),
        lambda shape, mode: measure(args, shape, mode), row)
    runs = [dict(common.environment_info(sys.argv), pairs=args.pairs, warmup=args.warmup)]
    if args.merge:
        old = common.read_results(args.out, "session_kind")
        results, runs = paired.merge_rows(old, results, runs)
    text = markdown(results, runs)
    common.write_results(args.out, "session_kind", dict(results=results, runs=runs), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
