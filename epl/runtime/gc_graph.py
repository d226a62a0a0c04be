"""Graph structure for gradient checkpointing: the forward region, what may be
recomputed, segments, and copying ops for the backward pass.

Everything here is a plain function of ``tf.Operation``s; nothing is parsed
back from op names. The forward region of a ``tf.gradients(ys, xs)`` call is
the set of ops on a data path from an ``x`` to a ``y``: the ops whose
activations backprop may need. Ops outside it (the input pipeline, masks
computed from the data alone) never depend on the weights and are left alone.
"""

import collections
import heapq

from epl import tf_adapter
from epl.ir.phase import Phase
from epl.ir.traverse import CONTROL_FLOW_TYPES as _CONTROL_FLOW
from epl.tf_adapter import tf

_LOOP_ENTRY, _LOOP_EXIT = ("Enter", "RefEnter"), ("Exit", "RefExit")
_SWITCH, _MERGE = ("Switch", "RefSwitch"), ("Merge", "RefMerge")
# Function calls and functional control flow: their bodies are not ours to copy.
_CALLS = frozenset(["If", "StatelessIf", "While", "StatelessWhile", "PartitionedCall",
                    "StatefulPartitionedCall", "SymbolicGradient", "Case"])
_FLOAT_TYPES = frozenset([tf.float16, tf.bfloat16, tf.float32, tf.float64,
                          tf.complex64, tf.complex128])


def differentiable(tensor):
    """True for tensors a gradient can flow through (floating and complex)."""
    return tensor.dtype.base_dtype in _FLOAT_TYPES


def tensor_key(tensor):
    """A hashable identity of a graph tensor (its op and output index)."""
    return id(tensor.op), tensor.value_index


def by_creation(ops):
    """``ops`` in a topological order of their data and control edges among
    themselves, creation order breaking ties.

    Creation order alone is not enough: a rewrite made while the user builds the
    step (AMP's float16 ops and casts) creates producers after the consumers it
    rewires to them, and levels and copies need producers first."""
    ops = list(ops)
    members = dict((id(op), op) for op in ops)
    waiting, readers = {}, collections.defaultdict(list)
    for op in ops:
        producers = set(id(t.op) for t in op.inputs) | set(id(c) for c in op.control_inputs)
        producers = [key for key in producers if key in members and key != id(op)]
        waiting[id(op)] = len(producers)
        for key in producers:
            readers[key].append(op)
    ready = [(tf_adapter.op_id(op), op) for op in ops if not waiting[id(op)]]
    heapq.heapify(ready)
    ordered = []
    while ready:
        _, op = heapq.heappop(ready)
        ordered.append(op)
        for reader in readers[id(op)]:
            waiting[id(reader)] -= 1
            if not waiting[id(reader)]:
                heapq.heappush(ready, (tf_adapter.op_id(reader), reader))
    if len(ordered) != len(ops):   # a cycle (loops are kept whole): fall back
        return sorted(ops, key=tf_adapter.op_id)
    return ordered


def forward_region(ys, xs):
    """Ops on a data path from an ``x`` to a ``y`` (both ends' ops included when
    they lie on such a path), in creation order."""
    behind = set()
    stack = [y.op for y in ys]
    while stack:
        op = stack.pop()
        if id(op) in behind:
            continue
        behind.add(id(op))
        stack.extend(t.op for t in op.inputs)
    region, seen = [], set()
    stack = [c for x in xs for c in x.consumers()]
    while stack:
        op = stack.pop()
        if id(op) in seen or id(op) not in behind:
            continue
        seen.add(id(op))
        region.append(op)
        stack.extend(c for t in op.outputs for c in t.consumers())
    return by_creation(region)


def control_flow_interior(region):
    """ids of the region's ops inside a tf.while_loop or a tf.cond (their plumbing
    included), found structurally: what Enter reaches before Exit, what Switch
    reaches before Merge."""
    inside = set()
    stack = [op for op in region if op.type in _LOOP_ENTRY + _SWITCH]
    while stack:
        op = stack.pop()
        if id(op) in inside:
            continue
        inside.add(id(op))
        if op.type in _LOOP_EXIT + _MERGE:
            continue
        stack.extend(c for t in op.outputs for c in t.consumers())
    return inside


