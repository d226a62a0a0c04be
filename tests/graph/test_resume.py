"""Exact resume in one process: a training run killed at a random step, then started
again, ends with the weights of a run that was never interrupted (max |diff| <= 1e-6).

Each case trains with a MonitoredTrainingSession that writes the user's own checkpoints
every 3 steps (the program of issue 34) and EPL snapshots every 2 steps. A "kill" is an
exception raised from a hook after a seeded random number of runs: the session closes
without its final checkpoint, as after SIGKILL. The second run (a new graph, a new
``epl.init``: the restarted process) restores the user's checkpoint, then EPL resumes
from its newest snapshot. Without the snapshots' input positions the second run would
train from the user's checkpoint on the first batches again (the failure before this
change); the kill step is printed so that a failure can be reproduced.

Layouts: data parallelism on 2 local devices (ResNet with batch norm, the embedding
model), gradient accumulation, a 2-stage pipeline, ZeRO v0, v1 and v2, split layers, AMP,
tf.Session with a Saver and an initializable iterator, an Estimator, and two in-process
workers with IO slicing. Real processes and epl-launch: tests/multiworker/test_resume_workers.py.
"""
import collections
import logging
import os
import random

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from eplutil import MEASURED, initial_weights, make_data, mlp, staged_mlp
from realmodels import MOVING_STATS, OddSizes, ResNet, WideDeep

LAST_STEP = 8
SNAPSHOT_EVERY = 2
USER_CHECKPOINT_EVERY = 3
TOL = 1e-6


class Killed(Exception):
    """What the test raises where a real job would be killed."""


class KillAfter(tf.train.SessionRunHook):
    def __init__(self, runs):
        self.runs, self.done = runs, 0

    def after_run(self, run_context, run_values):
        self.done += 1
        if self.done == self.runs:
            raise Killed("killed after %d runs" % self.done)


Layout = collections.namedtuple("Layout", ["devices", "config", "build", "default"])
Layout.__new__.__defaults__ = (True,)  # default: the model under epl.replicate(1)


def _mlp(x, y):
    return mlp(x, y, weights=initial_weights())


def _staged(x, y):
    return staged_mlp(x, y, initial_weights())


def _corpus(model):
    return lambda *batch: model.loss(batch)


def _split(x, y):
    with epl.replicate(2):
        hidden = tf.layers.dense(x, 8, activation=tf.nn.relu, name="backbone")
    with epl.split(2):
        logits = tf.layers.dense(hidden, 7, name="classifier")
        return tf.losses.sparse_softmax_cross_entropy(y, logits)


LAYOUTS = {
    "dp_resnet": Layout(2, {}, _corpus(ResNet())),
    "dp_embedding": Layout(2, {}, _corpus(WideDeep())),
    "ga": Layout(1, {"pipeline.num_micro_batch": 2}, _mlp),
    "pipeline": Layout(2, {"pipeline.num_micro_batch": 2}, _staged, False),
    "zero_v0": Layout(2, {"zero.level": "v0"}, _mlp),
    "zero_v1": Layout(2, {"zero.level": "v1"}, _corpus(OddSizes())),
    "zero_v2": Layout(2, {"zero.level": "v2"}, _mlp),
    "split": Layout(2, {"cluster.colocate_split_and_replicate": True}, _split, False),
    "amp": Layout(2, {"amp.level": "O1"}, _mlp),
}


def _data(name, rows):
    if name.startswith("dp_") or name == "zero_v1":
        model = {"dp_resnet": ResNet, "dp_embedding": WideDeep, "zero_v1": OddSizes}[name]()
        return model.data(rows)
    x, y = make_data(rows, seed=3)
    if name == "split":
        y = y * 2 + 1  # 7 classes
    return x, y


def _input(arrays, batch, shuffle=True):
    data = tf.data.Dataset.from_tensor_slices(tuple(arrays))
    if shuffle:
        data = data.shuffle(16, seed=5)
    return tf.data.make_one_shot_iterator(data.batch(batch, drop_remainder=True)).get_next()


