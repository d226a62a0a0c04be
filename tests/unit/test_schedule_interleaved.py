"""Interleaved stages (Megatron's interleaved 1F1B) as data: each device runs v virtual
stages, any number of devices (2 included) and any number of micro-batches. The order
validates and runs to the end, v = 1 is 1F1B, Megatron's own cases keep Megatron's
warm-up, and the timed simulation shows the bubble shrink by v. No TensorFlow."""
import os

import pytest

from epl.config import Config
from epl.parallel.plan import PlanError, TaskGraphSpec, make_plan
from epl.strategies.schedule import (Action, Schedule, ScheduleError, interleaved,
                                     prefer_backward, simulate, timed, to_grid, validate,
                                     zero_bubble)
from epl.strategies.schedule.interleaved import _row
from epl.strategies.schedule.picture import main
from schedule_cli import assert_draws_png

SIZES = [(s, m, v) for s in range(1, 6) for m in range(1, 12) for v in (2, 3)]


def _actions(text):
    return tuple(Action.parse(item) for item in text.split())


def test_two_devices_four_micro_batches_written_out():
    sched = interleaved(2, 4, 2)
    assert sched.num_virtual_stages == 2 and sched.model_stages == 4
    # device 0 runs virtual stages 0 and 2, device 1 runs 1 and 3 (TaskGraph t on t mod 2)
    assert sched.stage(0) == _actions("0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 "
                                      "2B2 2B3 0B2 0B3")
    assert sched.stage(1) == _actions("1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 "
                                      "3F3 3B3 1B2 1B3")
    grid = to_grid(sched)
    assert grid.splitlines()[0] == "Interleaved1F1B: 2 devices x 2 virtual stages x 4 " \
                                   "micro-batches"
    assert "device 1 |" in grid
    # each action is half a stage's work: 3M + 3(S - 1)/v with F = B = W = 1 (1F1B: 15)
    assert timed.makespan(sched) == 13.5 and timed.makespan(prefer_backward(2, 4)) == 15


@pytest.mark.parametrize("stages,micro,chunks", SIZES)
def test_every_size_validates_and_never_takes_longer_than_1f1b(stages, micro, chunks):
    sched = interleaved(stages, micro, chunks)
    validate(sched)
    for d in range(stages):
        row = sched.stage(d)
        assert sorted(set(a.stage for a in row)) == list(range(d, chunks * stages, stages))
        assert len(row) == 2 * chunks * micro
    assert timed.makespan(sched) <= timed.makespan(prefer_backward(stages, micro)) + 1e-9
    if micro % stages == 0 and stages > 1:
        # Megatron's case: its warm-up, and the bubble divided by v
        for d in range(stages):
            warm = next(i for i, a in enumerate(sched.stage(d)) if a.kind == "B")
            assert warm == min(chunks * micro, (chunks - 1) * stages + 2 * (stages - d - 1) + 1)
        assert timed.makespan(sched) == pytest.approx(3 * micro + 3.0 * (stages - 1) / chunks)


def test_docs_show_the_real_grid():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "pipeline_schedules.md")
    with open(path) as handle:
        assert to_grid(interleaved(2, 4, 2)) in handle.read()


