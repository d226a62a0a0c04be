"""IO slicing under data parallelism across in-process workers (real gRPC servers).

Equivalence: each worker trains on its own share of the files; the job must
match serial training on global batches made of the workers' batches in worker
order (worker 0's batch first), the order IO slicing's deal defines.
"""
import os

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.availability import NOT_BUILT
from epl.parallel import rewriter
from epl.parallel.file_shards import share_of, worker_indices
from epl.parallel.passes.io_slicing import IOSlicing
from eplutil import (FEATURES, copy_values, initial_weights, make_data, max_diff, mlp,
                     run_workers, serial_train, train_step, train_to_the_end)

STEPS, BATCH, WORKERS, FILES, ROWS = 3, 4, 2, 6, 8
TOL = 1e-5


@pytest.fixture(autouse=True)
def io_keys_available(monkeypatch):
    """Let epl.init accept io.* keys, and run IO slicing in the real rewrite."""
    monkeypatch.setattr("epl.availability.NOT_BUILT",
                        dict((k, v) for k, v in NOT_BUILT.items() if not k.startswith("io.")))
    original = rewriter.parallelize
    passes = rewriter.PASSES
    if not any(isinstance(p, IOSlicing) for p in passes):
        passes = (IOSlicing(),) + passes

    def parallelize(view, config, cluster, plan=None, passes=passes):
        return original(view, config, cluster, plan, passes)
    monkeypatch.setattr(rewriter, "parallelize", parallelize)


def write_rows(directory, x, y, files, rows):
    """Rows as float32 records (features then label), ``rows`` per file, in order."""
    paths = []
    for index in range(files):
        path = os.path.join(str(directory), "rows-%02d.tfrecord" % index)
        with tf.io.TFRecordWriter(path) as writer:
            for row in range(index * rows, (index + 1) * rows):
                record = np.append(x[row], np.float32(y[row])).astype(np.float32)
                writer.write(record.tobytes())
        paths.append(path)
    return paths


def _decode(record):
    values = tf.io.decode_raw(record, tf.float32)
    return tf.reshape(values[:FEATURES], [FEATURES]), tf.cast(values[FEATURES], tf.int64)


def worker_stream(x, y, worker, files=FILES, rows=ROWS):
    """The rows worker ``worker`` reads, in order: its files (IO slicing's deal)."""
    picked = worker_indices(files, share_of(worker, [1] * WORKERS))
    index = np.concatenate([np.arange(f * rows, (f + 1) * rows) for f in picked])
    return x[index], y[index]


def global_batches(x, y, per_worker):
    """Serial data whose global batch s is worker 0's step-s rows, then worker 1's."""
    streams = [worker_stream(x, y, w) for w in range(WORKERS)]
    parts_x, parts_y = [], []
    for step in range(STEPS):
        for sx, sy in streams:
            parts_x.append(sx[step * per_worker:(step + 1) * per_worker])
            parts_y.append(sy[step * per_worker:(step + 1) * per_worker])
    return np.concatenate(parts_x), np.concatenate(parts_y)


def _pipeline(directory, paths, use_pattern):
    if use_pattern:
        names = tf.data.Dataset.list_files(os.path.join(str(directory), "*.tfrecord"),
                                           shuffle=False)
        records = tf.data.TFRecordDataset(names)
    else:
        records = tf.data.TFRecordDataset(list(reversed(paths)))  # EPL sorts the names
    dataset = records.map(_decode).batch(BATCH)
    return tf.data.make_one_shot_iterator(dataset).get_next()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("devices,use_pattern", [(1, False), (2, True)],
                         ids=["2x1-const-list", "2x2-pattern"])
