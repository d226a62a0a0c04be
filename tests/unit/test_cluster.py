"""TF_CONFIG parsing, device counts and device names (no TF session)."""
import json

import pytest

from epl.cluster import Cluster, ClusterError, parse_tf_config, virtual_device_count
from epl.config import Config


def tf_config(cluster, task_type="worker", index=0):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def test_workers_only():
    hosts, index = parse_tf_config(tf_config({"worker": ["a:1", "b:2"]}, "worker", 1))
    assert hosts == ["a:1", "b:2"] and index == 1


def test_chief_is_worker_zero_and_workers_shift():
    cluster = {"chief": ["c:0"], "worker": ["a:1", "b:2"]}
    assert parse_tf_config(tf_config(cluster, "chief", 0)) == (["c:0", "a:1", "b:2"], 0)
    assert parse_tf_config(tf_config(cluster, "worker", 1)) == (["c:0", "a:1", "b:2"], 2)


def test_ps_hosts_are_workers_after_the_others():
    cluster = {"chief": ["c:0"], "worker": ["a:1"], "ps": ["p:9"]}
    assert parse_tf_config(tf_config(cluster, "ps", 0)) == (["c:0", "a:1", "p:9"], 2)


@pytest.mark.parametrize("text,match", [
    ("not json", "not valid JSON"),
    (tf_config({"worker": ["a:1"]}, "worker", 3), "worker:3 does not exist"),
    (tf_config({"worker": ["a:1"]}, "driver", 0), "'driver' is not one of"),
    (tf_config({"driver": ["a:1"]}), "unsupported job"),
    (tf_config({}), "no chief/master/worker/ps"),
    (tf_config({"worker": ["a:1"]}, "evaluator", 0), "not part of the training cluster"),
])
def test_bad_tf_config(text, match):
    with pytest.raises(ClusterError, match=match):
        parse_tf_config(text)


def test_virtual_device_count():
    assert virtual_device_count({}) == 1
    assert virtual_device_count({"EPL_NUM_VIRTUAL_DEVICES": "4"}) == 4
    for bad in ("0", "-2", "two"):
        with pytest.raises(ClusterError, match="EPL_NUM_VIRTUAL_DEVICES=%r" % bad):
            virtual_device_count({"EPL_NUM_VIRTUAL_DEVICES": bad})


def test_from_environment_local_virtual_devices():
    cluster = Cluster.from_environment(Config(), {"EPL_NUM_VIRTUAL_DEVICES": "3"})
    assert (cluster.worker_num, cluster.worker_index, cluster.gpu_num_per_worker,
            cluster.total_gpu_num, cluster.device_type) == (1, 0, 3, 3, "CPU")
    assert not cluster.distributed
    assert cluster.device(0, 2) == "/job:localhost/replica:0/task:0/device:CPU:2"
    assert cluster.run_visible_devices == ""


def test_from_environment_with_tf_config():
    env = {"TF_CONFIG": tf_config({"worker": ["h:1", "h:2"]}, "worker", 1),
           "EPL_NUM_VIRTUAL_DEVICES": "2"}
    cluster = Cluster.from_environment(Config(), env)
    assert cluster.distributed and cluster.worker_num == 2 and cluster.worker_index == 1
    assert cluster.total_gpu_num == 4
    assert cluster.device(1, 1) == "/job:worker/replica:0/task:1/device:CPU:1"
    assert cluster.worker_cpu() == "/job:worker/replica:0/task:1/device:CPU:0"
    assert cluster.cluster_spec() == {"worker": ["h:1", "h:2"]}


