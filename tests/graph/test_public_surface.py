"""The original EPL's public surface where user code touches it (docs/api.md)."""
import json
import logging
import os
import threading

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster, ClusterError
from eplutil import (copy_values, dataset_input, initial_weights, make_data, max_diff, mlp,
                     run_workers, serial_train, staged_mlp, train_step)

TOL = 1e-5


@pytest.fixture(autouse=True)
def _tf_collectives(monkeypatch):
    # These tests are about the API, not the transport: TF collectives keep no
    # sockets open after the session, unlike the ring (the suite shares one process).
    monkeypatch.setenv("EPL_COLLECTIVE_BACKEND", "tf")


# ---- Env: one object, reset in place ---------------------------------------------
def test_env_reference_taken_before_init_sees_the_new_config():
    env = epl.Env.get()
    epl.init(epl.Config({"pipeline.num_micro_batch": 3}))
    assert epl.Env.get() is env and env.config.pipeline.num_micro_batch == 3
    epl.init()
    assert epl.Env.get() is env and env.config.pipeline.num_micro_batch == 1
    assert env.strategy_context.current is None
    with epl.replicate(1, name="s") as strategy:
        assert env.strategy_context.current.strategy is strategy
    epl.reset()
    assert epl.Env.get() is env and not env.initialized


def test_worker_threads_keep_their_own_env():
    main = epl.init()

    def worker(index):
        env = epl.Env.get()
        return env is not main, env.cluster.worker_index, env.cluster.available_devices

    results = run_workers(worker, 2, 2)
    assert [r[:2] for r in results] == [(True, 0), (True, 1)]
    assert results[1][2] == ["/job:worker/replica:0/task:1/device:CPU:0",
                             "/job:worker/replica:0/task:1/device:CPU:1"]
    assert epl.Env.get() is main and not main.cluster.distributed


def test_a_thread_that_never_called_init_sees_the_process_env():
    main = epl.init(epl.Config({"pipeline.num_micro_batch": 2}))
    seen = []
    thread = threading.Thread(target=lambda: seen.append(epl.Env.get()))
    thread.start()
    thread.join()
    assert seen == [main]


# ---- epl.init keeps ops built before it ------------------------------------------
def test_dataset_built_before_init_is_kept_and_trains():
    x, y = make_data(64)
    xb, yb = dataset_input(x, y, 8)            # before epl.init, as scripts do
    epl.init(cluster=Cluster(devices_per_worker=2))
    assert xb.graph is tf.get_default_graph()
    epl.set_default_strategy(epl.replicate(1))
    graph = epl.Graph.get()
    assert graph.info(xb.op).taskgraph == 0      # joined the first TaskGraph
    loss = mlp(xb, yb, weights=initial_weights())
    train = train_step(loss)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(3):
            sess.run(train)
        copies = copy_values(sess, "d1/kernel")
    _, ref = serial_train(x, y, 16, 3)
    assert len(copies) == 2 and max_diff(ref["d1/kernel"], copies) < TOL


def test_init_inside_a_graph_keeps_that_graphs_ops():
    with tf.Graph().as_default() as graph:
        tf.constant(1.0, name="early")
        epl.init()
        epl.set_default_strategy(epl.replicate(1))
        tf.constant(2.0, name="late")
        view = epl.Graph.get()
        assert graph.get_operation_by_name("early") is not None
        assert view.info("early").taskgraph == view.info("late").taskgraph == 0


# ---- forgetting epl.init -----------------------------------------------------------
@pytest.mark.parametrize("use", ["set_default_strategy", "replicate", "split"])
def test_a_strategy_before_epl_init_is_an_error(use):
    """Before: a script with epl.replicate / set_default_strategy but no epl.init() trained
    as plain single-device TensorFlow without a word."""
    assert not epl.Env.get().initialized
    with pytest.raises(epl.StrategyError, match=r"before epl.init\(\): EPL is not "
                                                r"initialized.*Call epl.init\(\) first"):
        if use == "set_default_strategy":
            epl.set_default_strategy(epl.replicate(1))
        else:
            with getattr(epl, use)(2):
                tf.ones([2])
    assert epl.Env.get().strategy_context.current is None
    epl.init()
    epl.reset()    # and after epl.reset() as before epl.init()
    with pytest.raises(epl.StrategyError, match="before epl.init"):
        epl.set_default_strategy(epl.replicate(1))


def test_a_strategy_made_before_epl_init_works_after_it():
    strategy = epl.replicate(1, name="made_early")   # making one is harmless
    epl.init()
    epl.set_default_strategy(strategy)
    assert [tg.name for tg in epl.Graph.get().taskgraphs] == ["made_early"]


