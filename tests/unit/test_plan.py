"""The plan: pure data from (config, cluster, TaskGraphs); no TF session."""
import pytest

from epl.cluster import Cluster
from epl.config import Config
from epl.parallel.plan import PlanError, TaskGraphSpec, make_plan

STAGES = [TaskGraphSpec("stage_0", "replicate", 1), TaskGraphSpec("stage_1", "replicate", 1)]
DP = [TaskGraphSpec("model", "replicate", 1)]


def local(n):
    return Cluster(devices_per_worker=n)


def workers(w, n):
    return Cluster(["127.0.0.1:%d" % (2000 + i) for i in range(w)], 0, n)


def cpu(i):
    return "/job:localhost/replica:0/task:0/device:CPU:%d" % i


def test_two_stages_on_four_devices():
    plan = make_plan(Config(), local(4), STAGES)
    assert plan.num_replicas == 2
    assert plan.taskgraphs[0].devices == ((cpu(0),), (cpu(2),))
    assert plan.taskgraphs[1].devices == ((cpu(1),), (cpu(3),))
    assert plan.stages == (0, 1) and not plan.pipeline
    assert "2 model replica(s)" in str(plan)


def test_pipeline_flag_needs_micro_batches():
    plan = make_plan(Config({"pipeline.num_micro_batch": 4}), local(2), STAGES)
    assert plan.pipeline and not plan.gradient_accumulation
    assert "2 stages, 4 micro-batch(es), schedule PreferBackward" in str(plan)


def test_gradient_accumulation_with_one_taskgraph():
    plan = make_plan(Config({"pipeline.num_micro_batch": 3}), local(1), DP)
    assert plan.gradient_accumulation and not plan.pipeline and plan.stages == ()


def test_data_parallel_on_four_devices():
    plan = make_plan(Config(), local(4), DP)
    assert plan.num_replicas == 4
    assert plan.taskgraphs[0].all_devices == tuple(cpu(i) for i in range(4))
    assert plan.replicas_of(0) == [0, 1, 2, 3]
    assert [c.devices for c in plan.copies_of(0)] == [(cpu(i),) for i in range(4)]


def test_stages_on_two_workers_with_one_device():
    plan = make_plan(Config(), workers(2, 1), STAGES)
    assert plan.num_replicas == 1
    assert plan.taskgraphs[0].devices == (("/job:worker/replica:0/task:0/device:CPU:0",),)
    assert plan.taskgraphs[1].devices == (("/job:worker/replica:0/task:1/device:CPU:0",),)
    assert plan.replicas_of(0) == [0] and plan.replicas_of(1) == []
    assert plan.drivers == [0] and not plan.spmd
    assert plan.workers_used_by(0) == [0, 1]


def test_data_parallel_across_workers_is_built_locally():
    plan = make_plan(Config(), workers(2, 2), DP)
    assert plan.replicas_of(0) == [0, 1] and plan.replicas_of(1) == [2, 3]
    assert plan.workers_used_by(1) == [1]


def test_impossible_layout_names_numbers():
    specs = [TaskGraphSpec("a", "replicate", 2)]
    with pytest.raises(PlanError, match="needs 2 devices.*has 3 devices"):
        make_plan(Config(), local(3), specs)


def test_no_taskgraphs():
    with pytest.raises(PlanError, match="no TaskGraphs"):
        make_plan(Config(), local(1), [])


def test_plans_compare_by_value():
    assert make_plan(Config(), local(4), STAGES) == make_plan(Config(), local(4), STAGES)
    assert make_plan(Config(), local(4), STAGES) != make_plan(Config(), local(4), DP)


def test_colocated_split_and_replicate():
    config = Config({"cluster.colocate_split_and_replicate": True})
    specs = [TaskGraphSpec("resnet", "replicate", 4), TaskGraphSpec("fc", "split", 4)]
    plan = make_plan(config, workers(2, 4), specs)
    assert plan.num_replicas == 2 and plan.colocated and plan.stages == ()
    assert plan.taskgraphs[0].devices == plan.taskgraphs[1].devices


def test_warns_when_fewer_micro_batches_than_stages(caplog):
    specs = STAGES + [TaskGraphSpec("stage_2", "replicate", 1)]
    make_plan(Config({"pipeline.num_micro_batch": 2}), local(3), specs)
    assert "smaller than the 3 pipeline stages" in caplog.text


@pytest.mark.parametrize("specs,devices,micro_batches,why", [
    (DP, 1, 1, "no pipeline stages"),
    (DP, 1, 4, "one stage (pipeline.num_micro_batch=4 accumulates gradients"),
    (STAGES, 2, 1, "2 stages but pipeline.num_micro_batch=1")])
