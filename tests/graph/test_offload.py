"""Offload v0: weights on the host CPU, a just-in-time copy per use sent to the compute device.

Equivalence: training with offload ends with the weights of plain (serial) training,
on an MLP (ref and resource variables) and on the real-model corpus, with no
parallelism and data parallelism over 2 devices (the corpus's embedding and odd-sized
models; ResNet and BERT under data parallelism in test_corpus.py) and gradient
accumulation (every corpus model).
Structure: every variable, slot and update on the host, compute on the compute
devices (checked on GPU device strings, so host and compute devices differ).
A checkpoint round trip, and the bytes of weights resident on a compute device.
"""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import corpusutil
import epl
from epl import tf_adapter
from epl.cluster import Cluster
from epl.parallel import rewriter
from epl.profiler.run_metadata import device_memory_stats
from epl.runtime.offload import OFFLOAD_SCOPE
from eplutil import (MEASURED, copy_values, dataset_input, initial_weights, make_data, max_diff,
                     mlp, serial_train, train_step)
from realmodels import CORPUS

TOL = 1e-5
CORPUS_TOL = 2e-5
STEPS = 4
OFFLOAD = {"offload.level": "v0"}
HOST = "/job:localhost/replica:0/task:0/device:CPU:0"
CPU1 = "/job:localhost/replica:0/task:0/device:CPU:1"


def _record(value):
    import os
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], value))


def _build_mlp(devices, batch, opt_name, config=OFFLOAD, resource=False):
    x, y = make_data(64)
    epl.init(epl.Config(config), cluster=Cluster(devices_per_worker=devices))
    epl.set_default_strategy(epl.replicate(1))
    with tf.variable_scope("", use_resource=resource):
        loss = mlp(*dataset_input(x, y, batch), weights=initial_weights())
    return loss, train_step(loss, opt_name)


def values_of_copies(sess, name):
    """Every local copy's value of a (ref or resource) variable."""
    program = epl.Graph.get(sess.graph).parallel
    reads = []
    for op in program.variable_copies[name]:
        with tf.device(op.device):
            reads.append(tf_adapter.read_variable(op) if op.type == "VarHandleOp"
                         else op.outputs[0])
    return sess.run(reads)


