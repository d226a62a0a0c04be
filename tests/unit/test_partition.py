"""Automatic stage partitioning as pure functions (epl.parallel.partition), no TF."""
import itertools
import random

import pytest

from epl.config import Config, ConfigError
from epl.parallel import partition as P
from epl.parallel.partition import Node, PartitionError


class Model(object):
    """Builds Node lists the way the TF side would: graph order, input indices."""

    def __init__(self):
        self.nodes = []

    def op(self, name, op_type="Add", inputs=(), cost=1.0, source=False, group=None):
        index = dict((n.name, i) for i, n in enumerate(self.nodes))
        self.nodes.append(Node(name, op_type, tuple(index[i] for i in inputs), cost, source,
                               group))
        return name

    def dense(self, scope, x, cost=10.0, weight_first=False):
        """A dense layer: weight (not batch work), its read, matmul, bias add, relu."""
        kernel = self.op(scope + "/kernel", "VariableV2")
        read = self.op(scope + "/kernel/read", "Identity", [kernel])
        init = self.op(scope + "/kernel/Initializer/Const", "Const")
        self.op(scope + "/kernel/Assign", "Assign", [kernel, init])
        h = self.op(scope + "/MatMul", "MatMul", [x, read], cost)
        h = self.op(scope + "/BiasAdd", "BiasAdd", [h], 1.0)
        return self.op(scope + "/Relu", "Relu", [h], 1.0)

    def stages(self, k, **kwargs):
        return P.partition(self.nodes, k, **kwargs)


def mlp_of_blocks(blocks, head_cost=1.0, embed_cost=1.0):
    model = Model()
    x = model.op("IteratorGetNext", "IteratorGetNext", source=True)
    x = model.op("embed/Gather", "GatherV2", [x], embed_cost)
    for i in range(blocks):
        x = model.dense("model/block_%d" % i, x)
    x = model.op("head/MatMul", "MatMul", [x], head_cost)
    model.op("loss/Mean", "Mean", [x])
    return model


def _stage(result, name):
    return result.stage_of[name]


