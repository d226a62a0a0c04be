"""What the pipeline rewrite does so that TensorFlow starts its graph quickly.

The first step of a pipelined graph pays for grappler on micro-batch copies
(``benchmarks/rewrite_cost.py`` measures it); these tests pin the two graph
properties that keep that cost down.
"""
import tensorflow.compat.v1 as tf
from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.grappler import tf_optimizer

import epl
from epl.cluster import Cluster
from epl.parallel import rewriter
from epl.parallel.passes.micro_batches import constant_expressions
from eplutil import dataset_input, initial_weights, make_data, staged_mlp, train_step

MICRO_BATCHES = 4


def _pipelined_train_op():
    epl.init(epl.Config({"pipeline.num_micro_batch": MICRO_BATCHES}),
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
