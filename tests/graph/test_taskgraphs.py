"""Strategy scopes -> TaskGraphs, phases, hooks (TF graphs, no multi-process)."""
import subprocess
import sys

import pytest
import tensorflow.compat.v1 as tf

import epl
from epl import tf_adapter
from epl.ir import Phase
from epl.env import _hooks
from epl.strategies import StrategyError


def _dense(x, units, name):
    return tf.layers.dense(x, units, name=name)


def _two_stage_model(optimizer=True, clip=False):
    x = tf.ones([4, 3])
    with epl.replicate(device_count=1, name="stage_0"):
        h = _dense(x, 5, "d0")
    with epl.replicate(device_count=1, name="stage_1"):
        y = _dense(h, 2, "d1")
    loss = tf.reduce_mean(tf.square(y))
    if not optimizer:
        return loss, None
    opt = tf.train.GradientDescentOptimizer(0.1)
    grads_and_vars = opt.compute_gradients(loss)
    if clip:
        grads, variables = zip(*grads_and_vars)
        grads, _ = tf.clip_by_global_norm(grads, 1.0)
        grads_and_vars = list(zip(grads, variables))
    train = opt.apply_gradients(grads_and_vars, global_step=tf.train.get_or_create_global_step())
    return loss, train


def _tg_of(graph, op_name):
    return graph.info(op_name).taskgraph


def test_each_scope_entry_is_a_taskgraph():
    epl.init()
    _two_stage_model(optimizer=False)
    graph = epl.Graph.get()
    assert [tg.name for tg in graph.taskgraphs] == ["stage_0", "stage_1"]
    assert _tg_of(graph, "d0/MatMul") == 0 and _tg_of(graph, "d1/MatMul") == 1
    assert _tg_of(graph, "d0/kernel") == 0


def test_ops_before_first_scope_join_it_and_after_last_join_last():
    epl.init()
    loss, _ = _two_stage_model(optimizer=False)
    graph = epl.Graph.get()
    assert _tg_of(graph, "ones") == 0
    assert _tg_of(graph, loss.op.name) == 1


def test_nested_scopes_are_rejected():
    epl.init()
    with epl.replicate(1):
        with pytest.raises(StrategyError, match="cannot be nested"):
            with epl.split(2):
                pass


def test_set_default_strategy_rules():
    epl.init()
    with pytest.raises(StrategyError, match="accepts epl.replicate"):
        epl.set_default_strategy(epl.split(2))
    epl.set_default_strategy(epl.replicate(1))
    a = tf.ones([2], name="a")
    epl.set_default_strategy(epl.replicate(1))
    b = tf.ones([2], name="b")
    with epl.replicate(1, name="explicit"):
        c = tf.ones([2], name="c")
    d = tf.ones([2], name="d")
    graph = epl.Graph.get()
    assert [_tg_of(graph, t.op.name) for t in (a, b, c, d)] == [0, 1, 2, 1]


def test_bad_strategy_arguments():
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(StrategyError, match="device_count"):
            epl.replicate(bad)
    with pytest.raises(StrategyError, match="name"):
        epl.split(2, name=3)


def test_gradients_and_updates_follow_their_forward_taskgraph():
    epl.init()
    _two_stage_model()
    graph = epl.Graph.get()
    backward = {op.name: graph.info(op).taskgraph for op in graph.ops(phases=[Phase.BACKWARD])}
    assert backward["gradients/d0/MatMul_grad/MatMul_1"] == 0
    assert backward["gradients/d1/MatMul_grad/MatMul_1"] == 1
    apply_ops = {op.name: graph.info(op).taskgraph for op in graph.ops(phases=[Phase.APPLY])}
    assert apply_ops["GradientDescent/update_d0/kernel/ApplyGradientDescent"] == 0
    assert apply_ops["GradientDescent/update_d1/kernel/ApplyGradientDescent"] == 1
    assert len(graph.apply_calls) == 1 and len(graph.apply_calls[0]) == 4


