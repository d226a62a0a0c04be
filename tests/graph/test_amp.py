"""AMP O1 (epl/runtime/amp*.py): painting, float16 forward ops without float16
weights, loss scaling, skipped steps, and training that matches float32.

Numerics, not speed: float16 kernels on CPU are slow but exact enough to compare
loss curves with float32 training within 1e-2 (relative).
"""
import functools
import logging

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import corpusutil
import epl
from epl.cluster import Cluster
from epl.config import ConfigError
from epl.runtime import amp, amp_lists
from epl.runtime.amp_lists import ALLOW, CLEAR, DENY, INFER
from epl.runtime.amp_paint import paint
from eplutil import dataset_input, initial_weights, make_data, mlp, serial_train, train_step
from realmodels import Bert

RTOL = 1e-2


def _config(**settings):
    values = {"amp.level": "O1"}
    values.update(dict((k.replace("__", "."), v) for k, v in settings.items()))
    return epl.Config(values)


def _all_copies(sess):
    """{variable name: [value of each local copy]} in one run."""
    program = epl.Graph.get(sess.graph).parallel
    fetch = dict((name, [op.outputs[0] for op in ops])
                 for name, ops in program.variable_copies.items())
    return sess.run(fetch)


def _train_mlp(config, x, y, batch, steps, devices=1, opt="momentum", strategy=None):
    """EPL training of the MLP; (global mean loss per step, copies after each step, steps)."""
    epl.init(config, cluster=Cluster(devices_per_worker=devices))
    epl.set_default_strategy(strategy or epl.replicate(1))
    loss = mlp(*dataset_input(x, y, batch), weights=initial_weights())
    epl.add_to_collection(loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    train = train_step(loss, opt)
    step = tf.train.get_global_step()
    curve, states, counted = [], [], []
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(steps):
            curve.append(sess.run([loss, train])[0])
            states.append(_all_copies(sess))
            counted.append(sess.run(step))
    return curve, states, counted


# ---- painting (pure) ---------------------------------------------------------------
def test_paint_converts_the_chain_between_matmuls():
    kinds = {"mm1": ALLOW, "bias": INFER, "relu": CLEAR, "mm2": ALLOW, "bias2": INFER,
             "xent": DENY}
    edges = {"mm1": ["bias"], "bias": ["relu"], "relu": ["mm2"], "mm2": ["bias2"],
             "bias2": ["xent"]}
    assert paint(kinds, edges).half == {"mm1", "bias", "relu", "mm2"}


def test_paint_keeps_what_follows_a_denied_op_in_float32():
    # mm1 -> exp -> reshape -> mul -> mm2: mul (infer) is downstream of exp (deny) and
    # reshape leads to it, so both stay float32 although they sit between matmuls.
    kinds = {"mm1": ALLOW, "exp": DENY, "reshape": CLEAR, "mul": INFER, "mm2": ALLOW}
    edges = {"mm1": ["exp"], "exp": ["reshape"], "reshape": ["mul"], "mul": ["mm2"]}
    painting = paint(kinds, edges)
    assert painting.half == {"mm1", "mm2"}
    assert painting.denied == {"exp", "reshape", "mul"}


def test_paint_clear_ops_follow_float16_neighbours_but_not_fixed_ops():
    # softmax -> transpose -> mm: the transpose leads to no infer/deny op, so it
    # follows the matmul; "fixed" (None: e.g. a variable read) never changes.
    kinds = {"softmax": DENY, "transpose": CLEAR, "mm": ALLOW, "read": None, "shape": CLEAR}
    edges = {"softmax": ["transpose"], "transpose": ["mm"], "read": ["mm"], "mm": ["shape"]}
    assert paint(kinds, edges).half == {"transpose", "mm", "shape"}


def test_paint_infer_op_not_between_allowed_ops_stays_float32():
    kinds = {"mm": ALLOW, "add": INFER, "tanh": INFER}
    edges = {"mm": ["add"], "add": ["tanh"]}
    assert paint(kinds, edges).half == {"mm"}


def test_listed_ops_have_float16_kernels_except_the_known_ones():
    from tensorflow.python.framework import kernels  # test-only use of TF's registry

    def cpu_half(op_type):
        for kernel in kernels.get_registered_kernels_for_op(op_type).kernel:
            if kernel.device_type != "CPU":
                continue
            typed = [c for c in kernel.constraint if c.name == "T"]
            if not typed or any(t == tf.float16.as_datatype_enum
                                for c in typed for t in c.allowed_values.list.type):
                return True
        return False

    for kind in (ALLOW, INFER, CLEAR):
        for op_type in amp_lists.LISTS[kind]:
            expected = op_type not in amp_lists.NO_HALF_KERNEL["CPU"]
            assert cpu_half(op_type) == expected, op_type


def test_epl_init_refuses_amp_keys_without_a_level(monkeypatch):
    epl.init(epl.Config({"amp.level": "O1", "amp.loss_scale": 128}))
    epl.init(epl.Config({}))
    with pytest.raises(ConfigError, match=r"amp.loss_scale = 10000 \(source: dict\) has no "
                                          r'effect unless amp.level is set; set amp.level to "O1"'):
        epl.init(epl.Config({"amp.loss_scale": 10000}))
    with pytest.raises(ConfigError, match=r"amp.debug_log = True \(source: dict\)"):
        epl.init(epl.Config({"amp.debug_log": True}))
    monkeypatch.setenv("EPL_AMP_LOSS_SCALE", "128")
    with pytest.raises(ConfigError, match=r"amp.loss_scale = 128 \(source: env EPL_AMP_LOSS"):
        epl.init()


# ---- the rewritten graph ---------------------------------------------------------------
def _mlp_graph(config, devices=1):
    x, y = make_data(32)
    epl.init(config, cluster=Cluster(devices_per_worker=devices))
    loss = mlp(*dataset_input(x, y, 16), weights=initial_weights())
    return loss, train_step(loss)


def test_forward_ops_run_in_float16_without_float16_weights():
    loss, _ = _mlp_graph(_config())
    graph = tf.get_default_graph()
    state = amp.state()
    converted = dict(state.converted)
    assert sorted(converted) == ["d1/BiasAdd", "d1/MatMul", "d1/Relu", "d2/MatMul"]
    for original, twin in converted.items():
        twin_op, original_op = graph.get_operation_by_name(twin), \
            graph.get_operation_by_name(original)
        assert twin_op.type == original_op.type
        assert twin_op.get_attr("T") == tf.float16
        consumers = [c.name for t in original_op.outputs for c in t.consumers()]
        assert set(consumers) <= set(converted), original  # only other originals
    variables = [op for op in graph.get_operations() if op.type in ("VariableV2", "VarHandleOp")]
    assert variables and all(op.get_attr("dtype") != tf.float16 for op in variables)
    # d2's bias add is not between two matmuls: it reads a cast back to float32
    bias_add = graph.get_operation_by_name("d2/BiasAdd")
    assert bias_add.inputs[0].op.type == "Cast" and bias_add.inputs[0].dtype == tf.float32
    assert loss.dtype == tf.float32


def test_weight_casts_wait_for_the_other_inputs_of_their_op():
    _mlp_graph(_config())
    graph = tf.get_default_graph()
    for name in ("d1/MatMul", "d2/MatMul", "d1/BiasAdd"):
        twin = graph.get_operation_by_name(dict(amp.state().converted)[name])
        weight = [t.op for t in twin.inputs if t.op.type == "Cast"
                  and t.op.inputs[0].op.type == "Identity"
                  and t.op.inputs[0].op.inputs[0].op.type == "VariableV2"]
        assert len(weight) == 1, name
        others = [t.op for t in twin.inputs if t.op is not weight[0]]
        assert others and set(weight[0].control_inputs) == set(others), name
        assert weight[0].outputs[0].consumers() == [twin], name  # one cast per use
    # the gradient of x @ w reads w through a cast of its own, made when dy is ready
    grad = graph.get_operation_by_name("gradients/d2/MatMul_EPL_AMP_fp16_grad/MatMul")
    recast = grad.inputs[1].op
    assert recast.type == "Cast" and recast.inputs[0].op.name == "d2/kernel/read"
    assert recast.control_inputs == [grad.inputs[0].op]


def test_gradients_are_float32_and_unscaled():
    """With a fixed scale of 128 the gradients equal float32's within float16 error."""
    w_value = np.linspace(-1, 1, 12).reshape(3, 4).astype(np.float32)
    x_value = np.linspace(0, 2, 6).reshape(2, 3).astype(np.float32)

    def grads():
        w = tf.Variable(w_value, name="w")
        loss = tf.reduce_sum(tf.tanh(tf.matmul(tf.constant(x_value) * 1.0, w)))
        grad_ys = tf.constant(3.0)
        return w, tf.gradients(loss, [w])[0], tf.gradients(loss, [w], grad_ys=grad_ys)[0]

    with epl.paused(), tf.Graph().as_default():
        _, plain, plain3 = grads()
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            expected, expected3 = sess.run([plain, plain3])
    epl.init(_config(amp__loss_scale=128), cluster=Cluster(devices_per_worker=1))
    _, grad, grad3 = grads()
    assert grad.dtype == tf.float32 and grad3.dtype == tf.float32
    assert amp.state().converted, "the matmul should run in float16"
    assert len(amp.state().loss_scales) == 1  # both calls differentiate the same loss
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        got, got3 = sess.run([grad, grad3])
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=1e-3)
    np.testing.assert_allclose(got3, expected3, rtol=RTOL, atol=3e-3)


