"""What the pipeline rewrite does so that TensorFlow starts its graph quickly.

The first step of a pipelined graph pays for grappler on micro-batch copies
(``benchmarks/rewrite_cost.py`` measures it); these tests pin the graph and
session properties that keep that cost down: for unrolled copies, shared
constants and folded sums; for stage functions, call sites that no TF pass
turns into a copy of the body each (grappler's specialization and inlining
check, XLA's clustering check).
"""
import numpy as np
import tensorflow.compat.v1 as tf
from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.grappler import tf_optimizer

import epl
from epl.cluster import Cluster
from epl.parallel import rewriter
from epl.parallel.repeat.gates import GradientGates
from epl.parallel.repeat.step_ops import constant_expressions
from eplutil import (copy_values, dataset_input, initial_weights, make_data, staged_mlp,
                     train_step)

MICRO_BATCHES = 4


def _pipelined_train_op():
    # These tests are about unrolled micro-batch copies; stage functions sum gradients
    # inside the backward function and copy nothing (tests/graph/test_pipeline.py).
    epl.init(epl.Config({"pipeline.num_micro_batch": MICRO_BATCHES,
                         "pipeline.micro_batching": "unrolled"}),
             cluster=Cluster(devices_per_worker=2))
    x, y = make_data(64)
    train = train_step(staged_mlp(*dataset_input(x, y, 4), initial_weights()))
    env = epl.Env.get()
    rewriter.parallelize(epl.Graph.get(), env.config, env.cluster)
    return train


def _arithmetic_optimizer_only(train):
    """The graph after grappler's arithmetic optimizer (the pass that folds add chains)."""
    graph = tf.get_default_graph()
    graph.add_to_collection(tf.GraphKeys.TRAIN_OP, train)
    meta = tf.train.export_meta_graph(graph=graph)
    config = tf.ConfigProto()
    options = config.graph_options.rewrite_options
    off = rewriter_config_pb2.RewriterConfig.OFF
    for name in ("constant_folding", "dependency_optimization", "memory_optimization",
                 "layout_optimizer", "loop_optimization", "function_optimization",
                 "shape_optimization", "remapping", "debug_stripper"):
        setattr(options, name, off if name != "memory_optimization"
                else rewriter_config_pb2.RewriterConfig.NO_MEM_OPT)
    options.arithmetic_optimization = rewriter_config_pb2.RewriterConfig.ON
    options.min_graph_nodes = -1
    options.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    return tf_optimizer.OptimizeGraph(config, meta)


def test_micro_batch_sums_are_not_folded_into_wide_add_n():
    """Grappler's memory optimizer rewrites every AddN of more than two inputs
    (after a whole-graph memory simulation); the micro-batch sum of each gradient
    must reach it as two-input adds, in micro-batch order."""
    train = _pipelined_train_op()
    sums = [op for op in tf.get_default_graph().get_operations()
            if op.name.startswith("EPL_MICRO_BATCH_SUM") and op.type == "AddV2"]
    assert len(sums) == len(tf.trainable_variables()) * (MICRO_BATCHES - 1)  # a chain each
    for op in sums:  # each add waits for its addend: the chain keeps serial order
        assert op.inputs[1].op in op.control_inputs
    optimized = _arithmetic_optimizer_only(train)
    wide = [node.name for node in optimized.node
            if node.name.startswith("EPL_MICRO_BATCH_SUM") and node.op == "AddN"
            and len([i for i in node.input if not i.startswith("^")]) > 2]
    assert not wide
    kept = [node for node in optimized.node
            if node.name.startswith("EPL_MICRO_BATCH_SUM") and node.op == "AddV2"]
    assert len(kept) == len(sums)


