"""Gradient gates, which copies of the backward pass do without.

``Optimizer.compute_gradients`` gates each op's input gradients
(``gate_gradients=GATE_OP``): a NoOp ``tuple/group_deps`` waits for all of them
and an Identity per gradient (``tuple/control_dependency``) forwards its value
after that NoOp. They are a quarter of a backward pass's ops; in each of the
micro-batch and replica copies EPL makes, they cost the rewrite and TensorFlow's
graph optimization time at session start (seconds on a pipelined BERT-base)
and are removed by grappler before the graph runs anyway.

What the gate guarantees must survive: a ref variable's read aliases the
variable's buffer, so an op computing the gradient of its input from a weight
must finish before that weight's update, which waits only for the weight's
own gradient. So a copy keeps the ordering without the ops: whoever consumes a
forwarded gradient waits for the ops the gate waited for (its *members*), and
so do EPL's gradient sums (``Repetition.waits``, :mod:`epl.parallel.repeat.record`).
"""
import re

from epl import tf_adapter
from epl.ir.traverse import unique_ops

_GATE_NAME = re.compile(r"(^|/)tuple(_\d+)?/group_deps$")


class GradientGates(object):
    """The gates among a set of ops: forwarded Identities and dropped NoOps.

    Attributes:
      forwarded: {Identity name: the tensor it forwards}.
      dropped: names of the gate NoOps whose consumers among the ops are all
        forwarded.
    """

    def __init__(self, ops):
        names = set(op.name for op in ops)
        self.forwarded = {}
        self._gate = {}  # Identity name -> its gate NoOp
        for op in ops:
            gate = _gate_of(op)
            if gate is not None and gate.name in names:
                self.forwarded[op.name] = op.inputs[0]
                self._gate[op.name] = gate
        gate_ops = dict((gate.name, gate) for gate in self._gate.values())
        self.dropped = set(  # no consumer left in a copy
            name for name, gate in gate_ops.items()
            if all(c.name in self.forwarded or c.name not in names
                   for c in tf_adapter.control_outputs(gate)))
        self._waits = {}

    def skipped(self, name):
        return name in self.forwarded or name in self.dropped

    def source(self, tensor):
        """The tensor a copy reads instead of ``tensor`` (itself unless forwarded)."""
        while tensor.op.name in self.forwarded:
            tensor = self.forwarded[tensor.op.name]
        return tensor

    def waits(self, name):
        """The ops a consumer of forwarded Identity ``name`` waits for instead of it:
        its gate's members (resolved through forwarded members) and, along a chain
        of forwards, theirs."""
        if name not in self._waits:
            self._waits[name] = []  # a guard; chains of forwards are acyclic
            found = []
            for member in self._gate[name].control_inputs:
                found.extend(self.resolve_control(member))
            upstream = self.forwarded[name].op.name
            if upstream in self.forwarded:
                found.extend(self.waits(upstream))
            self._waits[name] = unique_ops(found)
        return self._waits[name]

    def resolve_control(self, op):
        """What a control input on ``op`` becomes in a copy."""
        if op.name not in self.forwarded:
            return [op]
        return unique_ops([self.source(op.outputs[0]).op] + self.waits(op.name))


def gradient_gates(ops):
    """The :class:`GradientGates` of ``ops`` (None when there are none)."""
    gates = GradientGates(ops)
    return gates if gates.forwarded else None


def _gate_of(op):
    """The gate NoOp of a gradient-gate Identity, else None."""
    if op.type != "Identity" or len(op.inputs) != 1 or len(op.control_inputs) != 1:
        return None
    gate = op.control_inputs[0]
    if gate.type == "NoOp" and _GATE_NAME.search(gate.name):
        return gate
    return None