def test_ops_inside_while_loops_stay_float32():
    epl.init(_config(), cluster=Cluster(devices_per_worker=1))
    w = tf.Variable(np.eye(3, dtype=np.float32) * 0.5, name="w")
    x = tf.constant(np.ones((2, 3), np.float32))
    looped = tf.while_loop(lambda i, h: i < 2, lambda i, h: (i + 1, tf.matmul(h, w)),
                           [0, tf.matmul(x, w)])[1]
    loss = tf.reduce_sum(looped)
    train = tf.train.GradientDescentOptimizer(0.1).minimize(loss)
    converted = [name for name, _ in amp.state().converted]
    assert converted == ["MatMul"], converted  # the matmul before the loop only
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        before = sess.run(loss)
        sess.run(train)
        assert sess.run(loss) < before


def test_non_float_loss_is_refused():
    epl.init(_config(), cluster=Cluster(devices_per_worker=1))
    w = tf.Variable(1.0)
    with pytest.raises(TypeError, match="floating point ys"):
        tf.gradients(tf.cast(w * 3.0, tf.int32), [w])


def test_new_forward_ops_join_the_taskgraph_of_the_op_they_replace():
    model = Bert()
    epl.init(_config(pipeline__num_micro_batch=2), cluster=Cluster(devices_per_worker=2))
    stage = lambda index: epl.replicate(1, name="stage_%d" % index)
    loss = model.loss(corpusutil.dataset(model.data(8), model.batch), stage)
    model.train_op(loss)
    view = epl.Graph.get()
    graph = tf.get_default_graph()
    stages = set()
    for original, twin in amp.state().converted:
        before, after = view.info(original), view.info(twin)
        assert (after.taskgraph, after.phase) == (before.taskgraph, "forward"), twin
        stages.add(after.taskgraph)
    assert stages == {0, 1}
    for name in amp.state().created:
        op = graph.get_operation_by_name(name)
        reader = op.outputs[0].consumers()[0]
        expected = "backward" if name.endswith("_EPL_AMP_recast_fp16") else "forward"
        assert view.info(op).phase == expected, name
        assert view.info(op).taskgraph == view.info(reader).taskgraph, name
    scale = graph.get_operation_by_name("EPL_AMP/loss_scale")
    assert view.info(scale).taskgraph == view.info(loss.op).taskgraph == 1


