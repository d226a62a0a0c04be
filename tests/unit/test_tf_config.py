"""TF_CONFIG as engines write it (epl.cluster.tf_config): no TensorFlow."""
import json

import pytest

from epl.cluster import tf_config
from epl.cluster.common import ClusterError


def text(cluster, task_type="worker", index=0, key="cluster"):
    return json.dumps({key: cluster, "task": {"type": task_type, "index": index}})


TFJOB = {"chief": ["job-chief-0:2222"], "worker": ["job-worker-0:2222", "job-worker-1:2222"],
         "ps": ["job-ps-0:2222"]}


@pytest.mark.parametrize("task_type,index,expected", [
    ("chief", 0, 0), ("worker", 0, 1), ("worker", 1, 2), ("ps", 0, 3)])
def test_tfjob_layout_chief_first_then_workers_then_ps(task_type, index, expected):
    spec = tf_config.parse(text(TFJOB, task_type, index))
    assert spec.hosts == ("job-chief-0:2222", "job-worker-0:2222", "job-worker-1:2222",
                          "job-ps-0:2222")
    assert (spec.index, spec.task_type, spec.task_index) == (expected, task_type, index)


def test_the_evaluator_is_not_part_of_the_training_cluster():
    """TFJob leaves the evaluator out of 'cluster'; a TF_CONFIG that lists it is the same."""
    for cluster in (TFJOB, dict(TFJOB, evaluator=["job-evaluator-0:2222"])):
        spec = tf_config.parse(text(cluster, "evaluator", 0))
        assert spec.index is None and spec.task_type == "evaluator"
        assert len(spec.hosts) == 4


def test_the_older_master_is_worker_zero():
    cluster = {"master": ["m:1"], "worker": ["w:1", "w:2"]}
    assert tf_config.parse(text(cluster, "master", 0)).index == 0
    assert tf_config.parse(text(cluster, "worker", 1)).index == 2


def test_sparse_jobs_that_name_every_task_are_read():
    cluster = {"chief": {"0": "c:1"}, "worker": {"1": "w:2", "0": "w:1"}}
    spec = tf_config.parse(text(cluster, "worker", 1))
    assert spec.hosts == ("c:1", "w:1", "w:2") and spec.index == 2


@pytest.mark.parametrize("given,match", [
    (text({"worker": {"1": "w:2"}}, "worker", 1),
     r"sparse 'worker' job lists task\(s\) \[1\] only.*task\(s\) \[0\] are missing"),
    (text({"worker": {"0": "w:1"}, "ps": ["p:1"]}, "worker", 0, key="sparseCluster"),
     r"'sparseCluster'.*task worker:0 sees only its own address.*enableDynamicWorker off"),
    (text({"worker": {"x": "w:1"}}), "sparse keys must be task indices"),
    (text({"worker": {"-1": "w:1"}}), "indices >= 0"),
    (text({"chief": ["c:1"], "master": ["m:1"]}, "chief"), "both a 'chief' and a 'master'"),
    (text({"chief": ["c:1", "c:2"]}, "chief"), "'chief' job has 2 tasks"),
    (text({"worker": ["a:1"]}, "worker", 1), "task worker:1 does not exist"),
    (text({"worker": ["a:1"]}, "worker", -1), "index must be an integer >= 0"),
    (text({"worker": ["a:1"]}, "local"), "'local' is not one of"),
    (text({"worker": "a:1"}), "must be a list of addresses"),
    (text({"worker": ["a:1", ""]}), "not a host:port string"),
    (text({"localhost": ["a:1"]}), r"unsupported job\(s\) \['localhost'\]"),
    ("[1, 2]", "must be a JSON object"),
    ('{"cluster": {"worker": ["a:1"]}, "task": ["worker", 0]}', "'task' must be an object"),
    ('{"cluster": ', "not valid JSON"),
])
def test_bad_tf_configs_are_named(given, match):
    with pytest.raises(ClusterError, match=match):
        tf_config.parse(given)


def test_an_evaluator_may_read_a_sparse_cluster():
    spec = tf_config.parse(text({"chief": {"0": "c:1"}, "worker": {"0": "w:1"}}, "evaluator",
                                key="sparseCluster"))
    assert spec.task_type == "evaluator"


def test_evaluator_view_gives_run_config_a_chief_from_any_layout():
    """RunConfig needs a chief job before it sets an evaluator's cluster aside."""
    task = {"type": "evaluator", "index": 0}
    for cluster, chief in ((TFJOB, "job-chief-0:2222"), ({"worker": ["w:1", "w:2"]}, "w:1"),
                           ({"master": ["m:1"], "worker": ["w:1"]}, "m:1")):
        view = tf_config.evaluator_view({"cluster": cluster, "task": task, "environment": "x"})
        assert view == {"cluster": {"chief": [chief]}, "task": task, "environment": "x"}
