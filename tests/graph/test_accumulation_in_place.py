"""Gradient accumulation adds each run's gradient into its buffer in place.

A run that only accumulates allocated three gradient-sized tensors per variable (the
sum, zeros for the select, the select) and copied the result into the buffer, plus a
dense tensor of the variable's shape for each sparse gradient: half of a gradient-
accumulation step of BERT-base went there (issue 41, ``benchmarks/startup.py``). Now
such a run allocates nothing gradient-sized for the accumulation: a dense gradient is
added into the buffer (``AssignAdd``), a sparse one's rows are (``ScatterAdd``).
Equivalence with serial training is tested with the corpus (test_corpus.py, ``ga_2``).
"""
import numpy as np
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster

ROWS, WIDTH, OUT = 1000, 64, 1024


def _accumulating_model():
    epl.init(epl.Config({"pipeline.num_micro_batch": 2}), cluster=Cluster(devices_per_worker=1))
    epl.set_default_strategy(epl.replicate(1))
    rng = np.random.RandomState(0)
    ids = tf.constant(rng.randint(0, ROWS, [8]), dtype=tf.int32)
    table = tf.get_variable("table", [ROWS, WIDTH])   # a sparse (IndexedSlices) gradient
    weights = tf.get_variable("weights", [WIDTH, OUT])
    loss = tf.reduce_sum(tf.square(tf.matmul(tf.nn.embedding_lookup(table, ids), weights)))
    return tf.train.AdamOptimizer(0.01).minimize(loss)


# ops that make a new tensor of their input's size (a copy, a sum, zeros, a select)
COPYING = {"Add", "AddV2", "Select", "SelectV2", "ZerosLike", "Fill", "ScatterNd", "Assign"}


def _accumulation_nodes(meta):
    """(op types of the EPL_GA nodes a traced run executed, bytes they allocated)."""
    types, allocated = set(), 0
    for device in meta.step_stats.dev_stats:
        for node in device.node_stats:
            if "EPL_GA" not in node.node_name or " = " not in node.timeline_label:
                continue
            # "name = Type(inputs)"; folded constants are not in the graph
            types.add(node.timeline_label.split(" = ", 1)[1].split("(", 1)[0])
            allocated += sum(record.alloc_bytes for memory in node.memory
                             for record in memory.allocation_records if record.alloc_bytes > 0)
    return types, allocated


def test_accumulation_runs_add_into_the_buffers_in_place():
    train = _accumulating_model()
    variable_bytes = 4 * (ROWS * WIDTH + WIDTH * OUT)
    with tf.train.MonitoredTrainingSession() as sess:
        sess.run(train)   # run 1 accumulates, run 2 applies
        sess.run(train)
        accumulate, release = tf.RunMetadata(), tf.RunMetadata()
        options = tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE)
        sess.run(train, options=options, run_metadata=accumulate)   # run 3
        sess.run(train, options=options, run_metadata=release)      # run 4
    types, allocated = _accumulation_nodes(accumulate)
    assert {"AssignAdd", "ScatterAdd"} <= types and not types & COPYING, types
    assert allocated < 0.01 * variable_bytes
    # the release run makes the released sums: the trace sees EPL_GA's copies
    types, allocated = _accumulation_nodes(release)
    assert "ScatterNd" in types and allocated > ROWS * WIDTH * 4


def test_an_accumulators_stateless_ops_are_made_from_node_defs(monkeypatch):
    """Each accumulated variable gets an accumulator of about 15 ops; through TF's op
    wrappers (and ``tf.zeros``' constants) the 200 of a 12-layer encoder took 1.3 s of
    the rewrite, the largest share of gradient accumulation's session creation
    (issue 41). Only the variable and its state ops go through TF's Python op
    construction now; the switches, sums, zeros and merges are made from NodeDefs."""
    from epl.runtime import gradient_accumulation as ga
    wrapped, inside = [], []
    create = tf.Graph._create_op_internal
    accumulate = ga.accumulate_dense

    def _create_op_internal(self, op_type, *args, **kwargs):
        if inside:
            wrapped.append(op_type)
        return create(self, op_type, *args, **kwargs)

    def accumulate_dense(*args, **kwargs):
        inside.append(True)
        try:
            return accumulate(*args, **kwargs)
        finally:
            inside.pop()
    monkeypatch.setattr(tf.Graph, "_create_op_internal", _create_op_internal)
    monkeypatch.setattr(ga, "accumulate_dense", accumulate_dense)
    train = _accumulating_model()
    with tf.train.MonitoredTrainingSession() as sess:
        sess.run(train)
    # the buffer (VariableV2, its initial Assign and read), AssignAdd, the reset's Assign
    assert sorted(wrapped) == ["Assign", "Assign", "AssignAdd", "Identity", "VariableV2"], \
        wrapped