# ---- training matches float32 ----------------------------------------------------------
@pytest.mark.parametrize("loss_scale", ["dynamic", 128])
def test_mlp_matches_float32(loss_scale):
    x, y = make_data(64)
    ref_curve, reference = serial_train(x, y, 16, 4)
    curve, states, steps = _train_mlp(_config(amp__loss_scale=loss_scale), x, y, 16, 4)
    np.testing.assert_allclose(curve, ref_curve, rtol=RTOL)
    assert steps == [1, 2, 3, 4]
    for name in ("d1/kernel", "d2/kernel", "d2/bias"):
        np.testing.assert_allclose(states[-1][name][0], reference[name], atol=RTOL)


@pytest.mark.parametrize("settings", [{}, {"pipeline.num_micro_batch": 2}],
                         ids=["dp_1x2", "dp_1x2_ga_2"])
def test_mlp_data_parallel_matches_float32(settings):
    x, y = make_data(128)
    steps = 4
    global_batch = 16 * (settings.get("pipeline.num_micro_batch", 1))
    ref_curve, reference = serial_train(x, y, global_batch, steps)
    config = dict({"amp.level": "O1"}, **settings)
    runs = steps * settings.get("pipeline.num_micro_batch", 1)
    curve, states, _ = _train_mlp(epl.Config(config), x, y, 8, runs, devices=2)
    if not settings:
        np.testing.assert_allclose(curve, ref_curve, rtol=RTOL)
    final = states[-1]
    for name in ("d1/kernel", "d2/kernel", "d2/bias"):
        np.testing.assert_array_equal(final[name][0], final[name][1])
        np.testing.assert_allclose(final[name][0], reference[name], atol=RTOL)
    assert final["EPL_AMP/loss_scale"] == [amp.INITIAL_SCALE] * 2
    assert final["EPL_AMP/good_steps"] == [steps] * 2  # counted on applying runs only