def test_workers_on_their_file_shares_match_serial(tmp_path, devices, use_pattern):
    x, y = make_data(FILES * ROWS)
    paths = write_rows(tmp_path, x, y, FILES, ROWS)
    per_worker = devices * BATCH  # the copies on a worker share its iterator
    gx, gy = global_batches(x, y, per_worker)
    _, reference = serial_train(gx, gy, WORKERS * per_worker, STEPS)

    def worker(index):
        epl.set_default_strategy(epl.replicate(1))
        loss = mlp(*_pipeline(tmp_path, paths, use_pattern), weights=initial_weights())
        train = train_step(loss)
        with tf.train.MonitoredTrainingSession() as sess:
            for _ in range(STEPS):
                sess.run(train)
            raw = sess._tf_sess()  # pylint: disable=protected-access
            return dict((n, copy_values(raw, n)) for n in ("d1/kernel", "d2/kernel"))

    results = run_workers(worker, WORKERS, devices, config=epl.Config({"io.slicing": True}),
                          timeout=120)
    for name in ("d1/kernel", "d2/kernel"):
        copies = [c for result in results for c in result[name]]
        assert len(copies) == WORKERS * devices
        assert max_diff(reference[name], copies) < TOL, name


@pytest.mark.timeout(180)
def test_uneven_pattern_fails_on_every_worker_at_the_first_step(tmp_path):
    x, y = make_data(5 * ROWS)
    write_rows(tmp_path, x, y, 5, ROWS)

    def worker(index):
        loss = mlp(*_pipeline(tmp_path, None, True), weights=initial_weights())
        train = train_step(loss)
        with tf.train.MonitoredTrainingSession() as sess:
            with pytest.raises(tf.errors.InvalidArgumentError) as info:
                sess.run(train)
        return info.value.message

    messages = run_workers(worker, WORKERS, 1, config=epl.Config({"io.slicing": True}),
                           timeout=120)
    for message in messages:
        assert "do not divide evenly among 2 workers" in message and "[5]" in message


@pytest.mark.timeout(180)
@pytest.mark.parametrize("key,steps", [("io.unbalanced_io_slicing", 4), ("io.drop_last_files", 3)])
def test_uneven_shares_end_every_worker_at_the_same_step(tmp_path, key, steps):
    """5 files of 2 batches; file 4 holds 1 batch more than the others. Unbalanced: worker 0
    reads files 0, 2, 4 (7 batches), worker 1 files 1, 3 (4 batches); with the last file
    dropped worker 0 reads 0, 2 (4 batches), worker 1 reads 1, 3 (4 batches) less the
    last batch of file 3, cut short below. Every worker stops at the first step where one
    has no batch, applies nothing of it, and ends cleanly (docs/data_parallelism.md)."""
    sizes = [ROWS, ROWS, ROWS, ROWS - (BATCH if key == "io.drop_last_files" else 0), ROWS + BATCH]
    offsets = np.cumsum([0] + sizes)
    x, y = make_data(int(offsets[-1]))
    paths = []
    for index, size in enumerate(sizes):
        path = os.path.join(str(tmp_path), "rows-%02d.tfrecord" % index)
        with tf.io.TFRecordWriter(path) as writer:
            for row in range(offsets[index], offsets[index] + size):
                writer.write(np.append(x[row], np.float32(y[row])).astype(np.float32).tobytes())
        paths.append(path)
    streams = [np.concatenate([np.arange(offsets[f], offsets[f + 1]) for f in worker_indices(
        len(sizes), share_of(w, [1] * WORKERS), drop_last=key == "io.drop_last_files",
        unbalanced=key == "io.unbalanced_io_slicing")]) for w in range(WORKERS)]
    order = np.concatenate([s[k * BATCH:(k + 1) * BATCH] for k in range(steps) for s in streams])
    _, reference = serial_train(x[order], y[order], WORKERS * BATCH, steps)

    def worker(index):
        epl.set_default_strategy(epl.replicate(1))
        train = train_step(mlp(*_pipeline(tmp_path, paths, False), weights=initial_weights()))
        return train_to_the_end(train, ("d1/kernel", "d2/kernel"))

    config = epl.Config({"io.slicing": True, key: True})
    for found in run_workers(worker, WORKERS, 1, config=config, timeout=120):
        assert (found["runs"], found["step"]) == (steps, steps)
        for name in ("d1/kernel", "d2/kernel"):
            assert max_diff(reference[name], found["weights"][name]) < TOL, name
