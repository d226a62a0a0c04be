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
from epl.config import default_of
from epl.parallel import mesh as _mesh
from epl.parallel import virtual_stages as _virtual
from epl.strategies import schedule as _schedule

LOG = logging.getLogger("epl")

TaskGraphSpec = collections.namedtuple("TaskGraphSpec", ["name", "kind", "device_count"])

# How the step is repeated per micro-batch and per local replica (``Plan.micro_batching``):
# each stage's forward and backward built once as functions and called per micro-batch
# and replica, or (when the user asks, pipeline.micro_batching) a copy of every op.
STAGE_FUNCTIONS = "stage functions"
UNROLLED = "unrolled copies"


class PlanError(ValueError):
    """The requested parallelism does not fit the job's devices."""


class TaskGraphPlan(collections.namedtuple(
        "TaskGraphPlan", ["index", "name", "kind", "device_count", "devices", "mesh",
                          "groups"])):
    """Placement of one TaskGraph: ``devices[replica][position]``, its mesh and its
    communication groups (see :mod:`epl.parallel.mesh`)."""

    __slots__ = ()

    @property
    def all_devices(self):
        """Every device holding a copy, replica-major."""
        return tuple(d for replica in self.devices for d in replica)

    def group(self, role, index=None):
        """The group of ``role`` (dp, split, sync) for shard/replica ``index``."""
        for group in self.groups:
            if group.role == role and group.index == index:
                return group
        raise KeyError("taskgraph %r has no %s group with index %r; it has: %s" % (
            self.name, role, index, ", ".join(g.name for g in self.groups)))

    def dp_group(self, position=None):
        """Data-parallel group of the weights of shard ``position``, or of weights every
        device holds (``position`` None, and always for replicate TaskGraphs)."""
        if self.kind != _mesh.SPLIT:
            return self.group(_mesh.DP)
        return self.group(_mesh.ALL) if position is None else self.group(_mesh.DP, position)

    def sync_group(self, position=None):
        """One device per worker among the holders of those weights."""
        if self.kind != _mesh.SPLIT:
            return self.group(_mesh.SYNC)
        return self.group(_mesh.SYNC, position)

    def split_group(self, replica):
        return self.group(_mesh.SPLIT_GROUP, replica)

    @property
    def all_group(self):
        """Every device of the TaskGraph (for replicate, the data-parallel group)."""
        return self.group(_mesh.DP if self.kind != _mesh.SPLIT else _mesh.ALL)