def test_constant_expressions_are_shared_by_micro_batches():
    graph = tf.Graph()
    with graph.as_default():
        perm = tf.constant([1, 0], name="perm")
        inverse = tf.invert_permutation(perm, name="inverse")
        x = tf.placeholder(tf.float32, [2, 3], name="x")
        moved = tf.transpose(x, inverse, name="moved")
        noise = tf.random_uniform([2], name="noise")  # stateful: one draw per micro-batch
        with tf.control_dependencies([moved]):
            tf.identity(perm, name="ordered")  # has a control input
        scaled = tf.multiply(inverse, 2, name="scaled")
    candidates = [op for op in graph.get_operations() if op.name != "scaled/y"]
    shared = constant_expressions(candidates)
    assert {"perm", "inverse"} <= shared
    assert not shared & {"x", "moved", "ordered", noise.op.name}
    assert scaled.op.name not in shared  # its constant input is not a candidate
    assert "moved" not in constant_expressions([perm.op, inverse.op, moved.op])


def test_pipeline_clones_do_not_copy_constant_expressions():
    _pipelined_train_op()
    ops = tf.get_default_graph().get_operations()
    copied = [op for op in ops if op.name.startswith("EPL_MICRO_BATCH_1/")]
    assert copied and not [op for op in copied if op.type == "Const" and not op.control_inputs]
    shared = constant_expressions([op for op in ops if not op.name.startswith("EPL_")])
    assert not [op for op in copied if op.name[len("EPL_MICRO_BATCH_1/"):] in shared]


def test_copies_do_without_gradient_gates_but_keep_their_order():
    """Micro-batch copies have no ``tuple/`` gate ops; the sum of d2/kernel's
    gradient still waits for the op of the same micro-batch that reads d2/kernel
    to compute d1's gradient (else the update could change the weight under it)."""
    _pipelined_train_op()
    ops = tf.get_default_graph().get_operations()
    assert [op for op in ops if "/tuple/" in op.name and not op.name.startswith("EPL_")]
    assert not [op for op in ops if op.name.startswith("EPL_MICRO_BATCH_1/")
                and "/tuple/" in op.name]
    reader = tf.get_default_graph().get_operation_by_name(
        "EPL_MICRO_BATCH_1/gradients/d2/MatMul_grad/MatMul")
    assert [t for t in reader.inputs if t.op.name.endswith("d2/kernel/read")]
    adds = [op for op in ops if op.name.startswith("EPL_MICRO_BATCH_SUM")
            and any(t.op.name == "EPL_MICRO_BATCH_1/gradients/d2/MatMul_grad/MatMul_1"
                    for t in op.inputs)]
    assert len(adds) == 1 and reader in adds[0].control_inputs


def test_gradient_gates_follow_chains_of_forwards():
    """AddN's gradient hands the same gated tensor to each input: the second gate
    forwards the first; a copy reads the producer and waits for both gates' members."""
    graph = tf.Graph()
    with graph.as_default():
        w = tf.get_variable("w", initializer=tf.constant([1.0, 2.0]))
        v = tf.get_variable("v", initializer=tf.constant([3.0, 4.0]))
        loss = tf.reduce_sum(tf.add_n([w * v, w * w]) * 2.0)
        tf.train.GradientDescentOptimizer(0.1).compute_gradients(loss)
    gates = GradientGates(graph.get_operations())
    assert gates.forwarded and gates.dropped
    chained = [name for name, tensor in gates.forwarded.items()
               if tensor.op.name in gates.forwarded]
    assert chained
    for name in chained:
        source = gates.source(graph.get_tensor_by_name(name + ":0"))
        assert source.op.name not in gates.forwarded and source.op.type != "Identity"
        upstream = gates.forwarded[name].op.name
        assert set(op.name for op in gates.waits(upstream)) <= set(
            op.name for op in gates.waits(name))
        assert not [op for op in gates.waits(name) if gates.skipped(op.name)]


# ---- local replicas start without a broadcast ---------------------------------------
def _dp_mlp(devices=2, random_init=True):
    """A 2-replica MLP (random, unseeded initial values unless told otherwise)."""
    epl.init(epl.Config(), cluster=Cluster(devices_per_worker=devices))
    epl.set_default_strategy(epl.replicate(1))
    x, y = make_data(64)
    xb, yb = dataset_input(x, y, 4)
    init = None if random_init else tf.constant_initializer(0.5)
    hidden = tf.layers.dense(xb, 8, activation=tf.nn.relu, kernel_initializer=init, name="d1")
    loss = tf.losses.sparse_softmax_cross_entropy(yb, tf.layers.dense(hidden, 3, name="d2"))
    return train_step(loss)