# ---- set_default_strategy and empty TaskGraphs -------------------------------------
def test_set_default_strategy_creates_its_taskgraph_now():
    epl.init()
    strategy = epl.replicate(1, name="default")
    epl.set_default_strategy(strategy)
    graph = epl.Graph.get()
    assert [tg.name for tg in graph.taskgraphs] == ["default"]
    with epl.replicate(1, name="explicit"):
        tf.ones([2], name="a")
    epl.set_default_strategy(strategy)         # the same object continues its TaskGraph
    tf.ones([2], name="b")
    assert [tg.name for tg in graph.taskgraphs] == ["default", "explicit"]
    assert graph.info("b").taskgraph == 0 and graph.info("a").taskgraph == 1


def test_empty_taskgraphs_take_no_devices_or_stages(caplog):
    x, y = make_data(64)
    epl.init(epl.Config({"pipeline.num_micro_batch": 2}),
             cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1, name="unused"))
    epl.set_default_strategy(epl.replicate(1, name="model"))
    loss = mlp(*dataset_input(x, y, 8), weights=initial_weights())
    train = train_step(loss)
    graph = epl.Graph.get()
    assert graph.num_stages == 1 and not graph.pipeline_enabled
    assert graph.taskgraphs[0].virtual_device is None and graph.taskgraphs[0].num_replicas == 0
    assert graph.taskgraphs[1].num_replicas == 2
    with caplog.at_level(logging.INFO, logger="epl"), tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(train)
    assert "dropped 1 empty TaskGraph(s)" in caplog.text
    assert [tg.name for tg in graph.taskgraphs] == ["model"]
    assert graph.taskgraphs[0].index == 0 and graph.info(loss.op).taskgraph == 0
    assert graph.parallel.plan.num_replicas == 2 and not graph.parallel.plan.stages


# ---- Graph / collections -------------------------------------------------------
def test_graph_get_may_create_and_collections():
    epl.init()
    with tf.Graph().as_default():
        assert epl.Graph.get(may_create=False) is None
        assert epl.Graph.get(may_create=True) is epl.Graph.get(may_create=False)
    keys = epl.GraphKeys.ALL_COLLECTION_KEYS
    assert epl.GraphKeys.GLOBAL_MEAN_OBJECTS in keys and len(keys) == 6
    value = tf.ones([2])
    epl.add_to_collection(value, epl.GraphKeys.LOCAL_SUM_OBJECTS)
    collections = epl.get_all_collections()
    assert sorted(collections) == sorted(keys)
    assert collections[epl.GraphKeys.LOCAL_SUM_OBJECTS] == [value]
    assert collections[epl.GraphKeys.GLOBAL_MEAN_OBJECTS] == []


def _two_stage_pipeline(devices=4, micro_batches=2):
    x, y = make_data(64)
    epl.init(epl.Config({"pipeline.num_micro_batch": micro_batches}),
             cluster=Cluster(devices_per_worker=devices))
    loss = staged_mlp(*dataset_input(x, y, 4), initial_weights())
    return loss, train_step(loss)


def _check_pipeline_introspection(graph):
    assert graph.num_stages == 2 and graph.pipeline_enabled
    first, second = graph.taskgraphs
    assert first.is_first_stage and not first.is_last_stage
    assert second.is_last_stage and not second.is_first_stage
    assert (first.num_replicas, first.local_num_replicas) == (2, 2)
    device = "/job:localhost/replica:0/task:0/device:CPU:%d"
    assert first.virtual_device.devices == ((device % 0,), (device % 2,))
    assert second.virtual_device.local_devices == (device % 1, device % 3)
    assert epl.Env.get().cluster.virtual_devices == [first.virtual_device,
                                                     second.virtual_device]
    names = set(v.op.name for v in first.get_variables())
    assert {"d1/bias", "d1/kernel", "d1/kernel/Momentum"} <= names
    assert not any(n.startswith("d2/") for n in names)
    assert len(graph.gradients) == 4
    assert "d1/MatMul" in graph.operations
    with pytest.raises(TypeError):
        graph.operations["x"] = None


def test_introspection_before_and_after_the_rewrite():
    loss, train = _two_stage_pipeline()
    graph = epl.Graph.get()
    _check_pipeline_introspection(graph)            # planned on demand
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run([loss, train])
    assert graph.parallel is not None
    _check_pipeline_introspection(graph)            # the rewrite's plan


def test_introspection_of_colocated_taskgraphs_and_data_parallelism():
    epl.init(epl.Config({"cluster.colocate_split_and_replicate": True}),
             cluster=Cluster(devices_per_worker=2))
    with epl.replicate(2):
        tf.ones([2], name="a")
    with epl.replicate(2):
        tf.ones([2], name="b")
    graph = epl.Graph.get()
    assert graph.num_stages == 1 and not graph.pipeline_enabled
    assert [tg.num_replicas for tg in graph.taskgraphs] == [1, 1]
    assert all(tg.is_first_stage and tg.is_last_stage for tg in graph.taskgraphs)


