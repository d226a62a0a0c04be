"""The cluster of a Slurm job step (``srun``), from the variables srun sets.

Tasks, nodes and places: ``SLURM_PROCID`` (this task's rank) of
``SLURM_STEP_NUM_TASKS`` (or ``SLURM_NTASKS``), ``SLURM_NODEID`` and
``SLURM_LOCALID`` (its node, and its index there), the nodes
``SLURM_STEP_NODELIST`` (or ``SLURM_JOB_NODELIST``) in Slurm's compressed form
and ``SLURM_STEP_TASKS_PER_NODE`` (or ``SLURM_TASKS_PER_NODE``). Which node runs
which task follows ``SLURM_DISTRIBUTION`` (block, Slurm's default, or cyclic);
each task checks that its own place (and ``SLURM_GTIDS``, the tasks of its node)
agrees, so any other distribution fails with a clear error on every task.

Ports are derived, so that every task computes every other task's address
without talking to it: the task with local index ``l`` on its node listens on
``port_base + (SLURM_JOB_ID mod (10000 // T)) * T + l``, where ``T`` is the
largest number of tasks on one node and ``port_base`` is ``cluster.port_base``
(20000 by default: ports 20000-29999, below Linux's ephemeral range).

Devices: with GPUs, ``CUDA_VISIBLE_DEVICES`` holds what Slurm gives the task.
When every task of a node sees all the node's GPUs (``--gres=gpu:4`` with 4 tasks
per node) the task takes its own block of ``SLURM_GPUS_PER_TASK`` (or visible /
tasks on the node) by ``SLURM_LOCALID``; one task per node uses them all. Without
GPUs, ``EPL_NUM_VIRTUAL_DEVICES`` gives each task its virtual devices, as always.

A batch script (``sbatch``) runs outside any step: ``SLURM_NTASKS=4`` there says
the job has four tasks, but the script's process is none of them. Training from
it would train alone, so it is an error that says to start the script with srun.
"""
from epl.cluster import hostlist
from epl.cluster.common import (PORT_SPAN, Claim, ClusterError, check_port_base, first_set,
                                int_variable)

SOURCE = "Slurm"
STEP_MARKERS = ("SLURM_STEP_ID", "SLURM_STEPID")
JOB_MARKERS = ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_PROCID", "SLURM_NTASKS") + STEP_MARKERS


