"""TF1 control flow (while loops, conds) in the step.

Gradients that come out of while loops and conds lose their static shape in TF;
fusion needs every dense gradient's size, and EPL takes it from the variable (a
dense gradient has its variable's shape). A dynamic_rnn model with a tf.cond trained
under data parallelism, and as a pipeline, must match serial training. Stage functions
(the default) keep the loops and conds as ops of each repetition and call functions
for the rest of each stage; unrolled copies clone everything.
"""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from eplutil import epl_paused

STEPS, BATCH = 3, 8


def _data():
    rng = np.random.RandomState(0)
    return rng.rand(64, 5, 4).astype(np.float32), rng.randint(0, 3, 64)


class _Nothing(object):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _train(batch, use_cond, stage=lambda index: _Nothing()):
    """``stage(i)``: the scope of pipeline stage i (the RNN, then the cond)."""
    x, y = _data()
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)
    xb, yb = tf.data.make_one_shot_iterator(data).get_next()
    with tf.variable_scope("m", initializer=tf.constant_initializer(0.1)):
        with stage(0):
            out, _ = tf.nn.dynamic_rnn(tf.nn.rnn_cell.BasicRNNCell(6), xb, dtype=tf.float32)
            h = out[:, -1]
        with stage(1):
            v = tf.get_variable("v", [6, 3])
            if use_cond:
                logits = tf.cond(tf.reduce_sum(h) > 0, lambda: tf.matmul(h, v),
                                 lambda: tf.matmul(h, v) * 2.0)
            else:
                logits = tf.matmul(h, v)
            loss = tf.losses.sparse_softmax_cross_entropy(yb, logits)
    # Plain SGD: Adam divides by the gradients' own magnitude, which turns float rounding
    # (two means of 8 rows vs one of 16) into 1e-6 differences on some CPUs.
    train = tf.train.GradientDescentOptimizer(0.5).minimize(
        loss, tf.train.get_or_create_global_step())
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(STEPS):
            sess.run(train)
        return dict((v.op.name, sess.run(v)) for v in tf.trainable_variables())


@pytest.mark.parametrize("use_cond", [False, True], ids=["rnn", "rnn_cond"])
def test_loop_and_cond_gradients_are_fused_under_data_parallelism(use_cond):
    with epl_paused(), tf.Graph().as_default():
        reference = _train(2 * BATCH, use_cond)
    with tf.Graph().as_default():
        epl.init(epl.Config(), cluster=Cluster(devices_per_worker=2))
        epl.set_default_strategy(epl.replicate(1))
        parallel = _train(BATCH, use_cond)
        assert epl.Graph.get().parallel.plan.micro_batching[0] == "stage functions"
    assert sorted(parallel) == sorted(reference)
    for name, value in reference.items():
        np.testing.assert_allclose(parallel[name], value, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("lowering", ["auto", "unrolled"])
def test_pipeline_with_a_loop_and_a_cond_matches_serial(lowering):
    """A dynamic_rnn in stage 0 and a tf.cond (whose branches both train v) in stage 1,
    4 micro-batches of 4 rows: the pipeline trains like serial global batches of 16."""
    micro_batches = 4
    with epl_paused(), tf.Graph().as_default():
        reference = _train(micro_batches * 4, True)
    with tf.Graph().as_default():
        epl.init(epl.Config({"pipeline.num_micro_batch": micro_batches,
                             "pipeline.micro_batching": lowering}),
                 cluster=Cluster(devices_per_worker=2))
        stages = [epl.replicate(1, name="stage_%d" % index) for index in range(2)]
        parallel = _train(4, True, stage=lambda index: stages[index])
        plan = epl.Graph.get().parallel.plan
        assert plan.pipeline and plan.micro_batching[0] == (
            "unrolled copies" if lowering == "unrolled" else "stage functions")
    assert sorted(parallel) == sorted(reference)
    for name, value in reference.items():
        np.testing.assert_allclose(parallel[name], value, atol=1e-6, err_msg=name)
