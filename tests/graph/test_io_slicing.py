"""IO slicing on real files: every record is read once per epoch across workers.

Most cases build the graph of worker r of a simulated 2-worker job in this
thread, run the IO slicing pass (and role classification) alone, and read the
pipeline with plain TensorFlow: fast, no servers. The first tests run the full
rewrite in 2 in-process workers with real servers (``run_workers``).
"""
import os
import random

import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.availability import NOT_BUILT
from epl.cluster import Cluster
from epl.parallel import rewriter
from epl.parallel.file_shards import IOSlicingError
from epl.parallel.passes.classify import ClassifyRoles
from epl.parallel.passes.io_slicing import IOSlicing
from eplutil import run_workers

PER_FILE = 3
HOSTS = ["127.0.0.1:1", "127.0.0.1:2"]


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


# ---- files ---------------------------------------------------------------------------------
def _value(file_index, record):
    return file_index * 100 + record


def write_files(directory, count, kind="tfrecord"):
    """``count`` files of PER_FILE records ``100 * file + record``; created in a random
    order so that directory listings are not sorted. Returns sorted paths."""
    paths = [os.path.join(str(directory), "part-%02d.%s" % (i, kind)) for i in range(count)]
    for i in random.Random(count).sample(range(count), count):
        records = [str(_value(i, r)) for r in range(PER_FILE)]
        if kind == "tfrecord":
            with tf.io.TFRecordWriter(paths[i]) as writer:
                for record in records:
                    writer.write(record.encode())
        elif kind == "txt":
            with open(paths[i], "w") as handle:
                handle.write("\n".join(records) + "\n")
        else:  # fixed-length records of 4 bytes
            with open(paths[i], "wb") as handle:
                handle.write(b"".join(record.rjust(4).encode() for record in records))
    return paths


def values_of(file_indices):
    return sorted(_value(i, r) for i in file_indices for r in range(PER_FILE))


def _parse(dataset):
    return dataset.map(lambda r: tf.strings.to_number(tf.strings.strip(r))).batch(2)


def pattern_pipeline(directory, kind="tfrecord"):
    files = tf.data.Dataset.list_files(os.path.join(str(directory), "*." + kind), shuffle=True)
    return _parse(tf.data.TFRecordDataset(files))


def const_text_pipeline(paths):
    names = list(paths)
    random.Random(7).shuffle(names)  # EPL sorts before dealing
    return _parse(tf.data.TextLineDataset(names))


def interleave_pipeline(paths):
    names = tf.data.Dataset.from_tensor_slices(list(paths))
    return _parse(names.interleave(tf.data.TFRecordDataset, cycle_length=2))


def fixed_length_pipeline(paths):
    return _parse(tf.data.FixedLengthRecordDataset(list(paths), 4))


# ---- the model and the reader --------------------------------------------------------------
def _model(values):
    loss = tf.reduce_mean(tf.layers.dense(tf.reshape(values, [-1, 1]), 1, name="d"))
    step = tf.train.get_or_create_global_step()
    tf.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)


def _iterate(dataset, initializable):
    if initializable:
        iterator = tf.data.make_initializable_iterator(dataset)
        return iterator.get_next(), iterator.initializer
    return tf.data.make_one_shot_iterator(dataset).get_next(), None


def read_all(sess, values):
    read = []
    while True:
        try:
            read.extend(int(v) for v in sess.run(values))
        except tf.errors.OutOfRangeError:
            return read


def worker_reader(build, initializable=False):
    """fn(worker) for run_workers: build, train-step graph, read until OutOfRange."""
    def worker(index):
        values, init_iterator = _iterate(build(), initializable)
        _model(values)
        init = tf.global_variables_initializer()
        with tf.Session() as sess:
            sess.run(init)
            if init_iterator is not None:
                sess.run(init_iterator)
            read = read_all(sess, values)
        added = [op.device for op in tf.get_default_graph().get_operations()
                 if op.name.startswith("EPL_IO_SLICING/")]
        host = epl.Env.get().cluster.worker_cpu()
        assert all(device == host for device in added), (host, added)
        return read
    return worker


def simulated_read(build, worker, config, initializable=False):
    """Worker ``worker`` of 2: its rewritten pipeline, read with plain TF (no servers)."""
    with tf.Graph().as_default() as graph:
        epl.init(epl.Config(config), cluster=Cluster(HOSTS, worker, 1))
        values, init_iterator = _iterate(build(), initializable)
        _model(values)
        view, env = epl.Graph.get(), epl.Env.get()
        rewriter.parallelize(view, env.config, env.cluster, passes=(IOSlicing(), ClassifyRoles()))
        with epl.paused(), tf.Session(graph=graph) as sess:
            if init_iterator is not None:
                sess.run(init_iterator)
            return read_all(sess, values)


