"""Gradient accumulation adds each run's gradient into its buffer in place.

A run that only accumulates allocated three gradient-sized tensors per variable (the
sum, zeros for the select, the select) and copied the result into the buffer, plus a
dense tensor of the variable's shape for each sparse gradient: half of a gradient-
accumulation step of BERT-base went there (issue 41, ``benchmarks/startup.py``). Now
such a run allocates nothing gradient-sized for the accumulation: a dense gradient is
added into the buffer (``AssignAdd``; a window's first run copies it in, ``Assign``),
a sparse one's rows are (``ScatterAdd``).
Equivalence with serial training is tested with the corpus (test_corpus.py, ``ga_2``).
"""
import numpy as np
import tensorflow.compat.v1 as tf

import epl
from epl.cluster import Cluster

ROWS, WIDTH, OUT = 1000, 64, 1024


def _accumulating_model(steps=2, sparse=True):
    epl.init(epl.Config({"pipeline.num_micro_batch": steps}),
             cluster=Cluster(devices_per_worker=1))
    epl.set_default_strategy(epl.replicate(1))
    rng = np.random.RandomState(0)
    ids = tf.constant(rng.randint(0, ROWS, [8]), dtype=tf.int32)
    table = tf.get_variable("table", [ROWS, WIDTH])   # a sparse (IndexedSlices) gradient
    weights = tf.get_variable("weights", [WIDTH, OUT])
    rows = tf.nn.embedding_lookup(table, ids) if sparse else table[:8] * 1.0
    loss = tf.reduce_sum(tf.square(tf.matmul(rows, weights)))
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


def _traced_runs(train, runs, traced):
    """RunMetadata of the runs numbered ``traced`` (from 1) of ``runs`` runs of ``train``."""
    found = {}
    with tf.train.MonitoredTrainingSession() as sess:
        for run in range(1, runs + 1):
            if run not in traced:
                sess.run(train)
                continue
            found[run] = tf.RunMetadata()
            sess.run(train, options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
                     run_metadata=found[run])
    return found


def test_accumulation_runs_add_into_the_buffers_in_place():
    """Windows of 3 runs: run 4 starts the second window (a dense gradient is copied
    into its buffer, ``Assign``, which allocates nothing once the buffer exists), run 5
    adds, run 6 releases."""
    traced = _traced_runs(_accumulating_model(steps=3), 6, (4, 5, 6))
    variable_bytes = 4 * (ROWS * WIDTH + WIDTH * OUT)
    types, allocated = _accumulation_nodes(traced[4])
    assert {"Assign", "ScatterAdd"} <= types and not types & (COPYING - {"Assign"}), types
    assert allocated < 0.01 * variable_bytes
    types, allocated = _accumulation_nodes(traced[5])
    assert {"AssignAdd", "ScatterAdd"} <= types and not types & COPYING, types
    assert allocated < 0.01 * variable_bytes
    # the release run makes the released sums: the trace sees EPL_GA's copies
    types, allocated = _accumulation_nodes(traced[6])
    assert "ScatterNd" in types and allocated > ROWS * WIDTH * 4


def test_a_dense_buffer_is_never_zeroed():
    """A dense gradient's buffer has no initializer: the set-up run made 440 MB of
    zeros on BERT-base, which TF's constant folding evaluated once more in the caller's
    thread (1.2 s CPU; issue 41). It is not reset either: a window's first run assigns
    its gradient, so the release run makes only the sum."""
    train = _accumulating_model(steps=2, sparse=False)
    traced = _traced_runs(train, 4, (4,))
    setup = epl.Graph.get().parallel.setup_op
    made = set(op.type for op in _ancestors(setup))
    assert "Fill" not in made and "VariableV2" in made, made   # the counter's only
    assert not [op for op in _ancestors(setup) if op.type == "Assign"
                and op.inputs[1].shape.num_elements() > 1]
    types, allocated = _accumulation_nodes(traced[4])
    assert "AddV2" in types and not types & {"Fill", "Assign", "ZerosLike"}, types
    assert allocated <= 4 * (ROWS * WIDTH + WIDTH * OUT) * 1.01   # the released sum


def _ancestors(op):
    seen, stack = set(), [op]
    while stack:
        op = stack.pop()
        if op not in seen:
            seen.add(op)
            stack.extend([t.op for t in op.inputs] + list(op.control_inputs))
    return seen


def test_an_accumulators_stateless_ops_are_made_from_node_defs(monkeypatch):
    """Each accumulated variable gets an accumulator of about 11 ops; through TF's op
    wrappers (and ``tf.zeros``' constants) the 200 of a 12-layer encoder took 1.3 s of
    the rewrite, the largest share of gradient accumulation's session creation
    (issue 41). Every one is made from a NodeDef now: the buffer, its assignments,
    switches, sum and merge."""
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
    assert wrapped == [], wrapped
