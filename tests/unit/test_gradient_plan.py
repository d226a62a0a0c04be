"""The gradient plan is pure data: groups, buckets, reductions and divisors."""
import pytest

from epl.config import Config
from epl.parallel import gradient_plan as gp
from epl.parallel.mesh import Group

TWO = Group("tg/dp", "dp", None, ("a", "b"))
ONE = Group("tg/dp", "dp", None, ("a",))


def info(name, order, nbytes=400, sparse=False, taskgraph=0, dtype="float32"):
    return gp.GradientInfo(name, taskgraph, sparse, nbytes, dtype, order)


def plan(infos, group=TWO, micro=1, steps=1, **config):
    settings = {"communication.max_splits": 2}
    settings.update(config)
    return gp.plan_gradients(infos, lambda info: group, Config(settings).communication, micro,
                             steps)


def test_dense_gradients_are_bucketed_in_production_order():
    result = plan([info("late", 3), info("early", 1), info("mid", 2), info("last", 4)])
    assert [e.name for e in result.entries] == ["early", "mid", "late", "last"]
    assert [e.bucket for e in result.entries] == [0, 0, 1, 1]
    assert all(e.reduction == gp.ALL_REDUCE and e.mean for e in result.entries)
    assert list(result.buckets()) == [("tg/dp", 0), ("tg/dp", 1)]


def test_sparse_gradients_are_gathered_unfused():
    result = plan([info("emb", 1, sparse=True), info("dense", 2)])
    assert result.entry("emb").reduction == gp.ALL_GATHER
    assert result.entry("emb").bucket is None
    assert result.entry("dense").bucket == 0


def test_accumulated_sparse_gathers_the_touched_rows():
    result = plan([info("emb", 1, sparse=True)], steps=3)
    entry = result.entry("emb")
    assert entry.reduction == gp.ALL_GATHER and entry.accumulate
    assert entry.divisor == 3


def sparse(name, shape, rows, order=1):
    return gp.GradientInfo(name, 0, True, 0, "float32", order, shape, rows, 8)


def test_sparse_reduction_all_reduce_and_auto_choose_per_variable():
    infos = [sparse("big", (1000000, 64), 512), sparse("small", (20, 4), 24, 2),
             sparse("unknown_rows", (50, 4), None, 3)]
    result = plan(infos, **{"communication.sparse_reduction": "auto"})
    assert result.entry("big").reduction == gp.ALL_GATHER
    assert "auto: gather" in str(result.entry("big"))
    assert result.entry("small").reduction == gp.ROWS_ALL_REDUCE
    assert "auto: all-reduce" in str(result.entry("small"))
    assert result.entry("unknown_rows").reduction == gp.ALL_GATHER
    assert "unknown" in str(result.entry("unknown_rows"))
    forced = plan(infos, **{"communication.sparse_reduction": "all_reduce"})
    assert {e.reduction for e in forced.entries} == {gp.ROWS_ALL_REDUCE}
    assert plan(infos).entry("small").reduction == gp.ALL_GATHER   # default: gather


def test_auto_counts_accumulated_runs_up_to_the_table():
    # 2 x 24 rows x (16 + 8) bytes against ~ 2 x 1/2 x 50 x 5 x 4: gather wins alone,
    # all-reduce wins over 4 accumulated runs (at most all 50 rows)
    one = sparse("emb", (50, 4), 24)
    assert plan([one]).entry("emb").reduction == gp.ALL_GATHER
    auto = {"communication.sparse_reduction": "auto"}
    assert plan([one], **auto).entry("emb").reduction == gp.ALL_GATHER
    assert plan([one], steps=4, **auto).entry("emb").reduction == gp.ROWS_ALL_REDUCE


def test_all_reduce_of_a_sparse_gradient_needs_the_variable_shape():
    with pytest.raises(ValueError, match="sparse_reduction='all_reduce' needs the static "
                                         "shape of emb"):
        plan([sparse("emb", (None, 4), 3)], **{"communication.sparse_reduction": "all_reduce"})
    assert plan([sparse("emb", None, 3)], **{"communication.sparse_reduction": "auto"}) \
        .entry("emb").reduction == gp.ALL_GATHER


def test_one_device_groups_communicate_nothing():
    result = plan([info("w", 1), info("emb", 2, sparse=True)], group=ONE, steps=2)
    assert {e.reduction for e in result.entries} == {gp.LOCAL}
    assert all(e.bucket is None for e in result.entries)


def test_divisor_counts_micro_batches_and_accumulation_for_mean_only():
    assert plan([info("w", 1)], micro=4).entry("w").divisor == 4
    summed = plan([info("w", 1)], micro=4, **{"communication.gradients_reduce_method": "sum"})
    assert summed.entry("w").divisor == 1 and not summed.entry("w").mean


def test_groups_per_taskgraph_and_dtypes_never_share_a_bucket():
    groups = {0: TWO, 1: Group("head/dp/shard0", "dp", 0, ("a", "c"))}
    infos = [info("a", 1), info("b", 2, dtype="float16"), info("h", 3, taskgraph=1)]
    result = gp.plan_gradients(infos, lambda info: groups[info.taskgraph], Config().communication)
    assert result.entry("h").group.name == "head/dp/shard0"
    assert result.entry("a").bucket != result.entry("b").bucket
    text = str(result)
    assert "a: all_reduce bucket 0 over tg/dp (mean)" in text


def test_shards_are_averaged_over_replicas_and_divided_by_the_shard_count():
    shard_group = Group("head/dp/shard1", "dp", 1, ("b", "f"))
    result = gp.plan_gradients([info("w", 1)], lambda i: (shard_group, 4),
                               Config().communication, 2, 1)
    entry = result.entry("w")
    assert entry.divisor == 8 and entry.mean and entry.group is shard_group


def test_zero_reduce_scatters_by_owner_in_one_bucket_for_v1_and_zero_buckets_for_v2():
    infos = [info("w1", 1), info("w2", 2), info("w3", 3), info("emb", 4, sparse=True)]
    owners = {"w1": 0, "w2": 1, "w3": 0, "emb": 1}
    config = Config({"communication.max_splits": 2}).communication
    v1 = gp.plan_gradients(infos, lambda i: TWO, config, owner_of=owners)
    v2 = gp.plan_gradients(infos, lambda i: TWO, config, owner_of=owners,
                           bucket_of={"w1": 1, "w2": 0, "w3": 0})
    for result in (v1, v2):
        dense = [e for e in result.entries if e.name != "emb"]
        assert all(e.reduction == gp.REDUCE_SCATTER for e in dense)
        assert [e.owner for e in dense] == [0, 1, 0]
        assert result.entry("emb").reduction == gp.ALL_GATHER  # sparse: as without ZeRO
    assert [v1.entry(n).bucket for n in ("w1", "w2", "w3")] == [0, 0, 0]
    assert [v2.entry(n).bucket for n in ("w1", "w2", "w3")] == [1, 0, 0]
