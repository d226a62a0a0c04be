"""auto.auto_parallel with pipeline.num_stages: EPL cuts an unannotated model into
stages, nests data parallelism over them, and trains like serial training."""
import copy
import logging

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import corpusutil
import epl
from epl.cluster import Cluster
from epl.config import ConfigError
from epl.ir.phase import Phase
from epl.parallel import partition, rewriter
from epl.parallel.passes.auto_stages import AutoParallelError, AutoStages
from epl.parallel.plan import PlanError
from eplutil import MEASURED, run_workers, worker_rows
from realmodels import Bert, Model

TOL = 2e-5
STEPS = 3


class BlockMLP(Model):
    """An MLP of four identical residual blocks between an input layer and a head."""

    name = "block_mlp"
    features, hidden, classes, blocks = 6, 8, 3, 4

    def optimizer(self):
        return tf.train.MomentumOptimizer(0.1, 0.9)

    def data(self, rows, seed=0):
        rng = np.random.RandomState(seed)
        x = rng.rand(rows, self.features).astype(np.float32)
        return x, rng.randint(0, self.classes, rows).astype(np.int64)

    def build(self, batch, stage=None):
        x, labels = batch
        h = tf.layers.dense(x, self.hidden, activation=tf.nn.relu, name="input")
        for i in range(self.blocks):
            with tf.variable_scope("block_%d" % i):
                h = h + tf.layers.dense(h, self.hidden, activation=tf.nn.tanh, name="dense")
        logits = tf.layers.dense(h, self.classes, name="head")
        return tf.losses.sparse_softmax_cross_entropy(labels, logits)


class DeepBert(Bert):
    """tests/realmodels.py's BERT encoder with four layers and no stage annotation."""

    name = "bert4"
    layers = 4

    def build(self, batch, stage=None):
        ids, segments, mask, labels = batch
        x = self._embed(ids, segments)
        for index in range(self.layers):
            x = self._layer(x, mask, index)
        pooled = tf.layers.dense(x[:, 0], self.hidden, activation=tf.tanh, name="pooler")
        logits = tf.layers.dense(pooled, self.classes, name="classifier")
        return tf.losses.sparse_softmax_cross_entropy(labels, logits)


class Funnel(Model):
    """Layers that all differ (no repeated blocks): the cost-based path."""

    name = "funnel"
    features, classes = 6, 3

    def optimizer(self):
        return tf.train.GradientDescentOptimizer(0.1)

    def data(self, rows, seed=0):
        return BlockMLP.data(self, rows, seed)

    def build(self, batch, stage=None):
        x, labels = batch
        h = tf.layers.dense(x, 64, activation=tf.nn.relu, name="wide")
        h = tf.layers.dense(h, 16, activation=tf.nn.tanh, name="middle")
        h = tf.layers.dense(h, 48, activation=tf.nn.sigmoid, name="narrow")
        logits = tf.layers.dense(h, self.classes, name="head")
        return tf.losses.sparse_softmax_cross_entropy(labels, logits)


class LoopModel(Model):
    """A dense layer, a dynamic RNN (a while loop), a cond and a head."""

    name = "loops"

    def optimizer(self):
        return tf.train.GradientDescentOptimizer(0.1)

    def data(self, rows, seed=0):
        rng = np.random.RandomState(seed)
        return (rng.rand(rows, 5, 4).astype(np.float32),
                rng.randint(0, 3, rows).astype(np.int64))

    def build(self, batch, stage=None):
        x, labels = batch
        x = tf.layers.dense(x, 6, activation=tf.nn.relu, name="pre")
        out, _ = tf.nn.dynamic_rnn(tf.nn.rnn_cell.BasicRNNCell(6), x, dtype=tf.float32)
        h = tf.layers.dense(out[:, -1], 6, activation=tf.nn.tanh, name="post")
        h = tf.cond(tf.reduce_sum(h) > -1e9, lambda: h * 2.0, lambda: h)
        logits = tf.layers.dense(h, 3, name="head")
        return tf.losses.sparse_softmax_cross_entropy(labels, logits)


def _config(stages=2, micro_batches=2, **more):
    settings = {"auto.auto_parallel": True, "pipeline.num_micro_batch": micro_batches}
    if stages is not None:
        settings["pipeline.num_stages"] = stages
    settings.update(more)
    return epl.Config(settings)


