"""ZeRO v2's structure: one reduce-scatter per bucket (several buckets), each member
receiving only its own variables' gradient elements plus padding, and one all-gather
per bucket of the updated values; training equals training without ZeRO."""
import collections

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import epl
from eplutil import (MEASURED, all_copy_values, dataset_input, make_data, run_workers,
                     worker_rows)

STEPS, BATCH, LAYERS, WIDTH = 2, 8, 4, 8


def _deep(x, y):
    """``LAYERS`` tanh layers: enough variables that a bucket holds several."""
    h = x
    for index in range(LAYERS):
        rows = h.shape[1].value
        init = np.linspace(-0.5, 0.5, rows * WIDTH).reshape(rows, WIDTH) * (index + 1) / 2.0
        h = tf.layers.dense(h, WIDTH, activation=tf.nn.tanh, name="l%d" % index,
                            kernel_initializer=tf.constant_initializer(init))
    logits = tf.layers.dense(h, 3, name="out",
                             kernel_initializer=tf.constant_initializer(0.1))
    return tf.losses.sparse_softmax_cross_entropy(y, logits)


def _train(workers, devices, config):
    per_worker = devices * BATCH
    x, y = make_data(workers * per_worker * STEPS, seed=5)

    def worker(index):
        rows = [worker_rows(v, STEPS, workers, per_worker, index) for v in (x, y)]
        epl.set_default_strategy(epl.replicate(1))
        loss = _deep(*dataset_input(rows[0], rows[1], BATCH))
        train = tf.train.AdamOptimizer(0.01, epsilon=1e-4).minimize(loss)
        names = [v.op.name for v in tf.trainable_variables()]
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            for _ in range(STEPS):
                sess.run(train)
            return all_copy_values(sess, names), epl.Graph.get().parallel, sess.graph

    return run_workers(worker, workers, devices, epl.Config(config), timeout=240)


def _by_device(program, graph, prefix, op_type):
    """{device: [collective results of the communicators named ``prefix``...]}. The
    CPU backends build a reduce-scatter as an all-reduce and this member's slice (a
    StridedSlice), an all-gather as a CollectiveGather."""
    found = collections.defaultdict(list)
    for name, comm in program.collective_ops.items():
        op = graph.get_operation_by_name(name)
        if comm.startswith(prefix) and op.type == op_type:
            found[tf.DeviceSpec.from_string(op.device).to_string()].append(op)
    return found


@pytest.mark.parametrize("workers,devices", [(1, 2), (2, 2)])
def test_v2_reduce_scatters_each_bucket_to_its_owners_and_gathers_updates(workers, devices):
    config = {"communication.max_splits": 2}
    plain = _train(workers, devices, config)
    zero = _train(workers, devices, dict(config, **{"zero.level": "v2"}))
    worst = 0.0
    for (values, _, _), (reference, _, _) in zip(zero, plain):
        for name, copies in values.items():
            for copy in copies:
                worst = max(worst, float(np.abs(copy - reference[name][0]).max()))
    MEASURED.append(("zero v2 buckets %dx%d" % (workers, devices), worst))
    assert worst < 2e-6
    for _, program, graph in zero:
        _check_structure(program, graph, workers * devices)


def _check_structure(program, graph, members):
    entries = program.gradient_plans[0].entries  # one TaskGraph: the same plan per copy
    group = entries[0].group
    # the group's gradient lanes and its exchange of new values
    scatters = _by_device(program, graph, "grads/" + group.name, "StridedSlice")
    gathers = _by_device(program, graph, "sync/" + group.name, "CollectiveGather")
    assert group.size == members and len(scatters) == len(program.gradient_plans)
    buckets = collections.OrderedDict()
    for entry in entries:
        buckets.setdefault(entry.bucket, []).append(entry)
    assert len(buckets) == 2
    own = [[sum(_elements(graph, e.name) for e in bucket if e.owner == rank)
            for rank in range(members)] for bucket in buckets.values()]
    chunks = [max(shares) for shares in own]
    assert all(min(shares) > 0 for shares in own)  # each bucket balanced over every member
    assert sum(chunks) < sum(_elements(graph, e.name) for e in entries)
    for device, ops in scatters.items():
        rank = [tf.DeviceSpec.from_string(d).to_string() for d in group.devices].index(device)
        # one reduce-scatter per bucket; each result is a chunk: the member's own
        # variables' elements (what it reads out) plus padding
        assert sorted(op.outputs[0].shape.num_elements() for op in ops) == sorted(chunks)
        read = sum(_read_out(op) for op in ops)
        assert read == sum(shares[rank] for shares in own)
    assert len(gathers) == len(scatters)
    for device, ops in gathers.items():
        assert sorted(op.outputs[0].shape.num_elements() for op in ops) == sorted(
            members * chunk for chunk in chunks)


def _read_out(scatter):
    """Elements a member takes out of its reduce-scatter result (the rest is padding)."""
    slices = [op for op in scatter.outputs[0].consumers() if op.type == "StridedSlice"]
    return sum(op.outputs[0].shape.num_elements() for op in slices)


def _elements(graph, name):
    return tf.TensorShape(graph.get_operation_by_name(name).get_attr("shape")).num_elements()
