"""The original EPL's Cluster surface: constructor keywords, attributes, visible devices."""
import pytest

import epl.cluster as cluster_module
from epl.cluster import Cluster, ClusterError, VirtualDevice, local_devices
from epl.cluster.session_config import session_config
from epl.config import Config
from epl.tf_adapter import tf

HOSTS = ["10.0.0.1:2222", "10.0.0.1:2223", "10.0.0.2:2222"]


def test_original_keywords():
    cluster = Cluster(worker_hosts=HOSTS[:2], ps_hosts=HOSTS[2:], job_name="worker",
                      worker_index=1, layout="auto", devices_per_worker=2)
    assert cluster.hosts == HOSTS and cluster.worker_num == 3 and cluster.worker_index == 1
    ps = Cluster(worker_hosts=HOSTS[:2], ps_hosts=HOSTS[2:], job_name="ps", worker_index=0,
                 devices_per_worker=1)
    assert ps.worker_index == 2   # ps hosts are workers after the others
    assert Cluster(worker_hosts=",".join(HOSTS), devices_per_worker=1).hosts == HOSTS


@pytest.mark.parametrize("kwargs,match", [
    ({"layout": "all"}, "colocate_split_and_replicate"),
    ({"layout": {"specific": [[0]]}}, "only layout=None or 'auto'"),
    ({"layout": {"aware_row": 2}}, "not supported"),
    ({"job_name": "chief"}, "job_name='chief'"),
    ({"job_name": "ps", "ps_hosts": ["p:1"], "worker_index": 1}, "1 ps host"),
    ({"worker_index": "0"}, "worker_index must be an integer"),
    ({"worker_hosts": ["a:1", 3]}, "host:port strings"),
])
def test_refused_keywords(kwargs, match):
    args = dict(worker_hosts=["a:1"], devices_per_worker=1)
    args.update(kwargs)
    with pytest.raises(ClusterError, match=match):
        Cluster(**args)


def test_attributes_of_the_original():
    cluster = Cluster(HOSTS, 2, 2, "CPU")
    assert cluster.available_devices == ["/job:worker/replica:0/task:2/device:CPU:0",
                                         "/job:worker/replica:0/task:2/device:CPU:1"]
    assert cluster.gpu_num_per_worker == 2 and cluster.total_gpu_num == 6
    assert cluster.current_worker_cpu() == "/job:worker/replica:0/task:2/device:CPU:0"
    assert cluster.current_worker_chief_gpu() == "/job:worker/replica:0/task:2/device:CPU:0"
    assert cluster.cluster_spec == {"worker": HOSTS}
    assert cluster.cluster_spec() == {"worker": HOSTS}      # callable, as EPL used it
    assert cluster.cluster_spec.as_dict() == {"worker": HOSTS}
    assert [Cluster(HOSTS, i, 1).get_local_rank() for i in range(3)] == [0, 1, 0]
    assert Cluster(devices_per_worker=1).get_local_rank() == 0


def test_cluster_errors_are_also_runtime_errors():
    """The original raised RuntimeError for cluster problems; code catching it works."""
    with pytest.raises(RuntimeError, match="worker_index 5 is out of range"):
        Cluster(HOSTS, 5, 1)
    assert issubclass(ClusterError, ValueError) and issubclass(ClusterError, RuntimeError)


def test_get_local_rank_of_a_global_rank_as_the_original():
    """get_local_rank(global_rank) is the device's index on its worker; it was a
    TypeError (EPL's took no argument)."""
    cluster = Cluster(HOSTS, 1, 4)
    assert [cluster.get_local_rank(r) for r in range(12)] == [0, 1, 2, 3] * 3
    assert cluster.get_local_rank() == 1   # this worker's index among those on its host
    for bad in (12, -1, "3", 1.5):
        with pytest.raises(ClusterError, match="expected a device rank in 0..11"):
            cluster.get_local_rank(bad)


TF_CONFIG = ('{"cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"]}, '
             '"task": {"type": "worker", "index": 1}}')


def test_a_bare_cluster_reads_tf_config_as_epl_init_does(monkeypatch):
    """Cluster() used to be one local worker whatever TF_CONFIG said."""
    monkeypatch.setenv("TF_CONFIG", TF_CONFIG)
    cluster = Cluster(devices_per_worker=2)
    assert cluster.hosts == ["c:1", "w:1", "w:2"] and cluster.worker_index == 2
    assert cluster.distributed and Cluster.from_environment(None).hosts == cluster.hosts
    assert Cluster(devices_per_worker=1, worker_index=2).worker_index == 2
    with pytest.raises(ClusterError, match="TF_CONFIG says this is worker 2"):
        Cluster(devices_per_worker=1, worker_index=0)
    assert Cluster(["x:1"], devices_per_worker=1).hosts == ["x:1"]   # explicit hosts win
    monkeypatch.delenv("TF_CONFIG")
    assert Cluster(devices_per_worker=1).hosts == ["localhost"]


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(cluster_module, "_physical_gpu_count", lambda: 0)