def test_docs_simulator_table():
    """The simulated steps docs/pipeline_schedules.md shows for interleaved stages."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "pipeline_schedules.md")
    with open(path) as handle:
        docs = handle.read()
    for stages in (2, 4):
        for micro in (3, 4, 8, 16):
            base = timed.makespan(prefer_backward(stages, micro))
            cells = ["%g (%.3f)" % (t, t / float(base)) for t in (
                timed.makespan(zero_bubble(stages, micro)),
                timed.makespan(interleaved(stages, micro, 2)),
                timed.makespan(interleaved(stages, micro, 4)))]
            row = "| %d | %d | %g | %s |" % (stages, micro, base, " | ".join(cells))
            assert row in docs, row


def test_one_virtual_stage_is_1f1b():
    assert interleaved(3, 5, 1) == prefer_backward(3, 5)


def test_short_last_round_gets_the_warm_up_it_needs():
    """M not a multiple of S: Megatron's warm-up stalls at S = 5, M = 7, v = 2 and is
    slower than 1F1B at S = 3, M = 4, v = 2; the builder adds the fewest warm-up
    forwards that run and are no slower than 1F1B."""
    for stages, micro, stalls in ((5, 7, True), (3, 4, False)):
        megatron = Schedule("megatron", stages, micro,
                            [_row(stages, micro, 2, d, 0) for d in range(stages)], 2)
        if stalls:
            assert not simulate(megatron).complete
        else:
            assert timed.makespan(megatron) > timed.makespan(prefer_backward(stages, micro))
        sched = interleaved(stages, micro, 2)
        assert simulate(sched).complete
        assert timed.makespan(sched) <= timed.makespan(prefer_backward(stages, micro))
        warm_up = [sum(next(i for i, a in enumerate(s.stage(d)) if a.kind == "B")
                       for d in range(stages)) for s in (sched, megatron)]
        assert warm_up[0] > warm_up[1]


def test_validator_checks_rows_of_virtual_stages():
    wrong_row = Schedule("wrong", 2, 1, ["0F0 1F0 1B0 0B0", "3F0 2F0 2B0 3B0"], 2)
    with pytest.raises(ScheduleError, match="row holds 1F0"):
        validate(wrong_row)
    missing = Schedule("missing", 2, 1, ["0F0 2F0 2B0 0B0", "1F0 1B0"], 2)
    with pytest.raises(ScheduleError, match="never runs 3F0"):
        validate(missing)
    stuck = Schedule("stuck", 2, 1, ["0F0 2B0 2F0 0B0", "1F0 3F0 3B0 1B0"], 2)
    with pytest.raises(ScheduleError, match="2B0 runs before 2F0"):
        validate(stuck)


def test_command_line_and_picture(capsys, tmp_path):
    assert main(["--stages", "2", "--micro-batches", "4", "--virtual-stages", "2",
                 "--costs", "1,1,1"]) == 0
    out = capsys.readouterr().out
    assert "device 0 |" in out and "3B3" in out and "step time with costs F=1 B=1 W=1: 13.5" in out
    assert main(["--stages", "2", "--micro-batches", "4", "--virtual-stages", "2",
                 "--strategy", "ZeroBubble"]) == 2
    assert "--virtual-stages 2 needs --strategy PreferBackward" in capsys.readouterr().err
    assert_draws_png(tmp_path, "interleaved.png",
                     ["--stages", "2", "--micro-batches", "4", "--virtual-stages", "2"])


def _specs(count, kinds=None):
    return [TaskGraphSpec("stage_%d" % i, (kinds or {}).get(i, "replicate"), 1)
            for i in range(count)]


def _interleaved_plan(devices, count=4, micro_batches=4, **settings):
    settings.setdefault("pipeline.num_virtual_stages", 2)
    settings["pipeline.num_micro_batch"] = micro_batches
    return make_plan(Config(settings), _local(devices), _specs(count))


def test_plan_places_taskgraph_t_on_device_t_mod_s_and_interleaves():
    plan = _interleaved_plan(2, micro_batches=3)
    assert plan.num_replicas == 1 and plan.stages == (0, 1, 2, 3)
    assert [plan.device_of(t, 0, 0)[-1] for t in range(4)] == ["0", "1", "0", "1"]
    assert plan.schedule == interleaved(2, 3, 2)
    assert "interleaved: 2 devices x 2 virtual stages" in str(plan)
    two = _interleaved_plan(4, count=6, micro_batches=5, **{"pipeline.num_virtual_stages": 3})
    assert two.num_replicas == 2 and two.schedule == interleaved(2, 5, 3)
    assert [two.device_of(t, 1, 0)[-1] for t in range(6)] == ["2", "3"] * 3


@pytest.mark.parametrize("count,devices,settings,message", [
    (3, 4, {}, r"needs S \* 2 pipeline TaskGraphs .* has 3 TaskGraph"),
    (2, 2, {}, r"with S >= 2 devices per replica.* has 2 TaskGraph"),
    (4, 3, {}, r"places the 4 TaskGraphs on 2 devices per replica, and the job has 3"),
    (4, 2, {"pipeline.strategy": "ZeroBubble"}, r"pipeline.strategy='ZeroBubble'"),
    (4, 2, {"pipeline.strategy": "PreferForward"}, r"pipeline.strategy='PreferForward'"),
    (4, 2, {"zero.level": "v1"}, r"zero.level='v1'"),
    (4, 2, {"cluster.colocate_split_and_replicate": True}, r"colocate_split_and_replicate"),
])
def test_plan_refuses_what_interleaved_stages_do_not_lower(count, devices, settings, message):
    with pytest.raises(PlanError, match=r"pipeline.num_virtual_stages=2 .*" + message):
        _interleaved_plan(devices, count=count, **settings)


def test_plan_refuses_split_stages_with_virtual_stages():
    specs = _specs(4)
    specs[1] = TaskGraphSpec("stage_1", "split", 2)
    with pytest.raises(PlanError, match=r"every pipeline TaskGraph to be epl.replicate\(1\).*"
                                        r"stage_1: split\(2\)"):
        make_plan(Config({"pipeline.num_virtual_stages": 2, "pipeline.num_micro_batch": 4}),
                  _local(4), specs)


def _local(devices):
    from epl.cluster import Cluster
    return Cluster(devices_per_worker=devices)
