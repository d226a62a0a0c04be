"""CPU seconds of the pipeline's schedule lowering as micro-batches grow (issue 40).

The schedule lowering (``epl/parallel/passes/pipeline.py``) orders each stage's
actions with barrier no-ops and, with stage functions, sends what an action hands
another stage through an Identity after the barrier (``_send_before_next``). Which
entrance reads an exit tensor is decided by walking the entrance's ancestors, so
the pass's cost grows with the micro-batches faster than the graph does. Each m
runs in a fresh child process: a 2-stage ``--shape`` of ``shapes.py`` (default
``bert_mid``, the BERT-style encoder at hidden 384) in ``pipe`` mode with stage
functions, EPL's rewrite run without a session; the child reports the process
CPU seconds of the pass (fastest of ``--repeats`` runs of the whole rewrite in
fresh graphs), of the whole rewrite, and the send Identities the pass built (a
count that must not change with a speed-up of the pass). CPU seconds move far
less with other processes' load than wall time does.

    .venv/bin/python benchmarks/schedule_lowering.py [--micro-batches 4,8,16,32]
        [--shape bert_mid] [--repeats 2] [--label TEXT] [--baseline OLD.json]

``--baseline`` puts an earlier run's JSON (the code before a change, run with
``--out`` elsewhere) beside this one: its pass CPU seconds and send count per m.

Writes benchmarks/results/schedule_lowering.{json,md}.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402
import results_files  # noqa: E402


def child(args):
    """Build the shape ``--repeats`` times in fresh graphs and rewrite it; print the
    fastest pass and rewrite CPU seconds."""
    tf = common.graph_mode_tf()
    import shapes
    import epl
    from epl.parallel import rewriter, session_hooks
    from epl.parallel.passes.pipeline import ScheduleLowering
    times = {"pass": [], "rewrite": []}
    original = ScheduleLowering.run

    def timed(self, ctx):
        start = time.process_time()
        try:
            return original(self, ctx)
        finally:
            times["pass"].append(time.process_time() - start)
    ScheduleLowering.run = timed
    counts = {}
    for _ in range(args.repeats):
        tf.reset_default_graph()
        shapes.train_op(tf, args.shape, "pipe", lowering="stage_functions",
                        micro_batches=args.micro_batches)
        graph = tf.get_default_graph()
        start = time.process_time()
        session_hooks.program_for(graph, epl.Env.get)
        times["rewrite"].append(time.process_time() - start)
        ops = graph.get_operations()
        counts = {"ops": len(ops),
                  "sends": sum(1 for op in ops if op.type == "Identity"
                               and op.name.startswith("EPL_SCHEDULE")
                               and "/send_" in op.name)}
    assert rewriter  # imported for its side effects on the session hooks' module
    common.bench_line(dict(counts, pass_cpu=min(times["pass"]),
                           rewrite_cpu=min(times["rewrite"])))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--micro-batches", type=common.csv_list(int), default=[4, 8, 16, 32])
    parser.add_argument("--shape", default="bert_mid")
    parser.add_argument("--repeats", type=common.positive_int, default=2)
    parser.add_argument("--label", default="")
    parser.add_argument("--baseline", default=None,
                        help="an earlier run's schedule_lowering.json to compare with")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.micro_batches = args.micro_batches[0]
        return child(args)
    start = time.time()
    info = results_files.environment_info(sys.argv)
    rows = []
    for m in args.micro_batches:
        argv_child = [sys.executable, os.path.abspath(__file__), "--child",
                      "--micro-batches", str(m), "--shape", args.shape,
                      "--repeats", str(args.repeats)]
        found = common.run_single(argv_child, 1800, "schedule lowering m=%d" % m)
        found["m"] = m
        rows.append(found)
        print("m=%d: %s" % (m, found), flush=True)
    payload = dict(info, label=args.label,
                   shape=args.shape, rows=rows)
    lines = ["# Schedule lowering: CPU seconds as micro-batches grow", "",
             "`%s`" % payload["command"], "",
             "Shape `%s`, 2 stages, stage functions; fastest of %d rewrites per m, each m in "
             "a fresh process; EPL %s. %s" % (args.shape, args.repeats,
                                              payload["git_revision"], args.label), "",
             "Load average at the start %s, at the end %s." % (
                 payload["loadavg_start"], results_files.load_average()), "", _table(rows)]
    if args.baseline:
        with open(args.baseline) as handle:
            payload["baseline"] = json.load(handle)
        lines += ["", "Against the baseline (`%s`, EPL %s, %s):" % (
            payload["baseline"]["command"], payload["baseline"]["git_revision"],
            payload["baseline"]["label"]), "", _compared(payload["baseline"]["rows"], rows)]
    markdown = "\n".join(lines)
    return common.publish(args.out, "schedule_lowering", payload, markdown,
                          time.time() - start)


def _table(rows):
    return results_files.markdown_table(
        ["m", "schedule lowering CPU s", "whole rewrite CPU s", "send Identities", "ops"],
        [[r["m"], "%.3f" % r["pass_cpu"], "%.2f" % r["rewrite_cpu"], r["sends"], r["ops"]]
         for r in rows])


def _compared(old_rows, rows):
    old = dict((r["m"], r) for r in old_rows)
    return results_files.markdown_table(
        ["m", "pass CPU s: baseline", "this run", "ratio", "send Identities: baseline",
         "this run"],
        [[r["m"], "%.3f" % old[r["m"]]["pass_cpu"], "%.3f" % r["pass_cpu"],
          "%.2f" % (r["pass_cpu"] / old[r["m"]]["pass_cpu"]), old[r["m"]]["sends"], r["sends"]]
         for r in rows if r["m"] in old])


if __name__ == "__main__":
    sys.exit(main())
