"""Interleaved stages against 1F1B: paired steps on 2 devices (issue 40, stretch).

The model of ``benchmarks/pipeline.py`` (2 stages of ``--layers`` dense layers on 2
virtual CPU devices, one inter-op thread per stage, one intra-op thread) runs either as
PreferBackward's 1F1B (2 TaskGraphs) or with ``pipeline.num_virtual_stages`` v: the same
layers cut into 2v TaskGraphs of ``layers / v`` layers, TaskGraph t on device t mod 2.
Both run at once as two processes asked for single steps in turn (``paired.py``); per m
the table gives the median ratio of adjacent steps (wall time) and of their CPU seconds
(the machine's cost, which other processes' load moves far less), beside the simulator's
ratio with equal F and B (``epl.strategies.schedule.timed``).

    .venv/bin/python benchmarks/pipeline_interleaved.py [--micro-batches 4,8] [--pairs 12]
        [--isolated]

Writes ``benchmarks/results/pipeline_interleaved.{json,md}``. On 2 shared cores the
ratio is a measurement of this machine at that moment: label it with the load.

``--isolated``: each device in a worker process of its own pinned to a core, one
thread each, as ``pipeline.py --isolated`` runs ZeroBubble (:mod:`pipeline_isolated`'s
jobs, pairing, traces and table, with ``pipeline.py``'s worker cutting each device's
layers into v TaskGraphs): interleaved v against PreferBackward per m, with the
simulator's ratio, the simulated step with each job's measured call times, and the
late sends. Its section replaces the previous isolated one in the results files; the
shared-core table above it stays.
"""
import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402
import paired as pairing  # noqa: E402
import pipeline  # noqa: E402
import pipeline_isolated  # noqa: E402

DEVICES = 2
INTERLEAVED = "Interleaved"  # the row's name for measure(); its job is PreferBackward's
ISOLATED_TITLE = "## Stages on their own cores"


def child(args):
    """Serve single steps of one configuration to the driver (paired.py)."""
    os.environ["EPL_NUM_VIRTUAL_DEVICES"] = str(DEVICES)
    tf = common.graph_mode_tf()
    import epl
    tf.logging.set_verbosity(tf.logging.ERROR)
    epl.init(epl.Config({"pipeline.num_micro_batch": args.child_micro_batches,
                         "pipeline.num_virtual_stages": args.child_chunks}))
    # the same layers as 1F1B's 2 stages, cut into 2 * chunks TaskGraphs
    _, train = pipeline.build_model(tf, epl, args.batch, args.width,
                                    args.layers // args.child_chunks,
                                    stages=DEVICES * args.child_chunks)
    config = tf.ConfigProto(intra_op_parallelism_threads=1,
                            inter_op_parallelism_threads=DEVICES)
    with tf.Session(config=config) as sess:
        sess.run(tf.global_variables_initializer())
        pairing.serve_steps(sess, train, args.warmup, 0.0)


def _argv(args, micro_batches, chunks):
    return [sys.executable, os.path.abspath(__file__), "--child-micro-batches",
            str(micro_batches), "--child-chunks", str(chunks), "--batch", str(args.batch),
            "--width", str(args.width), "--layers", str(args.layers),
            "--warmup", str(args.warmup)]


def simulated_ratio(micro_batches, chunks):
    from epl.strategies.schedule import interleaved, timed
    return (timed.makespan(interleaved(DEVICES, micro_batches, chunks))
            / timed.makespan(interleaved(DEVICES, micro_batches, 1)))


