"""The cluster of a Slurm step from srun's variables (epl.cluster.slurm): no TensorFlow."""
import pytest

from epl.cluster import hostlist, slurm
from epl.cluster.common import ClusterError

BASE = 20000


def step(rank, nodes="node[01-02]", per_node="2(x2)", size=4, job_id=123, **extra):
    """srun's variables for task ``rank`` of a block-distributed step."""
    placed = slurm.place_tasks(hostlist.tasks_per_node(per_node))
    env = {"SLURM_JOB_ID": str(job_id), "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank),
           "SLURM_NTASKS": str(size), "SLURM_STEP_NUM_TASKS": str(size),
           "SLURM_STEP_NODELIST": nodes, "SLURM_JOB_NODELIST": nodes,
           "SLURM_STEP_TASKS_PER_NODE": per_node, "SLURM_NODEID": str(placed[rank][0]),
           "SLURM_LOCALID": str(placed[rank][1])}
    env.update(extra)
    return env


def test_one_task_per_gpu_two_nodes():
    """4 tasks, 2 per node: every task computes the same hosts, ports from the job id."""
    claims = [slurm.claim(step(r), BASE) for r in range(4)]
    port = BASE + (123 % (10000 // 2)) * 2
    expected = ("node01:%d" % port, "node01:%d" % (port + 1), "node02:%d" % port,
                "node02:%d" % (port + 1))
    assert all(c.hosts == expected for c in claims)
    assert [(c.rank, c.size, c.source) for c in claims] == [(r, 4, "Slurm") for r in range(4)]
    assert "SLURM_PROCID=3 of 4 tasks, SLURM_STEP_NODELIST=node[01-02]" in claims[3].detail


def test_one_task_per_node():
    env = step(1, nodes="gpu[07,09]", per_node="1(x2)", size=2, job_id=99999)
    claim = slurm.claim(env, 30000)
    port = 30000 + 99999 % 10000
    assert claim.hosts == ("gpu07:%d" % port, "gpu09:%d" % port) and claim.rank == 1


def test_ports_are_deterministic_and_documented():
    assert slurm.task_port(123, 0, 1, 20000) == 20123
    assert slurm.task_port(10123, 1, 4, 20000) == 20000 + (10123 % 2500) * 4 + 1
    assert max(slurm.task_port(j, 3, 4, 55536) for j in range(20000)) <= 65535
    for bad_base in (80, 60000):
        with pytest.raises(ClusterError, match="cluster.port_base=%d" % bad_base):
            slurm.task_port(1, 0, 1, bad_base)


def test_cyclic_distribution():
    counts = [2, 2]
    assert slurm.place_tasks(counts, "cyclic") == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert slurm.place_tasks([3, 1], "cyclic") == [(0, 0), (1, 0), (0, 1), (0, 2)]
    env = step(1, SLURM_DISTRIBUTION="cyclic", SLURM_NODEID="1", SLURM_LOCALID="0")
    hosts = slurm.claim(env, BASE).hosts
    assert [h.split(":")[0] for h in hosts] == ["node01", "node02", "node01", "node02"]


def test_a_task_whose_place_disagrees_with_the_distribution_fails():
    """Cyclic placement under a block assumption (no SLURM_DISTRIBUTION) is caught by
    the task's own SLURM_NODEID/SLURM_LOCALID, or by SLURM_GTIDS on rank 0."""
    with pytest.raises(ClusterError, match="srun -m block"):
        slurm.claim(step(1, SLURM_NODEID="1", SLURM_LOCALID="0"), BASE)
    with pytest.raises(ClusterError, match="SLURM_GTIDS"):
        slurm.claim(step(0, SLURM_GTIDS="0,2"), BASE)
    with pytest.raises(ClusterError, match="SLURM_DISTRIBUTION=plane"):
        slurm.claim(step(0, SLURM_DISTRIBUTION="plane=2"), BASE)


def test_a_batch_script_of_a_multi_task_job_cannot_join():
    env = {"SLURM_JOB_ID": "5", "SLURM_NTASKS": "4", "SLURM_PROCID": "0",
           "SLURM_JOB_NODELIST": "node[01-04]", "SLURM_NODEID": "0"}
    claim = slurm.claim(env, BASE)
    assert claim.problem and "not started by srun" in claim.problem and not claim.training
    env["SLURM_NTASKS"] = "1"
    assert slurm.claim(env, BASE) is None          # a one-task job's script is that task
    assert slurm.claim({"HOME": "/root"}, BASE) is None


def test_a_one_task_step_is_one_local_worker():
    claim = slurm.claim(step(0, nodes="node01", per_node="1", size=1), BASE)
    assert (claim.rank, claim.size, claim.hosts) == (0, 1, None)


@pytest.mark.parametrize("changes,match", [
    ({"SLURM_PROCID": "4"}, r"SLURM_PROCID=4 is outside the step's 4 task\(s\)"),
    ({"SLURM_PROCID": "x"}, "SLURM_PROCID='x': expected an integer >= 0"),
    ({"SLURM_STEP_NODELIST": "node[01-", "SLURM_JOB_NODELIST": "node[01-"},
     r"'\[' without '\]'"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2,1,1"}, "but the node list has 2 node"),
    ({"SLURM_STEP_TASKS_PER_NODE": "1(x2)"}, r"gives 2 node\(s\) and 2 task\(s\)"),
    ({"SLURM_LOCALID": None}, "SLURM_LOCALID is not set"),
    ({"SLURM_JOB_ID": None}, "SLURM_JOBID is not set"),
])
def test_bad_step_variables_are_named(changes, match):
    env = step(1)
    for name, value in changes.items():
        if value is None:
            env.pop(name)
        else:
            env[name] = value
    with pytest.raises(ClusterError, match=match):
        slurm.claim(env, BASE)


def test_missing_node_list_is_named():
    env = step(1)
    del env["SLURM_STEP_NODELIST"], env["SLURM_JOB_NODELIST"]
    with pytest.raises(ClusterError, match="SLURM_STEP_NODELIST .* is not set"):
        slurm.claim(env, BASE)


def test_tasks_per_node_may_be_left_out_when_even():
    env = step(3)
    del env["SLURM_STEP_TASKS_PER_NODE"]
    assert slurm.claim(env, BASE).hosts[3].startswith("node02:")


@pytest.mark.parametrize("visible,per_task,tasks,local,expected", [
    (None, None, 4, 1, ""),            # no GPUs: virtual CPU devices as always
    ("0,1,2,3", None, 1, 0, ""),       # one task per node: all of the node's GPUs
    ("0,1,2,3", None, 4, 2, "2"),      # one task per GPU, every task sees all four
    ("0,1,2,3", "2", 2, 1, "2,3"),     # two GPUs per task
    ("0,1,2,3", "gpu:1", 4, 3, "3"),   # Slurm's type:count form
    ("5", "1", 4, 3, ""),              # Slurm bound the task's own GPU already
    ("GPU-a,GPU-b", "1", 2, 1, "1"),   # UUIDs: indices into the visible list
])
def test_task_devices(visible, per_task, tasks, local, expected):
    env = {}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    if per_task is not None:
        env["SLURM_GPUS_PER_TASK"] = per_task
    assert slurm.task_devices(env, tasks, local) == expected


def test_task_devices_that_cannot_be_shared_out():
    with pytest.raises(ClusterError, match="cannot be shared out evenly"):
        slurm.task_devices({"CUDA_VISIBLE_DEVICES": "0,1,2"}, 2, 0)
    with pytest.raises(ClusterError, match="need 4"):
        slurm.task_devices({"CUDA_VISIBLE_DEVICES": "0,1,2", "SLURM_GPUS_PER_TASK": "2"}, 2, 0)
    with pytest.raises(ClusterError, match="SLURM_GPUS_PER_TASK='many'"):
        slurm.task_devices({"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_GPUS_PER_TASK": "many"}, 2, 0)


def test_the_step_devices_reach_the_claim():
    env = step(3, CUDA_VISIBLE_DEVICES="0,1", SLURM_GPUS_PER_TASK="1")
    assert slurm.claim(env, BASE).visible_devices == "1"
