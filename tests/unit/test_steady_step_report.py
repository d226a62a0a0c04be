"""benchmarks/steady_step.py compares the two pipeline lowerings by pairs of steps
taken next to each other in time: the ratio of each pair, their median and
interquartile range, and the median per process pair, with each lowering's page
faults per step and the CPU allocator of the row; ``--merge`` keeps rows of other
micro-batch counts and allocators but drops rows of the earlier unpaired method."""
import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "steady_step.py")
_SPEC = importlib.util.spec_from_file_location("steady_step", SCRIPT)
steady = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(steady)


def _pair(functions, unrolled, load=1.0, faults=None):
    pair = dict(steps=dict(stage_functions=functions, unrolled=unrolled),
                load_before=[load, load, load], first_step=dict(stage_functions=1.0, unrolled=2.0))
    if faults is not None:
        pair["faults"] = faults
    return pair


def test_ratios_are_taken_per_pair_of_adjacent_steps():
    # Both processes are twice as slow in the second half (a slow period of the
    # machine): each ratio of adjacent steps stays 1.1, whatever the period.
    result = dict(run=0, pairs=[_pair([1.1, 2.2, 1.1, 2.2], [1.0, 2.0, 1.0, 2.0]),
                                _pair([3.3, 3.3], [3.0, 3.0])])
    summary = steady.summary(result)
    assert abs(summary["ratio"] - 1.1) < 1e-9
    assert [round(q, 9) for q in summary["quartiles"]] == [1.1, 1.1]
    assert [round(r, 9) for r in summary["pair_ratios"]] == [1.1, 1.1]
    assert summary["count"] == 6
    assert summary["median"] == dict(stage_functions=2.2, unrolled=2.0)
    row = steady.row("16", result)
    assert row[:4] == ["mid", "pipe", 16, "malloc"]
    assert row[6] == "+10% (+10% to +10%)" and row[7] == "+10% +10%"
    assert row[8] == "not recorded"  # rows from before faults were counted
    assert row[-1] == "not recorded"  # nor CPU seconds
    result["pairs"][0]["cpu"] = dict(stage_functions=[2.2, 2.2], unrolled=[2.0, 2.0])
    assert steady.row("16", result)[-1] == "+10% (+10% to +10%)"


def test_faults_are_each_lowerings_median_per_step():
    result = dict(run=0, pairs=[
        _pair([1.0, 1.0], [1.0, 1.0], faults=dict(stage_functions=[50000, 60000],
                                                  unrolled=[1000, 30000])),
        _pair([1.0], [1.0], faults=dict(stage_functions=[52000], unrolled=[2000]))])
    assert steady.summary(result)["faults"] == dict(stage_functions=52000, unrolled=2000)
    assert steady.row("4:bfc", result)[:4] == ["mid", "pipe", 4, "bfc"]
    assert steady.row("4:bfc", result)[8] == "52k / 2k"


def test_rows_are_keyed_by_shape_mode_count_and_allocator():
    assert steady.result_key(32, "malloc") == "32"  # as before the allocator was a choice
    assert steady.parse_key(steady.result_key(32, "bfc")) == (32, "bfc")
    assert sorted(["4:bfc", "16", "4"], key=steady.row_order) == ["4", "4:bfc", "16"]
    key = steady.result_key(4, "bfc", "bert", "dp")  # the corpus's other rows
    assert key == "bert/dp/4:bfc" and steady.parse_key(key) == (4, "bfc")
    assert steady.parse_shape(key) == ("bert", "dp") and steady.parse_shape("4") == ("mid", "pipe")
    assert sorted([key, "bert/pipe/4", "16"], key=steady.row_order) == [
        "16", "bert/pipe/4", key]


def test_each_row_names_its_allocator_whatever_the_caller_set(monkeypatch):
    """Explicitly 0 or 1: with the variable unset, epl.init would choose BFC itself."""
    monkeypatch.setenv(steady.BFC_VARIABLE, "1")  # a caller's own setting
    assert steady.child_env("malloc")[steady.BFC_VARIABLE] == "0"
    monkeypatch.delenv(steady.BFC_VARIABLE)
    assert steady.child_env("malloc")[steady.BFC_VARIABLE] == "0"
    assert steady.child_env("bfc")[steady.BFC_VARIABLE] == "1"


def test_quartiles_of_an_odd_count():
    assert steady.quartiles([5, 1, 4, 2, 3]) == (2, 4)


def test_merge_keeps_paired_rows_of_other_counts_and_drops_unpaired_ones(tmp_path):
    old_runs = [dict(command="old run a"), dict(command="old run b")]
    old = dict(runs=old_runs, results={
        "4": dict(run=0, stage_functions=[dict(median=1.0)], unrolled=[dict(median=1.0)]),
        "32": dict(run=1, pairs=[_pair([8.0], [7.5])]),
        "16": dict(run=0, pairs=[_pair([4.0], [4.0])])})
    (tmp_path / "steady_step.json").write_text(json.dumps(old))
    new = {"16": dict(run=0, pairs=[_pair([3.9], [4.0])]),
           "16:bfc": dict(run=0, pairs=[_pair([3.8], [4.0])])}
    results, runs = steady.merged(str(tmp_path), new, [dict(command="this run")])
    assert sorted(results, key=steady.row_order) == ["16", "16:bfc", "32"]
    assert results["16"] is new["16"]  # this run's row wins over the JSON's
    assert results["32"]["run"] == 1 and runs == [dict(command="this run"), old_runs[1]]