def test_devices_are_discovered_when_not_given(monkeypatch, no_gpu):
    monkeypatch.setenv("EPL_NUM_VIRTUAL_DEVICES", "3")
    cluster = Cluster(worker_hosts=["a:1", "b:2"], worker_index=1)
    assert (cluster.gpu_num_per_worker, cluster.device_type) == (3, "CPU")


def test_run_visible_devices_selects_virtual_devices(no_gpu):
    assert local_devices("1,2", {"EPL_NUM_VIRTUAL_DEVICES": "4"}) == (2, "CPU")
    assert local_devices("", {"EPL_NUM_VIRTUAL_DEVICES": "4"}) == (4, "CPU")
    cluster = Cluster.from_environment(Config({"cluster.run_visible_devices": "3,0"}),
                                       {"EPL_NUM_VIRTUAL_DEVICES": "4"})
    assert cluster.gpu_num_per_worker == 2 and cluster.run_visible_devices == "3,0"
    # Renumbered from 0, as TF does for GPUs; the session creates exactly 2 devices.
    assert cluster.available_devices[-1].endswith("device:CPU:1")
    assert session_config(cluster).device_count["CPU"] == 2
    with pytest.raises(ClusterError, match=r"names device\(s\) \[4\], but this worker has 4 "
                                           r"virtual CPU device\(s\)"):
        local_devices("1,4", {"EPL_NUM_VIRTUAL_DEVICES": "4"})
    with pytest.raises(ClusterError, match="distinct device indices"):
        local_devices("1,1", {"EPL_NUM_VIRTUAL_DEVICES": "4"})


def test_run_visible_devices_on_gpus(monkeypatch):
    monkeypatch.setattr(cluster_module, "_physical_gpu_count", lambda: 4)
    assert local_devices("1,2", {"EPL_NUM_VIRTUAL_DEVICES": "8"}) == (2, "GPU")
    assert local_devices("", {}) == (4, "GPU")
    with pytest.raises(ClusterError, match=r"GPU\(s\) \[5\], but this worker has 4 GPU"):
        local_devices("5", {})
    cluster = Cluster(devices_per_worker=2, device_type="GPU", run_visible_devices="1, 2")
    assert session_config(cluster).gpu_options.visible_device_list == "1,2"


def test_virtual_device_record():
    devices = (("d0", "d1"), ("d2", "d3"))
    device = VirtualDevice(0, "stage_0", devices, ("d0", "d1"))
    assert device.num_replicas == 2 and device.all_devices == ("d0", "d1", "d2", "d3")
    assert device.slice_devices == devices


def test_local_sessions_place_only_the_ops_each_run_needs():
    """A session in one process places each run's pruned graph (EPL's larger graph
    would otherwise be placed and pruned whole for every new set of fetches); a
    distributed session cannot (TF's master turns the option off with a warning)."""
    local = Cluster(devices_per_worker=2)
    assert session_config(local).graph_options.place_pruned_graph
    user = tf.ConfigProto()
    user.graph_options.rewrite_options.constant_folding = 2  # the user's choices stay
    merged = session_config(local, user)
    assert merged.graph_options.place_pruned_graph
    assert merged.graph_options.rewrite_options.constant_folding == 2
    workers = Cluster(worker_hosts=["a:1", "b:2"], worker_index=0)
    assert not session_config(workers).graph_options.place_pruned_graph


def test_cluster_place_pruned_graph_false_keeps_tfs_whole_graph_placement():
    """With a pruned placement TF 1.15 runs no grappler on the main graph (its layout,
    arithmetic and fusion rewrites: unrolled copies step with 8-12% more CPU);
    ``cluster.place_pruned_graph=false`` leaves the option as the user's ConfigProto
    has it (proto3 cannot tell an explicit False from unset, so a key says it)."""
    import epl
    local = Cluster(devices_per_worker=2)
    assert not session_config(local, place_pruned=False).graph_options.place_pruned_graph
    user = tf.ConfigProto()
    user.graph_options.place_pruned_graph = True
    assert session_config(local, user, place_pruned=False).graph_options.place_pruned_graph
    epl.init(epl.Config({"cluster.place_pruned_graph": False}), cluster=local)
    assert not epl.Env.get().get_config_proto().graph_options.place_pruned_graph
    epl.init(cluster=local)
    assert epl.Env.get().get_config_proto().graph_options.place_pruned_graph
