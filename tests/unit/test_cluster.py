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
    (tf_config({"master": ["a:1"]}), "unsupported job"),
    (tf_config({}), "no chief/worker/ps"),
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


def test_explicit_cluster_validation():
    with pytest.raises(ClusterError, match="out of range"):
        Cluster(["a:1"], worker_index=1)
    with pytest.raises(ClusterError, match=">= 1"):
        Cluster(devices_per_worker=0)
    with pytest.raises(ClusterError, match="device_type"):
        Cluster(device_type="TPU")
    assert Cluster(["a:1"], 0, 2) == Cluster(["a:1"], 0, 2)
