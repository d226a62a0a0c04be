"""Emulated cluster engines: the environment each engine gives its tasks, and a way
to start one process per task with it (no engine needed).

Each ``*_envs`` function returns one dict of variables per task, as that engine
sets them: Kubeflow TFJob (TF_CONFIG with chief, worker and evaluator tasks),
Slurm's ``srun``, Open MPI's ``mpirun`` and torchrun. :func:`run_tasks` starts a
command once per task with a clean environment (no engine variables inherited
from the test's own) plus those variables, waits for all under a deadline and
stops every one of them if any hangs.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

from epl.cluster.discovery import engine_variables

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def clean_env(**extra):
    """This process's environment without any engine's or EPL's variables, plus ``extra``."""
    env = dict(os.environ)
    for name in engine_variables(env) + [n for n in env if n.startswith("EPL_")]:
        env.pop(name, None)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(dict((k, str(v)) for k, v in extra.items()))
    return env


def tfjob_envs(hosts, evaluator=False):
    """TFJob's TF_CONFIG per task: hosts[0] is the chief, the rest workers; with
    ``evaluator`` one more task of type evaluator (not in the cluster, as TFJob
    writes it)."""
    cluster = {"chief": hosts[:1], "worker": hosts[1:]}
    tasks = [("chief", 0)] + [("worker", i) for i in range(len(hosts) - 1)]
    if evaluator:
        tasks.append(("evaluator", 0))
    return [{"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": t, "index": i},
                                      "environment": "cloud"})} for t, i in tasks]


def slurm_envs(nodes_text, nodes, tasks_per_node, job_id, port_base=None, gpus=None):
    """srun's variables for each task of a block-distributed step: ``nodes`` names
    (expanded ``nodes_text``) with ``tasks_per_node`` tasks each."""
    size = len(nodes) * tasks_per_node
    envs = []
    for rank in range(size):
        node, local = divmod(rank, tasks_per_node)
        env = {"SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id, "SLURM_STEP_ID": 0,
               "SLURM_PROCID": rank, "SLURM_LOCALID": local, "SLURM_NODEID": node,
               "SLURM_NTASKS": size, "SLURM_STEP_NUM_TASKS": size,
               "SLURM_JOB_NODELIST": nodes_text, "SLURM_STEP_NODELIST": nodes_text,
               "SLURM_NNODES": len(nodes), "SLURM_STEP_NUM_NODES": len(nodes),
               "SLURM_TASKS_PER_NODE": "%d(x%d)" % (tasks_per_node, len(nodes)),
               "SLURM_STEP_TASKS_PER_NODE": "%d(x%d)" % (tasks_per_node, len(nodes)),
               "SLURM_GTIDS": ",".join(str(node * tasks_per_node + i)
                                       for i in range(tasks_per_node)),
               "SLURMD_NODENAME": nodes[node]}
        if port_base is not None:
            env["EPL_CLUSTER_PORT_BASE"] = port_base
        if gpus is not None:
            env.update(gpus)
        envs.append(dict((k, str(v)) for k, v in env.items()))
    return envs


def mpi_envs(size, local_size=None, master=None):
    """Open MPI's variables per rank (``mpirun -np size``), with MASTER_ADDR/PORT
    exported to every rank when ``master`` = (host, port) is given."""
    local_size = size if local_size is None else local_size
    envs = []
    for rank in range(size):
        env = {"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": size,
               "OMPI_COMM_WORLD_LOCAL_RANK": rank % local_size,
               "OMPI_COMM_WORLD_LOCAL_SIZE": local_size,
               "OMPI_COMM_WORLD_NODE_RANK": rank % local_size}
        if master is not None:
            env.update(MASTER_ADDR=master[0], MASTER_PORT=master[1])
        envs.append(dict((k, str(v)) for k, v in env.items()))
    return envs


def torchrun_envs(size, master, local_size=None, run_id="epl-test"):
    """torchrun's variables per rank (``torchrun --nproc-per-node size``)."""
    local_size = size if local_size is None else local_size
    return [dict((k, str(v)) for k, v in {
        "RANK": rank, "WORLD_SIZE": size, "LOCAL_RANK": rank % local_size,
        "LOCAL_WORLD_SIZE": local_size, "GROUP_RANK": rank // local_size,
        "MASTER_ADDR": master[0], "MASTER_PORT": master[1],
        "TORCHELASTIC_RUN_ID": run_id}.items()) for rank in range(size)]


def free_port():
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
    finally:
        sock.close()


def port_is_free(port):
    sock = socket.socket()
    try:
        sock.bind(("", port))
        return True
    except OSError:
        return False
    finally:
        sock.close()


def slurm_job_id_with_free_ports(tasks_per_node, port_base=20000, start=None):
    """A SLURM_JOB_ID whose derived ports (epl.cluster.slurm.task_port) are free here."""
    start = os.getpid() if start is None else start
    slots = 10000 // tasks_per_node
    for attempt in range(200):
        job_id = start + attempt
        first = port_base + (job_id % slots) * tasks_per_node
        if all(port_is_free(first + i) for i in range(tasks_per_node)):
            return job_id
    raise RuntimeError("no free block of %d ports above %d" % (tasks_per_node, port_base))


def run_tasks(argv, envs, timeout, prefix=None):
    """Start ``argv`` once per environment in ``envs`` (each in its own process group,
    with ``clean_env()`` under it; ``prefix(i)`` may wrap task i's command, e.g. to
    enter a network namespace). Returns [(exit code, output)] in task order; tasks
    still running at the deadline are stopped and reported with code None."""
    procs = []
    for index, env in enumerate(envs):
        command = list(argv) if prefix is None else prefix(index) + list(argv)
        procs.append(subprocess.Popen(command, env=clean_env(**env), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.time() + timeout
    results = []
    for proc in procs:
        try:
            output, _ = proc.communicate(timeout=max(1.0, deadline - time.time()))
            results.append((proc.returncode, output.decode(errors="replace")))
        except subprocess.TimeoutExpired:
            results.append((None, ""))
    for index, proc in enumerate(procs):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            results[index] = (None, output.decode(errors="replace"))
    return results


def describe(results):
    """Every task's exit code and the tail of its output, for an assertion message."""
    return "\n".join("--- task %d exited %s:\n%s" % (i, code, output[-2500:])
                     for i, (code, output) in enumerate(results))


def python(script):
    """argv that runs ``script`` with this interpreter."""
    return [sys.executable, script]