# ---- repeated blocks -----------------------------------------------------------------
@pytest.mark.parametrize("blocks,stages", [(4, 2), (8, 4), (6, 3), (12, 4), (2, 2)])
def test_repeated_blocks_get_equal_shares(blocks, stages):
    result = mlp_of_blocks(blocks).stages(stages)
    assert result.method == P.BLOCKS
    assert result.blocks_per_stage() == [blocks // stages] * stages
    share = blocks // stages
    for i in range(blocks):
        assert _stage(result, "model/block_%d/MatMul" % i) == i // share
        # a block's weights live with the block that reads them
        assert _stage(result, "model/block_%d/kernel" % i) == i // share
        assert _stage(result, "model/block_%d/kernel/Assign" % i) == i // share


def test_embedding_goes_to_the_first_stage_and_head_to_the_last():
    result = mlp_of_blocks(4, head_cost=15, embed_cost=15).stages(2)
    assert result.method == P.BLOCKS
    assert _stage(result, "IteratorGetNext") == 0 and _stage(result, "embed/Gather") == 0
    assert _stage(result, "head/MatMul") == 1 and _stage(result, "loss/Mean") == 1
    assert result.stages[0].blocks == ("model/block_0", "model/block_1")
    assert result.stages[1].blocks == ("model/block_2", "model/block_3")


def test_blocks_that_do_not_divide_go_to_the_lighter_stages():
    # 5 blocks over 2 stages: the head is heavier than the embedding, so the first
    # stage takes the extra block.
    result = mlp_of_blocks(5, head_cost=20, embed_cost=1).stages(2)
    assert result.blocks_per_stage() == [3, 2]
    result = mlp_of_blocks(5, head_cost=1, embed_cost=20).stages(2)
    assert result.blocks_per_stage() == [2, 3]
    # 7 over 3: the middle stage has no embedding or head work.
    assert mlp_of_blocks(7, head_cost=5, embed_cost=5).stages(3).blocks_per_stage() == [2, 3, 2]


def test_fewer_blocks_than_stages_falls_back_to_costs():
    result = mlp_of_blocks(2).stages(4)
    assert result.method == P.COST
    assert len(result.stages) == 4 and all(stage.num_ops for stage in result.stages)


def test_parallel_towers_are_not_a_chain_of_blocks():
    model = Model()
    x = model.op("x", "Placeholder", source=True)
    outs = [model.dense("tower_%d" % i, x) for i in range(4)]
    model.op("concat", "ConcatV2", outs)
    result = model.stages(2)
    assert result.method == P.COST


def test_small_repeated_scopes_do_not_decide_the_partition():
    # two tiny repeated blocks next to a huge non-repeated computation
    model = Model()
    x = model.op("x", "Placeholder", source=True)
    x = model.dense("small_0", x, cost=1)
    x = model.dense("small_1", x, cost=1)
    x = model.op("big/Conv2D", "Conv2D", [x], 1000)
    model.op("big2/Conv2D", "Conv2D", [x], 1000)
    assert model.stages(2).method == P.COST


def test_block_families_prefer_the_largest_coverage():
    names = ["m/layer_%d/%s/%s" % (i, d, op) for i in range(3) for d in ("q", "k")
             for op in ("MatMul", "BiasAdd")]
    types = [n.rsplit("/", 1)[1] for n in names]
    families = P.block_families(names, types)
    assert [b.scope for b in families[0]] == ["m/layer_0", "m/layer_1", "m/layer_2"]
    assert all(len(b.members) == 4 for b in families[0])


# ---- costs ---------------------------------------------------------------------------
def test_cost_partition_balances_work_not_op_counts():
    model = Model()
    x = model.op("x", "Placeholder", source=True)
    x = model.op("conv", "Conv2D", [x], 100)          # one expensive op
    for i in range(10):
        x = model.op("cheap_%d" % i, "Relu", [x], 10)  # many cheap ones
    result = model.stages(2)
    assert result.method == P.COST
    assert _stage(result, "conv") == 0 and _stage(result, "cheap_0") == 1
    assert [s.cost for s in result.stages] == [101, 100]


def test_op_cost_from_static_shapes():
    assert P.op_cost("MatMul", [(None, 64), (64, 32)], [(None, 32)]) == 2 * 64 * 32
    assert P.op_cost("MatMul", [(64, 4), (64, 32)], [(4, 32)], {"transpose_a": True}) == \
        2 * 64 * 4 * 32
    assert P.op_cost("BatchMatMulV2", [(2, 3, 5, 7), (2, 3, 7, 4)], [(2, 3, 5, 4)]) == \
        2 * 7 * 2 * 3 * 5 * 4
    assert P.op_cost("Conv2D", [(1, 8, 8, 3), (3, 3, 3, 16)], [(1, 8, 8, 16)]) == \
        2 * 8 * 8 * 16 * 27
    assert P.op_cost("DepthwiseConv2dNative", [(1, 8, 8, 3), (3, 3, 3, 1)], [(1, 8, 8, 3)]) \
        == 2 * 8 * 8 * 3 * 9
    assert P.op_cost("Relu", [(None, 10)], [(None, 10)]) == 10
    assert P.op_cost("Split", [None], [(4, 2), (4, 2)]) == 16
    assert P.op_cost("NoOp", [], []) == 1 and P.op_cost("Relu", [None], [None]) == 1


def _brute_force(costs, k):
    best = None
    for cuts in itertools.combinations(range(1, len(costs)), k - 1):
        bounds = (0,) + cuts + (len(costs),)
        worst = max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
        best = worst if best is None else min(best, worst)
    return best


def test_linear_partition_is_optimal():
    rng = random.Random(3)
    for _ in range(300):
        n = rng.randint(1, 9)
        k = rng.randint(1, n)
        costs = [rng.choice([1, 2, 3, 10, 0.5]) for _ in range(n)]
        cuts = P.linear_partition(costs, k)
        assert len(cuts) == k - 1 and cuts == sorted(set(cuts))
        bounds = [0] + cuts + [n]
        worst = max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
        assert abs(worst - _brute_force(costs, k)) < 1e-9, (costs, k, cuts)


def test_linear_partition_is_even_when_it_can_be():
    assert P.linear_partition([1] * 10, 3) == [3, 7]
    assert P.linear_partition([1] * 8, 4) == [2, 4, 6]


def test_linear_partition_respects_allowed_cuts():
    assert P.linear_partition([1] * 10, 2, allowed=[2, 8]) in ([2], [8])
    with pytest.raises(PartitionError, match="cannot cut 2 units into 3 stages"):
        P.linear_partition([1] * 10, 3, allowed=[5])


# ---- structure -----------------------------------------------------------------------
def test_groups_are_never_cut():
    model = Model()
    x = model.op("x", "Placeholder", source=True)
    for i in range(6):  # a loop body of 6 ops that must stay together
        x = model.op("loop/op_%d" % i, "Mul", [x], 10, group="loop")
    model.op("after", "Mul", [x], 10)
    result = model.stages(2)
    stages = set(_stage(result, "loop/op_%d" % i) for i in range(6))
    assert len(stages) == 1


def test_a_weight_used_by_two_stages_lives_with_its_first_user():
    model = Model()
    x = model.op("x", "Placeholder", source=True)
    table = model.op("table", "VariableV2")
    read = model.op("table/read", "Identity", [table])
    x = model.op("embed", "GatherV2", [read, x], 10)
    x = model.op("mid", "Relu", [x], 10)
    model.op("logits", "MatMul", [x, read], 10)
    result = model.stages(2)
    assert _stage(result, "embed") == 0 and _stage(result, "logits") == 1
    assert _stage(result, "table") == 0 and _stage(result, "table/read") == 0


def test_every_edge_goes_forward():
    rng = random.Random(7)
    checked = 0
    for _ in range(80):
        model = Model()
        names = [model.op("src", "Placeholder", source=True)]
        for i in range(30):
            inputs = rng.sample(names, min(len(names), rng.randint(0, 2)))
            group = "g%d" % rng.randint(0, 4) if rng.random() < 0.2 else None
            names.append(model.op("op_%d" % i, rng.choice(["Add", "Const", "MatMul"]),
                                  inputs, rng.randint(1, 20), group=group))
        try:
            result = model.stages(3)
        except PartitionError:  # too little batch work for 3 stages
            continue
        checked += 1
        assert not P.check_order(model.nodes, result.stage_of)
        for group in set(n.group for n in model.nodes if n.group):
            assert len(set(result.stage_of[n.name] for n in model.nodes
                           if n.group == group)) == 1
    assert checked >= 40


def test_topological_order_follows_late_control_edges():
    nodes = [Node("a", "NoOp", (1,), 1, True, None), Node("b", "NoOp", (), 1, True, None)]
    assert P.topological_order(nodes) == [1, 0]


def test_too_many_stages_for_the_model():
    model = Model()
    x = model.op("x", "Placeholder", source=True)
    model.op("y", "Relu", [x])
    with pytest.raises(PartitionError, match="num_stages=3 exceeds the 2 unit"):
        model.stages(3)


def test_no_batch_computation():
    model = Model()
    model.op("c", "Const")
    with pytest.raises(PartitionError, match="no op that computes on the input batch"):
        model.stages(2)


def test_partition_prints_stages_blocks_ops_and_cost():
    text = str(mlp_of_blocks(8).stages(2))
    assert text.startswith("auto parallel: 2 stages by repeated blocks")
    assert "stage 0: blocks model/block_0 .. model/block_3 (4);" in text
    assert "stage 1: blocks model/block_4 .. model/block_7 (4);" in text
    assert "ops, cost" in text and "%" in text


# ---- configuration -------------------------------------------------------------------
def test_num_stages_without_auto_parallel_is_refused():
    with pytest.raises(ConfigError, match="pipeline.num_stages=2 .*auto.auto_parallel=True"):
        P.check_config(Config({"pipeline.num_stages": 2}))
    P.check_config(Config({"pipeline.num_stages": 2, "auto.auto_parallel": True}))
    P.check_config(Config({"auto.auto_parallel": True}))
    assert P.stage_count(Config({"auto.auto_parallel": True})) == 1


@pytest.mark.parametrize("workers,devices,stages,replicas", [
    (1, 2, 2, 1), (1, 4, 2, 2), (2, 4, 4, 2), (2, 1, 2, 1), (64, 8, 4, 128)])
def test_every_device_runs_a_pipeline(workers, devices, stages, replicas):
    assert P.check_devices(stages, workers, devices) == replicas


def test_stages_must_divide_the_devices():
    with pytest.raises(PartitionError, match=r"num_stages=3 does not divide the job's 4 "
                                             r"devices .*use num_stages in \[1, 2, 4\]"):
        P.check_devices(3, 1, 4)