class Region(object):
    """The forward region of one ``tf.gradients`` call and what may be recomputed.

    ``recomputable`` ops are copied for the backward pass; the others are *kept*:
    their outputs stay alive and copies read them. Kept are ops that touch state
    (variable reads, random ops: dropout masks must be the very same), ops inside
    while loops and conds, function calls, ops whose outputs are handles or
    variants, EPL's specialized ops (collectives built per copy), ops that are not
    forward ops, and ops of TaskGraphs beyond ``last_taskgraph`` (when given).
    """

    def __init__(self, view, ys, xs, last_taskgraph=None):
        self.view = view
        self.ys = list(ys)
        self.xs = list(xs)
        self.last_taskgraph = last_taskgraph
        self.ops = forward_region(self.ys, self.xs)
        self.members = set(id(op) for op in self.ops)
        interior = control_flow_interior(self.ops)
        functions = tf_adapter.function_names(self.ys[0].graph) if self.ops else set()
        special = set(view.specialized)
        for record in view.specialized.values():
            special.update(record.helpers)
        self.recomputable = set(
            id(op) for op in self.ops
            if id(op) not in interior and self._may_recompute(op, functions, special))

    def __contains__(self, op):
        return id(op) in self.members

    def may_recompute(self, op):
        return id(op) in self.recomputable

    def selectable(self, op):
        """True for ops of the TaskGraphs gradient checkpointing applies to."""
        return self.last_taskgraph is None or (self.taskgraph(op) or 0) <= self.last_taskgraph

    def taskgraph(self, op):
        info = self.view.info(op)
        return None if info is None else info.taskgraph

    def _may_recompute(self, op, functions, special):
        info = self.view.info(op)
        if info is None or info.phase != Phase.FORWARD or op.name in special:
            return False
        if not self.selectable(op):
            return False
        if op.type in _CONTROL_FLOW or op.type in _CALLS or op.type in functions:
            return False
        if not op.inputs or tf_adapter.touches_state(op):
            return False
        return not any(t.dtype in (tf.resource, tf.variant) or tf_adapter.is_ref_dtype(t.dtype)
                       for t in list(op.outputs) + list(op.inputs))

    def consumers(self, op):
        """The region's ops that read an output of ``op``."""
        return [c for t in op.outputs for c in t.consumers() if id(c) in self.members]

    def boundary(self, op):
        """Outputs of a checkpoint op that the region reads and a gradient can
        flow through: what the backward pass takes as given."""
        return [t for t in op.outputs if differentiable(t)
                and any(id(c) in self.members for c in t.consumers())]


def static_bytes(tensor):
    """Bytes of a tensor from its static shape; unknown dimensions count as 1
    (only relative sizes matter for balancing)."""
    shape = tensor.shape
    if shape.ndims is None:
        return tensor.dtype.size
    count = 1
    for dim in shape.as_list():
        count *= dim if dim else 1
    return count * tensor.dtype.size


def levels(region, checkpoints):
    """{id(checkpoint op): level}: 1 + the highest level among the checkpoints it
    depends on (data paths inside the region). Checkpoints of one level never
    depend on each other, so the gradients of a level's outputs are complete once
    every higher level (and the ys) has been differentiated."""
    marks = set(id(op) for op in checkpoints)
    above = {}
    result = {}
    for op in region.ops:
        below = max([above.get(id(t.op), 0) for t in op.inputs] + [0])
        if id(op) in marks:
            result[id(op)] = below + 1
            above[id(op)] = below + 1
        else:
            above[id(op)] = below
    return result


def to_copy(region, roots, stops, copied):
    """Ops to recompute for one gradient call from ``roots``, creation order.

    Walks back from the roots through recomputable ops that are not checkpoints
    (``stops``, ids) and not copied yet (``copied``, ids). A root that is a
    checkpoint is copied only when something behind it is recomputed (otherwise
    its gradient reads stored tensors only and the original serves); other
    recomputable roots (the ys' ops) are always copied.
    """
    result, seen = [], set()
    for root in roots:
        if not region.may_recompute(root) or id(root) in copied:
            continue
        behind = _walk_recomputable(region, root, stops, copied, seen)
        if behind or id(root) not in stops or _reads_copies(root, copied):
            result.extend(behind)
            if id(root) not in seen:
                seen.add(id(root))
                result.append(root)
    return by_creation(result)


