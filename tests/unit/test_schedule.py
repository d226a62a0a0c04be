"""Unit tests for epl.strategies.schedule: pipeline schedules as pure data.

Golden files pin the exact per-stage orders; invariant tests check the properties every
schedule of both strategies must have over many (S, M); validator tests check that each
kind of broken schedule is explained with a marked grid.
"""
import difflib
import fractions
import os
import pickle
import subprocess
import sys

import pytest

from epl.strategies.schedule import (PREFER_BACKWARD, PREFER_FORWARD, Action, Schedule,
                                     ScheduleError, bubble_fraction, dependencies,
                                     get_schedule, main, peak_in_flight, prefer_backward,
                                     prefer_forward, save_png, simulate, to_grid, validate)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO_ROOT, "tests", "fixtures", "schedules")
STRATEGIES = (PREFER_BACKWARD, PREFER_FORWARD)
GOLDEN_STRATEGIES = STRATEGIES + ("ZeroBubble",)
GOLDEN_SIZES = ((2, 4), (3, 3), (4, 8), (2, 1), (3, 2))
SIZES = [(s, m) for s in range(1, 7) for m in range(1, 11)]


def _actions(text):
    return tuple(Action.parse(item) for item in text.split())


# ----------------------------------------------------------------------------- golden files

@pytest.mark.parametrize("strategy", GOLDEN_STRATEGIES)
@pytest.mark.parametrize("stages,micro", GOLDEN_SIZES)
def test_golden_schedule(strategy, stages, micro):
    path = os.path.join(FIXTURES, "%s_%dx%d.txt" % (strategy, stages, micro))
    with open(path) as f:
        expected = f.read()
    actual = get_schedule(strategy, stages, micro).compact() + "\n"
    if actual != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                            "golden " + path, "generated"))
        pytest.fail("%s schedule for S=%d, M=%d differs from its golden file. If the change "
                    "is intended, regenerate with\n  python -m epl.strategies.schedule "
                    "--stages %d --micro-batches %d --strategy %s --compact > %s\n%s"
                    % (strategy, stages, micro, stages, micro, strategy, path, diff))
    assert Schedule.parse(expected, name=strategy) == get_schedule(strategy, stages, micro)


def test_golden_files_are_exactly_the_expected_set():
    expected = {"%s_%dx%d.txt" % (st, s, m) for st in GOLDEN_STRATEGIES
                for s, m in GOLDEN_SIZES}
    assert set(os.listdir(FIXTURES)) == expected


def test_spec_examples_written_out():
    sched = prefer_backward(4, 8)
    assert sched.stage(0) == _actions("0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 "
                                      "0B4 0B5 0B6 0B7")
    assert sched.stage(3) == _actions("3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 "
                                      "3F6 3B6 3F7 3B7")
    assert prefer_forward(2, 3).stage(1) == _actions("1F0 1F1 1F2 1B0 1B1 1B2")


# ----------------------------------------------------------------------------- invariants

@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("stages,micro", SIZES)
def test_invariants(strategy, stages, micro):
    sched = get_schedule(strategy, stages, micro)
    assert (sched.name, sched.num_stages, sched.num_micro_batch) == (strategy, stages, micro)
    timeline = validate(sched)
    assert timeline.complete and timeline == simulate(sched)
    for s in range(stages):
        row = sched.stage(s)
        assert len(row) == 2 * micro
        assert all(a.stage == s for a in row)
        forwards = [a.micro_batch for a in row if a.kind == "F"]
        backwards = [a.micro_batch for a in row if a.kind == "B"]
        assert forwards == list(range(micro)) and backwards == list(range(micro))
        assert all(row.index(Action(s, "F", m)) < row.index(Action(s, "B", m))
                   for m in range(micro))
    assert timeline.makespan == 2 * (micro + stages - 1)
    assert bubble_fraction(sched) == fractions.Fraction(stages - 1, micro + stages - 1)
    if strategy == PREFER_BACKWARD:
        assert peak_in_flight(sched) == tuple(min(stages - s, micro) for s in range(stages))
    else:
        assert peak_in_flight(sched) == (micro,) * stages


@pytest.mark.parametrize("stages,micro", SIZES)
def test_1f1b_never_holds_more_than_gpipe(stages, micro):
    one_f_one_b = peak_in_flight(prefer_backward(stages, micro))
    gpipe = peak_in_flight(prefer_forward(stages, micro))
    assert all(a <= b for a, b in zip(one_f_one_b, gpipe))


