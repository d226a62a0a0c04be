"""Grouped apply (``optimizer.num_apply_group``): the updates run in chained groups.

Grouped training ends with exactly the weights of ungrouped training (Momentum,
Adam; no parallelism, data parallelism on 2 devices, a 2-stage pipeline,
gradient accumulation; sparse Adam on the BERT-style corpus model). Adam's beta
powers and the global step advance once per step. Structure: each group's
updates wait for the previous group's, and nothing of a group waits for a later
one.
"""
import logging

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import corpusutil
import epl
from epl.cluster import Cluster
from epl.ir.traverse import ancestor_ops
from epl.runtime import grouped_apply
from epl.runtime.grouped_apply import balanced_groups, unsupported_reason
from eplutil import (all_copy_values, dataset_input, initial_weights, make_data, max_diff, mlp,
                     serial_train, staged_mlp, train_step)
from realmodels import Bert

STEPS = 3
TOL = 1e-5


@pytest.fixture(autouse=True)
def warnings_once_per_test(monkeypatch):
    monkeypatch.setattr(grouped_apply, "_WARNED", set())


# ---- partition (pure) -----------------------------------------------------------------
def test_groups_balance_bytes_and_keep_order():
    assert balanced_groups([4, 1, 1, 2], 2) == [[0], [1, 2, 3]]
    assert balanced_groups([10, 10, 10, 10], 3) == [[0, 3], [1], [2]]
    assert balanced_groups([5, 5], 8) == [[0], [1]]          # never an empty group
    assert balanced_groups([3], 4) == [[0]]
    sizes = [7, 1, 30, 2, 2, 9, 16, 16, 3]
    groups = balanced_groups(sizes, 3)
    assert sorted(i for g in groups for i in g) == list(range(len(sizes)))
    loads = [sum(sizes[i] for i in g) for g in groups]
    assert max(loads) - min(loads) <= max(sizes)
    assert groups == balanced_groups(list(sizes), 3)         # deterministic


def test_which_optimizers_can_be_grouped():
    assert unsupported_reason(tf.train.AdamOptimizer(0.1)) is None
    assert unsupported_reason(tf.train.MomentumOptimizer(0.1, 0.9)) is None

    class OwnApply(tf.train.GradientDescentOptimizer):
        def apply_gradients(self, grads_and_vars, global_step=None, name=None):
            return super(OwnApply, self).apply_gradients(grads_and_vars, global_step, name)

    assert "overrides apply_gradients" in unsupported_reason(OwnApply(0.1))
    assert "not a tf.compat.v1.train.Optimizer" in unsupported_reason(
        tf.keras.optimizers.SGD(0.1))