def test_a_job_of_one_task_runs_in_process():
    """epl-launch --num_workers 1 (and Slurm, MPI or explicit hosts of one task) describe
    a job with no one to talk to: no server, so sessions stay local (they place each
    run's pruned graph; through a server every session was TF's distributed master's,
    1.3-1.5x the CPU time to the first step of a BERT-base pipeline)."""
    from epl.cluster.session_config import session_config
    env = {"TF_CONFIG": tf_config({"worker": ["h:1"]}, "worker", 0),
           "EPL_NUM_VIRTUAL_DEVICES": "2"}
    cluster = Cluster.from_environment(Config(), env)
    assert not cluster.distributed and cluster.worker_num == 1 and cluster.hosts == ["h:1"]
    assert cluster.discovery.source == "TF_CONFIG"
    assert cluster.device(0, 1) == "/job:localhost/replica:0/task:0/device:CPU:1"
    config = session_config(cluster)
    assert config.graph_options.place_pruned_graph
    assert not config.experimental.collective_group_leader
    explicit = Cluster(["x:1"], 0, 2)
    assert not explicit.distributed and explicit.hosts == ["x:1"] and "x:1" in repr(explicit)
    assert Cluster(worker_hosts=["x:1"], ps_hosts=["y:1"], devices_per_worker=1).distributed


def test_explicit_cluster_validation():
    with pytest.raises(ClusterError, match="out of range"):
        Cluster(["a:1"], worker_index=1)
    with pytest.raises(ClusterError, match=">= 1"):
        Cluster(devices_per_worker=0)
    with pytest.raises(ClusterError, match="device_type"):
        Cluster(device_type="TPU")
    assert Cluster(["a:1"], 0, 2) == Cluster(["a:1"], 0, 2)


SLURM_TASK_1 = {"SLURM_JOB_ID": "10", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
                "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "node[01-02]",
                "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_NODEID": "1",
                "SLURM_LOCALID": "0", "EPL_NUM_VIRTUAL_DEVICES": "2"}


def test_from_environment_with_slurm_variables():
    cluster = Cluster.from_environment(Config(), SLURM_TASK_1)
    assert cluster.hosts == ["node01:20010", "node02:20010"] and cluster.worker_index == 1
    assert cluster.distributed and cluster.total_gpu_num == 4
    assert cluster.discovery.source == "Slurm" and cluster.task_type == "worker"
    ported = Cluster.from_environment(Config({"cluster.port_base": 40000}), SLURM_TASK_1)
    assert ported.hosts == ["node01:40010", "node02:40010"]


def test_slurm_gpu_share_becomes_the_visible_devices(monkeypatch):
    """Four tasks per node that each see the node's four GPUs take one each."""
    import epl.cluster as cluster_module
    monkeypatch.setattr(cluster_module, "_physical_gpu_count", lambda: 4)
    env = dict(SLURM_TASK_1, SLURM_NTASKS="4", SLURM_PROCID="3", SLURM_LOCALID="3",
               SLURM_NODEID="0", SLURM_STEP_NODELIST="node01", SLURM_STEP_TASKS_PER_NODE="4",
               CUDA_VISIBLE_DEVICES="0,1,2,3")
    cluster = Cluster.from_environment(Config(), env)
    assert (cluster.run_visible_devices, cluster.gpu_num_per_worker) == ("3", 1)
    chosen = Cluster.from_environment(Config({"cluster.run_visible_devices": "0,1"}), env)
    assert chosen.run_visible_devices == "0,1"     # the user's own choice wins


def test_an_evaluator_task_is_a_local_cluster():
    env = {"TF_CONFIG": tf_config({"chief": ["c:1"], "worker": ["w:1"]}, "evaluator", 0)}
    cluster = Cluster.from_environment(Config(), env)
    assert not cluster.distributed and cluster.worker_num == 1
    assert cluster.task_type == "evaluator" and "evaluator" in repr(cluster)
    assert cluster != Cluster.from_environment(Config(), {})


def test_a_bare_cluster_follows_the_engine_too(monkeypatch):
    for name, value in SLURM_TASK_1.items():
        monkeypatch.setenv(name, value)
    assert Cluster(devices_per_worker=1).hosts == ["node01:20010", "node02:20010"]
    with pytest.raises(ClusterError, match="Slurm says this is worker 1"):
        Cluster(devices_per_worker=1, worker_index=0)
    assert Cluster(["x:1"], devices_per_worker=1).discovery.source == "explicit"
