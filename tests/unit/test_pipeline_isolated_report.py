"""benchmarks/pipeline_isolated.py (``pipeline.py --isolated``): the F, B and W times it
reads from traced steps (stage-function calls only: not the host tracer's stubs, not
the calls' Send/Recv nodes), the simulator run with those per-stage costs, and the table."""
import argparse
import importlib.util
import os
import sys
from types import SimpleNamespace as Proto

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
_SPEC = importlib.util.spec_from_file_location(
    "pipeline_isolated", os.path.join(ROOT, "benchmarks", "pipeline_isolated.py"))
isolated = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(isolated)


def _trace(calls):
    """A RunMetadata-shaped object whose worker device ran ``calls`` ({node: micros})
    (the fields action_ms reads; no TensorFlow in unit tests)."""
    node = lambda name, micros: Proto(node_name=name, all_end_rel_micros=micros)
    worker = [node(name, micros) for name, micros in calls.items()]
    worker.append(node("EPL_MICRO_BATCH_0/EPL_stage1_backward0_S14", 10 ** 6))  # a _Send
    host = [node(name, 10 ** 6) for name in calls]  # the host tracer's async stubs
    return Proto(step_stats=Proto(dev_stats=[
        Proto(device="/job:worker/replica:0/task:1/device:CPU:0", node_stats=worker),
        Proto(device="/host:CPU", node_stats=host)]))


def test_action_times_sum_chunks_and_take_the_median_over_micro_batches():
    first = _trace({"EPL_MICRO_BATCH_0/EPL_stage1_forward": 1000,
                    "EPL_MICRO_BATCH_0/EPL_stage1_backward0": 2000,
                    "EPL_MICRO_BATCH_0/EPL_stage1_weights0_first": 500,
                    "EPL_MICRO_BATCH_0/EPL_stage1_weights1_first": 700,
                    "EPL_MICRO_BATCH_1/EPL_stage1_forward": 3000})
    second = _trace({"EPL_MICRO_BATCH_0/EPL_stage1_forward": 2000})
    found = isolated.action_ms([first, second])
    assert found == {"1F": 2.0, "1B": 2.0, "1W": 1.2}


def test_simulated_with_measured_costs():
    # Stage 0's backward is all W (nothing before it waits for input gradients): no B.
    zb = {"0F": 1.0, "0W": 2.0, "1F": 1.0, "1B": 1.0, "1W": 1.0}
    pb = {"0F": 1.0, "0B": 2.0, "1F": 1.0, "1B": 2.0}
    schedule = lambda name: isolated.schedule_of(name, 4, "pipeline")
    assert isolated.simulated_with(pb, schedule("PreferBackward")) == 15.0
    assert isolated.simulated_with(zb, schedule("ZeroBubble")) == 13.0
    slow_w = dict(zb, **{"1W": 3.0})
    assert isolated.simulated_with(slow_w, schedule("ZeroBubble")) > 13.0


def test_interleaved_chunks_are_simulated_at_their_measured_times():
    """A chunk's call time is what it measured: the simulator's division of a chunk's
    cost by the chunks per device is undone (pipeline_interleaved.py --isolated)."""
    from epl.strategies.schedule import interleaved, timed
    schedule = interleaved(2, 4, 2)
    # unit costs: a stage's F 1 and its fused backward 2 (B + W), so a chunk's 0.5 and 1
    halves = dict(("%d%s" % (stage, kind), cost) for stage in range(4)
                  for kind, cost in (("F", 0.5), ("B", 1.0)))
    assert isolated.simulated_with(halves, schedule) == timed.makespan(schedule)


def test_report_rows():
    row = {"median": 0.9, "quartiles": (0.85, 0.95), "base_step_seconds": 1.0,
           "step_seconds": 0.9, "simulated": 0.867, "simulated_measured": 0.88,
           "action_ms": {"base": {}, "other": {"0F": 10.0, "0W": 20.0, "1F": 10.0,
                                               "1B": 9.0, "1W": 11.0}},
           "simulated_ms": {"base": 150.0, "other": 132.0}, "pairs": 4,
           "load_before": [3.0, 2.0, 1.0], "load_after": None}
    lines = isolated.report_lines({4: {"ZeroBubble": row}}, argparse.Namespace(pairs=4))
    table = [line for line in "\n".join(lines).splitlines() if line.startswith("| ZeroBubble")]
    assert table == ["| ZeroBubble | 4 | 1000 | 900 | 0.900 | 0.850-0.950 | 0.867 | 75% | "
                     "0.880 | 0: 10.0/0.0/20.0; 1: 10.0/9.0/11.0 | 150 / 132 | - | - | 3.00 / - |"]
    row["late_sends"] = {"base": (2, 8), "other": (0, 8)}
    lines = isolated.report_lines({4: {"ZeroBubble": row}}, argparse.Namespace(pairs=4))
    assert "| 150 / 132 | 2 of 8 / 0 of 8 | - | 3.00 / - |" in "\n".join(lines)
    row["worker0_cpu_ratio"] = 1.015  # a schedule saves idle time, not work
    lines = isolated.report_lines({4: {"ZeroBubble": row}}, argparse.Namespace(pairs=4))
    assert "| 2 of 8 / 0 of 8 | 1.015 | 3.00 / - |" in "\n".join(lines)


