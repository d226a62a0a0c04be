"""``python -m epl.plan_cli``: print the plan EPL would make for a simulated job.

It lives on the tools floor because it joins layers that must not know each
other: the plan (:mod:`epl.parallel.plan`) and the memory estimate of
:mod:`epl.profiler.memory_estimate`. Neither imports TensorFlow, so the command
runs anywhere::

    python -m epl.plan_cli --workers 2 --devices 4 --taskgraphs replicate:4,split:4 \\
        cluster.colocate_split_and_replicate=true

``--png PATH`` also draws the plan (:mod:`epl.parallel.plan_picture`).
"""
import argparse
import sys

from epl.cluster import Cluster
from epl.config import Config
from epl.parallel import plan_picture
from epl.parallel.plan import PlanError, TaskGraphSpec, make_plan
from epl.profiler import memory_estimate
from epl.profiler.memory_estimate import MemoryEstimateError


def _value(text):
    """Config values on the command line: ints, true/false, else strings."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return int(text)
    except ValueError:
        return text


def main(argv=None):
    """Print the plan of a simulated job, e.g. for 2 stages on 4 devices::

        python -m epl.plan_cli --workers 1 --devices 4 \\
            --taskgraphs replicate:1,replicate:1 pipeline.num_micro_batch=4
    """
    parser = argparse.ArgumentParser(description="Print EPL's plan for a simulated cluster.")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--devices", type=int, default=1, help="compute devices per worker")
    parser.add_argument("--taskgraphs", default="replicate:1",
                        help="comma list of kind:device_count, in definition order")
    parser.add_argument("--memory", metavar="SIZES", default=None,
                        help="also estimate memory per device for a transformer of these "
                             "sizes: layers=,hidden=,heads=,seq=,intermediate=,vocab=,batch= "
                             "(layers cut evenly over the TaskGraphs; see docs/memory.md)")
    parser.add_argument("--slots", type=int, default=2,
                        help="optimizer slots per weight for --memory (Adam 2, Momentum 1)")
    parser.add_argument("--png", metavar="PATH", default=None,
                        help="also draw the plan (which devices each TaskGraph of each "
                             "replica uses) to this PNG (needs matplotlib)")
    parser.add_argument("config", nargs="*", help="config overrides as key=value")
    args = parser.parse_args(argv)
    config = Config(dict((k, _value(v)) for k, v in (c.split("=", 1) for c in args.config)))
    hosts = ["worker%d:2222" % i for i in range(args.workers)] if args.workers > 1 else None
    cluster = Cluster(hosts, 0, args.devices)
    try:
        plan = make_plan(config, cluster, _cli_specs(args.taskgraphs))
    except PlanError as err:
        parser.exit(2, "plan_cli: the plan is refused: %s\n" % err)
    print(plan)
    for worker in range(args.workers):
        copies = plan.copies_of(worker)
        print("worker %d builds %d copies: %s" % (worker, len(copies), ", ".join(
            "(replica %d, position %d)" % (c.replica, c.position) for c in copies) or "none"))
    if args.png:
        print("drew %s" % plan_picture.save_png([(args.taskgraphs, plan)], args.png))
    if args.memory:
        try:
            print(_memory(args.memory, args.slots, config, plan))
        except MemoryEstimateError as err:
            parser.error("--memory: %s" % err)
    return 0


def _memory(sizes, slots, config, plan):
    """The estimate of :mod:`epl.profiler.memory_estimate` for the CLI's formula model."""
    stages = 1 if plan.colocated else len(plan.taskgraphs)
    profile = memory_estimate.profile_for_config(memory_estimate.parse_sizes(sizes), config,
                                                 stages=stages, slots_per_weight=slots)
    return memory_estimate.estimate(profile, plan, config)


def _cli_specs(text):
    specs = []
    for index, item in enumerate(text.split(",")):
        kind, _, count = item.partition(":")
        specs.append(TaskGraphSpec("taskgraph_%d" % index, kind, int(count or 1)))
    return specs


if __name__ == "__main__":
    sys.exit(main())
