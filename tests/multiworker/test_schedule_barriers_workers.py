"""Grappler's dependency optimizer and the schedule lowering in multi-worker sessions.

Sessions of pipelined graphs turn the optimizer off unless the user's ConfigProto sets
it (epl/cluster/session_config.py ``ordered_sends``). These tests pin why that holds
for both lowerings of the repeated step, not only stage functions' send Identities:
in a distributed session (where grappler runs on the main graph) it removes the
schedule's barrier no-ops of unrolled copies as well."""
import collections

import pytest
import tensorflow.compat.v1 as tf
from tensorflow.core.protobuf import rewriter_config_pb2

import epl
from eplutil import dataset_input, initial_weights, make_data, run_workers, staged_mlp, train_step

B, M = 4, 4
ON = rewriter_config_pb2.RewriterConfig.ON
DEFAULT = rewriter_config_pb2.RewriterConfig.DEFAULT


def _ran(lowering, dependency_optimization):
    """Run one step on each worker of a 2-worker job (each its own 2-stage pipeline,
    so the session is distributed); per worker: the EPL_SCHEDULE ops built, those
    the partition graphs kept, and whether every consecutive pair of a stage's
    actions is still ordered there (the later action's entrances have every exit
    of the earlier among their ancestors)."""
    config = epl.Config({"pipeline.num_micro_batch": M, "pipeline.micro_batching": lowering})
    x, y = make_data(2 * M * B * 2)

    def worker(index):
        del index
        train = train_step(staged_mlp(*dataset_input(x, y, B), weights=initial_weights()))
        base = tf.ConfigProto()
        base.graph_options.rewrite_options.dependency_optimization = dependency_optimization
        meta = tf.RunMetadata()
        with tf.train.MonitoredTrainingSession(config=base) as sess:
            sess.run(train, options=tf.RunOptions(output_partition_graphs=True),
                     run_metadata=meta)
        program = epl.Graph.get().parallel
        built = [op.name for op in tf.get_default_graph().get_operations()
                 if op.name.startswith("EPL_SCHEDULE")]
        parents = _parents(meta.partition_graphs)
        return (built, [name for name in built if name in parents],
                _ordered(program, parents))
    return run_workers(worker, 2, 2, config=config, timeout=150)


def _parents(partition_graphs):
    """{node: its inputs and control inputs} over the partition graphs, a _Recv's
    parent being the _Send of the same tensor on another partition."""
    parents, sends = collections.defaultdict(set), {}
    for graph in partition_graphs:
        for node in graph.node:
            parents[node.name].update(i.lstrip("^").split(":")[0] for i in node.input)
            if node.op == "_Send":
                sends[node.attr["tensor_name"].s] = node.name
    for graph in partition_graphs:
        for node in graph.node:
            if node.op == "_Recv" and node.attr["tensor_name"].s in sends:
                parents[node.name].add(sends[node.attr["tensor_name"].s])
    return parents


def _ordered(program, parents):
    """(pairs ordered, pairs checked) over each stage's consecutive actions."""
    entrances, exits = program.boundaries[0]
    ordered = checked = 0
    for stage in range(program.schedule.num_stages):
        actions = [(a.stage, a.kind, a.micro_batch) for a in program.schedule.stage(stage)]
        actions = [a for a in actions if a in entrances and a in exits]
        for before, after in zip(actions, actions[1:]):
            first = set(op.name for op in exits[before]) & set(parents)
            for op in entrances[after]:
                if op.name in parents and first:
                    checked += 1
                    ordered += first <= _ancestors(op.name, parents)
    return ordered, checked


def _ancestors(name, parents):
    seen, todo = set(), [name]
    while todo:
        for parent in parents.get(todo.pop(), ()):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


@pytest.mark.servers
@pytest.mark.timeout(240)
def test_the_dependency_optimizer_removes_barriers_of_unrolled_copies_too():
    """With EPL's default (optimizer off) the partition graphs of an unrolled pipeline
    keep every schedule barrier; with the optimizer on they lose most (10 of 14 per
    worker here; with stage functions it also drops every barrier and send Identity,
    tests/graph/test_zero_bubble.py covers the setting there), so the rule covers
    every pipelined session, not only the lowering that builds the Identities. The
    stage order itself survives either way (the optimizer moves a removed no-op's
    edges to its neighbours): what is lost is the structure as the lowering built it,
    which pipeline traces name (benchmarks/pipeline_isolated.py)."""
    for setting in (DEFAULT, ON):
        for built, kept, (ordered, checked) in _ran("unrolled", setting):
            barriers = [name for name in built if "/after_" in name]
            assert barriers and checked and ordered == checked, (setting, ordered, checked)
            if setting == DEFAULT:
                assert kept == built, sorted(set(built) - set(kept))
            else:
                assert len([n for n in kept if "/after_" in n]) < len(barriers), kept