def test_timeline_respects_dependencies_and_one_action_per_slot():
    sched = prefer_backward(5, 7)
    finished = {}
    for t, slot in enumerate(simulate(sched).slots):
        assert len(slot) == 5
        for s, action in enumerate(slot):
            if action is not None:
                assert action.stage == s
                assert all(finished[dep] < t for dep in dependencies(action, 5))
                finished[action] = t
    assert len(finished) == 2 * 5 * 7


def test_simulation_of_small_1f1b_written_out():
    a = Action.parse
    assert simulate(prefer_backward(2, 2)).slots == (
        (a("0F0"), None), (a("0F1"), a("1F0")), (None, a("1B0")),
        (a("0B0"), a("1F1")), (None, a("1B1")), (a("0B1"), None))


def test_dependencies():
    assert dependencies(Action(0, "F", 2), 3) == ()
    assert dependencies(Action(2, "F", 2), 3) == (Action(1, "F", 2),)
    assert dependencies(Action(2, "B", 1), 3) == (Action(2, "F", 1),)
    assert dependencies(Action(0, "B", 1), 3) == (Action(0, "F", 1), Action(1, "B", 1))


# ----------------------------------------------------------------------------- Action

@pytest.mark.parametrize("text,expected", [
    ("1F3", Action(1, "F", 3)), ("0B0", Action(0, "B", 0)), ("12B10", Action(12, "B", 10)),
    ("105F2048", Action(105, "F", 2048))])
def test_action_parse_and_str_round_trip(text, expected):
    assert Action.parse(text) == expected
    assert str(expected) == text
    assert Action.parse(str(expected)) == expected


@pytest.mark.parametrize("text", ["", "1F", "F3", "13", "1X3", "1f3", "01F3", "1F03", " 1F3",
                                  "1F3 ", "1F3x", "-1F3", "1FB3", "1 F 3", "1F3\n", "\u0661F3"])
def test_action_parse_rejects_malformed_text(text):
    with pytest.raises(ScheduleError) as info:
        Action.parse(text)
    assert repr(text) in str(info.value)
    assert "<stage><F|B|W><micro_batch>" in str(info.value)


@pytest.mark.parametrize("value", [13, None, b"1F3"])
def test_action_parse_rejects_non_strings(value):
    with pytest.raises(ScheduleError, match="cannot parse action"):
        Action.parse(value)


@pytest.mark.parametrize("args,word", [
    ((-1, "F", 0), "stage"), ((True, "F", 0), "stage"), ((0, "X", 0), "kind"),
    ((0, "f", 0), "kind"), ((0, "F", 1.0), "micro_batch"), ((0, "F", -2), "micro_batch")])
def test_action_rejects_bad_fields(args, word):
    with pytest.raises(ScheduleError, match=word):
        Action(*args)


def test_action_is_an_immutable_hashable_record():
    action = Action(1, "F", 3)
    assert (action.stage, action.kind, action.micro_batch) == (1, "F", 3)
    assert len({action, Action(1, "F", 3), Action(1, "B", 3)}) == 2
    with pytest.raises(AttributeError):
        action.stage = 2
    assert pickle.loads(pickle.dumps(action)) == action
    assert isinstance(ScheduleError("x"), ValueError)


# ----------------------------------------------------------------------------- Schedule

@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("stages,micro", [(1, 1), (1, 5), (4, 8), (6, 10), (11, 12)])
def test_schedule_compact_parse_round_trip(strategy, stages, micro):
    sched = get_schedule(strategy, stages, micro)
    text = sched.compact()
    assert len(text.splitlines()) == stages
    assert Schedule.parse(text, name=strategy) == sched
    assert Schedule.parse(text + "\n\n", name=strategy) == sched
    assert Schedule.parse(text).name == "parsed"


def test_schedule_parse_explicit_micro_batches_and_errors():
    parsed = Schedule.parse("0F0 0B0", name="x", num_micro_batch=2)
    assert parsed.num_micro_batch == 2
    with pytest.raises(ScheduleError, match="without actions"):
        Schedule.parse(" \n\n")
    with pytest.raises(ScheduleError, match="'0F0,'"):
        Schedule.parse("0F0, 0B0")
    with pytest.raises(ScheduleError, match="needs a string"):
        Schedule.parse(None)


