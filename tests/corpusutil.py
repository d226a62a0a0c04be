"""Train corpus models serially and under each EPL mode, and compare the weights.

The serial reference takes the same rows per step as the parallel run and cuts
them into ``slices`` equal parts, one per replica or micro-batch of the parallel
run, builds the model once per slice with shared variables and minimizes the
mean of the slice losses. For models without batch statistics this is plain
serial training on the global batch; for batch norm it is what data
parallelism and micro-batching compute (statistics per slice), so equivalence
stays exact. Batch-norm moving statistics are updated slice after slice
(``stats="all"``: micro-batches and accumulation runs, in order) or from slice 0
only (``stats="first"``: replica 0 of data parallelism, which is what the
checkpoint holds; other replicas keep their own).
"""
import numpy as np
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from eplutil import all_copy_values, epl_paused, run_workers, worker_rows
from realmodels import MOVING_STATS, no_stage

STEPS = 3


def dataset(arrays, batch, static=True):
    """Batches of ``batch`` rows; ``static`` fixes the batch size in the graph."""
    data = tf.data.Dataset.from_tensor_slices(tuple(arrays)).batch(batch, drop_remainder=static)
    return tf.data.make_one_shot_iterator(data).get_next()


def _is_moving_stat(name):
    return any(name.endswith(stat) for stat in MOVING_STATS)


def compared(name):
    """Variables that must match serial training (all but the step counter)."""
    return name != "global_step"


def serial_reference(model, arrays, slices, steps=STEPS, stats="all"):
    """Variable values after ``steps`` serial steps of ``slices`` x ``model.batch`` rows."""
    with epl_paused(), tf.Graph().as_default():
        batch = dataset(arrays, slices * model.batch)
        parts = zip(*[tf.split(t, slices, axis=0) for t in batch])
        losses, updates = [], []
        for index, part in enumerate(parts):
            before = len(tf.get_collection(tf.GraphKeys.UPDATE_OPS))
            with tf.control_dependencies(updates[-1:] if stats == "all" else []):
                losses.append(model.loss(part, reuse=index > 0))
            new = tf.get_collection(tf.GraphKeys.UPDATE_OPS)[before:]
            if new and (stats == "all" or index == 0):
                updates.append(tf.group(*new))
        loss = tf.add_n(losses) / float(slices)
        with tf.control_dependencies(updates):
            train = model.optimizer().minimize(loss, tf.train.get_or_create_global_step())
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            curve = [sess.run([loss, train])[0] for _ in range(steps)]
            names = [v.op.name for v in tf.global_variables()]
            return curve, dict(zip(names, sess.run(tf.global_variables())))


def _copies(sess):
    """{variable name: [value of each local copy]} for the parallelized graph."""
    program = epl.Graph.get(sess.graph).parallel
    return all_copy_values(sess, program.variable_copies)