def _train_mlp(devices, opt_name, resource=False, config=OFFLOAD):
    loss, train = _build_mlp(devices, 16 // devices, opt_name, config, resource)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(STEPS):
            sess.run(train)
        names = [v.op.name for v in tf.global_variables() if v.op.name != "global_step"]
        return dict((n, values_of_copies(sess, n)) for n in names)


# ---- equivalence ------------------------------------------------------------------
@pytest.mark.parametrize("devices,opt_name,resource", [
    (1, "momentum", False), (1, "adam", True), (2, "momentum", True), (2, "adam", False)])
def test_mlp_matches_plain_training(devices, opt_name, resource):
    x, y = make_data(64)
    _, reference = serial_train(x, y, 16, STEPS, opt_name)
    copies = _train_mlp(devices, opt_name, resource)
    assert set(copies) == set(reference) - {"global_step"}
    for name, values in copies.items():
        assert len(values) == devices
        assert max_diff(reference[name], values) < TOL, name


MODES = {
    # mode: (runner, slices per step of the serial reference, moving statistics compared)
    "single": (lambda m, a: corpusutil.run_dp(m, a, devices=1, config=OFFLOAD), 1, "all"),
    "dp_1x2": (lambda m, a: corpusutil.run_dp(m, a, devices=2, config=OFFLOAD), 2, "first"),
    "ga_2": (lambda m, a: corpusutil.run_ga(m, a, micro_batches=2, config=OFFLOAD), 2, "all"),
}


# The costly ResNet and BERT graphs run offload here under gradient accumulation (batch
# norm's statistics and Adam's slots meet the accumulators); under data parallelism
# they run it in tests/graph/test_corpus.py ("dp_1x2+offload+grouped": offload and
# grouped apply on every replica's copies). Offload on one device is the replica-0 path
# of dp_1x2 without the all-reduce (the MLP cases above run it on ref and resource
# variables, Momentum and Adam). The models whose variables are unusual (odd sizes,
# sparse-gradient tables) run every mode. (Suite budget.)
CORPUS_CASES = [(model, mode) for mode in sorted(MODES) for model in CORPUS
                if mode == "ga_2" or model.name in ("embedding", "odd")]


@pytest.mark.parametrize("model_class,mode", CORPUS_CASES,
                         ids=["%s-%s" % (model.name, mode) for model, mode in CORPUS_CASES])
def test_corpus_matches_serial_training(model_class, mode, corpus_reference):
    runner, slices, stats = MODES[mode]
    model = model_class()
    arrays = model.data(slices * model.batch * corpusutil.STEPS)
    _, reference = corpus_reference(model, arrays, slices, stats)
    _, copies = runner(model, arrays)
    worst, where = corpusutil.max_difference(reference, copies, stats)
    _record(worst)
    assert worst < CORPUS_TOL, "%s differs from serial training by %.3g" % (where, worst)
    assert set(reference) - {"global_step"} <= set(copies)
    graph = tf.get_default_graph()
    assert any(op.name.startswith(OFFLOAD_SCOPE) for op in graph.get_operations())
    program = epl.Graph.get(graph).parallel
    for name, instances in program.variable_copies.items():
        assert all(op.device == HOST for op in instances), name


def _rnn_with_cond(x, y):
    """dynamic_rnn (a while loop reading its weights through Enter) and a tf.cond."""
    with tf.variable_scope("m", initializer=tf.constant_initializer(0.1)):
        out, _ = tf.nn.dynamic_rnn(tf.nn.rnn_cell.BasicRNNCell(6), x, dtype=tf.float32)
        h = out[:, -1]
        v = tf.get_variable("v", [6, 3])
        logits = tf.cond(tf.reduce_sum(h) > 0, lambda: tf.matmul(h, v),
                         lambda: tf.matmul(h, v) * 2.0)
    loss = tf.losses.sparse_softmax_cross_entropy(y, logits)
    return loss, tf.train.AdamOptimizer(0.01).minimize(
        loss, tf.train.get_or_create_global_step())


def _train_rnn(steps=3):
    rng = np.random.RandomState(0)
    x, y = rng.rand(32, 5, 4).astype(np.float32), rng.randint(0, 3, 32)
    loss, train = _rnn_with_cond(*dataset_input(x, y, 8))
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        curve = [sess.run([loss, train])[0] for _ in range(steps)]
        return curve, dict((v.op.name, sess.run(v)) for v in tf.trainable_variables())


def test_while_loop_and_cond_model_matches_plain_training():
    with epl.paused(), tf.Graph().as_default():
        ref_curve, reference = _train_rnn()
    epl.init(epl.Config(OFFLOAD), cluster=Cluster(devices_per_worker=1))
    curve, values = _train_rnn()
    np.testing.assert_allclose(curve, ref_curve, rtol=1e-6)
    for name, value in values.items():
        np.testing.assert_allclose(value, reference[name], atol=1e-7, err_msg=name)
    graph = tf.get_default_graph()
    assert any(op.name.startswith(OFFLOAD_SCOPE) for op in graph.get_operations())
    kernel_read = graph.get_operation_by_name("m/rnn/basic_rnn_cell/kernel/read")
    readers = kernel_read.outputs[0].consumers()
    assert readers and all(r.name.startswith(OFFLOAD_SCOPE) for r in readers)


# ---- structure ----------------------------------------------------------------------
def _gpu_program(opt_name="adam", resource=False, config=OFFLOAD):
    """Build the MLP on a 2-GPU worker (device strings only) and rewrite it; no run."""
    loss, _ = _build_gpu(opt_name, resource, config)
    env, view = epl.Env.get(), epl.Graph.get()
    program = rewriter.parallelize(view, env.config, env.cluster)
    return view, program, loss


def _build_gpu(opt_name, resource, config):
    x, y = make_data(64)
    epl.init(epl.Config(config), cluster=Cluster(devices_per_worker=2, device_type="GPU"))
    epl.set_default_strategy(epl.replicate(1))
    with tf.variable_scope("", use_resource=resource):
        loss = mlp(*dataset_input(x, y, 8), weights=initial_weights())
    return loss, train_step(loss, opt_name)


def _ops_of_copy(view, copy, phases):
    return [op for op in view.tf_graph.get_operations()
            if view.info(op) is not None and view.info(op).copy == copy
            and view.info(op).phase in phases]


_COMPUTE = ("MatMul", "BiasAdd", "Relu", "BiasAddGrad", "ReluGrad",
            "SparseSoftmaxCrossEntropyWithLogits")


def _compute_of_copy(view, copy):
    """(compute ops of ``copy`` in the graph, {"<function>/<node>": the call running it}
    for the compute nodes of the stage functions ``copy`` calls)."""
    ops = _ops_of_copy(view, copy, ("forward", "backward"))
    library = dict((f.signature.name, f) for f in
                   view.tf_graph.as_graph_def().library.function)
    in_calls = {}
    for call in [op for op in ops if op.type == "StatefulPartitionedCall"]:
        body = library[call.get_attr("f").name]
        for node in body.node_def:
            if node.op in _COMPUTE:
                in_calls["%s/%s" % (body.signature.name, node.name)] = call
    return [op for op in ops if op.type in _COMPUTE], in_calls


@pytest.mark.parametrize("resource", [False, True])
def test_variables_slots_and_updates_on_host_compute_on_devices(resource):
    view, program, _ = _gpu_program("adam", resource)
    for copy in range(2):
        gpu = "/job:localhost/replica:0/task:0/device:GPU:%d" % copy
        variables = [op for op in _ops_of_copy(view, copy, ("forward", "apply"))
                     if op.type in ("VariableV2", "VarHandleOp") and op.name != "global_step"]
        # d1, d2 (kernel, bias) with two Adam slots each, and the beta powers
        assert len(variables) == 4 * 3 + 2, [v.name for v in variables]
        assert all(v.device == HOST for v in variables)
        for op in _ops_of_copy(view, copy, ("apply",)):
            assert op.device == HOST, op.name
        # compute runs on the copy's GPU: as ops, or inside the calls of stage functions
        compute, in_calls = _compute_of_copy(view, copy)
        assert len(compute) + len(in_calls) >= 10
        assert all(op.device == gpu for op in compute), [(o.name, o.device) for o in compute]
        assert all(call.device == gpu for call in in_calls.values())
        for op in _ops_of_copy(view, copy, ("forward", "backward")):
            if op.type in ("ReadVariableOp", "VariableV2", "VarHandleOp") or \
                    (op.type == "Identity" and op.name.endswith("/read")):
                assert op.device == HOST, op.name
    assert set(program.variable_copies) >= {"d1/kernel", "d1/kernel/Adam", "beta1_power"}


def test_every_use_reads_its_own_copy_after_the_other_inputs():
    view, _, _ = _gpu_program("momentum")
    graph = view.tf_graph
    kernel_read = graph.get_operation_by_name("d2/kernel/read").outputs[0]
    readers = [c for c in kernel_read.consumers()]
    assert all(c.type == "Identity" and c.name.startswith(OFFLOAD_SCOPE) for c in readers)
    # forward MatMul and the backward MatMul (input gradient) each get a copy; the user
    # ops stand for the stage functions' calls, which read the copies now
    users = [c for r in readers for c in r.outputs[0].consumers()
             if c.type != "StatefulPartitionedCall"]
    assert sorted(u.name for u in users) == ["d2/MatMul", "gradients/d2/MatMul_grad/MatMul"]
    for copy in readers:
        user = [c for c in copy.outputs[0].consumers() if c.type != "StatefulPartitionedCall"][0]
        others = set(t.op.name for t in user.inputs) - {copy.name}
        assert others and len(copy.control_inputs) >= 1
        calls = [c for c in copy.outputs[0].consumers() if c.type == "StatefulPartitionedCall"]
        assert len(calls) == 1 and calls[0].device.endswith("GPU:0")
        # the copy waits for what computes the user's other inputs: the calls that do
        assert all(c.type == "StatefulPartitionedCall" or c.name in others
                   for c in copy.control_inputs), [c.name for c in copy.control_inputs]
        assert copy.device == HOST and user.device.endswith("GPU:0")
    # copy 1 has its own per-use copies, sent to its own device
    clone = graph.get_operation_by_name("EPL_REPLICA_1/%s" % readers[0].name)
    assert clone.device == HOST
    assert [c.device for c in clone.outputs[0].consumers()] == [
        "/job:localhost/replica:0/task:0/device:GPU:1"]
    assert graph.get_operation_by_name("EPL_REPLICA_1/d2/kernel/read").device == HOST


def test_initial_values_are_computed_on_the_host():
    _gpu_program("momentum")
    kernel = [v for v in tf.global_variables() if v.op.name == "d1/kernel"][0]
    assert kernel.initializer.device == HOST
    init_value = kernel.initializer.inputs[1].op
    assert init_value.device == HOST


def test_without_offload_weights_stay_on_devices():
    view, _, _ = _gpu_program("momentum", config={})
    kernel = view.tf_graph.get_operation_by_name("EPL_REPLICA_1/d1/kernel")
    assert kernel.device.endswith("GPU:1")
    assert not [op for op in view.tf_graph.get_operations() if OFFLOAD_SCOPE in op.name]


@pytest.mark.parametrize("lowering", ["stage_functions", "unrolled"])
def test_pipeline_stages_keep_compute_on_their_devices(lowering):
    """Two stages on CPU:0 and CPU:1: both stages' weights on the host, stage 1's
    compute on CPU:1; training still matches serial."""
    from eplutil import staged_mlp
    x, y = make_data(64)
    _, reference = serial_train(x, y, 8, STEPS)
    epl.init(epl.Config(dict(OFFLOAD, **{"pipeline.num_micro_batch": 2,
                                         "pipeline.micro_batching": lowering})),
             cluster=Cluster(devices_per_worker=2))
    loss = staged_mlp(*dataset_input(x, y, 4), weights=initial_weights())
    train = train_step(loss)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(STEPS):
            sess.run(train)
        values = dict((n, sess.run(n + ":0")) for n in ("d1/kernel", "d2/kernel", "d2/bias"))
    graph = tf.get_default_graph()
    assert graph.get_operation_by_name("d2/kernel").device == HOST
    assert graph.get_operation_by_name("d2/MatMul").device == CPU1
    if lowering == "unrolled":
        assert graph.get_operation_by_name("EPL_MICRO_BATCH_1/d2/MatMul").device == CPU1
    else:  # stage 1's calls (its body has no devices: it runs where it is called)
        entrances, _ = epl.Graph.get().parallel.boundaries[0]
        for micro_batch in range(2):
            for kind in "FB":
                assert entrances[(1, kind, micro_batch)][0].device == CPU1
    for name, value in values.items():
        assert max_diff(reference[name], [value]) < TOL, name


# ---- checkpoints ------------------------------------------------------------------
def test_checkpoint_round_trip(tmp_path):
    path = str(tmp_path / "model")
    loss, train = _build_mlp(2, 8, "adam", OFFLOAD)
    saver = tf.train.Saver()
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(2):
            sess.run(train)
        saved = dict((v.op.name, sess.run(v)) for v in tf.global_variables())
        saver.save(sess, path)
    epl.reset()
    with tf.Graph().as_default():
        loss, train = _build_mlp(2, 8, "adam", OFFLOAD)
        saver = tf.train.Saver()
        with tf.Session() as sess:
            saver.restore(sess, path)
            sess.run(loss)  # the first run syncs copy 1 from the restored copy 0
            for name, value in saved.items():
                if name == "global_step":
                    assert sess.run(name + ":0") == value
                    continue
                for copy in copy_values(sess, name):
                    np.testing.assert_array_equal(copy, value, err_msg=name)
    with tf.Graph().as_default(), epl.paused():
        reader = tf.train.load_checkpoint(path)
        np.testing.assert_array_equal(reader.get_tensor("d1/kernel"), saved["d1/kernel"])


# ---- memory ------------------------------------------------------------------------
def weight_bytes_per_device(run_metadata, variable_names):
    """Persistent bytes of variable nodes, per device, in one traced step."""
    found = {}
    for dev in run_metadata.step_stats.dev_stats:
        for node in dev.node_stats:
            if node.node_name in variable_names:
                found[dev.device] = found.get(dev.device, 0) + \
                    node.memory_stats.persistent_memory_size
    return found


def traced_step(config):
    loss, train = _build_mlp(2, 8, "adam", config)
    names = set()
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(train)
        program = epl.Graph.get(sess.graph).parallel
        for copies in program.variable_copies.values():
            names.update(op.name for op in copies)
        metadata = tf.RunMetadata()
        sess.run(train, options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
                 run_metadata=metadata)
    return metadata, names


def test_no_weight_bytes_resident_on_a_compute_device():
    """Copy 1 computes on CPU:1 (CPU:0 is also the host here); with offload none of
    its weights, slots or beta powers live there between steps."""
    metadata, names = traced_step(OFFLOAD)
    weights = weight_bytes_per_device(metadata, names)
    assert weights.get(CPU1, 0) == 0
    assert weights[HOST] > 0
    # What persists on CPU:1 is small constants only (grappler may fold a few of the
    # loss's per-example constants there: two of 32 bytes on TF 2.15), no variable. A list,
    # not a table by name: the nodes of a stage function's body keep their names in every
    # call, and each call's constants count.
    persistent = [(node.node_name, node.memory_stats.persistent_memory_size)
                  for dev in metadata.step_stats.dev_stats if dev.device == CPU1
                  for node in dev.node_stats if node.memory_stats.persistent_memory_size]
    assert not set(name for name, _ in persistent) & names
    assert all(size <= 64 for _, size in persistent), persistent
    assert device_memory_stats(metadata)[CPU1].persistent_bytes == sum(
        size for _, size in persistent)
    ran_on = dict((node.node_name, dev.device) for dev in metadata.step_stats.dev_stats
                  for node in dev.node_stats)
    # copy 1's forward is a call of the stage function (d1/MatMul runs inside it)
    assert ran_on["EPL_REPLICA_1/EPL_MICRO_BATCH_0/EPL_stage0_forward"] == CPU1
    assert ran_on["EPL_REPLICA_1/d1/kernel"] == HOST
    epl.reset()
    with tf.Graph().as_default():
        metadata, names = traced_step({})
        assert weight_bytes_per_device(metadata, names)[CPU1] > 0