def test_schedule_value_semantics_and_immutability():
    a = prefer_backward(3, 4)
    b = Schedule("PreferBackward", 3, 4, [[str(x) for x in row] for row in a.stages])
    c = Schedule("PreferBackward", 3, 4, [" ".join(str(x) for x in row) for row in a.stages])
    assert a == b == c and hash(a) == hash(b) == hash(c) and len({a, b, c}) == 1
    assert a != prefer_forward(3, 4) and a != Schedule("other", 3, 4, a.stages)
    assert a != a.stages and a != a.compact()
    assert isinstance(a.stages, tuple) and all(isinstance(row, tuple) for row in a.stages)
    with pytest.raises(AttributeError, match="immutable"):
        a.name = "x"
    with pytest.raises(AttributeError):
        del a.stages
    assert pickle.loads(pickle.dumps(a)) == a
    assert repr(a) == "<Schedule PreferBackward: 3 stages x 4 micro-batches>"
    assert str(a) == to_grid(a)


@pytest.mark.parametrize("index", [-1, 3, True, "0", None])
def test_schedule_stage_rejects_bad_index(index):
    with pytest.raises(ScheduleError, match=r"0\.\.2"):
        prefer_forward(3, 2).stage(index)


@pytest.mark.parametrize("args,match", [
    (("", 1, 1, [["0F0", "0B0"]]), "name"),
    (("x", 0, 1, []), "num_stages must be an integer >= 1, got 0"),
    (("x", 1, 0, [[]]), "num_micro_batch must be an integer >= 1, got 0"),
    (("x", 2, 1, [["0F0", "0B0"]]), "1 stage rows but num_stages=2"),
    (("x", 1, 1, [["0F0", "zz"]]), "'zz'"),
])
def test_schedule_constructor_errors(args, match):
    with pytest.raises(ScheduleError, match=match):
        Schedule(*args)


# ----------------------------------------------------------------------------- get_schedule

@pytest.mark.parametrize("name,expected", [
    ("PreferBackward", PREFER_BACKWARD), ("preferbackward", PREFER_BACKWARD),
    ("PREFERBACKWARD", PREFER_BACKWARD), ("PreferForward", PREFER_FORWARD),
    ("preferForward", PREFER_FORWARD)])
def test_get_schedule_names_are_case_insensitive(name, expected):
    sched = get_schedule(name, 3, 5)
    assert sched.name == expected
    assert sched == (prefer_backward if expected == PREFER_BACKWARD else prefer_forward)(3, 5)


@pytest.mark.parametrize("name", ["1F1B", "GPipe", "", " PreferBackward", None, 3])
def test_get_schedule_rejects_unknown_names(name):
    with pytest.raises(ScheduleError) as info:
        get_schedule(name, 2, 2)
    message = str(info.value)
    assert repr(name) in message and "PreferBackward" in message and "PreferForward" in message


@pytest.mark.parametrize("builder", [prefer_backward, prefer_forward,
                                     lambda s, m: get_schedule("PreferBackward", s, m)])
@pytest.mark.parametrize("stages,micro,label,value", [
    (0, 2, "num_stages", "0"), (-1, 2, "num_stages", "-1"), (True, 2, "num_stages", "True"),
    (2.0, 2, "num_stages", "2.0"), ("3", 2, "num_stages", "'3'"),
    (2, 0, "num_micro_batch", "0"), (2, None, "num_micro_batch", "None")])
def test_bad_counts_are_rejected(builder, stages, micro, label, value):
    with pytest.raises(ScheduleError) as info:
        builder(stages, micro)
    assert str(info.value) == "%s must be an integer >= 1, got %s" % (label, value)


# ----------------------------------------------------------------------------- validate

def _error(rows, num_micro_batch=2):
    sched = Schedule("broken", len(rows), num_micro_batch, rows)
    with pytest.raises(ScheduleError) as info:
        validate(sched)
    return str(info.value)


def _assert_marked_grid(message, *marked):
    assert "broken: " in message and "stage 0 |" in message and "stage 1 |" in message
    for action in marked:
        assert "[%s]" % action in message
    assert message.count("[") - message.count("[like this]") >= len(marked)


def test_validate_reports_missing_action():
    message = _error(["0F0 0F1 0B0", "1F0 1B0 1F1 1B1"])
    assert "stage 0 never runs 0B1" in message and "exactly once" in message
    _assert_marked_grid(message, "0B1")
    assert "<- [0B1] missing" in message


def test_validate_reports_duplicate_action():
    message = _error(["0F0 0F1 0B0 0B1 0B1", "1F0 1B0 1F1 1B1"])
    assert "0B1 appears 2 times on stage 0" in message and "exactly once" in message
    _assert_marked_grid(message, "0B1")


