"""Gradient accumulation: apply once every ``m`` session runs.

One TaskGraph with ``pipeline.num_micro_batch = m > 1``: each run adds this
run's gradient to an accumulator variable; every m-th run the accumulated sum
is released through a Switch (so on the other runs everything downstream,
the all-reduce and the update included, is dead and does not run) and the
accumulator is reset. The graph does not grow with m, unlike cloning the
model per micro-batch.

Sparse gradients (IndexedSlices) accumulate into a dense buffer of the
variable's shape plus a per-row count of how often a row was touched; the
release is again an IndexedSlices over the touched rows, so a sparse optimizer
update (momentum, Adagrad) changes exactly the rows that serial training on
the whole global batch would change. Accumulation runs add in place (a dense
gradient: one pass over it; a sparse one: its rows only); a release run makes the
released sum (and resets a sparse buffer); see docs/pipeline.md.

A dense buffer is never initialized or reset: the first run of each window
assigns its gradient (copied into the buffer, as ``AssignAdd`` adds into it), the
other runs add. Zeroing 440 MB of buffers on BERT-base cost the set-up run 1.2 s CPU
(TF's constant folding evaluates the zeros in the caller's thread before the run
makes them again), and each release run a pass of zeros (issue 41).
"""
import collections

from epl import tf_adapter
from epl.communicators.sparse import scatter_rows
from epl.ir.traverse import ancestors
from epl.tf_adapter import tf

Released = collections.namedtuple("Released", ["value", "store"])
SparseReleased = collections.namedtuple("SparseReleased", ["dense", "touched", "store"])
# release: True on every m-th run (the window's last); first: True on a window's first run
Gate = collections.namedtuple("Gate", ["release", "first"])


def accumulation_gate(host, steps, epl_variables, per_run_writes):
    """A counter on ``host`` bumped every run: a :data:`Gate` whose ``release`` is
    True every ``steps``-th run and ``first`` on the run after. The counter is EPL
    state, (re)initialized by the sync op (so a restore starts a window); its bump is
    appended to ``per_run_writes`` (it must not run in a step that the end of the
    input stops, or workers would disagree on the window)."""
    if steps < 2:
        raise ValueError("EPL internal error: gradient accumulation over %r runs" % (steps,))
    with tf.device(host), tf.name_scope("EPL_GA"):
        counter = tf.Variable(0, dtype=tf.int64, trainable=False, collections=[],
                              name="counter")
        epl_variables.append(counter)
        count = tf.assign_add(counter, 1)
        per_run_writes.append(count.op)
        phase = tf.floormod(count, steps)
        return Gate(tf.equal(phase, 0), tf.equal(phase, 1))


def _buffer(nodes, shape, dtype, name, epl_variables):
    acc = tf.Variable(nodes.zeros(shape, dtype), trainable=False, collections=[], name=name)
    epl_variables.append(acc)
    return acc


def _either(nodes, pred, *alive):
    """One op that runs whichever group of ops of ``alive`` is alive (exactly one is
    on each run): the store every run executes."""
    return nodes.merge([nodes.identity(pred, ops) for ops in alive]).op


def _released_then_reset(nodes, buffers, totals):
    """On release runs: the ``totals`` (each a fresh tensor read from its buffer), then
    the ``buffers`` reset to zeros once the totals are made (the reads forward the
    buffers' memory; the zeros too wait for the totals, so they are dead, not made, on
    accumulation runs). Assigned zeros, not the sum times 0: an overflowed micro-batch
    (AMP) leaves inf in the sum, and inf * 0 is NaN, which would poison later steps."""
    made = [t.op for t in totals]
    with tf.control_dependencies(made):
        return [tf.assign(acc, nodes.zeros(total.shape, total.dtype, made))
                for acc, total in zip(buffers, totals)]


