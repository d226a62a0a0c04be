"""A TensorFlow function (FunctionDef) made of ops that already exist in a graph.

Pipelines call each stage's forward and backward once per micro-batch. Instead
of copying the stage's ops per micro-batch, EPL turns them into one function
and calls it per micro-batch, so the graph and TensorFlow's set-up work (graph
optimization, executor creation) stay the size of one micro-batch whatever
``pipeline.num_micro_batch`` is.

The body is built straight from the ops' NodeDefs: every input from outside the
set becomes an argument, the tensors the caller asks for become results, and
*accumulators* (``acc + value`` for a running sum over calls) can be added, so
that summing a gradient over micro-batches costs no op per micro-batch outside
the function. Control inputs from outside the set cannot live in a function:
they are returned, and the caller puts them on the call.

Example::

    body = FunctionBody(ops, outputs=[loss, activation], accumulate=[grad])
    fdef = body.function_def("stage1_F")
    first = first_call_variant(fdef, "stage1_F_first")  # no acc arguments
    # body.inputs: tensors to pass, in order (then the accumulators);
    # results: outputs then sums
"""
from epl import tf_adapter


class FunctionBody(object):
    """The body of a function made of ``ops``.

    Args:
      ops: the ops of the body, in a topological order (creation order is one).
      outputs: tensors produced by ``ops`` that the function returns.
      accumulate: tensors produced by ``ops``; for each one the function takes one
        more argument ``acc`` (any shape that broadcasts) and returns ``acc +
        tensor`` after ``outputs`` (the ``first`` variant returns ``tensor``).

    Attributes:
      inputs: tensors produced outside ``ops`` that the body reads, in argument order
        (accumulator arguments come after them).
      outside_controls: ops outside ``ops`` that some op of the body waits for.
    """

    def __init__(self, ops, outputs=(), accumulate=()):
        self.ops = list(ops)
        self.outputs = list(outputs)
        self.accumulate = list(accumulate)
        names = set(op.name for op in self.ops)
        self.inputs, self.outside_controls = [], []
        seen_inputs, seen_controls = set(), set()
        for op in self.ops:
            for tensor in op.inputs:
                if tensor.op.name not in names and tensor.name not in seen_inputs:
                    seen_inputs.add(tensor.name)
                    self.inputs.append(tensor)
            for control in op.control_inputs:
                if control.name not in names and control.name not in seen_controls:
                    seen_controls.add(control.name)
                    self.outside_controls.append(control)
        self._names = names

    @property
    def num_results(self):
        return len(self.outputs) + len(self.accumulate)

    def function_def(self, name):
        """The FunctionDef (named ``name``); :func:`first_call_variant` derives
        the variant without accumulators from it."""
        fdef = tf_adapter.new_function_def(name)
        refs = {}
        for index, tensor in enumerate(self.inputs):
            _check_argument(tensor)
            _arg(fdef.signature.input_arg.add(), "in%d" % index, tensor.dtype)
            refs[tensor.name] = "in%d" % index
        stateful = False
        nodes = []
        for op in self.ops:
            node_def = op.node_def
            for tensor, ref in zip(op.outputs, _output_refs(op, node_def)):
                refs[tensor.name] = ref
            nodes.append((op, node_def))
            stateful = stateful or bool(op.op_def.is_stateful)
        for op, node_def in nodes:
            node = fdef.node_def.add()
            node.CopyFrom(node_def)
            node.device = ""
            if "_class" in node.attr:  # colocation with ops outside the function
                del node.attr["_class"]
            del node.input[:]
            node.input.extend(refs[t.name] for t in op.inputs)
            node.input.extend("^" + c.name for c in op.control_inputs if c.name in self._names)
        for index, tensor in enumerate(self.outputs):
            _arg(fdef.signature.output_arg.add(), "out%d" % index, tensor.dtype)
            fdef.ret["out%d" % index] = refs[tensor.name]
        for index, tensor in enumerate(self.accumulate):
            arg = "acc%d" % index
            _arg(fdef.signature.input_arg.add(), arg, tensor.dtype)
            node = fdef.node_def.add()
            node.name = "EPL_ACCUMULATE_%d" % index
            node.op = "AddV2"
            node.attr["T"].type = tensor.dtype.base_dtype.as_datatype_enum
            node.input.extend([arg, refs[tensor.name]])
            _arg(fdef.signature.output_arg.add(), "%s%d" % (_SUM, index), tensor.dtype)
            fdef.ret["%s%d" % (_SUM, index)] = "%s:z:0" % node.name
        fdef.signature.is_stateful = stateful
        return fdef


def first_call_variant(fdef, name):
    """A copy of ``fdef`` (a :meth:`FunctionBody.function_def` with accumulators)
    for the first call of the running sums, named ``name``: it takes no
    accumulator arguments and returns each accumulated tensor itself, so the first
    micro-batch does not pay a full-size add to zero per gradient (one add per
    dense gradient and step). Derived from the built proto rather than by walking
    the graph's ops again: a backward body holds thousands of nodes."""
    first = tf_adapter.new_function_def(name)
    first.CopyFrom(fdef)
    first.signature.name = name
    adds = {}
    for key in list(first.ret):
        if key.startswith(_SUM):
            adds[first.ret[key].split(":")[0]] = key
    accumulators = set()
    for node in first.node_def:
        if node.name in adds:
            accumulators.add(node.input[0])
            first.ret[adds[node.name]] = node.input[1]
    _keep(first.node_def, lambda node: node.name not in adds)
    _keep(first.signature.input_arg, lambda arg: arg.name not in accumulators)
    return first


_SUM = "sum"


def _keep(repeated, wanted):
    """Keep the items of a repeated proto field for which ``wanted`` is true
    (deleted in place, last first: the items to drop are few and at the end)."""
    for index in reversed([i for i, item in enumerate(repeated) if not wanted(item)]):
        del repeated[index]


def _arg(arg, name, dtype):
    arg.name = name
    arg.type = dtype.base_dtype.as_datatype_enum


def _check_argument(tensor):
    if tf_adapter.is_ref_dtype(tensor.dtype):
        raise ValueError("EPL internal error: ref tensor %s cannot enter a function"
                         % tensor.name)


def _output_refs(op, node_def):
    """How a function body names each output of ``op``: ``op:arg_name:index``."""
    refs = []
    for arg in op.op_def.output_arg:
        if arg.number_attr:
            count = node_def.attr[arg.number_attr].i
        elif arg.type_list_attr:
            count = len(node_def.attr[arg.type_list_attr].list.type)
        else:
            count = 1
        refs.extend("%s:%s:%d" % (op.name, arg.name, i) for i in range(count))
    return refs
