"""What a split micro-batch costs: ZeroBubble's B + W against PreferBackward's fused backward.

Issue 40: ZB-H1's gain at 2 stages is a fixed two F-units, while each split micro-batch of
the later stage costs a little more than its fused backward, paid m times. Wall times move
with the machine's load; this benchmark measures what does not, or barely: per step of
``benchmarks/pipeline.py``'s model (2 stages of 8 dense layers of 256, micro-batch 2048,
stage functions) in one process with 2 virtual devices pinned to one core, one inter-op
and one intra-op thread (every op runs in turn, none waits for a core):

* the calls and the executed nodes per step on each stage, by op type (TF's FULL_TRACE
  step stats, function bodies included): exact;
* each node's least kernel time over every execution in the traced steps (micro-batches
  times steps), times its executions per step, summed by op type: a preempted run only
  lengthens a kernel, so the least is what the kernel itself costs where it runs in the
  schedule (cold or warm caches included); the weight-layer matmuls are told apart as the
  forward's (``x . W``), the input gradient's (``dy . W^T``, in B) and the weight
  gradient's (``x^T . dy``, in W);
* the process's CPU seconds per untraced step (median; the one number here that other
  processes' cache traffic still moves).

Children alternate schedules (``--repeats`` each); a row keeps the least kernel sums and
the median CPU over its children.

    nice -n -10 .venv/bin/python benchmarks/split_cost.py [--micro-batches 8] [--repeats 2]

Writes benchmarks/results/split_cost.{json,md}.
"""
import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402

SCHEDULES = ("PreferBackward", "ZeroBubble")
CALL_TYPES = ("StatefulPartitionedCall", "PartitionedCall")
BOOKKEEPING = ("_Arg", "_Retval", "Const", "Identity", "NoOp", "TensorArrayReadV3",
               "TensorArrayWriteV3")
# TF 2.15.1 runs MatMul as oneDNN's _MklMatMul
_MATMULS = ("MatMul", "_FusedMatMul", "_MklMatMul")
# gradients/<layer>/MatMul_grad/MatMul is dy . W^T (B), .../MatMul_1 is x^T . dy (W)
_GRAD_MATMUL = re.compile(r"MatMul_grad/MatMul(_1)?$")


def op_class(op_type, node_name):
    """The row a node's kernel time is summed under: its op type, a matmul by role."""
    if op_type not in _MATMULS:
        return op_type
    match = _GRAD_MATMUL.search(node_name)
    if match is None:
        return "MatMul (forward)"
    return "MatMul (weight gradient)" if match.group(1) else "MatMul (input gradient)"


def stage_of(device):
    """Stage index of a virtual device (CPU:0 is stage 0, CPU:1 stage 1)."""
    return int(device.rsplit(":", 1)[1]) if "/device:CPU:" in device else None


def summarize(traces):
    """{stage: {"nodes": {type: per step}, "calls": {function: per step},
    "least_ms": {class: per step}}} of traced steps (RunMetadata protos)."""
    runs = collections.defaultdict(list)  # (stage, type, name) -> [micros]
    calls = collections.Counter()
    for metadata in traces:
        for dev in metadata.step_stats.dev_stats:
            stage = stage_of(dev.device)
            for node in dev.node_stats:
                if stage is None or " = " not in node.timeline_label:
                    continue  # the host tracer's stubs; entries that are not kernels
                op_type = node.timeline_label.split(" = ", 1)[1].split("(", 1)[0]
                if op_type in CALL_TYPES:
                    calls[(stage, node.node_name.split("/")[-1])] += 1
                    continue  # a call's time holds its body's nodes, listed too
                runs[(stage, op_type, node.node_name)].append(node.all_end_rel_micros)
    steps = float(len(traces))
    found = collections.defaultdict(lambda: {"nodes": collections.Counter(),
                                             "calls": collections.Counter(),
                                             "least_ms": collections.Counter()})
    for (stage, op_type, name), micros in runs.items():
        per_step = len(micros) / steps
        found[stage]["nodes"][op_type] += per_step
        found[stage]["least_ms"][op_class(op_type, name)] += min(micros) * per_step / 1e3
    for (stage, function), count in calls.items():
        found[stage]["calls"][function] += count / steps
    return dict((stage, dict((k, dict(v)) for k, v in parts.items()))
                for stage, parts in found.items())


def child(args):
    """One schedule in this process: CPU per untraced step, then the traced summary."""
    os.environ["EPL_NUM_VIRTUAL_DEVICES"] = "2"
    tf = common.graph_mode_tf()
    import epl
    import pipeline
    tf.logging.set_verbosity(tf.logging.ERROR)
    epl.init(epl.Config({"pipeline.num_micro_batch": args.micro_batches,
                         "pipeline.strategy": args.strategy}))
    _, train = pipeline.build_model(tf, epl, args.batch, args.width, args.layers)
    config = tf.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    with tf.Session(config=config) as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(args.warmup):
            sess.run(train)
        cpu = []
        for _ in range(args.steps):
            start = time.process_time()
            sess.run(train)
            cpu.append(time.process_time() - start)
        traces = [tf.RunMetadata() for _ in range(args.traces)]
        for metadata in traces:
            sess.run(train, options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
                     run_metadata=metadata)
    common.bench_line({"cpu_seconds": statistics.median(cpu), "stages": summarize(traces)})