def test_validate_reports_action_in_wrong_row():
    message = _error(["0F0 0F1 0B0 0B1", "1F0 0B0 1F1 1B1"])
    assert "stage 1's row holds 0B0, an action of stage 0" in message
    _assert_marked_grid(message, "0B0")


def test_validate_reports_micro_batch_out_of_range():
    message = _error(["0F0 0F1 0B0 0B1 0F2", "1F0 1B0 1F1 1B1"])
    assert "holds 0F2, but the schedule has only 2 micro-batches (0..1)" in message
    _assert_marked_grid(message, "0F2")


def test_validate_reports_backward_before_forward():
    message = _error(["0B0 0F0 0F1 0B1", "1F0 1B0 1F1 1B1"])
    assert "on stage 0, 0B0 runs before 0F0" in message and "needs the activations" in message
    _assert_marked_grid(message, "0B0")


@pytest.mark.parametrize("rows,bad,previous,label", [
    (["0F1 0F0 0B0 0B1", "1F0 1B0 1F1 1B1"], "0F0", "0F1", "forwards"),
    (["0F0 0F1 0B0 0B1", "1F0 1F1 1B1 1B0"], "1B0", "1B1", "backwards")])
def test_validate_reports_decreasing_micro_batch_order(rows, bad, previous, label):
    message = _error(rows)
    assert "%s comes after %s" % (bad, previous) in message
    assert "%s must run in increasing micro-batch order" % label in message
    assert "same order" in message
    _assert_marked_grid(message, bad)


def test_validate_reports_deadlock_with_what_each_stage_waits_for():
    # Stage 0 wants B0 before F1, stage 1 wants F1 before B0: each waits for the other.
    message = _error(["0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1"])
    assert "deadlock after 2 slots" in message
    assert "stage 0 waits at 0B0 for 1B0, which stage 1 only runs after 1F1" in message
    assert "stage 1 waits at 1F1 for 0F1, which stage 0 only runs after 0B0" in message
    _assert_marked_grid(message, "0B0", "1F1")
    assert "not run" in message and "STALLED after 2 slots: 6 of 8 actions" in message


def test_deadlock_in_longer_pipeline_is_found():
    rows = [" ".join(str(a) for a in row) for row in prefer_backward(3, 4).stages]
    rows[2] = "2F0 2F1 2B0 2B1 2F2 2B2 2F3 2B3"   # last stage needs F1 before returning B0
    rows[0] = "0F0 0B0 0F1 0B1 0F2 0B2 0F3 0B3"   # ... which stage 0 only sends after B0
    message = _error(rows, num_micro_batch=4)
    assert "deadlock" in message and "[0B0]" in message


def test_validate_accepts_unpipelined_but_valid_order():
    # Stage 0 runs B0 before F1 and stage 1 does the same: slow, but it completes.
    sched = Schedule("serial", 2, 2, ["0F0 0B0 0F1 0B1", "1F0 1B0 1F1 1B1"])
    timeline = validate(sched)
    assert timeline.complete and timeline.makespan == 8


def test_validate_rejects_non_schedule():
    with pytest.raises(ScheduleError, match="needs a Schedule"):
        validate("0F0 0B0")


def test_simulate_reports_stall_without_raising():
    timeline = simulate(Schedule("x", 2, 1, ["0B0 0F0", "1F0 1B0"]))
    assert not timeline.complete and timeline.slots == ()
    assert timeline.blocked == (Action(0, "B", 0), Action(1, "F", 0))
    with pytest.raises(ScheduleError, match="stalls"):
        bubble_fraction(Schedule("x", 2, 1, ["0B0 0F0", "1F0 1B0"]))


# ----------------------------------------------------------------------------- grid

EXPECTED_2X2_GRID = """\
PreferBackward: 2 stages x 2 micro-batches
slot    |  0    1    2    3    4    5
stage 0 | 0F0  0F1   .   0B0   .   0B1
stage 1 |  .   1F0  1B0  1F1  1B1   .
6 slots, bubble fraction (idle cells / all cells) = 4/12 = 33.3%"""


def test_grid_written_out():
    assert to_grid(prefer_backward(2, 2)) == EXPECTED_2X2_GRID
    assert str(prefer_backward(2, 2)) == EXPECTED_2X2_GRID