def test_local_replicas_are_initialized_with_replica_0_and_not_broadcast(monkeypatch):
    """On one worker, the user's initializer sets every local copy from the same
    (here random, unseeded) initial value; the first step runs EPL's set-up only,
    not the broadcast of every weight and slot."""
    from epl.session import runner
    train = _dp_mlp()
    broadcasts = []
    monkeypatch.setattr(runner, "LOG", _Recorder(broadcasts, runner.LOG))
    sess = tf.Session()
    sess.run(tf.global_variables_initializer())
    program = epl.Graph.get().parallel
    assert program.linked_init
    for name in ("d1/kernel", "d2/kernel"):
        first, second = copy_values(sess, name)
        assert (first == second).all() and first.any()
    sess.run(train)
    assert not [m for m in broadcasts if "synchronized" in m]
    kernel = tf.get_default_graph().get_tensor_by_name("d1/kernel:0")
    value = np.full(kernel.shape.as_list(), 0.25, np.float32)
    [v for v in tf.global_variables() if v.op.name == "d1/kernel"][0].load(value, sess)
    assert all((copy == value).all() for copy in copy_values(sess, "d1/kernel"))


def test_a_restore_still_broadcasts_to_local_replicas(tmp_path):
    train = _dp_mlp()
    saver = tf.train.Saver()
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(train)
        saved = copy_values(sess, "d1/kernel")[0]
        path = saver.save(sess, str(tmp_path / "model"))
        sess.run(tf.global_variables_initializer())  # different random values
        saver.restore(sess, path)
        sess.run(tf.train.get_global_step())  # the first run after a restore broadcasts
        first, second = copy_values(sess, "d1/kernel")
        assert (first == saved).all() and (second == saved).all()


def _sync_ops(graph):
    return [op for op in graph.get_operations() if op.name.startswith("EPL_SYNC")
            and not op.name.startswith("EPL_SYNC/init")]


def test_the_broadcast_is_built_only_when_a_restore_needs_it(tmp_path):
    """On one worker the broadcast serves only restores: the rewrite leaves it
    (two ops per variable and copy, about 40% of the rewrite of a BERT-shaped
    encoder on 2 replicas) to the first run after a restore, also on the graph a
    MonitoredTrainingSession finalized; the restored values reach every copy."""
    train = _dp_mlp()
    graph = tf.get_default_graph()
    directory = str(tmp_path)
    with tf.train.MonitoredTrainingSession(checkpoint_dir=directory,
                                           save_checkpoint_steps=1) as sess:
        for _ in range(2):
            sess.run(train)
        assert graph.finalized and epl.Graph.get().parallel.linked_init
        saved = copy_values(sess, "d1/kernel")[0]
    assert not [op for op in _sync_ops(graph) if op.type in ("Assign", "AssignVariableOp")]
    with tf.train.MonitoredTrainingSession(checkpoint_dir=directory) as sess:
        sess.run(tf.train.get_global_step())  # restored; the first run broadcasts
        assert graph.finalized
        first, second = copy_values(sess, "d1/kernel")
    assert (first == saved).all() and (second == saved).all()
    assert len([op for op in _sync_ops(graph) if op.type in ("Assign", "AssignVariableOp")]) \
        == len([v for v in tf.global_variables() if v.op.name.startswith("d")])


class _Recorder(object):
    """A logger stand-in that records info messages."""

    def __init__(self, messages, logger):
        self.messages, self.logger = messages, logger

    def info(self, message, *args):
        self.messages.append(message % args if args else message)

    def __getattr__(self, name):
        return getattr(self.logger, name)


def _stage_function_pipeline(micro_batching="stage_functions"):
    epl.init(epl.Config({"pipeline.num_micro_batch": MICRO_BATCHES,
                         "pipeline.micro_batching": micro_batching}),
             cluster=Cluster(devices_per_worker=2))
    x, y = make_data(64)
    return train_step(staged_mlp(*dataset_input(x, y, 4), initial_weights()))