class Plan(collections.namedtuple("Plan", [
        "worker_num", "devices_per_worker", "device_type", "num_replicas", "taskgraphs",
        "num_micro_batch", "strategy", "schedule", "colocated", "worker_of", "hosts",
        "micro_batching"])):
    """What runs where. Immutable; equal plans compare equal.

    ``worker_of`` maps every device string to its worker index; ``hosts[w]`` is
    worker w's host CPU; ``schedule`` is the pipeline Schedule (None without a
    pipeline), built from the ``strategy`` name. ``micro_batching`` is how
    micro-batches of a pipeline and local replicas are built:
    ``(STAGE_FUNCTIONS, None)`` or ``(UNROLLED, reason)`` (None when a step runs
    once per worker).
    """

    __slots__ = ()

    @property
    def calls_functions(self):
        """The step is repeated as calls of stage functions (what a session of the graph
        sets up differently: see epl.cluster.session_config)."""
        return self.micro_batching is not None and self.micro_batching[0] == STAGE_FUNCTIONS

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
        """No pipeline stages (one TaskGraph, or colocated ones) and ``num_micro_batch``
        session runs accumulated per apply."""
        return not self.stages and self.num_micro_batch > 1

    @property
    def spmd(self):
        """Every TaskGraph of a replica shares its positions (one TaskGraph, or
        colocated TaskGraphs): each worker builds the copies on its own devices.
        Otherwise a replica is a pipeline of stages (see :attr:`aligned`)."""
        return not self.stages

    @property
    def aligned(self):
        """Every TaskGraph of a replica has the same width k (device_count), so a
        replica is k copies: copy j runs position j of every TaskGraph (the batch
        slice j of a ``replicate(k)`` stage, shard j of a ``split(k)`` stage) and
        sends its activations and gradients between the TaskGraphs' devices. In the
        seeds' default placement (TaskGraphs on their own devices) that is k
        pipelines side by side; colocated, it is the SPMD copies."""
        return len(set(tg.device_count for tg in self.taskgraphs)) == 1

    @property
    def width(self):
        """Copies per model replica: the widest TaskGraph's device_count. A narrower
        TaskGraph (a width dividing it) runs several consecutive positions on each of
        its devices (:func:`epl.parallel.mesh.device_at`)."""
        return max(tg.device_count for tg in self.taskgraphs)

    def device_of(self, taskgraph, replica, position):
        """The device of TaskGraph ``taskgraph`` in copy ``position`` of ``replica``."""
        return _mesh.device_at(self.taskgraphs[taskgraph].devices[replica], position,
                               self.width)

    def driver_of(self, replica, position=0):
        """Worker that builds copy ``position`` of replica ``replica`` (the owner of
        its first TaskGraph's device)."""
        return self.worker_of[self.device_of(0, replica, position)]

    def copies_of(self, worker):
        """The :class:`epl.parallel.mesh.Copy` records ``worker`` builds, in order:
        the (replica, position) pairs whose first TaskGraph's device it owns."""
        layout = [tg.devices for tg in self.taskgraphs]
        return _mesh.spmd_copies(layout, worker, self.worker_of)

    def replicas_of(self, worker):
        """Model replicas of which ``worker`` builds at least one copy."""
        return sorted(set(copy.replica for copy in self.copies_of(worker)))

    @property
    def drivers(self):
        """Workers that build at least one copy (the others only serve devices)."""
        return [w for w in range(self.worker_num) if self.copies_of(w)]

    def workers_used_by(self, worker):
        """Workers hosting a device of any copy built by ``worker``."""
        used = {worker}
        for copy in self.copies_of(worker):
            used.update(self.worker_of[d] for d in copy.devices)
        return sorted(used)

    @property
    def host_group(self):
        """The host CPU of every driver worker: per-worker state (the global step)."""
        return _mesh.Group("hosts", _mesh.HOSTS, None,
                           tuple(self.hosts[w] for w in self.drivers))

    def __str__(self):
        return "\n".join(_describe(self))


