"""Any subset of the tensors merged by one epl.add_to_collection call can be fetched.

Regression: the other copies' merge collectives were keyed by the producing
op, so fetching ``a`` of ``a, b, c = tf.unstack(...)`` ran b's and c's
collectives on copy 1 only, and the step hung until the watchdog.
"""
import itertools

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster
from eplutil import dataset_input, initial_weights, make_data, mlp, run_workers, train_step

BATCH = 4
SUBSETS = [s for n in (1, 2, 3) for s in itertools.combinations(range(3), n)]


@pytest.fixture(autouse=True)
def _short_timeout(monkeypatch):
    # A regression must fail fast (the watchdog ends the run) rather than hang.
    monkeypatch.setenv("EPL_COMMUNICATION_TIMEOUT", "20")


def _model(rows, seed=0):
    """(x, [a, b, c] from one op, [m0, m1] from separate ops, mean loss, train op)."""
    x, y = make_data(rows, seed)
    xb, yb = dataset_input(x, y, BATCH)
    loss = mlp(xb, yb, weights=initial_weights())
    columns = tf.unstack(xb[:, :3], axis=1, name="columns")
    epl.add_to_collection(columns, epl.GraphKeys.GLOBAL_CONCAT_OBJECTS)
    means = [tf.reduce_mean(xb[:, 3], name="m0"), tf.reduce_sum(xb[:, 4], name="m1")]
    epl.add_to_collection(means, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    return x, columns, means, loss, train_step(loss)


def _fetch_all_subsets(sess, tensors, train, global_rows, x, first_row, step):
    """Fetch every subset of ``tensors`` (with and without the train op); return the
    next step index. Values are checked against the rows the step covers."""
    for subset in SUBSETS:
        for with_train in (True, False):
            fetches = [tensors[i] for i in subset] + ([train] if with_train else [])
            values = sess.run(fetches)
            rows = x[first_row(step):first_row(step) + global_rows]
            for i, value in zip(subset, values):
                np.testing.assert_allclose(value, rows[:, i], rtol=1e-6)
            step += 1
    return step


def test_subsets_of_one_call_on_two_local_devices():
    devices = 2
    global_rows = devices * BATCH
    epl.init(cluster=Cluster(devices_per_worker=devices))
    epl.set_default_strategy(epl.replicate(1))
    x, columns, means, _, train = _model(global_rows * 2 * len(SUBSETS) * 2 + global_rows)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        step = _fetch_all_subsets(sess, columns, train, global_rows, x,
                                  lambda s: s * global_rows, 0)
        # Separate ops merged by one call (ring all-reduce path): any subset.
        for subset in ([0], [1], [0, 1]):
            values = sess.run([means[i] for i in subset])
            rows = x[step * global_rows:(step + 1) * global_rows]
            expected = [rows[:, 3].mean(), rows[:, 4].sum() / devices]
            for i, value in zip(subset, values):
                assert value == pytest.approx(expected[i], rel=1e-5)
            step += 1


def test_program_keys_merge_extras_by_tensor(monkeypatch):
    monkeypatch.setenv("EPL_COLLECTIVE_BACKEND", "tf")
    epl.init(cluster=Cluster(devices_per_worker=2))
    epl.set_default_strategy(epl.replicate(1))
    _, columns, _, _, train = _model(64)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(train)
    program = epl.Graph.get().parallel
    merge_of = dict((c.name, program.fetches.merged_extras[c.name][0].name) for c in columns)
    for tensor in columns:
        substitute, extras = program.map_element(tensor)
        assert substitute is program.fetches.merged[tensor.name]
        names = set(op.name for op in extras)
        assert merge_of[tensor.name] in names
        assert not names.intersection(v for k, v in merge_of.items() if k != tensor.name)
    _, extras = program.map_element(columns[0].op)   # the op itself: no merge runs
    assert not set(op.name for op in extras).intersection(merge_of.values())


@pytest.mark.parametrize("workers,devices", [(2, 2)])
def test_subsets_of_one_call_on_two_workers(workers, devices, monkeypatch):
    # Concatenation is a TF all-gather; TF collectives for the gradients too keep
    # the ring's sockets out of the (shared) test process.
    monkeypatch.setenv("EPL_COLLECTIVE_BACKEND", "tf")
    per_worker = devices * BATCH
    global_rows = workers * per_worker
    steps = 2 * len(SUBSETS)
    rows = global_rows * (steps + 1)

    def worker(index):
        x, columns, _, _, train = _model(rows, seed=index)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            seen = []
            for subset in SUBSETS:
                for with_train in (True, False):
                    fetches = [columns[i] for i in subset] + ([train] if with_train else [])
                    values = sess.run(fetches)
                    seen.append([np.asarray(v) for v in values[:len(subset)]])
        return x, seen

    results = run_workers(worker, workers, devices, timeout=120)
    # Each worker reads its own data (seed = worker index); the gathered value is
    # every worker's rows of that step, in worker order, on every worker.
    for step, subset in enumerate(s for s in SUBSETS for _ in (0, 1)):
        expected = np.concatenate([x[step * per_worker:(step + 1) * per_worker]
                                   for x, _ in results])
        for x, seen in results:
            for i, value in zip(subset, seen[step]):
                assert value.shape == (global_rows,)
                np.testing.assert_allclose(value, expected[:, i], rtol=1e-6)


def test_a_tensor_belongs_to_one_collection():
    epl.init()
    value = tf.ones([2], name="v")
    epl.add_to_collection(value, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)
    epl.add_to_collection([value], epl.GraphKeys.GLOBAL_MEAN_OBJECTS)  # same key: no-op
    assert epl.get_collection(epl.GraphKeys.GLOBAL_MEAN_OBJECTS) == [value]
    with pytest.raises(ValueError, match="already in global_mean_objects"):
        epl.add_to_collection(value, epl.GraphKeys.GLOBAL_SUM_OBJECTS)
