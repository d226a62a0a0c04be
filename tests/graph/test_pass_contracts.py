"""Every rewrite pass touches only what it declares in ``reads`` and ``writes``.

Representative graphs (data parallelism with accumulation and merged outputs, pipelines
lowered as stage functions and as unrolled copies, a split classifier, automatic stages,
the memory savers, ZeRO and IO slicing on worker 0 of two) are rewritten with every pass
recorded (tests/graph/pass_contracts.py): the context fields a pass reads must be among
its declared reads or writes, the fields it changes among its writes. Together the
graphs must run every pass of ``epl.parallel.rewriter.PASSES``, so a new pass needs a
graph here. The pass table of docs/design.md is generated from the same declarations.
"""
import os

import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from epl.parallel import rewriter
from epl.parallel.context import FIELDS
from eplutil import dataset_input, initial_weights, make_data, mlp, staged_mlp, train_step
from pass_contracts import record

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TWO_WORKERS = ["127.0.0.1:1", "127.0.0.1:2"]


def _init(config, devices=2, hosts=None):
    epl.init(epl.Config(config), cluster=Cluster(hosts, 0, devices))


def _step(loss, opt_name="momentum"):
    epl.add_to_collection(loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    train_step(loss, opt_name)
    tf.train.Saver()


def _data_parallel(config, opt_name="momentum", devices=2, hosts=None):
    _init(config, devices, hosts)
    epl.set_default_strategy(epl.replicate(1))
    x, y = make_data(16)
    _step(mlp(*dataset_input(x, y, 4), weights=initial_weights()), opt_name)


def _pipeline(config):
    _init(dict(config, **{"pipeline.num_micro_batch": 2}))
    x, y = make_data(16)
    _step(staged_mlp(*dataset_input(x, y, 4), weights=initial_weights()))


def _split():
    _init({"cluster.colocate_split_and_replicate": True})
    x, y = make_data(16)
    features, labels = dataset_input(x, y, 4)
    with epl.replicate(2):
        hidden = tf.layers.dense(features, 8, activation=tf.nn.relu, name="backbone")
    with epl.split(2):
        logits = tf.layers.dense(hidden, 6, name="classifier")
        loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
    _step(loss)


def _auto_stages():
    _init({"auto.auto_parallel": True, "pipeline.num_stages": 2,
           "pipeline.num_micro_batch": 2})
    x, y = make_data(16)
    _step(staged_mlp(*dataset_input(x, y, 4), weights=initial_weights(), scopes=False))


def _savers():
    _init({"offload.level": "v0", "gradient_checkpoint.type": "collection"})
    epl.set_default_strategy(epl.replicate(1))
    x, y = make_data(16)
    features, labels = dataset_input(x, y, 4)
    hidden = tf.layers.dense(features, 8, activation=tf.nn.relu, name="d1")
    tf.add_to_collection("checkpoints", hidden)
    logits = tf.layers.dense(hidden, 3, name="d2")
    _step(tf.losses.sparse_softmax_cross_entropy(labels, logits), "adam")


def _io_slicing(tmp_path):
    paths = []
    for index in range(4):
        paths.append(str(tmp_path / ("part%d.txt" % index)))
        with open(paths[-1], "w") as handle:
            handle.write("%d\n" % index)
    _init({"io.slicing": True}, devices=1, hosts=TWO_WORKERS)
    epl.set_default_strategy(epl.replicate(1))
    lines = tf.data.TextLineDataset(tf.constant(paths)).map(
        lambda line: tf.strings.to_number(line, tf.float32)).batch(1).repeat()
    value = tf.data.make_one_shot_iterator(lines).get_next()
    weight = tf.get_variable("w", [1], initializer=tf.ones_initializer())
    _step(tf.reduce_sum(weight * value))


# scenario -> (builder, passes it must run besides the ones every graph runs)
SCENARIOS = {
    "data_parallel_accumulation": (lambda tmp: _data_parallel({"pipeline.num_micro_batch": 2}),
                                   ["repeat_step", "shared_step_dependencies",
                                    "input_order", "end_of_input"]),
    "pipeline_stage_functions": (lambda tmp: _pipeline({"pipeline.call_executor": "auto"}),
                                 ["repeat_step", "schedule_lowering",
                                  "call_executors"]),
    "pipeline_unrolled": (lambda tmp: _pipeline({"pipeline.micro_batching": "unrolled"}),
                          ["repeat_step", "schedule_lowering"]),
    "split": (lambda tmp: _split(), ["split_lowering", "batch_split", "sharded_checkpoints"]),
    "auto_stages": (lambda tmp: _auto_stages(), ["auto_stages"]),
    "offload_and_checkpointing": (lambda tmp: _savers(), ["unused_checkpoints", "offload"]),
    "amp_grouped_apply": (lambda tmp: _data_parallel(
        {"amp.level": "O1", "optimizer.num_apply_group": 2}), []),
    "zero_worker_0_of_2": (lambda tmp: _data_parallel(
        {"zero.level": "v1"}, "adam", devices=1, hosts=TWO_WORKERS),
        ["zero_partition", "zero_sync", "zero_checkpoints"]),
    "zero_1x2_accumulation": (lambda tmp: _data_parallel(
        {"zero.level": "v1", "pipeline.num_micro_batch": 2}, "adam"),
        ["zero_partition", "zero_sync", "zero_checkpoints"]),
    "zero_v2_1x2_accumulation": (lambda tmp: _data_parallel(
        {"zero.level": "v2", "pipeline.num_micro_batch": 2}, "adam"),
        ["zero_partition", "zero_sync", "zero_checkpoints"]),
    "io_slicing_worker_0_of_2": (_io_slicing, ["io_slicing"]),
    "snapshots_zero_worker_0_of_2": (lambda tmp: _data_parallel(
        {"zero.level": "v1", "checkpoint.snapshot_steps": 2,
         "checkpoint.snapshot_dir": str(tmp / "snapshots")}, "adam", devices=1,
        hosts=TWO_WORKERS), ["zero_checkpoints", "snapshot_state"]),
}
EVERY_GRAPH = ["classify_roles", "placement", "gradient_aggregation", "merged_outputs",
               "variable_sync"]


def _declared(rewrite_pass):
    return set(rewrite_pass.reads), set(rewrite_pass.writes)


def _check(observed):
    by_name = dict((p.name, p) for p in rewriter.PASSES)
    problems = []
    for seen in observed:
        reads, writes = _declared(by_name[seen.name])
        undeclared_reads = sorted(seen.reads - reads - writes - {"graph"})
        undeclared_writes = sorted(seen.writes - writes)
        if undeclared_reads or undeclared_writes:
            problems.append("%s reads %s and writes %s without declaring them" % (
                seen.name, undeclared_reads or "-", undeclared_writes or "-"))
    return problems


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_passes_touch_only_what_they_declare(scenario, tmp_path):
    build, expected = SCENARIOS[scenario]
    build(tmp_path)
    env = epl.Env.get()
    observed = record(epl.Graph.get(), env.config, env.cluster)
    ran = [seen.name for seen in observed]
    assert set(EVERY_GRAPH + expected) <= set(ran), "ran only %s" % ran
    problems = _check(observed)
    assert not problems, "\n".join(problems)


def test_every_pass_runs_in_some_scenario():
    covered = set(EVERY_GRAPH).union(*(expected for _, expected in SCENARIOS.values()))
    missing = [p.name for p in rewriter.PASSES if p.name not in covered]
    assert not missing, "passes no scenario runs (add a graph that does): %s" % missing


def test_declarations_name_context_fields():
    for rewrite_pass in rewriter.PASSES:
        unknown = sorted((set(rewrite_pass.reads) | set(rewrite_pass.writes)) - set(FIELDS))
        assert not unknown, ("pass %s declares %s, which are not fields of the rewrite "
                             "context (epl.parallel.context.FIELDS)" % (rewrite_pass.name,
                                                                        unknown))


def test_the_checker_catches_an_undeclared_write():
    from epl.protocols.passes import LOWER, Pass

    class Sneaky(Pass):
        name, phase, reads, writes = "sneaky", LOWER, ("copies",), ()

        def run(self, ctx):
            ctx.split_inputs.add("x")
            ctx.program.fetches.merged["loss"] = ctx.roles

    _data_parallel({})
    env = epl.Env.get()
    passes = [p for p in rewriter.PASSES if p.name == "classify_roles"] + [Sneaky()]
    (classify, sneaky) = record(epl.Graph.get(), env.config, env.cluster, passes)
    assert classify.writes == {"roles"}
    assert sneaky.reads >= {"split_inputs", "roles"}
    assert sneaky.writes == {"split_inputs", "program.fetches"}


def test_the_design_doc_table_is_current():
    with open(os.path.join(REPO_ROOT, "docs", "design.md")) as handle:
        docs = handle.read()
    assert rewriter.markdown_table() in docs, (
        "docs/design.md does not show the current pass table; regenerate it with: "
        "python -m epl.parallel.rewriter --markdown")