def _describe(plan):
    total = plan.worker_num * plan.devices_per_worker
    lines = ["Plan: %d worker(s) x %d %s device(s) = %d devices; %d model replica(s)"
             % (plan.worker_num, plan.devices_per_worker, plan.device_type, total,
                plan.num_replicas)]
    if plan.stages:
        lines.append("  pipeline: %d stages, %d micro-batch(es), schedule %s"
                     % (len(plan.stages), plan.num_micro_batch, plan.strategy))
        interleaved = _virtual.describe(plan.schedule)
        if interleaved:
            lines.append(interleaved)
    if plan.micro_batching is not None:
        lines.append("  %s: %s" % ("micro-batches" if plan.pipeline else "local replicas",
                                   describe_micro_batching(plan.micro_batching)))
    elif plan.gradient_accumulation:
        lines.append("  gradient accumulation over %d micro-batches" % plan.num_micro_batch)
    if plan.colocated:
        lines.append("  TaskGraphs colocated (cluster.colocate_split_and_replicate)")
    if plan.stages:  # TaskGraphs on devices of their own (colocated ones share each device)
        lines += _describe_copies(plan)
    for tg in plan.taskgraphs:
        lines.append("  taskgraph %d %r %s(device_count=%d): mesh %s"
                     % (tg.index, tg.name, tg.kind, tg.device_count, tg.mesh))
        if tg.device_count < plan.width:
            lines.append("    %d positions of a replica per device (weights once per "
                         "position; their gradients combined on the device, then all-reduced)"
                         % (plan.width // tg.device_count))
        for replica, devices in enumerate(tg.devices):
            lines.append("    replica %d: %s" % (replica, ", ".join(devices)))
        lines.append("    groups:")
        lines += ["      " + str(group) for group in tg.groups]
    lines.append("  " + str(plan.host_group))
    return lines


def _describe_copies(plan):
    """Per model replica, each copy's device in every TaskGraph: what runs where
    and where activations and gradients cross devices."""
    lines = ["  copies (position j of every TaskGraph; '->' sends activations forward "
             "and gradients back):"]
    for replica in range(plan.num_replicas):
        for position in range(plan.width):
            devices = [plan.device_of(tg.index, replica, position) for tg in plan.taskgraphs]
            path = " -> ".join("%s@%s" % (tg.name, _short(d))
                               for tg, d in zip(plan.taskgraphs, devices))
            lines.append("    replica %d position %d: %s" % (replica, position, path))
    return lines


def _short(device):
    """``task:0/device:CPU:2`` of a full device string (the job prefix is the same)."""
    return device.split("/replica:0/", 1)[-1]


def describe_micro_batching(choice):
    """One line for the plan print: which lowering, and why the fallback."""
    kind, reason = choice
    if kind == STAGE_FUNCTIONS:
        return ("stage functions (each stage's forward and backward built once, called "
                "per micro-batch and replica)")
    return "unrolled copies (one copy of the stage graph each: %s)" % reason


def make_plan(config, cluster, specs):
    """Compute the plan; raise PlanError when the layout is impossible."""
    specs = list(specs)
    if not specs:
        raise PlanError("the graph has no TaskGraphs; build the model after epl.init()")
    layout = _replica_layout(config, cluster, specs)
    worker_of = dict((cluster.device(w, d), w) for w in range(cluster.worker_num)
                     for d in range(cluster.gpu_num_per_worker))
    taskgraphs = tuple(_taskgraph_plan(index, spec, layout, cluster, worker_of)
                       for index, spec in enumerate(specs))
    hosts = tuple(cluster.worker_cpu(w) for w in range(cluster.worker_num))
    plan = Plan(cluster.worker_num, cluster.gpu_num_per_worker, cluster.device_type,
                len(layout), taskgraphs, config.pipeline.num_micro_batch,
                config.pipeline.strategy, None, config.cluster.colocate_split_and_replicate,
                worker_of, hosts, None)
    _check_widths(plan)
    if not plan.aligned and config.zero.level:
        raise PlanError(
            "zero.level=%r is not supported with TaskGraphs of different device_count (%s) "
            "in this EPL version: a narrower TaskGraph's copies share devices, and ZeRO "
            "gives each device of the data-parallel group its own part of the optimizer "
            "states; remove zero.level or give every TaskGraph the same device_count"
            % (config.zero.level, ", ".join("%s: %s(%d)" % (tg.name, tg.kind, tg.device_count)
                                            for tg in plan.taskgraphs)))
    if plan.pipeline:
        plan = plan._replace(schedule=_schedule_for(config, plan))
    if plan.pipeline or _local_replicas(plan):
        plan = plan._replace(micro_batching=choose_micro_batching(
            config.pipeline.micro_batching))
    _warn_about(plan, config)
    return plan


def _replica_layout(config, cluster, specs):
    """``layout[replica][taskgraph]``: the cluster layout, or with interleaved stages
    (pipeline.num_virtual_stages > 1) TaskGraph t on device t mod S of each replica."""
    names = [s.name for s in specs]
    colocate = config.cluster.colocate_split_and_replicate
    chunks = _virtual.chunks_of(config)
    try:
        if chunks > 1:
            return _virtual.layout(cluster, config.cluster.device_place_prefer_intra_node,
                                   _virtual.check(config, specs), names)
        return _layout.replica_layout(
            cluster.worker_num, cluster.gpu_num_per_worker, [s.device_count for s in specs],
            prefer_intra_node=config.cluster.device_place_prefer_intra_node,
            colocate=colocate, names=names)
    except _virtual.VirtualStagesError as err:
        raise PlanError(str(err))
    except _layout.LayoutError as err:
        if chunks > 1:
            total = cluster.worker_num * cluster.gpu_num_per_worker
            raise PlanError("%s=%d places the %d TaskGraphs on %d devices per replica, and the "
                            "job has %d device(s) (%d worker(s) x %d); use a multiple of %d "
                            "devices" % (_virtual.KEY, chunks, len(specs), len(specs) // chunks,
                                         total, cluster.worker_num, cluster.gpu_num_per_worker,
                                         len(specs) // chunks))
        raise PlanError(str(err))


def _schedule_for(config, plan):
    chunks = _virtual.chunks_of(config)
    if chunks > 1:
        return _schedule.interleaved(len(plan.stages) // chunks, plan.num_micro_batch, chunks)
    options = {}
    if plan.strategy == _schedule.ZERO_BUBBLE:
        options["memory"] = config.pipeline.zero_bubble_memory
    return _schedule.get_schedule(plan.strategy, len(plan.stages), plan.num_micro_batch,
                                  **options)


def choose_micro_batching(key):
    """How the plan repeats the step per micro-batch and local replica, for
    ``pipeline.micro_batching`` ``key``: (STAGE_FUNCTIONS, None), or (UNROLLED, why)
    when the user asks for copies. Stage functions hold every graph: what a function
    cannot hold (TF1 control flow, collectives built per copy, input pulls, ref
    variables) stays ops of each repetition (epl.parallel.repeat.functions)."""
    if key == "unrolled":
        return (UNROLLED, "pipeline.micro_batching='unrolled'")
    return (STAGE_FUNCTIONS, None)


def _local_replicas(plan):
    """True when some worker builds two or more copies (data-parallel replicas, or
    the positions of stages k devices wide)."""
    return any(len(plan.copies_of(w)) > 1 for w in range(plan.worker_num))


def _check_widths(plan):
    """TaskGraphs of different widths share a replica when the narrower ones are
    ``replicate`` TaskGraphs whose widths divide the widest: a replica is ``plan.width``
    copies, and a narrow TaskGraph runs consecutive copies on each of its devices (its
    weights once per copy there; those copies' gradients are combined on the device
    before the all-reduce, which takes one member per device). Refused otherwise,
    naming the widths and what is allowed."""
    if plan.aligned:
        return
    width = plan.width
    wrong = [tg for tg in plan.taskgraphs
             if width % tg.device_count or (tg.kind == _mesh.SPLIT and tg.device_count < width)]
    if wrong:  # (colocated TaskGraphs of different widths: refused by the layout)
        raise PlanError(unaligned_message(plan, wrong))
    for replica in range(plan.num_replicas):
        for tg in plan.taskgraphs:
            drivers = {}
            for position in range(width):
                device = plan.device_of(tg.index, replica, position)
                drivers.setdefault(device, set()).add(plan.driver_of(replica, position))
            split = [d for d, workers in drivers.items() if len(workers) > 1]
            if split:
                raise PlanError(
                    "TaskGraph %r (%s(%d)) runs %d positions of replica %d on %s, but "
                    "those positions are built by workers %s: the copies sharing a device "
                    "must be built by one worker. Keep a replica on one worker "
                    "(cluster.device_place_prefer_intra_node=True), put the narrower "
                    "TaskGraph first, or give every TaskGraph the same device_count. %s"
                    % (tg.name, tg.kind, tg.device_count, width // tg.device_count, replica,
                       split[0], sorted(drivers[split[0]]), _equal_widths_that_fit(plan)))


def unaligned_message(plan, wrong):
    """Why these TaskGraphs of different widths cannot share a replica, and what would
    work on this job's devices."""
    widths = ", ".join("%s: %s(%d)" % (tg.name, tg.kind, tg.device_count)
                       for tg in plan.taskgraphs)
    narrow = ", ".join("%s(%d)" % (tg.kind, tg.device_count) for tg in wrong)
    why = ("TaskGraphs of different widths need every width to divide the widest (%d) and "
           "every epl.split TaskGraph to be the widest (a split layer's shards need a device "
           "each); %s does not" % (plan.width, narrow))
    return ("the TaskGraphs of one model replica have different device_count (%s): %s. "
            "Allowed: replicate(a) stages with a dividing the widest TaskGraph's "
            "device_count (e.g. replicate(1) then split(2) or replicate(2)), or the same "
            "device_count k for every TaskGraph. %s" % (widths, why, _equal_widths_that_fit(plan)))


def _equal_widths_that_fit(plan):
    """The equal device_counts k this job's devices hold, in both placements."""
    total = plan.worker_num * plan.devices_per_worker
    count = len(plan.taskgraphs)
    own = [k for k in range(1, total + 1) if total % (k * count) == 0]
    shared = [k for k in range(1, total + 1) if total % k == 0]
    text = "On this job's %d devices: " % total
    if own:
        text += "device_count k in %s with devices of their own, or " % own
    else:
        text += ("no k gives each of the %d TaskGraphs devices of its own (a replica "
                 "needs %d x k devices); " % (count, count))
    return text + "k in %s with cluster.colocate_split_and_replicate=True" % shared


def _taskgraph_plan(index, spec, layout, cluster, worker_of):
    devices = tuple(tuple(cluster.device(w, d) for w, d in replica[index])
                    for replica in layout)
    return TaskGraphPlan(index, spec.name, spec.kind, spec.device_count, devices,
                         _mesh.mesh_of(spec.kind, devices),
                         _mesh.taskgraph_groups(spec.name, spec.kind, devices, worker_of))


DEFAULT_STRATEGY = default_of("pipeline.strategy")


def _no_pipeline_because(plan, stages):
    """Why a plan has no pipeline, in the user's terms."""
    if stages > 1:
        return "%d stages but pipeline.num_micro_batch=1" % stages
    if plan.gradient_accumulation:
        return ("one stage (pipeline.num_micro_batch=%d accumulates gradients, in micro-batch "
                "order)" % plan.num_micro_batch)
    return "no pipeline stages (one TaskGraph per model replica)"


def _warn_about(plan, config):
    stages = len(plan.stages)
    if config.pipeline.zero_bubble_memory != "pipeline" and \
            plan.strategy != _schedule.ZERO_BUBBLE:
        LOG.warning("pipeline.zero_bubble_memory=%r has no effect: it applies to "
                    "pipeline.strategy ZeroBubble, and the strategy is %s",
                    config.pipeline.zero_bubble_memory, plan.strategy)
    if config.pipeline.strategy != DEFAULT_STRATEGY and not plan.pipeline:
        LOG.warning("pipeline.strategy=%r has no effect: it orders the micro-batches of "
                    "pipeline stages, and this graph has %s; the step runs as without it",
                    config.pipeline.strategy, _no_pipeline_because(plan, stages))
    devices = plan.schedule.num_stages if plan.schedule is not None else stages
    if plan.pipeline and plan.num_micro_batch < devices:
        LOG.warning("pipeline.num_micro_batch=%d is smaller than the %d pipeline stages: "
                    "some stages will idle every step; use at least %d micro-batches",
                    plan.num_micro_batch, devices, devices)


def specs_from_graph(graph):
    """TaskGraphSpecs of an ``epl.ir.Graph`` in definition order."""
    return [TaskGraphSpec(tg.name, tg.kind, tg.device_count) for tg in graph.taskgraphs]