def test_stage_function_calls_are_not_specialized_per_call_site():
    """Grappler's function optimizer (when a user turns it on) leaves the calls
    alone: before, it made a specialized copy of a backward body for micro-batch
    0 and another for the rest, each instantiated on its own."""
    train = _stage_function_pipeline()
    env = epl.Env.get()
    rewriter.parallelize(epl.Graph.get(), env.config, env.cluster)
    graph = tf.get_default_graph()
    graph.add_to_collection(tf.GraphKeys.TRAIN_OP, train)
    config = tf.ConfigProto()
    options = config.graph_options.rewrite_options
    options.function_optimization = rewriter_config_pb2.RewriterConfig.ON
    options.min_graph_nodes = -1
    optimized = tf_optimizer.OptimizeGraph(config, tf.train.export_meta_graph(graph=graph))
    names = [f.signature.name for f in optimized.library.function]
    assert any(name.startswith("EPL_stage") for name in names)
    assert not [name for name in names if "specialized" in name]
    calls = [n for n in optimized.node if n.op == "StatefulPartitionedCall"]
    assert len(calls) == 2 * 2 * MICRO_BATCHES  # forward + backward, 2 stages: none inlined


def test_stage_function_calls_are_kept_from_xla_clustering():
    """TF's auto-clustering pass builds the body of every call it may cluster
    (even with XLA off); EPL's calls say they are not to be compiled whole."""
    _stage_function_pipeline()
    env = epl.Env.get()
    rewriter.parallelize(epl.Graph.get(), env.config, env.cluster)
    calls = [op for op in tf.get_default_graph().get_operations()
             if op.type == "StatefulPartitionedCall"]
    assert len(calls) >= 2 * MICRO_BATCHES
    assert all(op.get_attr("_XlaCompile") is False for op in calls)


def _function_optimization(sess):
    return sess._config.graph_options.rewrite_options.function_optimization  # noqa


def test_sessions_of_stage_function_graphs_run_without_the_function_optimizer():
    """Grappler's function optimizer builds a body per call site only to find it
    must not inline it: sessions of graphs calling stage functions turn it off;
    a user's explicit setting wins, and other graphs keep TF's default."""
    toggle = rewriter_config_pb2.RewriterConfig
    _stage_function_pipeline()
    with tf.Session() as sess:
        assert _function_optimization(sess) == toggle.OFF
    config = tf.ConfigProto()
    config.graph_options.rewrite_options.function_optimization = toggle.ON
    with tf.Session(config=config) as sess:
        assert _function_optimization(sess) == toggle.ON
    tf.reset_default_graph()
    _stage_function_pipeline("unrolled")
    with tf.Session() as sess:
        assert _function_optimization(sess) == toggle.DEFAULT


def test_pipelines_train_alike_with_the_function_optimizer_on_and_off():
    """The setting changes how TF prepares the graph, not what it computes."""
    values = []
    for toggle in (rewriter_config_pb2.RewriterConfig.OFF, rewriter_config_pb2.RewriterConfig.ON):
        tf.reset_default_graph()
        train = _stage_function_pipeline()
        config = tf.ConfigProto()
        config.graph_options.rewrite_options.function_optimization = toggle
        with tf.Session(config=config) as sess:
            sess.run(tf.global_variables_initializer())
            for _ in range(3):
                sess.run(train)
            values.append(sess.run([v for v in tf.trainable_variables()]))
    for off, on in zip(*values):
        np.testing.assert_allclose(off, on, rtol=0, atol=1e-6)


def test_a_deferred_broadcast_that_fails_to_build_is_tried_again():
    """A failure while building the deferred broadcast must not leave a program that
    silently never broadcasts after a restore."""
    from epl.parallel.program import ParallelProgram
    program, calls = ParallelProgram(None, 0, 2), []

    def builder():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first build fails")
    program.defer_sync(builder)
    assert program.needs_sync
    try:
        program.build_sync()
    except RuntimeError:
        pass
    program.build_sync()
    program.build_sync()
    assert len(calls) == 2
