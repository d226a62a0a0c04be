"""benchmarks/cpu_allocator.py and its paired-steps driver (benchmarks/paired.py): the
order of steps, the per-pair ratio BFC / malloc and what a row shows."""
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def _load(name):
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(ROOT, "benchmarks", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


paired = _load("paired")
report = _load("cpu_allocator")


class _Server(object):
    def __init__(self, name, log, seconds):
        self.name, self.log, self.seconds = name, log, list(seconds)

    def step(self):
        self.log.append(self.name)
        if not self.seconds:
            raise RuntimeError("child %s died" % self.name)
        return self.seconds.pop(0), 7

    def finish(self):
        self.log.append("finish " + self.name)

    def close(self):
        self.log.append("close " + self.name)


def test_steps_alternate_a_b_b_a():
    log = []
    servers = [("malloc", _Server("A", log, [1, 2, 3])), ("bfc", _Server("B", log, [4, 5, 6]))]
    steps, faults = paired.alternate(servers, 3)
    assert log == ["A", "B", "B", "A", "A", "B"]
    assert steps == dict(malloc=[1, 2, 3], bfc=[4, 5, 6])
    assert faults == dict(malloc=[7, 7, 7], bfc=[7, 7, 7])


def test_each_process_names_its_allocator_explicitly():
    assert paired.allocator_env("malloc", {paired.BFC_VARIABLE: "1"})[paired.BFC_VARIABLE] == "0"
    assert paired.allocator_env("bfc", {})[paired.BFC_VARIABLE] == "1"


def test_a_row_gives_the_ratio_of_adjacent_steps_faults_and_peak_memory():
    # The machine slows down for the last two pairs: each pair's ratio stays 0.8.
    result = dict(steps=dict(malloc=[1.0, 1.0, 2.0, 2.0], bfc=[0.8, 0.8, 1.6, 1.6]),
                  faults=dict(malloc=[90000, 91000, 92000, 93000], bfc=[0, 0, 3, 0]),
                  load_before=[1.2, 1.0, 1.0], max_rss_mb=dict(malloc=2454.4, bfc=2065.4))
    summary = report.summary(result)
    assert abs(summary["ratio"] - 0.8) < 1e-9 and summary["count"] == 4
    row = report.row("dp2", result)
    assert row[:4] == ["mid", "dp2", "1.50", "1.20"]
    assert row[4] == "-20% (-20% to -20%)"
    assert row[5] == "92k / 0" and row[6] == "2454 / 2065" and row[7] == 4
    assert report.row("bert/dp2", result)[:2] == ["bert", "dp2"]


def test_rows_of_the_corpus_are_keyed_by_shape_and_merged(tmp_path):
    import json
    assert report.result_key("mid", "ga4") == "ga4"  # as before the corpus
    assert report.result_key("moe", "ga4") == "moe/ga4"
    assert sorted(["moe/plain", "pipe4", "plain", "bert/dp2"], key=report.row_order) == [
        "plain", "pipe4", "bert/dp2", "moe/plain"]
    old = dict(run=dict(command="old"), results={"plain": dict(steps={}), "dp2": dict(steps={})})
    (tmp_path / "cpu_allocator.json").write_text(json.dumps(old))
    fresh = {"plain": dict(steps={"new": 1}, run=0)}
    results, runs = report.merged(str(tmp_path), fresh, [dict(command="new")])
    assert results["plain"] is fresh["plain"] and results["dp2"]["run"] == 1
    assert runs == [dict(command="new"), dict(command="old")]


def test_a_pair_is_started_one_at_a_time_stepped_ended_and_always_stopped():
    log = []

    def start(name, seconds):
        def make():
            log.append("start " + name)
            return _Server(name, log, seconds)
        return make

    steps, _, servers = paired.run_pair([("a", start("A", [1, 2])), ("b", start("B", [3, 4]))], 2)
    assert log == ["start A", "start B", "A", "B", "B", "A",
                   "finish A", "finish B", "close A", "close B"]
    assert steps == dict(a=[1, 2], b=[3, 4]) and [n for n, _ in servers] == ["a", "b"]
    del log[:]
    with pytest.raises(RuntimeError):
        paired.run_pair([("a", start("A", [1])), ("b", start("B", []))], 2)
    assert log[-2:] == ["close A", "close B"]  # a child that fails stops both


def test_cpu_seconds_per_step_are_compared_per_pair_too():
    """Other processes stretch a step's wall time far more than its CPU time."""
    assert paired.cpu_ratio([2.0, 4.0, 3.0], [1.0, 2.0, 1.0]) == (2.0, (2.0, 3.0))
    assert paired.cpu_ratio([None], [1.0]) is None
    result = dict(steps=dict(malloc=[1.0, 1.0], bfc=[0.9, 0.9]), faults=dict(malloc=[1, 1],
                  bfc=[0, 0]), load_before=[1.0] * 3, max_rss_mb=dict(malloc=1.0, bfc=1.0),
                  cpu=dict(malloc=[2.0, 2.0], bfc=[1.9, 1.9]))
    assert report.row("plain", result)[9] == "-5% (-5% to -5%)"