def test_a_schedule_without_a_pipeline_warns(caplog, specs, devices, micro_batches, why):
    config = Config({"pipeline.strategy": "preferforward",
                     "pipeline.num_micro_batch": micro_batches})
    make_plan(config, local(devices), specs)
    assert "pipeline.strategy='PreferForward' has no effect" in caplog.text
    assert why in caplog.text


def test_a_schedule_with_a_pipeline_does_not_warn(caplog):
    config = Config({"pipeline.strategy": "PreferForward", "pipeline.num_micro_batch": 2})
    make_plan(config, local(2), STAGES)
    make_plan(Config(), local(1), DP)  # the default schedule says nothing either
    assert "has no effect" not in caplog.text


def test_512_devices_four_stages():
    specs = [TaskGraphSpec("s%d" % i, "replicate", 1) for i in range(4)]
    plan = make_plan(Config(), workers(64, 8), specs)
    assert plan.num_replicas == 128
    for replica in range(plan.num_replicas):
        assert len({plan.worker_of[tg.devices[replica][0]] for tg in plan.taskgraphs}) == 1
    assert sum(len(plan.replicas_of(w)) for w in range(64)) == 128


def test_plan_cli_prints_the_plan(capsys):
    from epl.plan_cli import main
    assert main(["--workers", "2", "--devices", "1", "--taskgraphs",
                 "replicate:1,replicate:1", "pipeline.num_micro_batch=4"]) == 0
    out = capsys.readouterr().out
    assert "2 worker(s) x 1 CPU device(s)" in out and "2 stages, 4 micro-batch(es)" in out
    assert "replica 0: /job:worker/replica:0/task:1/device:CPU:0" in out


HYBRID = [TaskGraphSpec("backbone", "replicate", 2), TaskGraphSpec("head", "split", 2)]


def test_default_placement_gives_each_taskgraph_its_own_devices():
    """The seeds' default (no colocate key): replicate(2) + split(2) on 4 devices is one
    replica of two copies; copy j runs position j of both TaskGraphs on different devices."""
    plan = make_plan(Config(), local(4), HYBRID)
    assert plan.num_replicas == 1 and plan.aligned and plan.stages == (0, 1)
    assert [c.devices for c in plan.copies_of(0)] == [(cpu(0), cpu(2)), (cpu(1), cpu(3))]
    assert [(c.replica, c.position) for c in plan.copies_of(0)] == [(0, 0), (0, 1)]
    assert plan.taskgraphs[1].split_group(0).devices == (cpu(2), cpu(3))
    text = str(plan)
    assert "replica 0 position 1: backbone@task:0/device:CPU:1 -> head@task:0/device:CPU:3" \
        in text
    assert plan.micro_batching is not None  # two copies on one worker


def test_stages_two_devices_wide_in_a_pipeline_on_two_workers():
    plan = make_plan(Config({"pipeline.num_micro_batch": 2}), workers(2, 4),
                     [TaskGraphSpec("s0", "replicate", 2), TaskGraphSpec("s1", "replicate", 2)])
    assert plan.pipeline and plan.num_replicas == 2
    assert [(c.replica, c.position) for c in plan.copies_of(1)] == [(1, 0), (1, 1)]
    assert plan.taskgraphs[0].dp_group().size == 4  # data parallelism over both replicas
    assert plan.schedule is not None


@pytest.mark.parametrize("kinds,devices,copies", [
    (("replicate", "split"), 3, [[(0, 1), (0, 2)]]),
    (("replicate", "replicate"), 3, [[(0, 1), (0, 2)]]),
    (("replicate", "split"), 6, [[(0, 1), (0, 2)], [(3, 4), (3, 5)]])])
def test_a_width_one_stage_runs_both_positions_of_a_width_two_stage(kinds, devices, copies):
    """replicate(1) then split(2) (the issue's case) or replicate(2): a replica is two
    copies, both running the narrow stage on its one device; with 6 devices, two
    replicas. The narrow stage's groups hold each device once."""
    specs = [TaskGraphSpec("s0", kinds[0], 1), TaskGraphSpec("s1", kinds[1], 2)]
    plan = make_plan(Config({"pipeline.num_micro_batch": 2}), local(devices), specs)
    assert plan.width == 2 and not plan.aligned and plan.pipeline
    assert [[(int(a[-1]), int(b[-1])) for a, b in (c.devices for c in plan.copies_of(0)
                                                   if c.replica == r)]
            for r in range(plan.num_replicas)] == copies
    assert plan.taskgraphs[0].dp_group().size == len(copies)
    text = str(plan)
    assert "replica 0 position 1: s0@task:0/device:CPU:0 -> s1@task:0/device:CPU:2" in text
    assert "2 positions of a replica per device" in text