def _train(model, arrays, devices, config, steps=STEPS):
    """Build the unannotated model under EPL and train it; (curve, {var: copies})."""
    epl.init(config, cluster=Cluster(devices_per_worker=devices))
    loss = model.loss(corpusutil.dataset(arrays, model.batch))
    epl.add_to_collection(loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    train = model.train_op(loss)
    # Grappler takes most of the first step on the graph of 2 replicas x 2 micro-batches
    # (9 s of 20 for BERT on 4 devices); it changes no value.
    session_config = tf.ConfigProto()
    session_config.graph_options.rewrite_options.disable_meta_optimizer = True
    with tf.Session(config=session_config) as sess:
        sess.run(tf.global_variables_initializer())
        curve = [sess.run([loss, train])[0] for _ in range(steps)]
        program = epl.Graph.get().parallel
        # one run for every copy of every variable (a run per variable costs seconds)
        copies = sess.run(dict((name, [op.outputs[0] for op in ops])
                               for name, ops in program.variable_copies.items()))
    return curve, copies


def _serial(model, arrays, slices):
    """Serial training on the global batch of ``slices`` micro-batches (these models
    have no batch statistics, so one graph on the whole batch is the reference, at a
    quarter of the graph-building cost of one per slice)."""
    whole = copy.copy(model)
    whole.batch = slices * model.batch
    return corpusutil.serial_reference(whole, arrays, 1)


def _matches_serial(model, devices, stages=2, micro_batches=2):
    slices = micro_batches * devices // stages      # micro-batches x pipeline replicas
    arrays = model.data(slices * model.batch * STEPS)
    ref_curve, reference = _serial(model, arrays, slices)
    curve, copies = _train(model, arrays, devices, _config(stages, micro_batches))
    worst, where = corpusutil.max_difference(reference, copies)
    label = "%s_%dx%d_on_%d" % (model.name, stages, micro_batches, devices)
    MEASURED.append(("test_auto_parallel::" + label, worst))
    assert worst < TOL, "%s differs from serial training by %.3g" % (where, worst)
    assert set(reference) - {"global_step"} <= set(copies)
    assert all(len(values) == devices // stages for values in copies.values())
    np.testing.assert_allclose(curve, ref_curve, rtol=1e-5, atol=1e-6)
    return epl.Graph.get()


def _device(op):
    return op.device.rsplit("/", 1)[-1]


# ---- equivalence ---------------------------------------------------------------------
@pytest.mark.parametrize("devices", [2, 4])
def test_mlp_of_blocks_matches_serial(devices):
    view = _matches_serial(BlockMLP(), devices)
    result = view.auto_partition
    assert result.method == partition.BLOCKS
    assert result.stages[0].blocks == ("model/block_0", "model/block_1")
    assert result.stages[1].blocks == ("model/block_2", "model/block_3")
    plan = view.parallel.plan
    assert [tg.name for tg in plan.taskgraphs] == ["stage_0", "stage_1"]
    assert plan.num_replicas == devices // 2 and plan.pipeline


@pytest.mark.parametrize("devices", [2, 4])
def test_bert_encoder_matches_serial_with_equal_layers_per_stage(devices):
    view = _matches_serial(DeepBert(), devices)
    result = view.auto_partition
    assert result.method == partition.BLOCKS
    assert result.blocks_per_stage() == [2, 2]
    assert result.stages[0].blocks == ("model/layer_0", "model/layer_1")
    graph = tf.get_default_graph()
    stage_of = lambda name: view.info(graph.get_operation_by_name(name)).taskgraph
    assert stage_of("model/word_embeddings") == 0          # embeddings: first stage
    assert stage_of("model/classifier/kernel") == 1        # head: last stage
    assert stage_of("model/layer_1/ffn/outer/kernel") == 0
    assert stage_of("model/layer_2/ffn/outer/kernel") == 1
    # every device runs: stage s of replica r on device 2r + s
    used = set(_device(op) for op in graph.get_operations()
               if view.info(op) is not None and view.info(op).phase == Phase.BACKWARD)
    assert used == set("device:CPU:%d" % d for d in range(devices))


def test_cost_based_partition_without_repeated_blocks_matches_serial():
    view = _matches_serial(Funnel(), 2)
    result = view.auto_partition
    assert result.method == partition.COST
    graph = tf.get_default_graph()
    stage_of = lambda name: view.info(graph.get_operation_by_name(name)).taskgraph
    # the work is in the matrix products: wide+middle (6x64, 64x16) vs narrow+head
    # (16x48, 48x3), whatever the op counts
    assert stage_of("model/middle/MatMul") == 0 and stage_of("model/narrow/MatMul") == 1
    costs = [stage.cost for stage in result.stages]
    assert max(costs) < 0.65 * sum(costs), result


@pytest.mark.parametrize("devices", [2, 4])
def test_loop_and_cond_bodies_stay_in_one_stage(devices):
    view = _matches_serial(LoopModel(), devices, stages=devices, micro_batches=devices)
    graph = tf.get_default_graph()
    stages = lambda types: set(
        view.info(op).taskgraph for op in view.ops(phases=(Phase.FORWARD,))
        if op.type in types)
    assert len(stages(("Enter", "Exit", "LoopCond", "NextIteration"))) == 1
    assert len(stages(("Switch", "Merge"))) <= 2        # the loop's and the cond's
    assert graph.get_operation_by_name("model/head/MatMul").device.endswith(
        "CPU:%d" % (devices - 1))


def test_batch_norm_model_matches_serial():
    """slim ResNet: batch-norm statistics update per micro-batch, in order."""
    from realmodels import ResNet
    model = ResNet()
    arrays = model.data(2 * model.batch * STEPS)
    ref_curve, reference = corpusutil.serial_reference(model, arrays, 2, stats="all")
    curve, copies = _train(model, arrays, 2, _config())
    worst, where = corpusutil.max_difference(reference, copies)
    assert worst < TOL, "%s differs from serial training by %.3g" % (where, worst)
    assert len(epl.Graph.get().parallel.plan.stages) == 2


@pytest.mark.timeout(180)
def test_two_workers_each_drive_a_pipeline():
    """2 workers x 2 devices, 2 stages: 2 pipeline replicas, one per worker."""
    model, workers, micro_batches = BlockMLP(), 2, 2
    per_worker = micro_batches * model.batch
    arrays = model.data(workers * per_worker * STEPS)
    _, reference = _serial(model, arrays, workers * micro_batches)

    def worker(index):
        rows = [worker_rows(a, STEPS, workers, per_worker, index) for a in arrays]
        loss = model.loss(corpusutil.dataset(rows, model.batch))
        train = model.train_op(loss)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            for _ in range(STEPS):
                sess.run(train)
            view = epl.Graph.get()
            copies = sess.run(dict((name, [op.outputs[0] for op in ops])
                                   for name, ops in view.parallel.variable_copies.items()))
            return view.parallel.plan, str(view.auto_partition), copies

    results = run_workers(worker, workers, 2, config=_config(micro_batches=micro_batches))
    assert results[0][1] == results[1][1]            # both workers cut the same stages
    plan = results[0][0]
    assert plan.num_replicas == 2 and len(plan.stages) == 2
    for _, _, copies in results:
        worst, where = corpusutil.max_difference(reference, copies)
        assert worst < TOL, "%s differs from serial training by %.3g" % (where, worst)


def test_backward_and_apply_ops_follow_their_forward_ops():
    model = BlockMLP()
    _train(model, model.data(2 * model.batch * STEPS), 2, _config(), steps=1)
    view, graph = epl.Graph.get(), tf.get_default_graph()
    for op in graph.get_operations():
        info = view.info(op)
        if info is None or info.copy or info.micro_batch or info.phase != Phase.BACKWARD:
            continue
        source = view.gradient_sources.get(op.name)
        if source is not None:
            assert info.taskgraph == view.info(source).taskgraph, op.name
    kernel = graph.get_operation_by_name("model/block_3/dense/kernel")
    for op in graph.get_operations():
        info = view.info(op)
        if info is not None and info.phase == Phase.APPLY and \
                op.colocation_groups() == kernel.colocation_groups():
            assert info.taskgraph == 1 and _device(op) == "device:CPU:1", op.name
    assert _device(graph.get_operation_by_name("model/block_0/dense/kernel")) == "device:CPU:0"


def test_partition_is_logged_and_reachable(caplog):
    caplog.set_level(logging.INFO, logger="epl")
    model = BlockMLP()
    _train(model, model.data(2 * model.batch * STEPS), 2, _config(), steps=1)
    text = str(epl.Graph.get().auto_partition)
    assert text in caplog.text
    assert "stage 0: blocks model/block_0, model/block_1;" in text
    assert [tg.name for tg in epl.Graph.get().taskgraphs] == ["stage_0", "stage_1"]


def test_the_pass_is_first_in_the_rewriter_and_the_plan_has_the_stages():
    assert isinstance(rewriter.PASSES[0], AutoStages)
    epl.init(_config(), cluster=Cluster(devices_per_worker=2))
    model = BlockMLP()
    loss = model.loss(corpusutil.dataset(model.data(8), model.batch))
    model.train_op(loss)
    view, env = epl.Graph.get(), epl.Env.get()
    program = rewriter.parallelize(view, env.config, env.cluster)
    assert len(program.plan.stages) == 2 and view.auto_partition is not None


def test_the_pass_refuses_a_plan_made_without_the_stages():
    epl.init(_config(), cluster=Cluster(devices_per_worker=2))
    model = BlockMLP()
    model.train_op(model.loss(corpusutil.dataset(model.data(8), model.batch)))
    view, env = epl.Graph.get(), epl.Env.get()
    view.ensure_taskgraph()
    from epl.parallel.plan import make_plan, specs_from_graph
    plan = make_plan(env.config, env.cluster, specs_from_graph(view))
    with pytest.raises(RuntimeError, match="stages must be made before planning"):
        rewriter.parallelize(view, env.config, env.cluster, plan=plan)


# ---- no stages -----------------------------------------------------------------------
@pytest.mark.parametrize("stages", [None, 1])
def test_without_stages_auto_parallel_is_data_parallelism_over_all_devices(stages):
    model = BlockMLP()
    arrays = model.data(4 * model.batch * STEPS)
    _, reference = _serial(model, arrays, 4)
    _, copies = _train(model, arrays, 4, _config(stages, micro_batches=1))
    view = epl.Graph.get()
    assert view.auto_partition is None and len(view.taskgraphs) == 1
    assert view.parallel.plan.num_replicas == 4
    worst, where = corpusutil.max_difference(reference, copies)
    assert worst < TOL, where


# ---- bad input -----------------------------------------------------------------------
def _build_and_run(config, devices=2, scope=None, model=None, setup=None):
    epl.init(config, cluster=Cluster(devices_per_worker=devices))
    if setup is not None:
        setup()
    model = model or BlockMLP()
    if scope is not None:
        with scope:
            loss = model.loss(corpusutil.dataset(model.data(8), model.batch))
    else:
        loss = model.loss(corpusutil.dataset(model.data(8), model.batch))
    train = model.train_op(loss)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(train)


def test_strategy_scopes_with_auto_parallel_are_refused():
    with pytest.raises(AutoParallelError, match=r"auto.auto_parallel=True cannot be combined "
                                                r"with strategy scopes.*'stage_a'"):
        _build_and_run(_config(), scope=epl.replicate(1, name="stage_a"))


def test_default_strategy_with_auto_parallel_is_refused():
    with pytest.raises(AutoParallelError, match="set_default_strategy"):
        _build_and_run(_config(stages=None),
                       setup=lambda: epl.set_default_strategy(epl.replicate(1)))


def test_num_stages_without_auto_parallel_is_refused_by_epl_init():
    """Refused before the model is built (tests/graph/test_init_refusals.py)."""
    with pytest.raises(ConfigError, match="pipeline.num_stages=2 is only read by automatic"):
        epl.init(epl.Config({"pipeline.num_stages": 2}), cluster=Cluster(devices_per_worker=2))


def test_stages_must_divide_the_devices():
    with pytest.raises(partition.PartitionError,
                       match="num_stages=3 does not divide the job's 4 devices"):
        epl.init(_config(stages=3), cluster=Cluster(devices_per_worker=4))
    # the pass refuses it too, for a rewrite started without epl.init's check
    epl.init(_config(stages=2), cluster=Cluster(devices_per_worker=4))
    model = BlockMLP()
    model.train_op(model.loss(corpusutil.dataset(model.data(8), model.batch)))
    view = epl.Graph.get()
    with pytest.raises(PlanError, match="num_stages=3 does not divide the job's 4 devices"):
        rewriter.plan_for(view, _config(stages=3), Cluster(devices_per_worker=4))


class _Tiny(Model):
    """Three ops of batch work: cannot make four stages."""

    name = "tiny"

    def data(self, rows, seed=0):
        return (np.ones((rows, 3), np.float32),)

    def build(self, batch, stage=None):
        weights = tf.get_variable("w", [3, 1])
        return tf.reduce_sum(tf.matmul(batch[0], weights))


def test_more_stages_than_the_model_has_units():
    with pytest.raises(PlanError, match="num_stages=4 exceeds the 3 unit"):
        _build_and_run(_config(stages=4), devices=4, model=_Tiny())
