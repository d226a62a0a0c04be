"""Meshes, groups and per-copy records: pure functions, simulated clusters up to 512 devices."""
import pytest

from epl.cluster import Cluster
from epl.config import Config
from epl.parallel.mesh import Group, one_per_worker
from epl.parallel.plan import TaskGraphSpec, make_plan

COLOCATE = Config({"cluster.colocate_split_and_replicate": True})


def workers(w, n):
    return Cluster(["10.0.0.%d:2222" % i for i in range(w)], 0, n)


def dev(worker, index):
    return "/job:worker/replica:0/task:%d/device:CPU:%d" % (worker, index)


def _split_plan(w, n, width):
    specs = [TaskGraphSpec("backbone", "replicate", width), TaskGraphSpec("head", "split", width)]
    return make_plan(COLOCATE, workers(w, n), specs)


def test_split_taskgraph_on_two_workers_with_four_devices():
    plan = _split_plan(2, 4, 4)
    head = plan.taskgraphs[1]
    assert str(head.mesh) == "replica=2 x shard=4" and plan.num_replicas == 2
    assert head.dp_group(3).devices == (dev(0, 3), dev(1, 3))
    assert head.split_group(1).devices == tuple(dev(1, i) for i in range(4))
    assert head.sync_group(0).devices == (dev(0, 0), dev(1, 0))
    backbone = plan.taskgraphs[0]
    assert str(backbone.mesh) == "replica=2 x batch=4"
    assert backbone.dp_group(2) == backbone.dp_group(0)  # every position holds all weights
    assert backbone.dp_group().size == 8
    assert [g.name for g in head.groups] == [
        "head/dp/shard0", "head/dp/shard1", "head/dp/shard2", "head/dp/shard3",
        "head/split/replica0", "head/split/replica1",
        "head/sync/shard0", "head/sync/shard1", "head/sync/shard2", "head/sync/shard3",
        "head/all", "head/sync"]
    text = str(plan)
    assert "head/dp/shard3: 2 device(s)" in text and "hosts: 2 device(s)" in text


def test_split_replica_spanning_workers_is_built_by_every_worker():
    plan = _split_plan(4, 1, 4)  # one replica over 4 workers x 1 device
    for worker in range(4):
        (copy,) = plan.copies_of(worker)
        assert (copy.replica, copy.shard, copy.devices) == (0, worker, (dev(worker, 0),) * 2)
    assert plan.drivers == [0, 1, 2, 3] and plan.workers_used_by(2) == [2]
    assert plan.taskgraphs[1].split_group(0).size == 4
    assert plan.taskgraphs[1].dp_group(2).devices == (dev(2, 0),)


@pytest.mark.parametrize("w,n,width", [(64, 8, 8), (32, 8, 4), (128, 4, 8), (16, 2, 32)])
def test_groups_partition_the_devices_at_scale(w, n, width):
    plan = _split_plan(w, n, width)
    head = plan.taskgraphs[1]
    everything = set(head.all_devices)
    dp = [head.dp_group(j) for j in range(width)]
    split = [head.split_group(r) for r in range(plan.num_replicas)]
    for family in (dp, split):
        members = [d for g in family for d in g.devices]
        assert len(members) == len(set(members)) == len(everything) == w * n
    # every dp group meets every split group in exactly one device
    for g in dp[:3]:
        for s in split[:3]:
            assert len(set(g.devices) & set(s.devices)) == 1
    copies = [c for worker in range(w) for c in plan.copies_of(worker)]
    assert len(copies) == w * n
    assert len({(c.replica, c.position) for c in copies}) == w * n
    names = [g.name for tg in plan.taskgraphs for g in tg.groups]
    assert len(names) == len(set(names))


def test_sync_group_takes_one_device_per_worker_in_worker_order():
    worker_of = {"a0": 0, "a1": 0, "b0": 1, "c0": 2, "c1": 2}
    assert one_per_worker(("c1", "a1", "b0", "a0", "c0"), worker_of) == ("a1", "b0", "c1")


def test_lanes_are_independent_groups_over_the_same_devices():
    group = Group("tg/dp", "dp", None, ("a", "b"))
    lanes = group.lanes(3)
    assert [g.name for g in lanes] == ["tg/dp/lane0", "tg/dp/lane1", "tg/dp/lane2"]
    assert all(g.devices == group.devices for g in lanes) and group.lanes(1) == (group,)


def test_data_parallel_copies_and_host_group():
    plan = make_plan(Config(), workers(3, 2), [TaskGraphSpec("m", "replicate", 1)])
    assert [(c.index, c.replica, c.position) for c in plan.copies_of(1)] == [(0, 2, 0), (1, 3, 0)]
    assert plan.host_group.devices == tuple(dev(w, 0) for w in range(3))
    assert plan.taskgraphs[0].sync_group().devices == (dev(0, 0), dev(1, 0), dev(2, 0))


def test_pipeline_replicas_are_built_by_their_driver():
    specs = [TaskGraphSpec("s0", "replicate", 1), TaskGraphSpec("s1", "replicate", 1)]
    plan = make_plan(Config({"pipeline.num_micro_batch": 4}), workers(2, 1), specs)
    (copy,) = plan.copies_of(0)
    assert copy.devices == (dev(0, 0), dev(1, 0)) and plan.copies_of(1) == []
    assert plan.schedule.name == "PreferBackward" and plan.schedule.num_micro_batch == 4


def test_plan_cli_lists_groups_and_copies(capsys):
    from epl.plan_cli import main
    assert main(["--workers", "2", "--devices", "4", "--taskgraphs", "replicate:4,split:4",
                 "cluster.colocate_split_and_replicate=true"]) == 0
    out = capsys.readouterr().out
    assert "taskgraph_1/split/replica1: 4 device(s)" in out
    assert "worker 1 builds 4 copies: (replica 1, position 0)" in out