def rewrite_error(build, config):
    """The IOSlicingError the rewrite of worker 0 of 2 raises."""
    with tf.Graph().as_default():
        epl.init(epl.Config(config), cluster=Cluster(HOSTS, 0, 1))
        _model(_iterate(build(), False)[0])
        view, env = epl.Graph.get(), epl.Env.get()
        passes = (IOSlicing(),) + rewriter.PASSES
        with pytest.raises(IOSlicingError) as info:
            rewriter.parallelize(view, env.config, env.cluster, passes=passes)
        return str(info.value)


def assert_read_once(shares, expected):
    union = sorted(v for share in shares for v in share)
    assert union == expected, "duplicates or missing records"
    assert all(shares)


SLICING = {"io.slicing": True}


# ---- two in-process workers, full rewrite ------------------------------------------------
@pytest.mark.timeout(120)
def test_pattern_each_record_read_once_across_workers(tmp_path):
    write_files(tmp_path, 8)
    shares = run_workers(worker_reader(lambda: pattern_pipeline(tmp_path)), 2, 1,
                         config=epl.Config(SLICING), timeout=60)
    assert_read_once(shares, values_of(range(8)))
    assert sorted(set(v // 100 for v in shares[0])) == [0, 2, 4, 6]  # sorted deal


@pytest.mark.timeout(120)
def test_const_list_each_record_read_once_across_workers(tmp_path):
    paths = write_files(tmp_path, 8, "txt")
    shares = run_workers(worker_reader(lambda: const_text_pipeline(paths), initializable=True),
                         2, 1, config=epl.Config(SLICING), timeout=60)
    assert_read_once(shares, values_of(range(8)))
    assert sorted(set(v // 100 for v in shares[1])) == [1, 3, 5, 7]


@pytest.mark.timeout(120)
def test_without_slicing_every_worker_reads_everything(tmp_path):
    write_files(tmp_path, 8)
    shares = run_workers(worker_reader(lambda: pattern_pipeline(tmp_path)), 2, 1, timeout=60)
    assert [sorted(s) for s in shares] == [values_of(range(8))] * 2


# ---- simulated workers: the pipeline kinds --------------------------------------------------
@pytest.mark.parametrize("kind", ["one_shot", "initializable"])
def test_pattern_in_either_iterator_kind(tmp_path, kind):
    write_files(tmp_path, 6)
    initializable = kind == "initializable"
    shares = [simulated_read(lambda: pattern_pipeline(tmp_path), w, SLICING, initializable)
              for w in range(2)]
    assert_read_once(shares, values_of(range(6)))


@pytest.mark.parametrize("kind", ["one_shot", "initializable"])
def test_interleaved_const_list(tmp_path, kind):
    paths = write_files(tmp_path, 6)
    shares = [simulated_read(lambda: interleave_pipeline(paths), w, SLICING,
                             kind == "initializable") for w in range(2)]
    assert_read_once(shares, values_of(range(6)))


def test_fixed_length_records(tmp_path):
    paths = write_files(tmp_path, 4, "bin")
    shares = [simulated_read(lambda: fixed_length_pipeline(paths), w, SLICING)
              for w in range(2)]
    assert_read_once(shares, values_of(range(4)))


def test_parallel_reads(tmp_path):
    paths = write_files(tmp_path, 4)
    build = lambda: _parse(tf.data.TFRecordDataset(paths, num_parallel_reads=2))
    shares = [simulated_read(build, w, SLICING, initializable=True) for w in range(2)]
    assert_read_once(shares, values_of(range(4)))


def test_one_shot_iterator_reads_a_rewritten_factory(tmp_path):
    paths = write_files(tmp_path, 4)
    with tf.Graph().as_default() as graph:
        epl.init(epl.Config(SLICING), cluster=Cluster(HOSTS, 1, 1))
        values, _ = _iterate(interleave_pipeline(paths), False)
        _model(values)
        view, env = epl.Graph.get(), epl.Env.get()
        rewriter.parallelize(view, env.config, env.cluster, passes=(IOSlicing(), ClassifyRoles()))
        iterator = [op for op in graph.get_operations() if op.type == "OneShotIterator"][0]
        assert iterator.get_attr("dataset_factory").name.endswith("_epl_io_worker1")


# ---- uneven counts ----------------------------------------------------------------------
def test_drop_last_with_a_pattern(tmp_path):
    write_files(tmp_path, 7)
    config = dict(SLICING, **{"io.drop_last_files": True})
    shares = [simulated_read(lambda: pattern_pipeline(tmp_path), w, config) for w in range(2)]
    assert_read_once(shares, values_of(range(6)))  # the last file is dropped
    assert len(shares[0]) == len(shares[1])


def test_unbalanced_with_a_const_list(tmp_path):
    paths = write_files(tmp_path, 7)
    config = dict(SLICING, **{"io.unbalanced_io_slicing": True})
    shares = [simulated_read(lambda: interleave_pipeline(paths), w, config) for w in range(2)]
    assert_read_once(shares, values_of(range(7)))
    assert (len(shares[0]), len(shares[1])) == (4 * PER_FILE, 3 * PER_FILE)


# ---- errors ------------------------------------------------------------------------------
def test_uneven_const_list_is_refused_at_rewrite_time(tmp_path):
    paths = write_files(tmp_path, 7)
    message = rewrite_error(lambda: interleave_pipeline(paths), SLICING)
    for text in ("7 files", "2 workers", "io.drop_last_files", "io.unbalanced_io_slicing"):
        assert text in message


def test_uneven_pattern_fails_at_the_first_pull(tmp_path):
    write_files(tmp_path, 7)
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        simulated_read(lambda: pattern_pipeline(tmp_path), 0, SLICING)
    message = info.value.message
    for text in ("do not divide evenly among 2 workers", "io.drop_last_files=True",
                 "io.unbalanced_io_slicing=True", "N =", "[7]"):
        assert text in message


def test_pattern_that_matches_nothing_fails(tmp_path):
    # (A missing directory already fails in MatchingFiles, with TF's NotFoundError.)
    write_files(tmp_path, 2, "txt")
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        simulated_read(lambda: pattern_pipeline(tmp_path), 0, SLICING)
    assert "has no files" in info.value.message and "*.tfrecord" in info.value.message


def test_fewer_files_than_workers_is_refused_even_when_unbalanced(tmp_path):
    paths = write_files(tmp_path, 1)
    config = dict(SLICING, **{"io.unbalanced_io_slicing": True})
    message = rewrite_error(lambda: interleave_pipeline(paths), config)
    assert "1 file(s) for 2 workers" in message and "hang" in message


def test_fewer_matches_than_workers_fails_at_the_first_pull(tmp_path):
    write_files(tmp_path, 1)
    config = dict(SLICING, **{"io.unbalanced_io_slicing": True})
    with pytest.raises(tf.errors.InvalidArgumentError, match="for 2 workers"):
        simulated_read(lambda: pattern_pipeline(tmp_path), 1, config)


def test_in_memory_data_is_not_sliced_and_says_so():
    message = rewrite_error(lambda: tf.data.Dataset.from_tensor_slices([1.0, 2.0]).batch(1),
                            SLICING)
    assert "no file-based input pipeline" in message and "io.slicing=False" in message


def test_a_pipeline_that_shards_itself_is_refused(tmp_path):
    paths = write_files(tmp_path, 4)
    message = rewrite_error(lambda: _parse(tf.data.TFRecordDataset(paths).shard(2, 0)),
                            SLICING)
    assert "Dataset.shard" in message and "Remove the .shard() call" in message


@pytest.mark.parametrize("config,text", [
    ({"io.drop_last_files": True}, "only applies when io.slicing=True"),
    ({"io.slicing": True, "io.drop_last_files": True, "io.unbalanced_io_slicing": True},
     "opposite things")])
def test_flag_combinations_are_refused_by_epl_init(config, text):
    """Before: refused by the rewrite, after the model was built."""
    with pytest.raises(IOSlicingError, match=text):
        epl.init(epl.Config(config), cluster=Cluster(HOSTS, 0, 1))


def test_one_worker_reads_every_file(tmp_path):
    write_files(tmp_path, 3)
    with tf.Graph().as_default() as graph:
        epl.init(epl.Config(SLICING), cluster=Cluster(devices_per_worker=1))
        values, _ = _iterate(pattern_pipeline(tmp_path), False)
        _model(values)
        view, env = epl.Graph.get(), epl.Env.get()
        rewriter.parallelize(view, env.config, env.cluster, passes=(IOSlicing(), ClassifyRoles()))
        with epl.paused(), tf.Session(graph=graph) as sess:
            assert sorted(read_all(sess, values)) == values_of(range(3))