def test_a_width_two_stage_feeds_a_width_one_stage():
    plan = make_plan(Config({"pipeline.num_micro_batch": 2}), local(3),
                     [TaskGraphSpec("s0", "replicate", 2), TaskGraphSpec("s1", "replicate", 1)])
    assert [c.devices for c in plan.copies_of(0)] == [(cpu(0), cpu(2)), (cpu(1), cpu(2))]


@pytest.mark.parametrize("specs,devices,why", [
    ((("replicate", 2), ("split", 1)), 3, r"split\(1\) does not"),
    ((("replicate", 2), ("replicate", 3)), 5, r"replicate\(2\) does not"),
    ((("split", 2), ("split", 4)), 6, r"split\(2\) does not")])
def test_widths_that_cannot_share_a_replica_are_refused_naming_what_works(specs, devices, why):
    """A split stage narrower than the replica (two shards' copies on one device), or a
    width that does not divide the widest: refused naming the widths, the rule and the
    equal widths the job holds."""
    specs = [TaskGraphSpec("s%d" % i, kind, width) for i, (kind, width) in enumerate(specs)]
    named = ", ".join(r"s%d: %s\(%d\)" % (i, s.kind, s.device_count)
                      for i, s in enumerate(specs))
    with pytest.raises(PlanError, match=named + ".*" + why + r".*Allowed: replicate\(a\) "
                       r"stages with a dividing.*On this job's %d devices" % devices):
        make_plan(Config({"pipeline.num_micro_batch": 2}), local(devices), specs)


def test_a_narrow_stage_whose_positions_two_workers_build_is_refused():
    """Column order puts replicate(2)'s devices on two workers: the two copies sharing
    the replicate(1) stage's device would be built by different workers."""
    config = Config({"pipeline.num_micro_batch": 2,
                     "cluster.device_place_prefer_intra_node": False})
    with pytest.raises(PlanError, match=r"TaskGraph 's1' \(replicate\(1\)\) runs 2 positions "
                                        r"of replica 0 on .* built by workers \[0, 1\].*"
                                        r"prefer_intra_node=True"):
        make_plan(config, workers(2, 3), [TaskGraphSpec("s0", "replicate", 2),
                                          TaskGraphSpec("s1", "replicate", 1)])


def test_different_widths_are_refused_colocated_and_with_zero():
    specs = [TaskGraphSpec("s0", "replicate", 1), TaskGraphSpec("s1", "replicate", 2)]
    with pytest.raises(PlanError, match=r"colocate_split_and_replicate=True all TaskGraphs "
                                        r"share one device group, so they need the same "
                                        r"device_count; got TaskGraph 0 \(s0\): 1"):
        make_plan(Config({"cluster.colocate_split_and_replicate": True}), local(4), specs)
    with pytest.raises(PlanError, match=r"zero.level='v1' is not supported with TaskGraphs "
                                        r"of different device_count \(s0: replicate\(1\)"):
        make_plan(Config({"zero.level": "v1", "pipeline.num_micro_batch": 2}), local(3), specs)


def test_a_layout_that_does_not_fit_names_the_colocate_key():
    specs = [TaskGraphSpec("a", "replicate", 3), TaskGraphSpec("b", "split", 3)]
    with pytest.raises(PlanError, match=r"needs 6 devices.*colocate_split_and_replicate=True "
                                        r"\(every TaskGraph of a replica on the same 3"):
        make_plan(Config(), local(3), specs)
    with pytest.raises(PlanError, match=r"device_count k in \[1, 2\] for every TaskGraph"):
        make_plan(Config(), local(4), [TaskGraphSpec("a", "replicate", 3),
                                       TaskGraphSpec("b", "split", 3)])


def test_plan_picture_shows_what_runs_on_each_device(tmp_path):
    """The layout picture lists, per device, each TaskGraph's replica and slice or shard:
    default placement gives every device one TaskGraph, colocation two; plan_cli --png
    draws it."""
    from epl.parallel import plan_picture
    from epl.plan_cli import main
    default, colocated, pipeline, widths = [plan for _, plan in plan_picture.docs_panels()]
    runs = plan_picture._what_runs(default)
    assert [text for _, text in runs[cpu(2)]] == ["head r0 shard 0"]
    assert [text for _, text in runs[cpu(5)]] == ["backbone r1 slice 1"]
    assert [text for _, text in plan_picture._what_runs(colocated)[cpu(3)]] == [
        "backbone r1 slice 1", "head r1 shard 1"]
    assert pipeline.pipeline and pipeline.num_replicas == 2
    worker1 = "/job:worker/replica:0/task:1/device:CPU:0"
    assert [text for _, text in plan_picture._what_runs(widths)[worker1]] == [
        "backbone r1 slice 0-1"]  # a width-1 stage runs both positions of its replica
    path = str(tmp_path / "plan.png")
    assert main(["--devices", "4", "--taskgraphs", "replicate:2,split:2", "--png", path]) == 0
    with open(path, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