def test_user_clipping_between_gradients_and_apply_is_backward():
    epl.init()
    _two_stage_model(clip=True)
    graph = epl.Graph.get()
    norm = [op for op in graph.tf_graph.get_operations() if op.name.endswith("global_norm/L2Loss")]
    assert norm and all(graph.info(op).phase == Phase.BACKWARD for op in norm)


def test_savers_are_session_phase():
    epl.init()
    _two_stage_model()
    tf.train.Saver()
    graph = epl.Graph.get()
    assert graph.info("save/SaveV2").phase == Phase.SESSION


def test_unannotated_model_gets_an_implicit_replicate_taskgraph():
    epl.init()
    tf.ones([2], name="x")
    graph = epl.Graph.get()
    assert graph.taskgraphs == []
    graph.ensure_taskgraph()
    assert len(graph.taskgraphs) == 1 and graph.taskgraphs[0].implicit
    assert _tg_of(graph, "x") == 0


def test_graph_prints_taskgraphs():
    epl.init()
    _two_stage_model()
    text = str(epl.Graph.get())
    assert "[0] stage_0 replicate(device_count=1, name='stage_0')" in text
    assert "backward=" in text and "apply=" in text


def test_second_init_resets_state_and_never_double_wraps():
    epl.init(epl.Config({"pipeline.num_micro_batch": 2}))
    _two_stage_model(optimizer=False)
    wrapped = tf.Graph._add_op
    epl.init()
    assert tf.Graph._add_op is wrapped
    assert epl.Env.get().config.pipeline.num_micro_batch == 1
    assert epl.Graph.get().taskgraphs == []
    assert _hooks().install() is False


def test_reset_restores_tensorflow():
    """The op-creation hook's target is the adapter's (TF 1.15 defines ``Graph._add_op`` on
    the Python class; TF 2.x inherits it from the C++ base class, so the class has no own
    attribute before ``epl.init`` and must have none again after ``epl.reset``)."""
    owner, attr = tf_adapter.OP_CREATION
    missing = object()
    original, looked_up = vars(owner).get(attr, missing), getattr(owner, attr)
    epl.init()
    assert vars(owner).get(attr, missing) is not original
    assert getattr(owner, attr) is not looked_up
    epl.reset()
    assert vars(owner).get(attr, missing) is original
    assert getattr(owner, attr) is looked_up
    assert not _hooks().installed


def test_init_rejects_eager_mode():
    code = ("import tensorflow.compat.v1 as tf; tf.enable_eager_execution(); import epl\n"
            "try:\n    epl.init()\nexcept RuntimeError as e:\n    print('ERR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, timeout=120).stdout.decode()
    assert "ERR epl.init() needs TensorFlow graph mode" in out


def test_init_rejects_bad_config_type():
    with pytest.raises(TypeError, match="epl.Config or a dict"):
        epl.init(config=["pipeline.num_micro_batch"])


def test_env_exposes_config_and_cluster(monkeypatch):
    monkeypatch.setenv("EPL_NUM_VIRTUAL_DEVICES", "4")
    epl.init(epl.Config({"communication.fp16": True}))
    env = epl.Env.get()
    assert env.config.communication.fp16 is True
    assert env.cluster.total_gpu_num == 4 and env.cluster.worker_num == 1


def test_add_to_collection():
    epl.init()
    loss, _ = _two_stage_model(optimizer=False)
    epl.add_to_collection(loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    assert epl.get_collection(epl.GraphKeys.GLOBAL_MEAN_OBJECTS) == [loss]
    with pytest.raises(ValueError, match="unknown key"):
        epl.add_to_collection(loss, "mean")


def test_paused_builds_plain_tensorflow_and_restores_the_hooks():
    epl.init()
    with epl.paused(), tf.Graph().as_default() as graph:
        tf.constant(1.0, name="plain")
        assert epl.Graph.get(graph, create=False) is None
    assert _hooks().installed
    tf.constant(2.0, name="recorded")
    assert epl.Graph.get().info("recorded") is not None