def _walk_recomputable(region, root, stops, copied, seen):
    found = []
    stack = [t.op for t in root.inputs]
    while stack:
        op = stack.pop()
        if id(op) in seen or id(op) in stops or id(op) in copied or \
                id(op) not in region.members or not region.may_recompute(op):
            continue
        seen.add(id(op))
        found.append(op)
        stack.extend(t.op for t in op.inputs)
    return found


def _reads_copies(op, copied):
    return any(id(t.op) in copied for t in op.inputs)


def reached(region, roots, stops):
    """(checkpoint ops, indices of xs) a gradient from ``roots`` reaches.

    The walk follows every op of the region (a gradient also flows through kept
    ops) and stops at checkpoints other than the roots themselves: those are the
    call's stop points, whose gradients it returns.
    """
    root_ids = set(id(op) for op in roots)
    hit, keys, seen = [], set(), set(root_ids)
    stack = list(roots)
    while stack:
        op = stack.pop()
        for tensor in op.inputs:
            keys.add(tensor_key(tensor))
            producer = tensor.op
            if id(producer) in seen:
                continue
            seen.add(id(producer))
            if id(producer) in stops:
                hit.append(producer)
            elif id(producer) in region.members:
                stack.append(producer)
    xs = [i for i, x in enumerate(region.xs) if tensor_key(x) in keys]
    return by_creation(hit), xs


def copy_ops(view, ops, prefix, copies):
    """Copy ``ops`` (creation order) into their graph under ``prefix``.

    Inputs read the copy of their op when ``copies`` ({id(original): copy}, updated
    in place) has one, else the original. Consecutive ops of one
    TaskGraph are imported together (``import_graph_def`` on their NodeDefs)
    inside ``view.gradient_of(op)``, so that EPL's IR gives each copy the
    TaskGraph of the op it copies (and the BACKWARD phase of the enclosing
    ``tf.gradients``). Colocation with ops outside the set is dropped; the
    NodeDef keeps the original's device. Returns the new copies, in order.
    """
    made = []
    for chunk in _chunks(view, ops):
        graph = chunk[0].graph
        names = set(op.name for op in chunk)
        graph_def = tf.GraphDef()
        graph_def.versions.CopyFrom(graph.graph_def_versions)
        input_map, controls = {}, []
        for op in chunk:
            node = graph_def.node.add()
            node.CopyFrom(op.node_def)
            tf_adapter.drop_outside_colocation(node, names)
            del node.input[:]
            for tensor in op.inputs:
                ref = "%s:%d" % (tensor.op.name, tensor.value_index)
                if tensor.op.name not in names:
                    earlier = copies.get(id(tensor.op))
                    input_map[ref] = tensor if earlier is None else \
                        earlier.outputs[tensor.value_index]
                node.input.append(ref)
            for control in op.control_inputs:
                if control.name in names:
                    node.input.append("^" + control.name)
                else:
                    controls.append((op, copies.get(id(control), control)))
        with view.gradient_of(chunk[0]):
            imported = tf_adapter.import_nodes(graph, graph_def, input_map, prefix,
                                               [op.name for op in chunk])
        for op, new in zip(chunk, imported):
            copies[id(op)] = new
            made.append(new)
        for op, control in controls:
            tf_adapter.add_control_inputs(copies[id(op)], [control])
    return made


def _chunks(view, ops):
    """Runs of consecutive ops that share a TaskGraph."""
    chunks, current, key = [], [], object()
    for op in ops:
        info = view.info(op)
        taskgraph = None if info is None else info.taskgraph
        if current and taskgraph != key:
            chunks.append(current)
            current = []
        current.append(op)
        key = taskgraph
    if current:
        chunks.append(current)
    return chunks