def accumulate_dense(var, local, device, gate, shape=None):
    """(running sum released on apply runs, op storing the running sum). ``shape`` is
    this copy's shape of ``var`` when it differs from the user's (a shard's).

    A window's first run assigns ``local`` to the buffer, the next add it in place (one
    pass over the gradient each); the release run adds it to the buffer's value into
    the released sum. The buffer needs no initializer and no reset: none of the zeros
    that cost the set-up run a second on BERT-base. The select and copy that used to
    store the sum every run took about 40% of the CPU time of a gradient-accumulation
    step of BERT-base, and the ops made through TF's op wrappers 1.3 s of a 12-layer
    encoder's rewrite (issue 41): every op here is made from a NodeDef."""
    nodes = tf_adapter.NodeOps(device)
    with tf.device(device), tf.name_scope("EPL_GA"):
        acc = nodes.variable(var.shape if shape is None else shape, local.dtype,
                             "accumulator")
        keep, release = nodes.switch(local, gate.release)
        later, first = nodes.switch(keep, gate.first)
        started, added = nodes.assign(acc, first), nodes.assign_add(acc, later)
        total = nodes.add(nodes.switch(acc, gate.release)[1], release)  # read on release only
        return Released(total, _either(nodes, gate.release, [started.op], [added.op],
                                       [total.op]))


def accumulate_sparse(var, values, indices, device, gate, epl_variables):
    """Accumulate an IndexedSlices gradient of ``var``.

    Returns the dense sum and per-row touch counts, both released (alive) only
    on apply runs, and the op storing them. The rows are added in place on
    accumulation runs (``scatter_add`` touches only this run's rows); a release run
    adds them to a dense copy of the sum. Both sum duplicate indices, as the
    optimizers' own de-duplication does.
    """
    shape = tf_adapter.variable_shape(var.op)
    if not shape.is_fully_defined():
        raise ValueError("gradient accumulation of the sparse gradient of %s needs a fully "
                         "defined variable shape, got %s" % (var.op.name, shape))
    rows, pred = shape.as_list()[0], gate.release
    nodes = tf_adapter.NodeOps(device)
    with tf.device(device), tf.name_scope("EPL_GA"):
        acc = _buffer(nodes, shape, values.dtype, "sparse_accumulator", epl_variables)
        counts = _buffer(nodes, [rows], values.dtype, "touched_rows", epl_variables)
        ones = tf.ones_like(indices, values.dtype)
        keep_values, release_values = nodes.switch(values, pred)
        keep_indices, release_indices = nodes.switch(indices, pred)
        added = [tf.scatter_add(acc, keep_indices, keep_values),
                 tf.scatter_add(counts, keep_indices, nodes.switch(ones, pred)[0])]
        dense, once = scatter_rows(release_values, release_indices, shape)
        total = nodes.add(nodes.switch(acc.value(), pred)[1], dense)
        touched = nodes.add(nodes.switch(counts.value(), pred)[1], once)
        reset = _released_then_reset(nodes, [acc, counts], [total, touched])
        return SparseReleased(total, touched, _either(nodes, pred, [a.op for a in added],
                                                      [r.op for r in reset]))


def release_token(host, gate):
    """An op that is alive only on release runs: a control input from it makes
    any op dead (skipped) on the other runs."""
    with tf.device(host), tf.name_scope("EPL_GA"):
        return tf.identity(tf_adapter.switch(gate.release, gate.release)[1],
                           name="release").op


def _initializer_closure(tf_graph):
    """Names of variable initializers and everything they read: never gated, or
    ``global_variables_initializer`` would find them dead."""
    roots = []
    for key in (tf.GraphKeys.GLOBAL_VARIABLES, tf.GraphKeys.LOCAL_VARIABLES):
        roots += [v.initializer for v in tf_graph.get_collection(key)]
    return ancestors(roots)


def gate_apply_ops(view, token, skip=()):
    """Make every stateful op of the apply phase wait for ``token``.

    Dead gradients already stop the update kernels on accumulation runs, but an
    optimizer may also change state without reading the gradient: sparse Adam
    decays its moment slots with ``assign(m, m * beta1)`` before adding the
    gradient rows, and that op would run (and decay the slots) on every run.
    Initializers (and what they read) stay ungated; ``skip`` names ops that
    cannot take control inputs (inside while loops).
    """
    tf_graph = view.tf_graph
    keep = _initializer_closure(tf_graph)
    gated = 0
    for op in tf_graph.get_operations():
        info = view.info(op)
        if info is None or info.phase != "apply" or op.name in skip:
            continue
        if op.name in keep or (info.origin and info.origin in keep):
            continue
        if not tf_adapter.touches_state(op) or tf_adapter.is_variable_op(op):
            continue
        tf_adapter.add_control_inputs(op, [token])
        gated += 1
    return gated