# ---- training ----------------------------------------------------------------------------
def _train(mode, opt_name, groups, steps=STEPS):
    """Variables of every local copy after ``steps`` steps of ``mode``."""
    settings = {"optimizer.num_apply_group": groups}
    x, y = make_data(64)
    if mode == "pipeline":
        settings["pipeline.num_micro_batch"] = 2
        epl.init(epl.Config(settings), cluster=Cluster(devices_per_worker=2))
        loss = staged_mlp(*dataset_input(x, y, 4), weights=initial_weights())
    else:
        devices = 2 if mode == "dp" else 1
        if mode == "ga":
            settings["pipeline.num_micro_batch"] = 2
        epl.init(epl.Config(settings), cluster=Cluster(devices_per_worker=devices))
        epl.set_default_strategy(epl.replicate(1))
        loss = mlp(*dataset_input(x, y, 8 // devices if mode == "dp" else 8),
                   weights=initial_weights())
    train = train_step(loss, opt_name)
    runs = steps * (2 if mode == "ga" else 1)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(runs):
            sess.run(train)
        values = all_copy_values(sess, [v.op.name for v in tf.global_variables()
                                        if v.op.name != "global_step"])
        values["global_step"] = [sess.run(tf.train.get_global_step())]
    values["group ops"] = [len([op for op in tf.get_default_graph().get_operations()
                                if "_group_" in op.name and op.type == "NoOp"
                                and "/" not in op.name])]
    epl.reset()
    return values


@pytest.mark.parametrize("opt_name", ["momentum", "adam"])
@pytest.mark.parametrize("mode", ["single", "dp", "pipeline", "ga"])
def test_grouped_training_equals_ungrouped(mode, opt_name):
    with tf.Graph().as_default():
        plain = _train(mode, opt_name, 1)
    with tf.Graph().as_default():
        grouped = _train(mode, opt_name, 3)
    assert sorted(grouped) == sorted(plain)
    for name in set(plain) - {"group ops"}:
        for got, want in zip(grouped[name], plain[name]):
            np.testing.assert_array_equal(got, want, err_msg=name)
    assert grouped["global_step"] == [STEPS]
    assert plain["group ops"] == [0] and grouped["group ops"] == [2]
    if opt_name == "adam":  # advanced once per step, not once per group
        np.testing.assert_allclose(grouped["beta1_power"][0], 0.9 ** (STEPS + 1), rtol=1e-6)
        np.testing.assert_allclose(grouped["beta2_power"][0], 0.999 ** (STEPS + 1), rtol=1e-6)


def test_grouped_training_matches_serial():
    x, y = make_data(64)
    _, reference = serial_train(x, y, 8, STEPS, "adam")
    with tf.Graph().as_default():
        grouped = _train("dp", "adam", 4)
    for name in ("d1/kernel", "d2/bias", "d1/kernel/Adam_1", "beta1_power"):
        assert max_diff(reference[name], grouped[name]) < TOL, name


def test_sparse_adam_on_bert_equals_ungrouped():
    """Embedding tables get IndexedSlices gradients (Adam's sparse path, whose
    temporaries are what grouping bounds)."""
    model = Bert()
    arrays = model.data(model.batch * corpusutil.STEPS)
    results = []
    for groups in (1, 5):
        with tf.Graph().as_default():
            results.append(corpusutil.run_dp(model, arrays, devices=1,
                                             config={"optimizer.num_apply_group": groups})[1])
            epl.reset()
    plain, grouped = results
    assert sorted(plain) == sorted(grouped)
    for name in plain:
        np.testing.assert_array_equal(grouped[name][0], plain[name][0], err_msg=name)


# ---- structure ----------------------------------------------------------------------------
APPLY_TYPES = ("ApplyAdam", "ApplyMomentum", "ResourceApplyAdam", "ResourceApplyMomentum")


def _groups_of_updates(graph, prefix="Adam"):
    """[[update ops of group k]] from the group ops ``<prefix>_group_<k>``; the rest
    (no group op of its own) is the last group."""
    updates = [op for op in graph.get_operations()
               if op.type in APPLY_TYPES and not op.name.startswith("EPL_")]
    groups, seen = [], set()
    index = 0
    while True:
        try:
            done = graph.get_operation_by_name("%s_group_%d" % (prefix, index))
        except KeyError:
            break
        members = [op for op in done.control_inputs if op.type in APPLY_TYPES]
        groups.append(members)
        seen.update(op.name for op in members)
        index += 1
    groups.append([op for op in updates if op.name not in seen])
    return groups


def test_groups_are_chained():
    x, y = make_data(32)
    epl.init(epl.Config({"optimizer.num_apply_group": 3}), cluster=Cluster(devices_per_worker=1))
    loss = mlp(*dataset_input(x, y, 8), weights=initial_weights())
    train = train_step(loss, "adam")
    graph = tf.get_default_graph()
    groups = _groups_of_updates(graph)
    assert len(groups) == 3 and all(groups)
    assert sorted(op.name for g in groups for op in g) == sorted(
        op.name for op in graph.get_operations() if op.type in APPLY_TYPES)
    for earlier, later in zip(groups, groups[1:]):
        for op in later:
            before = set(a.name for a in ancestor_ops([op]))
            assert all(e.name in before for e in earlier), (op.name, [e.name for e in earlier])
    for index, group in enumerate(groups[:-1]):
        for op in group:
            before = set(a.name for a in ancestor_ops([op]))
            assert not any(later.name in before for g in groups[index + 1:] for later in g)
    # The returned op (the step increment) waits for every group; one TRAIN_OP.
    everything = set(a.name for a in ancestor_ops([train]))
    assert all(op.name in everything for g in groups for op in g)
    assert tf.get_collection(tf.GraphKeys.TRAIN_OP) == [train]
    # Adam's beta powers are updated by one op each, after the last group.
    beta_updates = [op for op in graph.get_operations() if op.type == "Assign"
                    and op.inputs[0].op.name in ("beta1_power", "beta2_power")
                    and "Initializer" not in op.name and op.name != op.inputs[0].op.name +
                    "/Assign"]
    assert len(beta_updates) == 2
    for op in beta_updates:
        before = set(a.name for a in ancestor_ops([op]))
        assert all(u.name in before for g in groups for u in g)


def test_names_follow_the_user():
    x, y = make_data(32)
    epl.init(epl.Config({"optimizer.num_apply_group": 2}), cluster=Cluster(devices_per_worker=1))
    loss = mlp(*dataset_input(x, y, 8), weights=initial_weights())
    opt = tf.train.MomentumOptimizer(0.1, 0.9)
    train = opt.minimize(loss, tf.train.get_or_create_global_step(), name="train")
    assert train.name == "train"
    assert tf.get_default_graph().get_operation_by_name("train_group_0").type == "NoOp"
    # the same slot variables as without grouping
    assert sorted(v.op.name for v in tf.global_variables() if "Momentum" in v.op.name) == [
        "d1/bias/Momentum", "d1/kernel/Momentum", "d2/bias/Momentum", "d2/kernel/Momentum"]


def test_more_groups_than_variables_and_none_gradients():
    x, y = make_data(32)
    epl.init(epl.Config({"optimizer.num_apply_group": 30}),
             cluster=Cluster(devices_per_worker=1))
    loss = mlp(*dataset_input(x, y, 8), weights=initial_weights())
    unused = tf.get_variable("unused", [3], initializer=tf.zeros_initializer())
    opt = tf.train.GradientDescentOptimizer(0.1)
    grads = opt.compute_gradients(loss, tf.trainable_variables())
    assert [g for g, v in grads if v is unused] == [None]
    train = opt.apply_gradients(grads, tf.train.get_or_create_global_step())
    groups = [op for op in tf.get_default_graph().get_operations()
              if op.name.startswith("GradientDescent_group_") and "/" not in op.name]
    assert len(groups) == 3   # 4 variables with gradients: 4 groups, the last returned
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(train)
        assert sess.run(tf.train.get_global_step()) == 1


def test_unsupported_optimizer_is_applied_in_one_group_with_a_warning(caplog):
    class OwnApply(tf.train.GradientDescentOptimizer):
        def apply_gradients(self, grads_and_vars, global_step=None, name=None):
            return super(OwnApply, self).apply_gradients(grads_and_vars, global_step, name)

    x, y = make_data(32)
    epl.init(epl.Config({"optimizer.num_apply_group": 2}), cluster=Cluster(devices_per_worker=1))
    loss = mlp(*dataset_input(x, y, 8), weights=initial_weights())
    with caplog.at_level(logging.WARNING, logger="epl"):
        train = OwnApply(0.1).minimize(loss, tf.train.get_or_create_global_step())
    assert "num_apply_group=2 is not applied to OwnApply" in caplog.text
    assert not [op for op in tf.get_default_graph().get_operations() if "_group_" in op.name]
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(train)