def run_child(args, strategy):
    argv = ["taskset", "-c", str(args.core), sys.executable, os.path.abspath(__file__),
            "--child", "--strategy", strategy, "--micro-batches", str(args.micro_batches),
            "--steps", str(args.steps), "--traces", str(args.traces),
            "--warmup", str(args.warmup), "--batch", str(args.batch),
            "--width", str(args.width), "--layers", str(args.layers)]
    env = dict(os.environ, PYTHONPATH=common.REPO, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(argv, cwd=common.REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, universal_newlines=True,
                         timeout=args.timeout).stdout
    for line in out.splitlines():
        if line.startswith(common.BENCH_TAG + " "):
            return json.loads(line[len(common.BENCH_TAG) + 1:])
    raise common.BenchmarkError("split_cost child %s printed no result:\n%s"
                                % (strategy, out[-3000:]))


def combine(results):
    """A schedule's children as one row: median CPU, least kernel sums, the counts of
    the first child (the same in every child: the graph does not change)."""
    row = {"cpu_seconds": statistics.median(r["cpu_seconds"] for r in results), "stages": {}}
    for stage, parts in results[0]["stages"].items():
        least = dict((key, min(r["stages"][stage]["least_ms"].get(key, 0.0) for r in results))
                     for key in parts["least_ms"])
        row["stages"][stage] = dict(parts, least_ms=least)
    return row


def table_rows(rows, stage, micro_batches):
    """[item, PreferBackward, ZeroBubble, difference per step, per split micro-batch]."""
    base, split = rows["PreferBackward"]["stages"][stage], rows["ZeroBubble"]["stages"][stage]
    out = []

    def add(item, a, b, fmt):
        out.append([item, fmt % a, fmt % b, fmt % (b - a), fmt % ((b - a) / micro_batches)])
    add("calls", sum(base["calls"].values()), sum(split["calls"].values()), "%.1f")
    add("executed nodes", sum(base["nodes"].values()), sum(split["nodes"].values()), "%.1f")
    for op_type in BOOKKEEPING:
        add("  %s nodes" % op_type, base["nodes"].get(op_type, 0), split["nodes"].get(op_type, 0),
            "%.1f")
    for key in sorted(set(base["least_ms"]) | set(split["least_ms"]),
                      key=lambda k: -max(base["least_ms"].get(k, 0), split["least_ms"].get(k, 0))):
        a, b = base["least_ms"].get(key, 0.0), split["least_ms"].get(key, 0.0)
        if max(a, b) >= 0.05:
            add("%s, least kernel ms" % key, a, b, "%.2f")
    add("all kernels, least ms", sum(base["least_ms"].values()),
        sum(split["least_ms"].values()), "%.2f")
    return out


def markdown(rows, info):
    m = info["micro_batches"]
    header = ["per step, stage 1", "PreferBackward", "ZeroBubble", "difference",
              "per split micro-batch"]
    cpu = [rows[s]["cpu_seconds"] * 1e3 for s in SCHEDULES]
    extra = cpu[1] - cpu[0]
    return "\n".join([
        "# What a split micro-batch costs: ZeroBubble against PreferBackward", "",
        "- `%s`; %s; EPL git %s; %s, %s CPUs; 1-min load before / after %s / %s" % (
            info["command"], info["date"], info["git_revision"], info["cpu_model"],
            info["cpu_count"], info["load_before"], info["load_after"]),
        "- m = %d; one process, 2 virtual devices on one pinned core, one thread; %d children "
        "per schedule, alternating; stage 1 splits all %d micro-batches (stage 0 runs "
        "fused under both)" % (m, info["repeats"], m),
        "- process CPU ms per untraced step (both stages, median of the children's medians): "
        "PreferBackward %.1f, ZeroBubble %.1f, difference %.1f (%.2f per split micro-batch; "
        "moved by other processes' cache traffic)" % (cpu[0], cpu[1], extra, extra / m), "",
        common.markdown_table(header, table_rows(rows, "1", m))])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", help=argparse.SUPPRESS)
    parser.add_argument("--micro-batches", type=common.positive_int, default=8)
    parser.add_argument("--repeats", type=common.positive_int, default=2,
                        help="children per schedule, alternating")
    parser.add_argument("--steps", type=common.positive_int, default=20,
                        help="untraced steps timed (CPU) per child")
    parser.add_argument("--traces", type=common.positive_int, default=8)
    parser.add_argument("--warmup", type=common.positive_int, default=5)
    parser.add_argument("--batch", type=common.positive_int, default=2048)
    parser.add_argument("--width", type=common.positive_int, default=256)
    parser.add_argument("--layers", type=common.positive_int, default=8)
    parser.add_argument("--core", type=int, default=1, help="the core children are pinned to")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    load_before = common.load_average()
    results = collections.defaultdict(list)
    for _ in range(args.repeats):
        for strategy in SCHEDULES:
            results[strategy].append(run_child(args, strategy))
            print(strategy, "CPU s per step %.3f" % results[strategy][-1]["cpu_seconds"],
                  flush=True)
    rows = dict((s, combine(results[s])) for s in SCHEDULES)
    info = dict(common.environment_info(sys.argv), micro_batches=args.micro_batches,
                repeats=args.repeats, load_before=load_before,
                load_after=common.load_average())
    text = markdown(rows, info)
    common.write_results(args.out, "split_cost", dict(rows=rows, children=results,
                                                      runs=[info]), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