def measure(args):
    """{m: row dict} of the paired ratios interleaved / 1F1B."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    found = {}
    for m in args.micro_batches:
        starts = [(name, lambda c=c: pairing.StepServer(
            _argv(args, m, c), env, "m=%d v=%d" % (m, c)))
            for name, c in (("base", 1), ("interleaved", args.chunks))]
        steps, _, servers = pairing.run_pair(starts, args.pairs)
        cpu = dict((name, server.cpu) for name, server in servers)
        ratios = [a / b for a, b in zip(steps["interleaved"], steps["base"])]
        cpu_ratio = pairing.cpu_ratio(cpu["interleaved"], cpu["base"])
        found[m] = {"ratio": statistics.median(ratios), "quartiles": pairing.quartiles(ratios),
                    "cpu_ratio": cpu_ratio, "simulated": simulated_ratio(m, args.chunks),
                    "base_ms": 1e3 * statistics.median(steps["base"]),
                    "interleaved_ms": 1e3 * statistics.median(steps["interleaved"]),
                    "steps": steps, "cpu": cpu}
        print("m=%d: interleaved v=%d / 1F1B %.3f (simulated %.3f)" % (
            m, args.chunks, found[m]["ratio"], found[m]["simulated"]), flush=True)
    return found


def report(args, found, load_start):
    info = common.environment_info(sys.argv)
    rows = []
    for m, row in sorted(found.items()):
        cpu = row["cpu_ratio"]
        rows.append([m, "%.1f" % row["base_ms"], "%.1f" % row["interleaved_ms"],
                     "%.3f (%.3f-%.3f)" % ((row["ratio"],) + tuple(row["quartiles"])),
                     "n/a" if cpu is None else "%.3f" % cpu[0], "%.3f" % row["simulated"]])
    load_end = os.getloadavg()
    markdown = "\n".join([
        "# Interleaved stages (v = %d) against 1F1B, 2 devices" % args.chunks, "",
        "- Command: `%s`" % info["command"],
        "- Date: %s; EPL git %s" % (info["date"], info["git_revision"]),
        "- %s, %s CPUs; load average (1 min) %.2f at start, %.2f at end" % (
            info["cpu_model"], info["cpu_count"], load_start, load_end[0]),
        "- Model: %d dense layers of width %d per device (1F1B: one TaskGraph of %d per "
        "device; interleaved: %d of %d), micro-batch %d, GradientDescent; %d paired steps "
        "per m after %d warm-up steps" % (args.layers, args.width, args.layers, args.chunks,
                                          args.layers // args.chunks, args.batch, args.pairs,
                                          args.warmup), "",
        common.markdown_table(["m", "1F1B ms (median)", "interleaved ms (median)",
                               "step / 1F1B (median, quartiles)", "CPU s / 1F1B",
                               "simulated"], rows), "",
        "Ratios are medians of adjacent steps of the two processes (paired.py); CPU s is "
        "the ratio of the processes' CPU seconds per step. Simulated: the interleaved "
        "schedule's step over 1F1B's with equal F and B times and free sends.", ""])
    if args.label:
        markdown = markdown.replace("\n", "\n\n**%s**\n" % args.label, 1)
    settings = dict(vars(args), out=common.portable_path(args.out))
    payload = {"environment": info, "settings": settings, "load_start": load_start,
               "load_end": load_end[0], "rows": dict((str(m), v) for m, v in found.items())}
    common.write_results(args.out, "pipeline_interleaved", payload, markdown)
    print(markdown)


def isolated(args):
    """Interleaved v against PreferBackward with each device on a core of its own;
    the section goes into the results files beside the shared-core table."""
    import argparse
    import tempfile
    from epl.strategies.schedule import interleaved, timed
    worker = argparse.Namespace(**dict(vars(args), steps=1))

    def chunks(strategy):
        return args.chunks if strategy == INTERLEAVED else 1

    def schedules(strategy, m, memory):
        del memory
        return interleaved(DEVICES, m, chunks(strategy))

    def argv(m, strategy, memory):
        return pipeline.isolated_worker_argv(worker, m, "PreferBackward", memory,
                                             chunks(strategy))

    def simulated(strategy, m, memory="pipeline"):
        return timed.makespan(schedules(strategy, m, memory)), None
    log_dir = tempfile.mkdtemp(prefix="epl_interleaved_isolated_")
    print("worker 1 logs: %s" % log_dir, flush=True)
    rows = (("interleaved v=%d" % args.chunks, INTERLEAVED, "pipeline"),)
    found = pipeline_isolated.measure(argv, args.micro_batches, rows, args.pairs, log_dir,
                                      simulated, schedules)
    info = common.environment_info(sys.argv)
    section = pipeline_isolated.report_lines(found, args)
    section[0] = "%s: interleaved v = %d" % (ISOLATED_TITLE, args.chunks)
    section[1:1] = ["", "- Command: `%s`" % info["command"],
                    "- Date: %s; EPL git %s; load average at start %s" % (
                        info["date"], info["git_revision"], info["loadavg_start"]),
                    "- Model: %d dense layers of width %d per device (PreferBackward: one "
                    "TaskGraph per device; interleaved: %d of %d), micro-batch %d, "
                    "GradientDescent; %d warm-up steps per job" % (
                        args.layers, args.width, args.chunks, args.layers // args.chunks,
                        args.batch, args.warmup)]
    if args.label:
        section[1:1] = ["", "**%s**" % args.label]
    payload = common.read_results(args.out, "pipeline_interleaved") or {}
    payload["isolated"] = {"environment": info, "settings": dict(
        vars(args), out=common.portable_path(args.out)),
        "rows": dict((str(m), v) for m, v in found.items())}
    try:
        with open(os.path.join(args.out, "pipeline_interleaved.md")) as handle:
            kept = handle.read().split("\n" + ISOLATED_TITLE)[0].rstrip("\n")
    except OSError:
        kept = "# Interleaved stages against 1F1B"
    markdown = "\n".join([kept, ""] + section)
    common.write_results(args.out, "pipeline_interleaved", payload, markdown)
    print("\n".join(section))


def main(argv=None):
    common.measure_tensors_not_chunks()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--micro-batches", type=lambda t: [int(v) for v in t.split(",")],
                        default=[4, 8])
    parser.add_argument("--chunks", type=int, default=2, help="num_virtual_stages")
    parser.add_argument("--batch", type=int, default=1024, help="micro-batch size")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8, help="dense layers per device")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--label", default="", help="a note under the title, e.g. the load")
    parser.add_argument("--isolated", action="store_true",
                        help="each device in a worker process pinned to a core of its own "
                             "(pipeline_isolated.py), against PreferBackward")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--child-micro-batches", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--child-chunks", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_micro_batches:
        child(args)
        return 0
    if args.layers % args.chunks:
        parser.error("--layers %d is not a multiple of --chunks %d" % (args.layers, args.chunks))
    if args.isolated:
        isolated(args)
        return 0
    load_start = os.getloadavg()[0]
    report(args, measure(args), load_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
