"""The parallel plan: pure data computed before EPL touches the graph.

From (config, cluster, TaskGraphs) it decides how many model replicas run,
which devices each TaskGraph uses in each replica, the pipeline stages and the
micro-batch count. It has no TensorFlow dependency, prints readably and
compares by value, so layouts are unit-tested on simulated clusters.

Example: two stages on one worker with 4 devices (defaults)::

    >>> plan = make_plan(Config(), Cluster(devices_per_worker=4),
    ...                  [TaskGraphSpec("stage_0", "replicate", 1),
    ...                   TaskGraphSpec("stage_1", "replicate", 1)])
    >>> plan.num_replicas, plan.taskgraphs[0].devices
    (2, (('/job:localhost/replica:0/task:0/device:CPU:0',),
         ('/job:localhost/replica:0/task:0/device:CPU:2',)))
"""
import collections
import logging

from epl.cluster import layout as _layout

LOG = logging.getLogger("epl")

TaskGraphSpec = collections.namedtuple("TaskGraphSpec", ["name", "kind", "device_count"])


class PlanError(ValueError):
    """The requested parallelism does not fit the job's devices."""


class TaskGraphPlan(collections.namedtuple(
        "TaskGraphPlan", ["index", "name", "kind", "device_count", "devices"])):
    """Placement of one TaskGraph: ``devices[replica]`` is a tuple of devices."""

    __slots__ = ()

    @property
    def all_devices(self):
        """Every device holding a copy, replica-major (the collective group)."""
        return tuple(d for replica in self.devices for d in replica)


class Plan(collections.namedtuple("Plan", [
        "worker_num", "devices_per_worker", "device_type", "num_replicas", "taskgraphs",
        "num_micro_batch", "schedule", "colocated", "worker_of"])):
    """What runs where. Immutable; equal plans compare equal.

    ``worker_of`` maps every device string to its worker index.
    """

    __slots__ = ()

    @property
    def stages(self):
        """TaskGraph indices in pipeline order (empty for one TaskGraph or colocation)."""
        if self.colocated or len(self.taskgraphs) < 2:
            return ()
        return tuple(tg.index for tg in self.taskgraphs)

    @property
    def pipeline(self):
        """Micro-batches flow through two or more stages."""
        return bool(self.stages) and self.num_micro_batch > 1

    @property
    def gradient_accumulation(self):
        """One TaskGraph accumulating ``num_micro_batch`` session runs per apply."""
        return len(self.taskgraphs) == 1 and self.num_micro_batch > 1

    def constructor_of(self, replica):
        """Worker that builds and drives ``replica`` (owner of its first device)."""
        return self.worker_of[self.taskgraphs[0].devices[replica][0]]

    def replicas_built_by(self, worker):
        """Replica indices whose graph the given worker builds."""
        return [r for r in range(self.num_replicas) if self.constructor_of(r) == worker]

    def workers_used_by(self, worker):
        """Workers hosting a device of any replica built by ``worker``."""
        used = {worker}
        for replica in self.replicas_built_by(worker):
            for tg in self.taskgraphs:
                used.update(self.worker_of[d] for d in tg.devices[replica])
        return sorted(used)

    def __str__(self):
        total = self.worker_num * self.devices_per_worker
        lines = ["Plan: %d worker(s) x %d %s device(s) = %d devices; %d model replica(s)"
                 % (self.worker_num, self.devices_per_worker, self.device_type, total,
                    self.num_replicas)]
        if self.stages:
            lines.append("  pipeline: %d stages, %d micro-batch(es), schedule %s"
                         % (len(self.stages), self.num_micro_batch, self.schedule))
        elif self.gradient_accumulation:
            lines.append("  gradient accumulation over %d micro-batches" % self.num_micro_batch)
        if self.colocated:
            lines.append("  TaskGraphs colocated (cluster.colocate_split_and_replicate)")
        for tg in self.taskgraphs:
            lines.append("  taskgraph %d %r %s(device_count=%d)"
                         % (tg.index, tg.name, tg.kind, tg.device_count))
            for replica, devices in enumerate(tg.devices):
                lines.append("    replica %d: %s" % (replica, ", ".join(devices)))
        return "\n".join(lines)


def make_plan(config, cluster, specs):
    """Compute the plan; raise PlanError when the layout is impossible."""
    specs = list(specs)
    if not specs:
        raise PlanError("the graph has no TaskGraphs; build the model after epl.init()")
    names = [s.name for s in specs]
    colocate = config.cluster.colocate_split_and_replicate
    try:
        layout = _layout.replica_layout(
            cluster.worker_num, cluster.gpu_num_per_worker, [s.device_count for s in specs],
            prefer_intra_node=config.cluster.device_place_prefer_intra_node,
            colocate=colocate, names=names)
    except _layout.LayoutError as err:
        raise PlanError(str(err))
    taskgraphs = []
    for index, spec in enumerate(specs):
        devices = tuple(tuple(cluster.device(w, d) for w, d in replica[index])
                        for replica in layout)
        taskgraphs.append(TaskGraphPlan(index, spec.name, spec.kind, spec.device_count,
                                        devices))
    worker_of = dict((cluster.device(w, d), w) for w in range(cluster.worker_num)
                     for d in range(cluster.gpu_num_per_worker))
    plan = Plan(cluster.worker_num, cluster.gpu_num_per_worker, cluster.device_type,
                len(layout), tuple(taskgraphs), config.pipeline.num_micro_batch,
                config.pipeline.strategy, colocate, worker_of)
    _warn_about(plan)
    return plan


def _warn_about(plan):
    stages = len(plan.stages)
    if plan.pipeline and plan.num_micro_batch < stages:
        LOG.warning("pipeline.num_micro_batch=%d is smaller than the %d pipeline stages: "
                    "some stages will idle every step; use at least %d micro-batches",
                    plan.num_micro_batch, stages, stages)


def specs_from_graph(graph):
    """TaskGraphSpecs of an ``epl.ir.Graph`` in definition order."""
    return [TaskGraphSpec(tg.name, tg.kind, tg.device_count) for tg in graph.taskgraphs]


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

        python -m epl.parallel.plan --workers 1 --devices 4 \\
            --taskgraphs replicate:1,replicate:1 pipeline.num_micro_batch=4
    """
    import argparse
    from epl.cluster import Cluster
    from epl.config import Config
    parser = argparse.ArgumentParser(description="Print EPL's plan for a simulated cluster.")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--devices", type=int, default=1, help="compute devices per worker")
    parser.add_argument("--taskgraphs", default="replicate:1",
                        help="comma list of kind:device_count, in definition order")
    parser.add_argument("config", nargs="*", help="config overrides as key=value")
    args = parser.parse_args(argv)
    config = Config(dict((k, _value(v)) for k, v in (c.split("=", 1) for c in args.config)))
    hosts = ["worker%d:2222" % i for i in range(args.workers)] if args.workers > 1 else None
    cluster = Cluster(hosts, 0, args.devices)
    specs = []
    for index, item in enumerate(args.taskgraphs.split(",")):
        kind, _, count = item.partition(":")
        specs.append(TaskGraphSpec("taskgraph_%d" % index, kind, int(count or 1)))
    print(make_plan(config, cluster, specs))
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