def _timed(name, start, micros):
    return Proto(node_name=name, all_start_micros=start, all_end_rel_micros=micros)


def test_late_sends_count_sends_that_follow_another_call_on_their_worker():
    """Stage 1's B of micro-batch 0 ends at 20; its _Send (named after the call) runs
    at 50, after the next forward started at 20: late. Micro-batch 1's leaves through
    the lowering's Identity (send_...) at 60, before the call at 70: on time. Stage
    0's call on the other worker does not count."""
    worker1 = [_timed("EPL_MICRO_BATCH_0/EPL_stage1_backward0", 0, 20),
               _timed("EPL_MICRO_BATCH_1/EPL_stage1_forward", 20, 30),
               _timed("EPL_MICRO_BATCH_1/EPL_stage1_backward0", 50, 10),
               _timed("EPL_MICRO_BATCH_0/EPL_stage1_weights0_first", 70, 10)]
    worker0 = [_timed("EPL_MICRO_BATCH_2/EPL_stage0_forward", 21, 30)]
    host = [_timed("EPL_MICRO_BATCH_0/EPL_stage1_backward0_S8:_Send", 50, 1),
            _timed("EPL_SCHEDULE_16/send_EPL_MICRO_BATCH_1_EPL_stage1_backward0_S14:_Send",
                   60, 1)]
    trace = Proto(step_stats=Proto(dev_stats=[
        Proto(device="/job:worker/replica:0/task:1/device:CPU:0", node_stats=worker1),
        Proto(device="/job:worker/replica:0/task:0/device:CPU:0", node_stats=worker0),
        Proto(device="/host:CPU", node_stats=host)]))
    assert isolated.late_sends([trace]) == (1, 2)
    assert isolated.late_sends([trace, trace]) == (2, 4)


def test_late_sends_count_the_send_identities_where_a_trace_has_no_send():
    """TF 2.15.1's traces list the lowering's send Identities but no _Send (checked on
    .venv-tf2 with ``pipeline.py --isolated --quick``): they stand in for the sends
    there. Where _Sends are traced (TF 1.15) the Identities beside them do not count."""
    worker1 = [_timed("EPL_MICRO_BATCH_0/EPL_stage1_backward0", 0, 20),
               _timed("EPL_SCHEDULE_7/send_EPL_MICRO_BATCH_0_EPL_stage1_backward0", 25, 1),
               _timed("EPL_MICRO_BATCH_1/EPL_stage1_forward", 20, 30),
               _timed("EPL_MICRO_BATCH_1/EPL_stage1_backward0", 50, 10),
               _timed("EPL_SCHEDULE_10/send_EPL_MICRO_BATCH_1_EPL_stage1_backward0", 60, 1),
               _timed("EPL_MICRO_BATCH_0/EPL_stage1_weights0_first", 70, 10)]
    tf2 = Proto(step_stats=Proto(dev_stats=[
        Proto(device="/job:worker/replica:0/task:1/device:CPU:0", node_stats=worker1)]))
    assert isolated.late_sends([tf2]) == (1, 2)
    host = [_timed("EPL_SCHEDULE_10/send_EPL_MICRO_BATCH_1_EPL_stage1_backward0_S14:_Send",
                   61, 1)]
    tf1 = Proto(step_stats=Proto(dev_stats=tf2.step_stats.dev_stats + [
        Proto(device="/host:CPU", node_stats=host)]))
    assert isolated.late_sends([tf1]) == (0, 1)


def test_the_paired_table_gives_no_share_where_no_gain_is_predicted():
    """pipeline.py's paired rows: the simulator predicts ZeroBubble with its memory held
    per stage no gain at 2 stages (it runs 1F1B there), so the share of the predicted
    gain is "-" (it divided by zero before)."""
    spec = importlib.util.spec_from_file_location(
        "pipeline_bench", os.path.join(ROOT, "benchmarks", "pipeline.py"))
    pipeline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pipeline)
    labels = [label for label, _, _ in pipeline.SCHEDULES[2:]]
    pairs = {4: {label: (0.90, 0.85, 0.95) for label in labels}}
    table = "\n".join(pipeline.pairs_report(pairs, {}, 8))
    assert "| ZeroBubble, memory per stage | 4 | 0.900 | 0.850-0.950 | 1.000 | - |" in table
    assert "| ZeroBubble | 4 | 0.900 | 0.850-0.950 | 0.867 | 75% |" in table
