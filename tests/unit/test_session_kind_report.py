"""benchmarks/session_kind.py: the per-pair ratio of two session kinds (local / server
unless a row names another pair), in wall and CPU seconds, and how rows are keyed and
merged (benchmarks/paired.py's merge_rows)."""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import paired  # noqa: E402 (benchmarks/ is not a package)
import session_kind as report  # noqa: E402


def _result(kinds=None):
    # The machine slows down for the last two pairs: the wall ratio of each pair stays 1.1,
    # CPU seconds per step barely move.
    first, second = kinds or ("local", "server")
    result = dict(steps={first: [1.1, 1.1, 2.2, 2.2], second: [1.0, 1.0, 2.0, 2.0]},
                  cpu={first: [0.5, 0.5, 0.5, 0.5], second: [0.5, 0.5, 0.5, 0.5]},
                  load_before=[8.1, 8.0, 7.0], load_after=[9.0, 8.0, 7.0], run=0)
    if kinds:
        result["kinds"] = list(kinds)
    return result


def test_a_row_gives_the_wall_and_cpu_ratio_of_adjacent_steps():
    summary = report.summary(_result())
    assert abs(summary["ratio"] - 1.1) < 1e-9 and summary["count"] == 4
    assert summary["cpu"][0] == 1.0
    row = report.row("resnet/pipe4", _result())
    assert row[:4] == ["resnet", "pipe4", "local vs server", "1.650 / 1.500"]
    assert row[4] == "+10% (+10% to +10%)" and row[5] == "0.50 / 0.50"
    assert row[6] == "+0% (+0% to +0%)" and row[7] == 4 and row[8] == "8.1 / 9.0"


def test_another_pair_of_kinds_is_its_own_row():
    kinds = ("unpruned", "server")
    key = report.result_key("mid", "dp2u", kinds)
    assert key == "mid/dp2u/unpruned-server"
    assert report.result_key("mid", "dp2u", ("local", "server")) == "mid/dp2u"
    row = report.row(key, _result(kinds))
    assert row[:3] == ["mid", "dp2u", "unpruned vs server"]
    assert sorted([key, "resnet/pipe4", "mid/dp2u"], key=report.row_order) == [
        "mid/dp2u", key, "resnet/pipe4"]


def test_rows_not_run_again_are_merged_with_their_runs(tmp_path):
    old = dict(runs=[dict(command="old")],
               results={"mid/dp2u": _result(), "bert/pipe4": _result()})
    (tmp_path / "session_kind.json").write_text(json.dumps(old))
    fresh = {"mid/dp2u": _result()}
    results, runs = paired.merge_rows(report.common.read_results(str(tmp_path), "session_kind"),
                                      fresh, [dict(command="new")])
    assert results["mid/dp2u"] is fresh["mid/dp2u"] and results["bert/pipe4"]["run"] == 1
    assert runs == [dict(command="new"), dict(command="old")]
    described = [dict(r, date="d", git_revision="g", cpu_model="c", cpu_count=2, warmup=2)
                 for r in runs]
    text = report.markdown(results, described)
    assert "| bert | pipe4 | local vs server |" in text and "- Run 2: `old`" in text