@functools.lru_cache(maxsize=None)
def _serial(model_class):
    """Float32 serial reference (2 slices per step, replica 0's batch statistics)."""
    model = model_class()
    arrays = model.data(2 * model.batch * corpusutil.STEPS)
    return arrays, corpusutil.serial_reference(model, arrays, 2, stats="first")


def _corpus_run(model_class, stage=None, **settings):
    """(reference curve, reference variables, AMP curve, AMP copies) on 2 devices:
    data parallelism, or with ``stage`` a 2-stage pipeline."""
    model = model_class()
    arrays, (ref_curve, reference) = _serial(model_class)
    config = dict({"amp.level": "O1"}, **dict((k.replace("__", "."), v)
                                              for k, v in settings.items()))
    epl.init(epl.Config(config), cluster=Cluster(devices_per_worker=2))
    if stage is None:
        epl.set_default_strategy(epl.replicate(1))
        loss = model.loss(corpusutil.dataset(arrays, model.batch))
    else:
        loss = model.loss(corpusutil.dataset(arrays, model.batch), stage)
    epl.add_to_collection(loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    train = model.train_op(loss)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        curve = [sess.run([loss, train])[0] for _ in range(corpusutil.STEPS)]
        copies = _all_copies(sess)
    np.testing.assert_allclose(curve, ref_curve, rtol=RTOL)
    return reference, copies


def _weights_match(reference, copies, atol=RTOL):
    for name, values in copies.items():
        if name in reference and not name.endswith(("/Adam", "/Adam_1", "/Momentum")):
            for value in values:
                np.testing.assert_allclose(value, reference[name], atol=atol, err_msg=name)


def _converted_types():
    graph = tf.get_default_graph()
    return set(graph.get_operation_by_name(name).type for name, _ in amp.state().converted)


def test_bert_data_parallel_matches_float32():
    reference, copies = _corpus_run(Bert)
    assert {"BatchMatMulV2", "MatMul", "BiasAdd"} <= _converted_types()
    _weights_match(reference, copies)
    for name, values in copies.items():  # same decisions, same updates on both copies
        np.testing.assert_array_equal(values[0], values[1], err_msg=name)
    assert copies["EPL_AMP/loss_scale"] == [amp.INITIAL_SCALE] * 2


def test_bert_pipeline_matches_float32():
    stage = lambda index: epl.replicate(1, name="stage_%d" % index)
    reference, copies = _corpus_run(Bert, stage, pipeline__num_micro_batch=2,
                                    amp__loss_scale=1024)
    _weights_match(reference, copies)


def test_resnet_convolutions_and_batch_norm_match_float32():
    """Conv2D and FusedBatchNormV3 run in float16; batch norm's float32 statistics
    feed the moving averages straight from the float16 op. Adam moves weights whose
    gradients are tiny by up to lr per step in either direction, so only the loss
    curve is compared here (within 1e-2)."""
    from realmodels import ResNet
    _corpus_run(ResNet)
    assert {"Conv2D", "FusedBatchNormV3", "MatMul"} <= _converted_types()
    graph = tf.get_default_graph()
    originals = set(name for name, _ in amp.state().converted)
    for name in originals:
        op = graph.get_operation_by_name(name)
        readers = set(c.name for t in op.outputs for c in t.consumers())
        assert readers <= originals, name  # the float32 originals never run


# ---- loss scaling and skipped steps ---------------------------------------------------
def test_overflow_skips_the_step_on_every_replica_and_the_scale_adapts(monkeypatch):
    monkeypatch.setattr(amp, "INITIAL_SCALE", 8.0)
    monkeypatch.setattr(amp, "GROWTH_INTERVAL", 3)
    x, y = make_data(80)
    x[24:32] = 1e5  # step 2, replica 1 only: inf once cast to float16
    _, states, steps = _train_mlp(_config(amp__debug_log=True), x, y, 8, 5, devices=2)
    scale = [s["EPL_AMP/loss_scale"] for s in states]
    assert scale == [[8.0, 8.0], [4.0, 4.0], [4.0, 4.0], [4.0, 4.0], [8.0, 8.0]]
    assert [s["EPL_AMP/good_steps"] for s in states] == [[1, 1], [0, 0], [1, 1], [2, 2],
                                                         [0, 0]]
    assert [s["EPL_AMP/skipped_steps"] for s in states][-1] == [1, 1]
    assert steps == [1, 2, 3, 4, 5]  # a skipped step still counts (step-based hooks end)
    in_a_row = [s["EPL_AMP/skipped_in_a_row"] for s in states]
    assert in_a_row == [[0, 0], [1, 1], [0, 0], [0, 0], [0, 0]]
    for name in ("d1/kernel", "d1/bias", "d2/kernel", "d1/kernel/Momentum"):
        for copy in (0, 1):
            np.testing.assert_array_equal(states[1][name][copy], states[0][name][copy])
        np.testing.assert_array_equal(states[2][name][0], states[2][name][1])
        assert not np.array_equal(states[2][name][0], states[1][name][0]), name


def test_fixed_scale_skips_non_finite_steps_and_keeps_optimizer_state():
    """Adam's slots and beta powers stay as they were on a skipped step; global_step
    advances."""
    epl.init(_config(amp__loss_scale=128), cluster=Cluster(devices_per_worker=1))
    x, y = make_data(16)
    boost = tf.placeholder_with_default(1.0, [], name="boost")
    loss = mlp(tf.constant(x) * boost, tf.constant(y), initial_weights())
    train = train_step(loss, "adam")
    graph = tf.get_default_graph()
    assert graph.get_operation_by_name("EPL_AMP/loss_scale").type == "Const"
    names = [v.op.name for v in tf.global_variables()]
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(train)
        before = dict(zip(names, sess.run(tf.global_variables())))
        sess.run(train, {boost: 1e5})
        after = dict(zip(names, sess.run(tf.global_variables())))
        counters = {"global_step": 1, "EPL_AMP/skipped_in_a_row": 1}
        for name in names:
            expected = before[name] + counters.get(name, 0)
            np.testing.assert_array_equal(after[name], expected, err_msg=name)
        sess.run(train)
        assert sess.run(tf.train.get_global_step()) == 3


def test_keras_optimizer_on_resource_variables():
    """Weights read through ReadVariableOp are cast per use too; a skipped step leaves
    the weights and the Keras optimizer's ``iterations`` unchanged."""
    epl.init(_config(), cluster=Cluster(devices_per_worker=1))
    x, y = make_data(16)
    boost = tf.placeholder_with_default(1.0, [], name="boost")
    with tf.variable_scope(tf.get_variable_scope(), use_resource=True):
        loss = mlp(tf.constant(x) * boost, tf.constant(y), initial_weights())
    weights = tf.trainable_variables()
    opt = tf.keras.optimizers.Adam(0.01)
    train = opt.apply_gradients(zip(tf.gradients(loss, weights), weights))
    converted = dict(amp.state().converted)
    assert sorted(converted) == ["d1/BiasAdd", "d1/MatMul", "d1/Relu", "d2/MatMul"]
    twin = tf.get_default_graph().get_operation_by_name(converted["d2/MatMul"])
    assert [t.op.type for t in twin.inputs] == ["Relu", "Cast"]
    assert twin.inputs[1].op.inputs[0].op.type == "ReadVariableOp"
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(train)
        before = sess.run(weights)
        sess.run(train, {boost: 1e5})
        assert sess.run(opt.iterations) == 1
        for old, new in zip(before, sess.run(weights)):
            np.testing.assert_array_equal(old, new)
        sess.run(train)
        assert sess.run(opt.iterations) == 2


def test_debug_log_reports_conversions_and_every_step(caplog, capfd):
    with caplog.at_level(logging.INFO, logger="epl.amp"):
        loss, train = _mlp_graph(_config(amp__debug_log=True))
    text = caplog.text
    assert "4 op(s) run in float16: d1/MatMul, d1/BiasAdd, d1/Relu, d2/MatMul" in text
    assert "loss scale dynamic, starting at 32768" in text
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(train)
        sess.run(train)
    err = capfd.readouterr().err
    assert err.count("EPL AMP: gradients finite: 1 loss scale: 32768 skipped steps: 0") == 2


def test_no_amp_state_without_the_level():
    _mlp_graph(epl.Config({}))
    assert amp.state() is None
    assert not [op for op in tf.get_default_graph().get_operations() if "EPL_AMP" in op.name]