def test_grid_mark_keeps_columns_aligned():
    plain = to_grid(prefer_backward(2, 2)).splitlines()
    marked = to_grid(prefer_backward(2, 2), mark=Action(1, "B", 0)).splitlines()
    assert "[1B0]" in marked[3] and [len(x) for x in marked] == [len(x) for x in plain]
    assert to_grid(prefer_backward(2, 2), mark="1B0") == "\n".join(marked)
    several = to_grid(prefer_backward(2, 2), mark=["0F0", "9F0"])
    assert "[0F0]" in several and "marked [9F0]: not in this schedule" in several
    wrong_row = Schedule("x", 2, 1, ["0F0 0B0", "1F0 5B0"])
    grid = to_grid(wrong_row, mark="5B0")
    assert "[5B0]" in grid and "not in this schedule" not in grid
    message = _error(["0F0 0B0", "1F0 5B0"], num_micro_batch=1)
    assert "stage 1's row holds 5B0, an action of stage 5" in message and "[5B0]" in message


def test_schedule_without_actions_is_reported_not_crashing(tmp_path):
    empty = Schedule("empty", 1, 1, [[]])
    assert to_grid(empty).endswith("0 slots: the schedule has no actions")
    with pytest.raises(ScheduleError, match="no actions"):
        bubble_fraction(empty)
    assert "stage 0 never runs 0F0" in _error([[]], num_micro_batch=1)
    pytest.importorskip("matplotlib")
    assert os.path.getsize(save_png(empty, str(tmp_path / "empty.png"))) > 0


def test_grid_columns_are_fixed_width_with_multi_digit_labels():
    sched = prefer_forward(11, 12)
    slots = simulate(sched).slots
    lines = to_grid(sched).splitlines()
    assert lines[2].startswith("stage 0  |  0F0 ") and lines[-2].startswith("stage 10 |")
    width = len(" 10B11 ")   # longest action text plus one space each side
    start = len("stage 10 |")
    for s, line in enumerate(lines[2:-1]):
        cells = [line[start + t * width:start + (t + 1) * width] for t in range(len(slots))]
        assert [c.strip() for c in cells] == [str(slot[s]) if slot[s] else "." for slot in slots]
    header = lines[1][start:]
    assert [header[t * width:(t + 1) * width].strip() for t in range(len(slots))] == [
        str(t) for t in range(len(slots))]
    assert lines[-1].startswith("44 slots")


def test_docs_show_the_real_4x8_grid():
    with open(os.path.join(REPO_ROOT, "docs", "pipeline_schedules.md")) as f:
        assert to_grid(prefer_backward(4, 8)) in f.read()


# ----------------------------------------------------------------------------- picture and CLI

def test_save_png_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = str(tmp_path / "s.png")
    assert save_png(prefer_backward(3, 4), path) == path
    with open(path, "rb") as f:
        data = f.read()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 2000


def test_save_png_draws_a_stalled_schedule(tmp_path):
    pytest.importorskip("matplotlib")
    path = save_png(Schedule("x", 2, 2, ["0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1"]),
                    str(tmp_path / "stalled.png"))
    assert os.path.getsize(path) > 0


def test_main_prints_grid(capsys, tmp_path):
    assert main(["--stages", "4", "--micro-batches", "8", "--strategy", "PreferBackward"]) == 0
    assert capsys.readouterr().out == to_grid(prefer_backward(4, 8)) + "\n"
    assert main(["--stages", "2", "--micro-batches", "4", "--strategy", "preferforward",
                 "--compact"]) == 0
    assert capsys.readouterr().out == prefer_forward(2, 4).compact() + "\n"


def test_main_saves_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = str(tmp_path / "out.png")
    assert main(["--stages", "2", "--micro-batches", "3", "--png", path]) == 0
    assert "saved %s" % path in capsys.readouterr().out and os.path.getsize(path) > 0


@pytest.mark.parametrize("argv,message", [
    (["--stages", "2", "--micro-batches", "3", "--strategy", "GPipe"], "'GPipe'"),
    (["--stages", "0", "--micro-batches", "3"], "num_stages must be an integer >= 1")])
def test_main_reports_errors(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_module_runs_as_script_without_tensorflow_or_matplotlib():
    code = ("import sys, runpy; sys.argv = ['x', '--stages', '3', '--micro-batches', '2'];\n"
            "try:\n    runpy.run_module('epl.strategies.schedule', run_name='__main__')\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\n"
            "assert 'tensorflow' not in sys.modules and 'matplotlib' not in sys.modules\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == to_grid(prefer_backward(3, 2)) + "\n"
