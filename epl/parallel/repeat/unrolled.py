"""Unrolled copies: one clone of every forward and backward op per micro-batch and copy.

The lowering EPL started with, and the original library's: the graph holds the
step once per (copy, micro-batch), which makes the graph, the rewrite and
TensorFlow's start-up grow with the micro-batches and the local replicas. Kept
for ``pipeline.micro_batching: unrolled`` and for graphs the plan says stage
functions cannot hold (the plan print names why). Also what runs where nothing
repeats on this worker (one copy, one micro-batch): then it clones nothing.

An action of the schedule is (stage, "F" | "B", micro_batch); its ops are found
from the IR's op table, and its boundaries from the tensors that cross actions
(see :meth:`UnrolledCopies.boundaries`).
"""
from epl import tf_adapter
from epl.ir.phase import Phase
from epl.ir.traverse import ancestor_ops, control_flow_interior
from epl.parallel.repeat.backward_split import kind_of
from epl.parallel.repeat.copies import clone_copies, clone_micro_batches, order_shared_writes
from epl.parallel.repeat.record import Repetition
from epl.parallel.repeat.step_ops import constant_expressions, micro_batch_candidates
from epl.tf_adapter import tf

_KINDS = {Phase.FORWARD: "F", Phase.BACKWARD: "B"}


class UnrolledCopies(Repetition):
    """Micro-batch m > 0 is a clone of every step op of micro-batch 0, except the
    constant expressions, which every micro-batch shares; copies clone it all."""

    def __init__(self, copies, micro_batches, split_backward=frozenset()):
        super(UnrolledCopies, self).__init__(copies, micro_batches, split_backward)
        self._interior = None  # control_flow_interior of the graph, once per schedule

    def build(self, ctx):
        self.weight_parts(ctx)  # before the clones: they copy the user's gates
        candidates = micro_batch_candidates(ctx) if self.micro_batches > 1 else []
        self.shared = constant_expressions(candidates, ctx.view.specialized)
        sources = [op for op in candidates if op.name not in self.shared]
        clone_micro_batches(ctx, self, sources)
        clone_copies(ctx, self)
        order_shared_writes(ctx, self, sources)

    def boundaries(self, ctx, copy):
        """Entrances and exits of each action of ``copy`` from crossing tensors.

        Entrance ops read a tensor produced outside their action (another stage, the
        other phase, another micro-batch's shared state, or the input pipeline); exit
        ops produce a tensor read outside it (the next stage, the backward pass, or
        gradient aggregation). Ops inside while loops (except Enter/Exit) and inside
        cond branches (as exits) are left out: control edges into a loop frame are
        invalid and an untaken branch would kill the barrier.

        One walk over the inputs of the step's ops (and of EPL's and the apply phase's
        ops, which read gradients) finds both sides of every crossing; asking each op
        for its consumers instead costs a C call per tensor. An op that reads from
        another action is an entrance only if nothing of its own action that already
        waits for the barrier feeds it: such an op waits through that input. Walking in
        creation order (a topological order of data edges) finds those; on a BERT-base
        pipeline this keeps the barriers' edges to the few ops where an action starts
        instead of every backward op reading a forward activation (thousands of edges
        TensorFlow's optimizer walks at session start).
        """
        if self._interior is None:  # barriers between copies change no loop or branch
            self._interior = control_flow_interior(ctx.tf_graph)
        no_entrance, no_exit = self._interior
        keys = self._action_keys(ctx, copy)
        entrances, leaving, waiting = {}, set(), set()
        for op, key in sorted(keys.values(), key=lambda item: tf_adapter.op_id(item[0])):
            crosses, fed = False, False
            for tensor in op.inputs:
                producer = tensor.op
                other = _key_of(keys, producer)
                if other != key:
                    if other is not None:
                        leaving.add(id(producer))
                    crosses = crosses or not self._free(producer)
                elif id(producer) in waiting:
                    fed = True
            fed = fed or any(id(c) in waiting and _key_of(keys, c) == key
                             for c in op.control_inputs)
            if fed:
                waiting.add(id(op))
            elif crosses and op.name not in no_entrance:
                entrances.setdefault(key, []).append(op)
                waiting.add(id(op))
        for op in _readers_outside_actions(ctx):
            leaving.update(id(t.op) for t in op.inputs)
        exits = {}
        for op, key in keys.values():
            if id(op) in leaving and op.name not in no_exit:
                exits.setdefault(key, []).append(op)
        return entrances, exits

    def _action_keys(self, ctx, copy):
        """{id(op): (op, action key)} for the ops a step of ``copy`` runs."""
        roots = []
        for call in ctx.view.apply_calls:
            for grad, _ in call.grads_and_vars:
                tensors = [grad.values, grad.indices] if isinstance(grad, tf.IndexedSlices) \
                    else [grad]
                for tensor in tensors:
                    roots += [self.tensor(tensor, copy, m).op
                              for m in range(self.micro_batches)]
        keys, weights = {}, self.weight_parts(ctx)
        for op in ancestor_ops(roots):
            info = ctx.view.info(op)
            if info is not None and info.copy == copy and info.phase in _KINDS \
                    and not self._free(op):
                kind = kind_of(_KINDS[info.phase], info.origin or op.name, weights)
                keys[id(op)] = (op, (info.taskgraph, kind, info.micro_batch))
        return keys

    def _free(self, op):
        """Constants and the constant expressions micro-batches share belong to no
        action: reading one orders nothing (counting their readers as entrances would
        put a control edge on a quarter of the model's ops)."""
        return (op.type == "Const" and not op.control_inputs) or op.name in self.shared


def _key_of(keys, op):
    entry = keys.get(id(op))
    return None if entry is None else entry[1]


def _readers_outside_actions(ctx):
    """EPL's ops (gradient sums, collectives) and apply ops: what they read leaves
    its action."""
    graph = ctx.tf_graph
    for name, info in list(ctx.view.op_info.items()):
        if info.phase in (Phase.EPL, Phase.APPLY):
            yield graph.get_operation_by_name(name)
