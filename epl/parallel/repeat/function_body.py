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
    # body.inputs: tensors to pass, in order (then the arrays, then the accumulators);
    # results: body.results() (outputs, the arrays' flows, sums)
"""
from epl import tf_adapter, tf_functions


class FunctionBody(object):
    """The body of a function made of ``ops``.

    Args:
      ops: the ops of the body, in a topological order (creation order is one).
      outputs: tensors produced by ``ops`` that the function returns.
      accumulate: tensors produced by ``ops``; for each one the function takes one
        more argument ``acc`` (any shape that broadcasts) and returns ``acc +
        tensor`` after ``outputs`` (the ``first`` variant returns ``tensor``).
      writes: ``[(tensor, slot)]``, tensors produced by ``ops`` that the body writes
        into slot ``slot`` of a TensorArray of their dtype (see *Saved tensors*).
      reads: ``[(tensor, slot)]``, tensors produced outside ``ops`` that the body
        reads from slot ``slot`` of the TensorArray of their dtype instead of
        taking them as arguments.
      sum_only: names of ``accumulate`` tensors that are also ``outputs`` but that
        only the first call needs to return (a gradient whose only other reader is
        its update, which reads the sum): returning it from the summing calls too
        would keep it alive beside its sum and stop the add from reusing its buffer.

    Saved tensors: a function never updates its arguments in place (the caller
    and the call frame hold them until the call ends), so a backward that took
    the forward's activations as arguments would keep every one of them until
    its last op and allocate a fresh buffer where unrolled copies reuse the
    activation's. Written into a TensorArray that clears a slot when it is read,
    each activation has one owner in the backward, released after its last use.
    For each dtype (``arrays``) the body takes two more arguments, the array's
    handle and flow, and a writing body returns the flow after its writes.

    Attributes:
      inputs: tensors produced outside ``ops`` that the body reads, in argument order
        (array and accumulator arguments come after them).
      arrays: the dtypes of the TensorArrays the body writes or reads, in order.
      flows: the dtypes of the arrays it writes: their flows are results after
        ``outputs`` (before the sums).
      outside_controls: ops outside ``ops`` that some op of the body waits for.
    """

    def __init__(self, ops, outputs=(), accumulate=(), writes=(), reads=(), sum_only=()):
        self.ops = list(ops)
        self.outputs = list(outputs)
        self.accumulate = list(accumulate)
        summed = set(t.name for t in self.accumulate)
        self.sum_only = set(name for name in sum_only if name in summed)
        self.writes, self.reads = list(writes), list(reads)
        self.arrays = sorted(set(t.dtype.base_dtype for t, _ in self.writes + self.reads),
                             key=lambda dtype: dtype.as_datatype_enum)
        written = set(t.dtype.base_dtype for t, _ in self.writes)
        self.flows = [dtype for dtype in self.arrays if dtype in written]
        names = set(op.name for op in self.ops)
        read = set(t.name for t, _ in self.reads)
        self.inputs, self.outside_controls = [], []
        seen_inputs, seen_controls = set(), set()
        for op in self.ops:
            for tensor in op.inputs:
                if tensor.name in read:
                    continue
                if tensor.op.name not in names and tensor.name not in seen_inputs:
                    seen_inputs.add(tensor.name)
                    self.inputs.append(tensor)
            for control in op.control_inputs:
                if control.name not in names and control.name not in seen_controls:
                    seen_controls.add(control.name)
                    self.outside_controls.append(control)
        self._names = names

    def results(self, first=False):
        """What the calls' results are, in order: ("out", tensor), ("flow", dtype) and
        ("sum", tensor); ``first``: of the variant for the first call (see
        :func:`first_call_variant`), which returns the sum-only outputs last."""
        layout = [("out", t) for t in self.outputs if t.name not in self.sum_only]
        layout += [("flow", dtype) for dtype in self.flows]
        layout += [("sum", t) for t in self.accumulate]
        if first:
            layout += [("out", t) for t in self.outputs if t.name in self.sum_only]
        return layout

    def returned_sums(self):
        """Indices in ``accumulate`` of the sum-only outputs (first variant's extras)."""
        index = dict((t.name, i) for i, t in enumerate(self.accumulate))
        return [index[t.name] for t in self.outputs if t.name in self.sum_only]

    def function_def(self, name):
        """The FunctionDef (named ``name``); :func:`first_call_variant` derives
        the variant without accumulators from it."""
        fdef = tf_functions.new_function_def(name)
        refs = {}
        for index, tensor in enumerate(self.inputs):
            _check_argument(tensor)
            _arg(fdef.signature.input_arg.add(), "in%d" % index, tensor.dtype)
            refs[tensor.name] = "in%d" % index
        arrays = _array_args(fdef, self.arrays)
        for tensor, slot in self.reads:
            refs[tensor.name] = _read_node(fdef, tensor, slot, arrays)
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
        for index, tensor in enumerate(t for t in self.outputs if t.name not in self.sum_only):
            _arg(fdef.signature.output_arg.add(), "out%d" % index, tensor.dtype)
            fdef.ret["out%d" % index] = refs[tensor.name]
        _write_nodes(fdef, [(refs[t.name], t, slot) for t, slot in self.writes], arrays)
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
        fdef.signature.is_stateful = stateful or bool(self.arrays)
        return fdef


def _array_args(fdef, dtypes):
    """Handle and flow arguments of one TensorArray per dtype: {dtype: (handle, flow)}."""
    arrays = {}
    for index, dtype in enumerate(dtypes):
        handle, flow = fdef.signature.input_arg.add(), fdef.signature.input_arg.add()
        handle.name, handle.type = "array%d" % index, _RESOURCE
        flow.name, flow.type = "flow%d" % index, _FLOAT
        arrays[dtype] = (handle.name, flow.name)
    return arrays


def _read_node(fdef, tensor, slot, arrays):
    """A TensorArrayReadV3 of ``tensor`` from its slot; returns its output's ref. The
    node carries the tensor's static shape (``_output_shapes``) and name for whoever
    rebuilds the body as a graph (the profiler: TF infers no shape through it)."""
    handle, flow = arrays[tensor.dtype.base_dtype]
    name = "EPL_SAVED_READ_%d_%d" % (tensor.dtype.base_dtype.as_datatype_enum, slot)
    node = fdef.node_def.add()
    node.name, node.op = name, "TensorArrayReadV3"
    node.input.extend([handle, _index_node(fdef, name, slot), flow])
    node.attr["dtype"].type = tensor.dtype.base_dtype.as_datatype_enum
    node.attr["_output_shapes"].list.shape.add().CopyFrom(tensor.shape.as_proto())
    node.attr[tf_functions.SAVED_TENSOR_ATTR].s = tensor.name.encode()
    return "%s:value:0" % name


def _write_nodes(fdef, writes, arrays):
    """One TensorArrayWriteV3 per (ref, tensor, slot); returns, per array, a flow that
    waits for all its writes (``flow_out%d`` results after the outputs)."""
    waits = dict((dtype, []) for dtype in arrays)
    for ref, tensor, slot in writes:
        dtype = tensor.dtype.base_dtype
        handle, flow = arrays[dtype]
        name = "EPL_SAVED_WRITE_%d_%d" % (dtype.as_datatype_enum, slot)
        node = fdef.node_def.add()
        node.name, node.op = name, "TensorArrayWriteV3"
        node.input.extend([handle, _index_node(fdef, name, slot), ref, flow])
        node.attr["T"].type = dtype.as_datatype_enum
        waits[dtype].append(name)
    for index, dtype in enumerate(arrays):  # the arguments' order
        if not waits[dtype]:
            continue
        node = fdef.node_def.add()
        node.name, node.op = "EPL_SAVED_FLOW_%d" % index, "Identity"
        node.input.append(arrays[dtype][1])
        node.input.extend("^" + name for name in waits[dtype])
        node.attr["T"].type = _FLOAT
        out = fdef.signature.output_arg.add()
        out.name, out.type = "flow_out%d" % index, _FLOAT
        fdef.ret[out.name] = "%s:output:0" % node.name


def _index_node(fdef, name, slot):
    node = fdef.node_def.add()
    node.name, node.op = name + "/index", "Const"
    node.attr["dtype"].type = _INT32
    node.attr["value"].tensor.dtype = _INT32
    node.attr["value"].tensor.int_val.append(slot)
    return "%s:output:0" % node.name


def first_call_variant(fdef, name, returned_sums=()):
    """A copy of ``fdef`` (a :meth:`FunctionBody.function_def` with accumulators)
    for the first call of the running sums, named ``name``: it takes no
    accumulator arguments and returns each accumulated tensor itself, so the first
    micro-batch does not pay a full-size add to zero per gradient (one add per
    dense gradient and step); after the sums it also returns the accumulated
    tensors of the indices ``returned_sums`` (sum-only outputs, which the first
    call's readers need). Derived from the built proto rather than by walking the
    graph's ops again: a backward body holds thousands of nodes."""
    first = tf_functions.new_function_def(name)
    first.CopyFrom(fdef)
    first.signature.name = name
    adds = {}
    for key in list(first.ret):
        if key.startswith(_SUM):
            adds[first.ret[key].split(":")[0]] = key
    accumulators = set()
    types = dict((arg.name, arg.type) for arg in first.signature.output_arg)
    for node in first.node_def:
        if node.name in adds:
            accumulators.add(node.input[0])
            first.ret[adds[node.name]] = node.input[1]
    for index in returned_sums:
        out = first.signature.output_arg.add()
        out.name, out.type = "first_out%d" % index, types["%s%d" % (_SUM, index)]
        first.ret[out.name] = first.ret["%s%d" % (_SUM, index)]
    _keep(first.node_def, lambda node: node.name not in adds)
    _keep(first.signature.input_arg, lambda arg: arg.name not in accumulators)
    return first


_SUM = "sum"
_RESOURCE, _FLOAT, _INT32 = 20, 1, 3  # DataType enums: DT_RESOURCE, DT_FLOAT, DT_INT32


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
