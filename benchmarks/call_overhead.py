"""What a pipeline step executes with stage functions against unrolled copies.

Issue 41 item 3: on the ResNet-style and MoE pipelines of ``benchmarks/shapes.py``
stage functions spend 5-7% more CPU per step than unrolled copies
(``benchmarks/steady_step.py``). Wall and CPU times move with the machine's load;
what a step executes does not. This benchmark builds one lowering per child
process (both lowerings never share a process: their graphs would), traces
``--steps`` steady steps (TF's FULL_TRACE step stats, which list the nodes run
inside a call's body too) and reports, per lowering, the nodes executed per
step by op type, and the process's CPU seconds per untraced step (under load,
a hint only: ``steady_step.py`` pairs them).

``--rewrites on`` runs grappler on each stage function's body when a call is
instantiated (the call's ``config_proto`` left empty instead of EPL's
"rewrites off"), the experiment behind docs/design.md's item-3 paragraph.

    .venv/bin/python benchmarks/call_overhead.py [--shapes resnet,moe]
        [--micro-batches 4] [--steps 5] [--rewrites off,on]

Writes benchmarks/results/call_overhead.{json,md}.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402

# (label, lowering, grappler on the bodies)
VARIANTS = (("stage functions", "stage_functions", False),
            ("stage functions, bodies rewritten", "stage_functions", True),
            ("unrolled copies", "unrolled", False))
# The op types the Markdown table lists (the rest are summed in "other").
SHOWN = ("_Arg", "_Retval", "StatefulPartitionedCall", "TensorArrayReadV3",
         "TensorArrayWriteV3", "Const", "NoOp", "Identity", "Conv2D", "FusedBatchNormV3",
         "FusedBatchNormGradV3", "MatMul", "_FusedMatMul")


def child(args):
    """Build one lowering, warm up, time and trace steady steps; print a BENCH line."""
    tf = common.graph_mode_tf()
    import shapes
    if args.rewrite_bodies:
        from epl import tf_functions
        tf_functions._DISABLED_REWRITES = b""  # pylint: disable=protected-access
    built = shapes.train_op(tf, args.shape, "pipe", args.lowering, args.micro_batches)
    config = tf.ConfigProto(device_count={"CPU": built.devices})
    with tf.train.MonitoredTrainingSession(config=config) as sess:
        for _ in range(3):
            sess.run(built.train)
        cpu = time.process_time()
        for _ in range(args.steps):
            sess.run(built.train)
        cpu = (time.process_time() - cpu) / args.steps
        counts = collections.Counter()
        for _ in range(args.steps):
            counts.update(_traced_op_types(tf, sess, built.train))
    common.bench_line(dict(cpu=cpu, nodes=dict((op, n / float(args.steps))
                                               for op, n in counts.items())))


def _traced_op_types(tf, sess, train):
    """Op type of every node one traced run of ``train`` executed (function bodies too)."""
    metadata = tf.RunMetadata()
    sess.run(train, options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
             run_metadata=metadata)
    for device in metadata.step_stats.dev_stats:
        for node in device.node_stats:
            # timeline_label: "name = OpType(inputs)"; nodes without one are not kernels
            if " = " in node.timeline_label:
                yield node.timeline_label.split(" = ", 1)[1].split("(", 1)[0]


def measure(args, shape, variant):
    """One child process for ``variant`` of ``shape``: its BENCH payload."""
    _, lowering, rewrite = variant
    argv = [sys.executable, os.path.abspath(__file__), "--child", "--shape", shape,
            "--lowering", lowering, "--micro-batches-one", str(args.micro_batches),
            "--steps", str(args.steps)] + (["--rewrite-bodies"] if rewrite else [])
    env = dict(os.environ, PYTHONPATH=common.REPO, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(argv, cwd=common.REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, universal_newlines=True,
                         timeout=args.timeout).stdout
    for line in out.splitlines():
        if line.startswith(common.BENCH_TAG):
            return json.loads(line[len(common.BENCH_TAG):].strip())
    raise RuntimeError("call_overhead child (%s, %s) printed no result:\n%s"
                       % (shape, variant[0], out[-3000:]))


def markdown(results, info):
    header = ["shape", "lowering", "CPU s per step (load-dependent)", "nodes per step"]
    rows = []
    for key in sorted(results):
        shape, label = key.split("/", 1)
        nodes = results[key]["nodes"]
        shown = ["%d" % round(nodes.get(op, 0)) for op in SHOWN]
        other = sum(n for op, n in nodes.items() if op not in SHOWN)
        rows.append([shape, label, "%.3f" % results[key]["cpu"],
                     "%d" % round(sum(nodes.values()))] + shown + ["%d" % round(other)])
    return "\n".join([
        "# Executed nodes per pipeline step: stage functions vs unrolled copies", "",
        "- `%s`; %s; EPL git %s; %s, %s CPUs; 1-min load %s" % (
            info["command"], info["date"], info["git_revision"], info["cpu_model"],
            info["cpu_count"], info.get("load_average")),
        "- Nodes per step from TF's FULL_TRACE step stats (function bodies included), "
        "by op type; CPU s: the process's CPU seconds per untraced step, one process per "
        "row (compare pairs with benchmarks/steady_step.py)", "",
        common.markdown_table(header + list(SHOWN) + ["other"], rows)])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--lowering", help=argparse.SUPPRESS)
    parser.add_argument("--micro-batches-one", type=int, dest="micro_batches_one",
                        help=argparse.SUPPRESS)
    parser.add_argument("--rewrite-bodies", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shapes", type=common.csv_list(str), default=["resnet", "moe"])
    parser.add_argument("--micro-batches", type=common.positive_int, default=4)
    parser.add_argument("--steps", type=common.positive_int, default=5)
    parser.add_argument("--rewrites", type=common.csv_list(str, ("off", "on")),
                        default=["off", "on"],
                        help="stage functions with EPL's bodies as built (off) and/or "
                             "with grappler run on them (on)")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    if args.child:
        args.micro_batches = args.micro_batches_one
        return child(args)
    variants = [v for v in VARIANTS
                if v[1] == "unrolled" or ("on" if v[2] else "off") in args.rewrites]
    results = {}
    for shape in args.shapes:
        for variant in variants:
            results["%s/%s" % (shape, variant[0])] = measure(args, shape, variant)
            print(shape, variant[0], results["%s/%s" % (shape, variant[0])]["cpu"], flush=True)
    info = dict(common.environment_info(sys.argv), micro_batches=args.micro_batches,
                steps=args.steps, load_average=common.load_average())
    text = markdown(results, info)
    common.write_results(args.out, "call_overhead", dict(results=results, runs=[info]), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