def _config(layout, snapshots):
    settings = {"checkpoint.snapshot_steps": SNAPSHOT_EVERY if snapshots else 0,
                "checkpoint.snapshot_dir": snapshots or ""}
    settings.update(layout.config)
    return epl.Config(settings)


def _values(sess):
    """{variable: [value of each local copy]} (the global step: [its value])."""
    program = epl.Graph.get(sess.graph).parallel
    names = sorted(program.variable_copies)
    values = sess.run(dict((n, [_read(op) for op in program.variable_copies[n]])
                           for n in names))
    values["global_step"] = [sess.run(tf.train.get_global_step())]
    return values


def _read(op):
    if op.type == "VarHandleOp":
        return tf.raw_ops.ReadVariableOp(resource=op.outputs[0], dtype=op.get_attr("dtype"))
    return op.outputs[0]


def _train(name, checkpoints, snapshots, kill_after=None):
    """One process's run of layout ``name``: the user's values at the end, or None when
    killed."""
    layout = LAYOUTS[name]
    rows = 64 * layout.devices * 4
    with tf.Graph().as_default():
        tf.set_random_seed(7)  # the split layers' initial values: the same in every run
        epl.init(_config(layout, snapshots), cluster=Cluster(devices_per_worker=layout.devices))
        if layout.default:
            epl.set_default_strategy(epl.replicate(1))
        loss = layout.build(*_input(_data(name, rows), 4))
        step = tf.train.get_or_create_global_step()
        with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS)):
            train = tf.train.AdamOptimizer(0.01, epsilon=1e-4).minimize(loss, global_step=step)
        hooks = [tf.train.StopAtStepHook(last_step=LAST_STEP)]
        if kill_after:
            hooks.append(KillAfter(kill_after))
        try:
            with tf.train.MonitoredTrainingSession(
                    checkpoint_dir=checkpoints, save_checkpoint_steps=USER_CHECKPOINT_EVERY,
                    save_summaries_steps=None, hooks=hooks) as sess:
                while not sess.should_stop():
                    sess.run(train)
                return _values(sess._tf_sess()), _snapshot_restores(sess.graph)
        except Killed:
            return None


def _snapshot_restores(graph):
    """Restore ops of EPL's snapshot Savers (made only when a resume restores)."""
    return [op.name for op in graph.get_operations()
            if op.type == "RestoreV2" and op.name.startswith("EPL_SNAPSHOT_")]


def _max_diff(reference, resumed):
    """Largest difference over every variable and local copy. Batch norm's moving
    statistics are compared on copy 0, the one checkpoints hold: every replica keeps the
    statistics of its own batches, and a restore gives them replica 0's (as a restore of
    the user's checkpoint does)."""
    assert sorted(reference) == sorted(resumed)
    worst = 0.0
    for name in reference:
        copies = 1 if name.endswith(MOVING_STATS) else len(reference[name])
        for mine, theirs in zip(reference[name][:copies], resumed[name][:copies]):
            worst = max(worst, float(np.abs(np.asarray(mine) - theirs).max()))
    MEASURED.append((os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0], worst))
    return worst


def _kill_step(name):
    runs = LAYOUTS[name].config.get("pipeline.num_micro_batch", 1) \
        if LAYOUTS[name].devices == 1 else 1
    kill = random.Random(name).randint(USER_CHECKPOINT_EVERY + 1, LAST_STEP - 1) * runs
    print("layout %s: killed after %d runs (seed %r)" % (name, kill, name))
    return kill


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_a_killed_run_resumes_exactly(name, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="epl")
    reference, healthy_restores = _train(name, str(tmp_path / "ref_ckpt"),
                                         str(tmp_path / "ref_snap"))
    checkpoints, snapshots = str(tmp_path / "ckpt"), str(tmp_path / "snap")
    assert _train(name, checkpoints, snapshots, kill_after=_kill_step(name)) is None
    resumed, resume_restores = _train(name, checkpoints, snapshots)
    assert "resuming from the snapshot of step" in caplog.text
    # a healthy run builds no restore for its snapshots; the resume built them
    assert healthy_restores == [] and resume_restores
    assert _max_diff(reference, resumed) <= TOL
    assert int(resumed["global_step"][0]) == LAST_STEP