def claim(environ, port_base):
    """The :class:`~epl.cluster.common.Claim` of this process, or None when it is not
    in a Slurm job (or is the batch script of a one-task job)."""
    if not any(environ.get(name) for name in JOB_MARKERS):
        return None
    _, tasks_text = first_set(environ, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"))
    if not any(environ.get(name) for name in STEP_MARKERS):
        if tasks_text and tasks_text.isdigit() and int(tasks_text) > 1:
            return Claim(SOURCE, problem=(
                "This process is in a Slurm job of SLURM_NTASKS=%s tasks but was not started "
                "by srun (no SLURM_STEP_ID): it is none of those tasks, and would train "
                "alone. Start it with `srun python script.py` (one process per task), or set "
                "EPL_CLUSTER_SOURCE=local to train alone on purpose." % tasks_text))
        return None
    step = _read_step(environ)
    if step["size"] == 1:
        return Claim(SOURCE, 0, 1, None, detail=step["detail"],
                     visible_devices=task_devices(environ, 1, 0))
    ports = [task_port(step["job_id"], local, max(step["counts"]), port_base)
             for _, local in step["placement"]]
    hosts = tuple("%s:%d" % (step["nodes"][node], port)
                  for (node, _), port in zip(step["placement"], ports))
    node = step["placement"][step["rank"]][0]
    devices = task_devices(environ, step["counts"][node], step["local"])
    return Claim(SOURCE, step["rank"], step["size"], hosts, detail=step["detail"],
                 visible_devices=devices)


def _read_step(environ):
    """The step's numbers, checked against each other and against this task's place."""
    size = int_variable(environ, _first_name(environ, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")),
                        minimum=1)
    rank = int_variable(environ, "SLURM_PROCID")
    if rank >= size:
        raise ClusterError("SLURM_PROCID=%d is outside the step's %d task(s) (SLURM_PROCID "
                           "counts from 0)" % (rank, size))
    job_id = int_variable(environ, _first_name(environ, ("SLURM_JOB_ID", "SLURM_JOBID")))
    list_name, list_text = first_set(environ, ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                               "SLURM_NODELIST"))
    if list_name is None:
        raise ClusterError("SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST) is not set: EPL needs "
                           "the step's nodes to find task %d's peers" % rank)
    nodes = hostlist.expand(list_text, list_name)
    counts = _counts(environ, nodes, size)
    node, local = int_variable(environ, "SLURM_NODEID"), int_variable(environ, "SLURM_LOCALID")
    placement = place_tasks(counts, _distribution(environ))
    if placement[rank] != (node, local) or not _gtids_agree(environ, placement, node):
        raise ClusterError(
            "Slurm task %d is on node %d as local task %d (SLURM_NODEID, SLURM_LOCALID%s), but "
            "%s distribution of %s over %s puts it on node %d as local task %d: EPL derives "
            "every task's node from a block or cyclic distribution only (srun -m block)"
            % (rank, node, local, ", SLURM_GTIDS" if environ.get("SLURM_GTIDS") else "",
               _distribution(environ), counts, list_text, placement[rank][0],
               placement[rank][1]))
    detail = ("SLURM_PROCID=%d of %d tasks, %s=%s, SLURM_JOB_ID=%d"
              % (rank, size, list_name, list_text, job_id))
    return dict(size=size, rank=rank, job_id=job_id, nodes=nodes, counts=counts,
                placement=placement, local=local, detail=detail)


def _first_name(environ, names):
    name, _ = first_set(environ, names)
    return name or names[-1]


def _counts(environ, nodes, size):
    """Tasks on each node of the step, from SLURM_STEP_TASKS_PER_NODE (or the job's)."""
    name, text = first_set(environ, ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
    if name is None:
        if size % len(nodes):
            raise ClusterError("SLURM_STEP_TASKS_PER_NODE is not set and %d tasks do not "
                               "divide evenly over %d node(s)" % (size, len(nodes)))
        return [size // len(nodes)] * len(nodes)
    counts = hostlist.tasks_per_node(text, name)
    if len(counts) != len(nodes) or sum(counts) != size:
        raise ClusterError("%s=%s gives %d node(s) and %d task(s), but the node list has %d "
                           "node(s) and the step %d task(s)"
                           % (name, text, len(counts), sum(counts), len(nodes), size))
    return counts


def _distribution(environ):
    text = (environ.get("SLURM_DISTRIBUTION") or "block").strip().lower()
    return text.split(":")[0].split(",")[0] or "block"


def place_tasks(counts, distribution="block"):
    """``[(node, local index)]`` of each task, in rank order, for ``counts`` tasks per node.

    ``block`` fills node 0, then node 1, ...; ``cyclic`` deals ranks round-robin over
    the nodes that still have room."""
    if distribution == "block":
        return [(node, local) for node, count in enumerate(counts) for local in range(count)]
    if distribution != "cyclic":
        raise ClusterError("SLURM_DISTRIBUTION=%s: EPL derives every task's node from a block "
                           "or cyclic distribution only (srun -m block)" % distribution)
    placed, used = [], [0] * len(counts)
    while len(placed) < sum(counts):
        for node, count in enumerate(counts):
            if used[node] < count:
                placed.append((node, used[node]))
                used[node] += 1
    return placed


def _gtids_agree(environ, placement, node):
    """SLURM_GTIDS (ranks on this node), when set, must be the ranks placed here."""
    text = (environ.get("SLURM_GTIDS") or "").strip()
    if not text:
        return True
    try:
        found = sorted(int(part) for part in text.split(","))
    except ValueError:
        raise ClusterError("SLURM_GTIDS=%r: expected task ranks separated by commas" % text)
    return found == [rank for rank, (n, _) in enumerate(placement) if n == node]


def task_port(job_id, local_index, tasks_per_node, port_base):
    """The port of the task with ``local_index`` on its node (see the module doc)."""
    check_port_base(port_base)
    if tasks_per_node > PORT_SPAN:
        raise ClusterError("%d tasks on one node: EPL derives at most %d ports per node"
                           % (tasks_per_node, PORT_SPAN))
    slots = PORT_SPAN // tasks_per_node
    return port_base + (job_id % slots) * tasks_per_node + local_index


def task_devices(environ, tasks_on_node, local_index):
    """This task's share of ``CUDA_VISIBLE_DEVICES``, as indices into it ("" for all).

    The visible list is what Slurm gave: the task's own GPUs (nothing to select),
    or the whole node's when every task of the node sees them all; then the task
    takes block ``local_index`` of ``SLURM_GPUS_PER_TASK`` (or visible / tasks)."""
    visible = [entry for entry in (environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")
               if entry.strip()]
    if not visible or visible[0].strip().startswith("-"):
        return ""
    per_task = _gpus_per_task(environ)
    if per_task is None:
        if tasks_on_node == 1:
            return ""
        if len(visible) % tasks_on_node:
            raise ClusterError(
                "CUDA_VISIBLE_DEVICES=%s lists %d GPU(s) for %d tasks on this node: they "
                "cannot be shared out evenly; set --gpus-per-task (SLURM_GPUS_PER_TASK)"
                % (",".join(visible), len(visible), tasks_on_node))
        per_task = len(visible) // tasks_on_node
    if len(visible) == per_task:
        return ""
    if len(visible) < per_task * tasks_on_node:
        raise ClusterError(
            "CUDA_VISIBLE_DEVICES=%s lists %d GPU(s), but %d tasks on this node x "
            "SLURM_GPUS_PER_TASK=%d need %d"
            % (",".join(visible), len(visible), tasks_on_node, per_task, per_task * tasks_on_node))
    start = local_index * per_task
    return ",".join(str(i) for i in range(start, start + per_task))


def _gpus_per_task(environ):
    """SLURM_GPUS_PER_TASK as a count; Slurm also writes ``type:count`` (``a100:2``)."""
    raw = (environ.get("SLURM_GPUS_PER_TASK") or "").strip()
    if not raw:
        return None
    count = raw.rsplit(":", 1)[-1]
    if not count.isdigit() or int(count) < 1:
        raise ClusterError("SLURM_GPUS_PER_TASK=%r: expected a count such as 2 or a100:2" % raw)
    return int(count)
