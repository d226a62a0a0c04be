"""benchmarks/call_overhead.py counts the nodes a traced step executes by op type
(TF's step stats, function bodies included; entries without a kernel label are
not nodes) and tabulates them per shape and lowering, the op types it does not
list summed as "other"."""
import importlib.util
import os
import types

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "call_overhead.py")
_SPEC = importlib.util.spec_from_file_location("call_overhead", SCRIPT)
overhead = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(overhead)


class _Session(object):
    """Fills the run metadata as a traced TF run would: one device's node stats."""

    def __init__(self, labels):
        self.labels = labels

    def run(self, fetches, options=None, run_metadata=None):
        nodes = [types.SimpleNamespace(timeline_label=label) for label in self.labels]
        run_metadata.step_stats.dev_stats.append(types.SimpleNamespace(node_stats=nodes))


def _fake_tf():
    metadata = lambda: types.SimpleNamespace(step_stats=types.SimpleNamespace(dev_stats=[]))

    class RunOptions(object):
        FULL_TRACE = 3

        def __init__(self, trace_level):
            self.trace_level = trace_level

    return types.SimpleNamespace(RunMetadata=metadata, RunOptions=RunOptions)


def test_traced_nodes_are_counted_by_op_type():
    session = _Session(["a = Conv2D(x, w)", "f/_arg_x_0 = _Arg()", "g = _Arg()",
                        "call = StatefulPartitionedCall(x)", "RecvTensor", ""])
    found = list(overhead._traced_op_types(_fake_tf(), session, "train"))
    assert sorted(found) == ["Conv2D", "StatefulPartitionedCall", "_Arg", "_Arg"]


def test_table_lists_the_call_nodes_and_sums_the_rest():
    results = {"resnet/unrolled copies": dict(cpu=0.5, nodes={"Conv2D": 4.0, "Relu": 2.0}),
               "resnet/stage functions": dict(cpu=0.52, nodes={"Conv2D": 4.0, "_Arg": 6.0,
                                                               "Relu": 2.0, "Tile": 1.0})}
    info = dict(command="call_overhead.py", date="today", git_revision="abc",
                cpu_model="cpu", cpu_count=2, load_average=[1.0, 1.0, 1.0])
    lines = overhead.markdown(results, info).splitlines()
    header = [cell.strip() for cell in lines[5].strip("|").split("|")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[7:]]
    assert rows[0][:4] == ["resnet", "stage functions", "0.520", "13"]
    assert rows[0][header.index("_Arg")] == "6" and rows[0][header.index("other")] == "3"
    assert rows[1][:4] == ["resnet", "unrolled copies", "0.500", "6"]
    assert rows[1][header.index("_Arg")] == "0" and rows[1][header.index("Conv2D")] == "4"