def test_virtual_devices_of_a_worker():
    def worker(index):
        x, y = make_data(32)
        epl.set_default_strategy(epl.replicate(1))
        train_step(mlp(*dataset_input(x, y, 4), weights=initial_weights()))
        tg = epl.Graph.get().taskgraphs[0]
        return (epl.Env.get().cluster.virtual_devices[0].local_devices,
                tg.num_replicas, tg.local_num_replicas)

    results = run_workers(worker, 2, 2)
    device = "/job:worker/replica:0/task:%d/device:CPU:%d"
    assert results[1] == ((device % (1, 0), device % (1, 1)), 4, 2)


# ---- Cluster as a context manager, run_visible_devices ------------------------------
def test_cluster_context_manager_sets_the_env_cluster():
    epl.init(cluster=Cluster(devices_per_worker=1))
    env = epl.Env.get()
    before = env.cluster
    hosts = ["127.0.0.1:2222", "127.0.0.1:2223"]
    with epl.Cluster(worker_hosts=hosts, worker_index=1, devices_per_worker=2) as cluster:
        assert env.cluster is cluster
        epl.init()                                  # uses the block's cluster
        assert env.cluster is cluster and env.cluster.worker_index == 1
    assert env.cluster is before


def test_run_visible_devices_selects_virtual_devices(monkeypatch):
    monkeypatch.setenv("EPL_NUM_VIRTUAL_DEVICES", "4")
    monkeypatch.setenv("EPL_CLUSTER_RUN_VISIBLE_DEVICES", "1,2")
    x, y = make_data(64)
    epl.init()
    cluster = epl.Env.get().cluster
    assert cluster.gpu_num_per_worker == 2
    assert cluster.available_devices == ["/job:localhost/replica:0/task:0/device:CPU:0",
                                         "/job:localhost/replica:0/task:0/device:CPU:1"]
    epl.set_default_strategy(epl.replicate(1))
    train = train_step(mlp(*dataset_input(x, y, 8), weights=initial_weights()))
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(train)
        assert len(copy_values(sess, "d1/kernel")) == 2
    monkeypatch.setenv("EPL_CLUSTER_RUN_VISIBLE_DEVICES", "1,4")
    with pytest.raises(ClusterError, match="run_visible_devices='1,4'"):
        epl.init()


def test_a_bare_cluster_sees_the_devices_of_the_current_config(monkeypatch):
    """Before: epl.Cluster() read TF_CONFIG but not cluster.run_visible_devices, and said 4
    devices per worker where epl.Env.get().cluster said 2."""
    monkeypatch.setenv("EPL_NUM_VIRTUAL_DEVICES", "4")
    monkeypatch.setenv("EPL_CLUSTER_RUN_VISIBLE_DEVICES", "1,2")
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
        "task": {"type": "worker", "index": 1}}))
    bare = epl.Cluster()
    assert (bare.worker_num, bare.worker_index, bare.gpu_num_per_worker) == (2, 1, 2)
    assert bare.run_visible_devices == "1,2" and bare == epl.Env.get().cluster
    epl.init(epl.Config({"cluster.run_visible_devices": "3"}))
    assert epl.Cluster() == epl.Env.get().cluster and epl.Cluster().gpu_num_per_worker == 1
    assert epl.Cluster(run_visible_devices="").gpu_num_per_worker == 4   # explicit wins
    assert epl.Cluster(devices_per_worker=3).run_visible_devices == ""


@pytest.mark.parametrize("verbosity", [tf.logging.DEBUG, tf.logging.WARN])
def test_epl_leaves_tensorflows_logging_alone(monkeypatch, verbosity):
    """The examples turn TF's warnings off themselves; EPL never changes a user's logging."""
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    logger, previous = tf.get_logger(), tf.logging.get_verbosity()
    handlers = list(logger.handlers)
    tf.logging.set_verbosity(verbosity)
    try:
        x, y = make_data(32)
        epl.init(cluster=Cluster(devices_per_worker=2))
        epl.set_default_strategy(epl.replicate(1))
        train = train_step(mlp(*dataset_input(x, y, 8), weights=initial_weights()))
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            sess.run(train)
        assert tf.logging.get_verbosity() == verbosity and logger.handlers == handlers
        assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"
    finally:
        tf.logging.set_verbosity(previous)


def test_exports():
    for name in ("init", "Env", "Cluster", "Config", "Graph", "GraphKeys", "replicate",
                 "split", "set_default_strategy", "add_to_collection", "get_collection",
                 "get_all_collections", "VERSION", "paused", "reset", "StrategyError",
                 "ClusterError", "ConfigError"):
        assert hasattr(epl, name), name
    assert issubclass(epl.StrategyError, ValueError)
    assert issubclass(epl.StrategyError, RuntimeError)
    assert np.isscalar(len(epl.__all__))