def _train(model, arrays, runs, stage=no_stage, collect=True, monitored=False, batch=None,
           static=True):
    loss = model.loss(dataset(arrays, batch or model.batch, static), stage)
    if collect:
        epl.add_to_collection(loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    train = model.train_op(loss)
    if monitored:
        with tf.train.MonitoredTrainingSession() as sess:
            curve = [sess.run([loss, train])[0] for _ in range(runs)]
            return curve, _copies(sess._tf_sess())  # pylint: disable=protected-access
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        curve = [sess.run([loss, train])[0] for _ in range(runs)]
        return curve, _copies(sess)


def run_dp(model, arrays, devices, config=None, steps=STEPS):
    """Data parallelism over ``devices`` local devices (MonitoredTrainingSession)."""
    epl.init(epl.Config(config or {}), cluster=Cluster(devices_per_worker=devices))
    epl.set_default_strategy(epl.replicate(1))
    return _train(model, arrays, steps, monitored=True)


def run_pipeline(model, arrays, micro_batches, config=None, steps=STEPS, devices=2):
    """Two stages, ``micro_batches`` micro-batches per step."""
    settings = {"pipeline.num_micro_batch": micro_batches}
    settings.update(config or {})
    epl.init(epl.Config(settings), cluster=Cluster(devices_per_worker=devices))
    stage = lambda index: epl.replicate(1, name="stage_%d" % index)
    return _train(model, arrays, steps, stage=stage)


def run_ga(model, arrays, micro_batches, config=None, steps=STEPS):
    """Gradient accumulation: one apply every ``micro_batches`` runs, one device."""
    settings = {"pipeline.num_micro_batch": micro_batches}
    settings.update(config or {})
    epl.init(epl.Config(settings), cluster=Cluster(devices_per_worker=1))
    epl.set_default_strategy(epl.replicate(1))
    return _train(model, arrays, steps * micro_batches, collect=False)


def run_workers_dp(model, arrays, workers, devices=1, config=None, steps=STEPS,
                   device_count=1, static=True):
    """Data parallelism over ``workers`` in-process workers x ``devices`` each.

    With ``device_count=k`` one replica spans k devices: each worker reads its
    own batches for its part of the replica and, when the batch size is dynamic
    (``static=False``), splits them over its devices of it, so every device
    still sees ``model.batch`` rows. With a static batch size every copy pulls
    ``model.batch`` rows of its own.
    """
    per_worker = devices * model.batch
    batch = model.batch * min(device_count, devices) if not static else model.batch

    def worker(index):
        rows = [worker_rows(a, steps, workers, per_worker, index) for a in arrays]
        epl.set_default_strategy(epl.replicate(device_count))
        return _train(model, rows, steps, batch=batch, static=static)

    return run_workers(worker, workers, devices, epl.Config(config or {}), timeout=240)


def max_difference(reference, copies, stats="all"):
    """Largest |copy - serial| over compared variables and every copy, and its name.

    With ``stats="first"`` moving statistics are compared on copy 0 only: each
    data-parallel replica keeps the statistics of its own batches; ``"skip"``
    leaves them out (a worker other than worker 0).
    """
    worst, where = 0.0, None
    for name, values in copies.items():
        if not compared(name):
            continue
        if stats != "all" and _is_moving_stat(name):
            values = values[:1] if stats == "first" else []
        for value in values:
            diff = float(np.max(np.abs(np.asarray(value) - reference[name])))
            if diff > worst:
                worst, where = diff, name
    return worst, where


def run_hybrid(model, arrays, width, head, micro_batches, devices, config=None,
               steps=STEPS):
    """Two TaskGraphs ``width`` devices wide: ``epl.replicate(width)`` for stage 0 and
    ``epl.replicate``/``epl.split(width)`` (``head``) for stage 1, on ``devices`` local
    devices; without the colocate key each TaskGraph has devices of its own (the seeds'
    default placement), a pipeline when ``micro_batches`` > 1. Each micro-batch of
    ``width * model.batch`` rows is split over the stage's devices (a dynamic batch)."""
    settings = {"pipeline.num_micro_batch": micro_batches}
    settings.update(config or {})
    epl.init(epl.Config(settings), cluster=Cluster(devices_per_worker=devices))
    kinds = (epl.replicate, epl.split if head == "split" else epl.replicate)
    stage = lambda index: kinds[index](width, name="stage_%d" % index)
    return _train(model, arrays, steps, stage=stage, batch=width * model.batch, static=False)


def run_workers_hybrid(model, arrays, workers, devices, width, micro_batches, steps=STEPS):
    """:func:`run_hybrid` with two ``replicate(width)`` stages on ``workers`` in-process
    workers x ``devices``: each worker reads its own part of every step's global batch
    (one replica per worker when ``devices == 2 * width``)."""
    per_worker = (devices // (2 * width)) * width * micro_batches * model.batch

    def worker(index):
        rows = [worker_rows(a, steps, workers, per_worker, index) for a in arrays]
        stage = lambda i: epl.replicate(width, name="stage_%d" % i)
        return _train(model, rows, steps, stage=stage, batch=width * model.batch,
                      static=False)

    config = epl.Config({"pipeline.num_micro_batch": micro_batches})
    return run_workers(worker, workers, devices, config, timeout=240)
