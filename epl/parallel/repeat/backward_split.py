"""B and W: each stage's backward split for schedules that run them apart (ZeroBubble).

Only the stages where the schedule runs some W apart from its B are split
(``epl.strategies.schedule.split_stages``); where every W directly follows its B the
stage's backward runs fused, as PreferBackward's, which frees each layer's output
gradient and activations as soon as both of its gradients are done, where a split
keeps those W reads alive until B ends.

``tf.gradients`` already builds a layer's input gradient (``dx = dy . W^T``) and its
weight gradient (``dW = x^T . dy``) as separate ops. A stage's backward ops that the
previous stage's backward waits for, and everything they need, are its B part; the
rest (weight gradients and what only they need) is its W part, which nothing outside
the stage waits for, so a schedule may run it later, in a bubble. Both lowerings of
the repetition ask :func:`weight_ops` once and file an op under (stage, "W") instead of
(stage, "B") when it is there; the schedule lowering then orders B and W actions like
any others.

``Optimizer.compute_gradients`` gates each op's gradients (``gate_gradients=GATE_OP``):
an Identity forwards ``dx`` (and another ``dW``) only after a NoOp that waits for ``dx``
and ``dW`` alike. For ``dx`` that would make every B wait for its W (and deadlock a
schedule that runs W later), so :func:`ungate` takes the control input away from the
gate Identities in B parts only. The gates of the weight gradients stay, and they are
what the gates are for: a ref variable's read aliases its buffer, so ``dx = dy . W^T``
must finish before W's update, which waits only for W's own (gated) gradient.
"""
from epl import tf_adapter
from epl.ir.phase import Phase
from epl.parallel.repeat.gates import gradient_gates

WEIGHT = "W"


def _user_backward_ops(ctx):
    """{op: stage} of the user's backward ops (copy 0, micro-batch 0), creation order."""
    found = {}
    for op in ctx.tf_graph.get_operations():
        info = ctx.view.info(op)
        if info is not None and info.phase == Phase.BACKWARD and not info.copy \
                and not info.micro_batch and info.origin is None and info.taskgraph is not None:
            found[op] = info.taskgraph
    return found


def ungate(ctx, weights, stages):
    """Drop the control input of the gradient gates' Identities of ``stages`` that are
    not in ``weights`` (see above): a B part then never waits for its W part. The
    gates of stages whose backward runs fused stay as PreferBackward has them."""
    stage_of = dict((op.name, stage) for op, stage in _user_backward_ops(ctx).items())
    gates = gradient_gates(list(_user_backward_ops(ctx)))
    if gates is None:
        return
    graph = ctx.tf_graph
    for name in gates.forwarded:
        if name not in weights and stage_of.get(name) in stages:
            tf_adapter.remove_control_inputs(graph.get_operation_by_name(name))


def weight_ops(ctx, stages):
    """Names of the user's backward ops in the W parts of ``stages`` (the stages whose
    backward the schedule runs split, ``epl.strategies.schedule.split_stages``): those
    that no backward op of another stage needs, directly or through ops of their own
    stage (a gradient gate's wait for its NoOp does not count: :func:`ungate` drops it
    where it would). The other stages' backward runs fused, all of it B."""
    stage_of = _user_backward_ops(ctx)
    gates = gradient_gates(list(stage_of))
    gated = gates.forwarded if gates is not None else {}
    needed, stack = set(), []
    for op, stage in stage_of.items():
        readers = [c for t in op.outputs for c in t.consumers()]
        readers += tf_adapter.control_outputs(op)
        if any(stage_of.get(reader, stage) != stage for reader in readers):
            stack.append(op)
    while stack:
        op = stack.pop()
        if op in needed:
            continue
        needed.add(op)
        stage = stage_of[op]
        controls = [] if op.name in gated else list(op.control_inputs)
        for producer in [t.op for t in op.inputs] + controls:
            if stage_of.get(producer) == stage:
                stack.append(producer)
    _reductions_into_b(stage_of, needed, gated)
    return frozenset(op.name for op, stage in stage_of.items()
                     if op not in needed and stage in stages)


# Op types that reduce their first input (a sum over rows, a mean, ...).
_REDUCTIONS = frozenset(["BiasAddGrad", "BiasAddGradV1", "Sum", "Mean", "Max", "Min", "Prod"])


def _reductions_into_b(stage_of, needed, gated):
    """Add to ``needed`` (the B parts) the W reductions of what B computed: ops of a
    reducing type whose first input comes from B and whose other inputs from B or
    from outside the backward (a bias's ``BiasAddGrad``, a layer norm offset's ``Sum``).

    Why: such an op reads an output gradient ``dy`` that B has just written. Run in B,
    it reads ``dy`` while it is still in the core's cache; run in W, after the
    stage's other actions, it reads it back from memory: on the dense stacks of
    ``benchmarks/pipeline.py`` (2048 x 256 rows), ``BiasAddGrad`` took 0.28 ms in W
    against 0.14 ms in a fused backward, about 1 ms per micro-batch of a split
    8-layer stage (docs/pipeline_schedules.md, speed). B grows by the hot reduction,
    W shrinks by the cold one and keeps the large work (``x^T . dy``, which reads the
    forward's activations); what B hands over grows by the reduced result, which is
    small. Gate Identities stay where they are: their order guards a weight's update.
    """
    for op, stage in stage_of.items():  # creation order: producers first
        if (op in needed or op.type not in _REDUCTIONS or op.name in gated
                or op.control_inputs or op.inputs[0].op not in needed):
            continue
        if all(t.op in needed or t.op not in stage_of for t in op.inputs):
            needed.add(op)


def kind_of(kind, name, weights):
    """The action kind of an op filed under ``kind`` ("F" or "B") whose user op is
    ``name``: "W" when it belongs to a W part."""
    return WEIGHT if kind == "B" and name in weights else kind
