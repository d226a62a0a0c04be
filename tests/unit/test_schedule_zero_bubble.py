"""ZeroBubble (ZB-H1) as data: W actions, its invariants, the timed simulation, the
validator's checks of split backwards, the command line and picture. No TensorFlow."""
import os

import pytest

from epl.strategies.schedule import (Action, Schedule, ScheduleError, get_schedule,
                                     peak_in_flight, prefer_backward, prefer_forward, timed,
                                     validate, zero_bubble)
from epl.strategies.schedule.picture import main

SIZES = [(s, m) for s in range(1, 7) for m in range(1, 11)]


def _actions(text):
    return tuple(Action.parse(item) for item in text.split())


def test_w_actions_parse_and_print():
    assert Action.parse("12W10") == Action(12, "W", 10) and str(Action(1, "W", 3)) == "1W3"
    with pytest.raises(ScheduleError, match="'F', 'B' or 'W'"):
        Action(0, "X", 0)


def test_two_stages_four_micro_batches_written_out():
    sched = zero_bubble(2, 4)
    assert sched.stage(0) == _actions("0F0 0F1 0B0 0W0 0F2 0B1 0W1 0F3 0B2 0W2 0B3 0W3")
    assert sched.stage(1) == _actions("1F0 1B0 1F1 1B1 1W0 1F2 1B2 1W1 1F3 1B3 1W2 1W3")
    assert timed.makespan(sched) == 13 and timed.makespan(prefer_backward(2, 4)) == 15
    assert zero_bubble(2, 4, memory="stage").stage(1) == _actions(
        "1F0 1B0 1W0 1F1 1B1 1W1 1F2 1B2 1W2 1F3 1B3 1W3")
    assert timed.makespan(zero_bubble(2, 4, memory="stage")) == 14


@pytest.mark.parametrize("memory", ["pipeline", "stage"])
@pytest.mark.parametrize("stages,micro", SIZES)
def test_invariants(stages, micro, memory):
    sched = zero_bubble(stages, micro, memory)
    assert sched.splits_backward and sched.kinds() == ("F", "B", "W")
    validate(sched)
    for s in range(stages):
        row = sched.stage(s)
        assert len(row) == 3 * micro
        for kind in "FBW":
            assert [a.micro_batch for a in row if a.kind == kind] == list(range(micro))
        for m in range(micro):
            assert row.index(Action(s, "B", m)) < row.index(Action(s, "W", m))
    one_f_one_b = prefer_backward(stages, micro)
    # equal F, B, W: never slower than 1F1B; ZB-H1 saves 2(S - 1) units once M >= S
    assert timed.makespan(sched) <= timed.makespan(one_f_one_b)
    if memory == "pipeline" and micro >= stages:
        assert timed.makespan(sched) == 3 * (micro + stages - 1) - 2 * (stages - 1)
    # in flight from F to W: ZB-H1 holds the pipeline's 1F1B peak on every stage,
    # "stage" each stage's own 1F1B peak
    if memory == "pipeline":
        assert peak_in_flight(sched) == (min(stages, micro),) * stages
    else:
        assert peak_in_flight(sched) == peak_in_flight(one_f_one_b)


@pytest.mark.parametrize("stages,micro", SIZES)
def test_unit_costs_reproduce_the_slot_simulation_of_existing_schedules(stages, micro):
    """A fused backward costs B + W = 2 units: 1F1B and GPipe take 3(M + S - 1), the
    slot simulation's 2(M + S - 1) slots with each backward twice as long."""
    for sched in (prefer_backward(stages, micro), prefer_forward(stages, micro)):
        assert timed.makespan(sched) == 3 * (micro + stages - 1)
        assert timed.makespan(sched, timed.Costs(1, 0.5, 0.5)) == 2 * (micro + stages - 1)


def test_costs_and_ideal_speed_up():
    sched = zero_bubble(2, 4)
    assert timed.ideal_speedup(sched) == pytest.approx(24 / 13.0)
    assert timed.ideal_speedup(prefer_backward(2, 4)) == pytest.approx(24 / 15.0)
    times = timed.finish_times(sched, timed.Costs(2, 1, 1))
    assert times[Action(1, "F", 0)] == (2, 4) and times[Action(0, "W", 3)][1] == \
        timed.makespan(sched, timed.Costs(2, 1, 1))


def test_timed_simulation_names_a_stall():
    stalled = Schedule("stuck", 2, 1, ["0B0 0F0", "1F0 1B0"])
    with pytest.raises(ScheduleError, match="stalls"):
        timed.makespan(stalled)


@pytest.mark.parametrize("rows,message", [
    (["0F0 0W0 0B0", "1F0 1B0 1W0"], "0W0 runs before 0B0"),
    (["0F0 0B0", "1F0 1B0 1W0"], "stage 0 never runs 0W0"),
    (["0F0 0F1 0B0 0B1 0W1 0W0", "1F0 1B0 1W0 1F1 1B1 1W1"], "weight-gradient backwards must"),
])
def test_validator_explains_split_backward_mistakes(rows, message):
    sched = Schedule("broken", 2, max(len(r.split()) for r in rows) // 3, rows)
    with pytest.raises(ScheduleError) as info:
        validate(sched)
    assert message in str(info.value) and "[" in str(info.value)


def test_unknown_memory_option_is_refused():
    with pytest.raises(ScheduleError, match="'pipeline', 'stage'"):
        zero_bubble(2, 4, memory="device")
    with pytest.raises(ScheduleError, match="ZeroBubble"):
        get_schedule("zerobubbles", 2, 4)
    assert get_schedule("zerobubble", 2, 4, memory="stage") == zero_bubble(2, 4, "stage")


def test_command_line_prints_grid_and_step_time(capsys, tmp_path):
    assert main(["--stages", "2", "--micro-batches", "4", "--strategy", "ZeroBubble",
                 "--costs", "1,1,1"]) == 0
    out = capsys.readouterr().out
    assert "0W0" in out and "step time with costs F=1 B=1 W=1: 13" in out
    assert main(["--stages", "2", "--micro-batches", "4", "--costs", "1,x"]) == 2
    assert "--costs must be three positive numbers" in capsys.readouterr().err
    pytest.importorskip("matplotlib")
    path = str(tmp_path / "zb.png")
    assert main(["--stages", "2", "--micro-batches", "4", "--strategy", "ZeroBubble",
                 "--png", path]) == 0
    assert os.path.getsize(path) > 0
