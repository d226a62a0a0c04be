"""Slurm's compressed host lists and task counts (epl.cluster.hostlist): no TensorFlow."""
import pytest

from epl.cluster.hostlist import HostlistError, expand, tasks_per_node


@pytest.mark.parametrize("given,expected", [
    ("node01", ["node01"]),
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("node[9-11]", ["node9", "node10", "node11"]),
    ("n[008-010]", ["n008", "n009", "n010"]),
    ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
    ("gpu-a[1-2]-ib", ["gpu-a1-ib", "gpu-a2-ib"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("host.example.org,10.0.0.[1-2]", ["host.example.org", "10.0.0.1", "10.0.0.2"]),
    ("node[3]", ["node3"]),
])
def test_expand(given, expected):
    assert expand(given) == expected


@pytest.mark.parametrize("given,match", [
    ("", "is empty"),
    ("node[01-02", r"'\[' without '\]'"),
    ("node01-02]", "unbalanced or nested"),
    ("node[[1]]", "unbalanced or nested"),
    ("node[1-a]", "must hold numbers and ranges"),
    ("node[]", "must hold numbers and ranges"),
    ("node[4-2]", "ends before it starts"),
    ("a,,b", "empty name"),
    ("node 1", "is not a host name"),
    ("node[1-99999999]", "names more than"),
])
def test_unparsable_host_lists_are_named(given, match):
    with pytest.raises(HostlistError, match=match):
        expand(given, "SLURM_STEP_NODELIST")


def test_tasks_per_node():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("4") == [4]
    for bad in ("", "2(x)", "0", "two", "2(3)"):
        with pytest.raises(HostlistError, match="expected counts such as 2"):
            tasks_per_node(bad, "SLURM_TASKS_PER_NODE")
