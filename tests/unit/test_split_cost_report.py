"""benchmarks/split_cost.py: what a split micro-batch costs, from traced steps. A node's
kernel time is its least over every execution (a preempted run only lengthens it) times
its executions per step; weight-layer matmuls are told apart by their gradient role; a
call's own time is not a kernel's (its body's nodes are listed too)."""
import importlib.util
import os
import sys
from types import SimpleNamespace as Proto

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
_SPEC = importlib.util.spec_from_file_location(
    "split_cost", os.path.join(ROOT, "benchmarks", "split_cost.py"))
split_cost = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(split_cost)


def _node(name, op_type, micros):
    return Proto(node_name=name, timeline_label="%s = %s(a, b)" % (name, op_type),
                 all_end_rel_micros=micros)


def _trace(stage1, stage0=()):
    return Proto(step_stats=Proto(dev_stats=[
        Proto(device="/job:localhost/replica:0/task:0/device:CPU:1", node_stats=stage1),
        Proto(device="/job:localhost/replica:0/task:0/device:CPU:0", node_stats=list(stage0)),
        Proto(device="/host:CPU", node_stats=[_node("x", "MatMul", 10 ** 6)])]))


def test_matmuls_are_told_apart_by_role():
    assert split_cost.op_class("MatMul", "s1_l0/MatMul") == "MatMul (forward)"
    assert split_cost.op_class("MatMul", "gradients/s1_l0/MatMul_grad/MatMul") == \
        "MatMul (input gradient)"
    assert split_cost.op_class("MatMul", "gradients/s1_l0/MatMul_grad/MatMul_1") == \
        "MatMul (weight gradient)"
    assert split_cost.op_class("_MklMatMul", "gradients/s1_l0/MatMul_grad/MatMul") == \
        "MatMul (input gradient)"  # TF 2.15.1's oneDNN kernel
    assert split_cost.op_class("BiasAddGrad", "gradients/s1_l0/BiasAdd_grad/B") == "BiasAddGrad"


def test_least_kernel_time_per_node_times_its_runs_per_step():
    dw = "gradients/s1_l0/MatMul_grad/MatMul_1"
    first = _trace([_node(dw, "MatMul", 300), _node(dw, "MatMul", 200),  # two micro-batches
                    _node("EPL_MICRO_BATCH_0/EPL_stage1_weights0", "StatefulPartitionedCall",
                          900),
                    _node("w/_arg_0", "_Arg", 1), Proto(node_name="stub",
                                                        timeline_label="",
                                                        all_end_rel_micros=50)],
                   stage0=[_node("s0_l0/MatMul", "MatMul", 100)])
    second = _trace([_node(dw, "MatMul", 250), _node(dw, "MatMul", 900)])
    found = split_cost.summarize([first, second])
    stage1 = found[1]
    assert stage1["nodes"] == {"MatMul": 2.0, "_Arg": 0.5}
    assert stage1["calls"] == {"EPL_stage1_weights0": 0.5}
    assert stage1["least_ms"] == {"MatMul (weight gradient)": 0.4, "_Arg": 0.0005}
    assert found[0]["least_ms"] == {"MatMul (forward)": 0.05}


def test_the_table_shows_the_difference_per_split_micro_batch():
    stage = lambda calls, ms: {"calls": {"f": calls}, "nodes": {"_Arg": 2.0 * calls},
                               "least_ms": {"MatMul (weight gradient)": ms}}
    rows = {"PreferBackward": {"cpu_seconds": 1.0, "stages": {"1": stage(8, 100.0)}},
            "ZeroBubble": {"cpu_seconds": 1.1, "stages": {"1": stage(16, 116.0)}}}
    table = split_cost.table_rows(rows, "1", 8)
    assert table[0] == ["calls", "8.0", "16.0", "8.0", "1.0"]
    assert ["MatMul (weight gradient), least kernel ms", "100.00", "116.00", "16.00",
            "2.00"] in table
