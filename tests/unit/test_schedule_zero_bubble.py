"""ZeroBubble (ZB-H1) as data: W actions, its invariants, the timed simulation, the
validator's checks of split backwards, the command line and picture. No TensorFlow."""
import pytest

from epl.strategies.schedule import (Action, Schedule, ScheduleError, get_schedule,
                                     memory_units, peak_in_flight, prefer_backward,
                                     prefer_forward, split_stages, timed, validate,
                                     zero_bubble)
from epl.strategies.schedule.core import STAGE_MEMORY_BOUND
from epl.strategies.schedule.picture import main
from schedule_cli import assert_draws_png

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
    # every W of "stage" follows its B: the lowering runs them fused, as 1F1B does
    assert timed.makespan(zero_bubble(2, 4, memory="stage")) == 15


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


def test_split_stages_are_those_with_a_w_apart_from_its_b():
    """A W right after its own B is lowered fused with it; one W elsewhere splits the
    stage's whole backward."""
    assert split_stages(zero_bubble(3, 4)) == {1, 2}  # ZB-H1: stage s defers s Ws
    assert split_stages(zero_bubble(3, 4, "stage")) == frozenset()
    assert split_stages(prefer_backward(3, 4)) == frozenset()
    mixed = Schedule.parse("0F0 0F1 0B0 0W0 0B1 0W1\n1F0 1B0 1F1 1B1 1W0 1W1")
    assert split_stages(mixed) == {1}
    apart = Schedule.parse("0F0 0B0 0F1 0W0 0B1 0W1\n1F0 1B0 1W0 1F1 1B1 1W1")
    assert split_stages(apart) == {0}
    # a fused stage's W costs nothing, its B the whole backward
    times = timed.finish_times(mixed, timed.Costs(1, 2, 3))
    assert times[Action(0, "B", 0)][1] - times[Action(0, "B", 0)][0] == 5
    assert times[Action(0, "W", 0)][0] == times[Action(0, "W", 0)][1]
    assert times[Action(1, "W", 0)][1] - times[Action(1, "W", 0)][0] == 3


@pytest.mark.parametrize("stages,micro", SIZES + [(30, 30), (31, 40), (40, 40)])
def test_stage_memory_keeps_every_stage_within_the_bound(stages, micro):
    """The memory model counts a deferred W's activations and the output gradients B
    saves for it: "stage" defers a W only where 1.1x of the stage's own 1F1B peak
    allows (a stage holding 30 micro-batches or more; stage 0, which has no bubble to
    fill, never); ZB-H1 holds more on later
    stages and never more than 1F1B's pipeline peak of activations on stage 0."""
    one_f_one_b = memory_units(prefer_backward(stages, micro))
    assert one_f_one_b == peak_in_flight(prefer_backward(stages, micro))
    per_stage = zero_bubble(stages, micro, "stage")
    for s, (got, bound) in enumerate(zip(memory_units(per_stage), one_f_one_b)):
        assert got <= STAGE_MEMORY_BOUND * bound + 1e-9, (s, got, bound)
        assert (s in split_stages(per_stage)) == (s > 0 and min(stages - s, micro) >= 30), s
    assert timed.makespan(per_stage) <= timed.makespan(prefer_backward(stages, micro))
    zb_h1 = memory_units(zero_bubble(stages, micro))
    assert zb_h1[0] == one_f_one_b[0]


def test_stage_memory_gain_where_the_bound_allows_a_deferral():
    """What "stage" leaves of ZB-H1's gain (equal F, B and W): nothing below 30
    micro-batches on a stage, some beyond."""
    rows = {}
    for stages, micro in ((2, 8), (8, 32), (31, 40), (40, 40)):
        base = timed.makespan(prefer_backward(stages, micro))
        rows[(stages, micro)] = (timed.makespan(zero_bubble(stages, micro, "stage")) / base,
                                 timed.makespan(zero_bubble(stages, micro)) / base)
    assert rows[(2, 8)][0] == rows[(8, 32)][0] == 1.0
    assert rows[(31, 40)][0] == pytest.approx(209 / 210.0)  # stage 1 defers one W
    assert rows[(40, 40)][0] == pytest.approx(227 / 237.0)
    for per_stage, zb_h1 in rows.values():
        assert zb_h1 < per_stage


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
    assert_draws_png(tmp_path, "zb.png",
                     ["--stages", "2", "--micro-batches", "4", "--strategy", "ZeroBubble"])
