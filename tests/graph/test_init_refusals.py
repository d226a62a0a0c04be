"""Refusals that need only the config and the cluster come from epl.init, before the model.

Before: each came from the rewrite (or from tf.gradients), after the whole model was built;
on a real model that costs minutes. epl.parallel.preflight lists them; each check lives with
its feature, whose pass still calls it for a rewrite started without epl.init."""
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from epl.parallel import preflight

TWO_WORKERS = Cluster(["127.0.0.1:1", "127.0.0.1:2"], 0, 2)

REFUSED = [
    ({"pipeline.num_stages": 2}, "pipeline.num_stages=2 is only read by automatic parallelism"),
    ({"auto.auto_parallel": True, "pipeline.num_stages": 3},
     "pipeline.num_stages=3 does not divide the job's 4 devices (2 worker(s) x 2)"),
    ({"gradient_checkpoint.type": "collection", "auto.auto_parallel": True,
      "pipeline.num_stages": 2}, "auto.auto_parallel = True and pipeline.num_stages = 2"),
    ({"zero.level": "v2", "communication.fp16": True},
     "zero.level='v2' with communication.fp16=True is not supported"),
    ({"zero.level": "v1", "communication.clip_after_allreduce": True},
     "zero.level='v1' with communication.clip_after_allreduce=True is not supported"),
    ({"io.unbalanced_io_slicing": True}, "io.unbalanced_io_slicing=True only applies when "
                                         "io.slicing=True"),
    ({"io.slicing": True, "io.drop_last_files": True, "io.unbalanced_io_slicing": True},
     "ask for opposite things"),
]


@pytest.mark.parametrize("config,message", REFUSED, ids=[",".join(c) for c, _ in REFUSED])
def test_epl_init_refuses_what_needs_only_the_config(config, message):
    with pytest.raises(ValueError) as info:
        epl.init(epl.Config(config), cluster=TWO_WORKERS)
    assert message in str(info.value)
    assert not epl.Env.get().initialized      # nothing installed, nothing to undo
    assert not tf.get_default_graph().get_operations()


@pytest.mark.parametrize("variable,value", [("EPL_COLLECTIVE_BACKEND", "nccl2"),
                                            ("EPL_RING_SHARED_MEMORY", "maybe")])
def test_epl_init_refuses_a_bad_collective_variable(monkeypatch, variable, value):
    """Before: refused when the first collective was built, after the model."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match="%s=%r: expected" % (variable, value)):
        epl.init(cluster=TWO_WORKERS)


def test_what_the_cluster_allows_is_accepted():
    epl.init(epl.Config({"auto.auto_parallel": True, "pipeline.num_stages": 4}),
             cluster=TWO_WORKERS)
    assert epl.Env.get().initialized


def test_every_refusal_is_a_function_of_config_and_cluster():
    """The list is data: each entry takes (config, cluster) and returns None when accepted."""
    config = epl.Config()
    assert all(refusal(config, TWO_WORKERS) is None for refusal in preflight.REFUSALS)
    seen = []
    preflight.check(config, TWO_WORKERS, refusals=(lambda c, k: seen.append((c, k)),))
    assert seen == [(config, TWO_WORKERS)]
