"""Copy a set of ops into the same graph under a name prefix.

The copy is made with ``import_graph_def`` on the NodeDefs of the set, which
keeps gradients, while loops and conds intact, with fix-ups TensorFlow does
not do for us:

  * every ``Enter`` gets a prefixed ``frame_name``, otherwise two loops share a
    frame and TF refuses to run ("more than one LoopCond");
  * inputs and control inputs from outside the set are re-pointed explicitly
    (``input_map``, or the caller's replacement);
  * colocation with ops outside the set is dropped (devices are set explicitly),
    and resource-variable ``shared_name``s are prefixed so each copy owns its
    variable;
  * ops that must be built for their copy, such as a collective whose rank and
    group depend on the copy, are *specialized*: the import gets a placeholder of
    the op's output shape, and a builder makes the real op from the clone's
    inputs, so no collective is ever copied from copy 0 with stale attributes.

A :class:`Cloner` builds the GraphDef of its set once and imports it for every
prefix (micro-batches, copies), which is most of the rewrite's cost saved on
big models.
"""
from epl import tf_adapter
from epl.tf_adapter import tf

_ENTER_TYPES = ("Enter", "RefEnter")


class CloneResult(object):
    """Mapping from source op/tensor to its copy.

    A forwarded gate Identity (see :class:`Cloner`) has no copy of its own: its
    output maps to the copy of the tensor it forwards (``aliases``), as an op it
    maps to that tensor's producer, and ``gates`` lists the copies of the ops it
    waited for, which whoever consumes the alias must wait for instead.
    """

    def __init__(self, ops):
        self.ops = ops  # source op name -> new tf.Operation
        self.aliases = {}  # source op name -> new tf.Tensor
        self.gates = {}    # source op name -> [new tf.Operation]

    def op(self, source):
        return self.ops.get(source.name)

    def tensor(self, source):
        """Copy of a tensor if its producer was cloned, else None."""
        if source.op.name in self.aliases:
            return self.aliases[source.op.name]
        new_op = self.ops.get(source.op.name)
        return None if new_op is None else new_op.outputs[source.value_index]


class Cloner(object):
    """Clones one fixed set of ops, as often as needed.

    ``specialized`` maps the names of ops in the set that must be rebuilt per
    clone to ``(builder, inputs)``: ``builder(tag, inputs) -> op`` gets ``tag``
    (what the caller passed to :meth:`clone`: which copy, which micro-batch)
    and the clone's version of ``inputs`` (cloned where the producer is in the
    set, else the original or its replacement); the built op must have the
    source op's outputs.

    ``gates`` (optional :class:`epl.parallel.repeat.gates.GradientGates` of the set) are
    left out of the copies: a consumer of a forwarded Identity reads the copy of
    what it forwards and waits for the copies of the gate's members.
    """

    def __init__(self, tf_graph, ops, specialized=None, gates=None):
        self.tf_graph = tf_graph
        self.gates = gates
        self.ops = [op for op in ops if gates is None or not gates.skipped(op.name)]
        self.names = set(op.name for op in self.ops)
        self.specialized = dict(specialized or {})
        self._template = tf.GraphDef()
        self._template.versions.CopyFrom(tf_graph.graph_def_versions)
        self._outside = {}          # tensor ref -> source tensor (inputs from outside)
        self._control_edges = {}    # op name -> [outside control ops]
        self._nodes = {}            # op name -> NodeDef in the template
        self._placeholders = dict(
            (op.name, ["%s/EPL_SPECIALIZED_%d:0" % (op.name, t.value_index) for t in op.outputs])
            for op in self.ops if op.name in self.specialized)
        for op in self.ops:
            if op.name in self.specialized:
                self._add_placeholders(op)
            else:
                self._add_node(op)
        _add_functions(tf_graph, self._template)

    def _add_node(self, op):
        node = self._template.node.add()
        node.CopyFrom(op.node_def)
        tf_adapter.drop_outside_colocation(node, self.names)
        del node.input[:]
        controls = list(op.control_inputs)
        for tensor in op.inputs:
            if self.gates is not None and tensor.op.name in self.gates.forwarded:
                controls.extend(self.gates.waits(tensor.op.name))
                tensor = self.gates.source(tensor)
            ref = _tensor_ref(tensor)
            if tensor.op.name in self._placeholders:
                ref = self._placeholders[tensor.op.name][tensor.value_index]
            elif tensor.op.name not in self.names:
                self._outside[ref] = tensor
            node.input.append(ref)
        if self.gates is not None:
            controls = [c for control in controls for c in self.gates.resolve_control(control)]
        outside, seen = [], set()
        for control in controls:
            if control.name in seen:
                continue
            seen.add(control.name)
            if control.name in self.names and control.name not in self.specialized:
                node.input.append("^" + control.name)
            else:
                outside.append(control)
        if outside:
            self._control_edges[op.name] = outside
        self._nodes[op.name] = node

    def _add_placeholders(self, op):
        """One placeholder per output stands for a specialized op in the import."""
        for tensor, ref in zip(op.outputs, self._placeholders[op.name]):
            node = self._template.node.add()
            node.name = ref[:-len(":0")]
            node.op = "Placeholder"
            node.attr["dtype"].type = tensor.dtype.as_datatype_enum
            node.attr["shape"].shape.CopyFrom(tensor.shape.as_proto())

    def clone(self, prefix, replace=None, device_of=None, tag=None):
        """Import one copy under ``prefix``.

        Args:
          tag: handed to the builders of specialized ops.
          replace: optional {source tensor: tensor} for inputs from outside the
            set; other outside inputs are shared (the copy reads the original).
          device_of: optional function(source op) -> device string for the copy.
        """
        if not self.ops:
            return CloneResult({})
        replace = replace or {}
        self._prepare(prefix, device_of)
        input_map = dict((ref, replace.get(t, t)) for ref, t in self._outside.items())
        returned = [op.name for op in self.ops if op.name not in self.specialized]
        if self._template.library.function:
            with self.tf_graph.as_default(), tf.name_scope(None), tf.device(None):
                imported = tf.import_graph_def(self._template, input_map=input_map,
                                               return_elements=returned, name=prefix)
        else:
            imported = tf_adapter.import_nodes(self.tf_graph, self._template, input_map, prefix,
                                               returned)
        result = CloneResult(dict(zip(returned, imported)))
        self._build_specialized(result, prefix, replace, device_of, tag)
        for name, tensor in (self.gates.forwarded.items() if self.gates else ()):
            result.aliases[name] = _cloned(self.gates.source(tensor), result, replace)
            result.ops[name] = result.aliases[name].op
            result.gates[name] = [result.ops.get(m.name, m) for m in self.gates.waits(name)]
        for name, controls in self._control_edges.items():
            tf_adapter.add_control_inputs(
                result.ops[name], [result.ops.get(c.name, c) for c in controls])
        return result

    def _prepare(self, prefix, device_of):
        """Per-prefix fields of the template: frame names, shared names, devices."""
        for op in self.ops:
            node = self._nodes.get(op.name)
            if node is None:
                continue
            if node.op in _ENTER_TYPES:
                node.attr["frame_name"].s = ("%s/%s" % (
                    prefix, op.get_attr("frame_name").decode())).encode()
            if node.op == "VarHandleOp" and op.get_attr("shared_name"):
                node.attr["shared_name"].s = ("%s/%s" % (
                    prefix, op.get_attr("shared_name").decode())).encode()
            if device_of is not None:
                node.device = device_of(op)

    def _build_specialized(self, result, prefix, replace, device_of, tag):
        """Build each specialized op from the clone's inputs; rewire the placeholders'
        consumers to it. Specialized ops are built in set order, so one may read
        another's output."""
        for op in self.ops:
            if op.name not in self.specialized:
                continue
            builder, sources = self.specialized[op.name]
            waits = []
            if self.gates is not None:  # read what a gate forwards, after its members
                waits = [m for t in sources if t.op.name in self.gates.forwarded
                         for m in self.gates.waits(t.op.name)]
                sources = [self.gates.source(t) for t in sources]
            inputs = [_cloned(t, result, replace) for t in sources]
            with self.tf_graph.as_default(), tf.name_scope(None), tf.device(
                    device_of(op) if device_of is not None else op.device):
                new_op = builder(tag, inputs)
            tf_adapter.add_control_inputs(new_op, [result.ops.get(m.name, m) for m in waits])
            result.ops[op.name] = new_op
            for ref, new in zip(self._placeholders[op.name], new_op.outputs):
                placeholder = self.tf_graph.get_tensor_by_name("%s/%s" % (prefix, ref))
                for consumer in list(placeholder.consumers()):
                    for index, value in enumerate(consumer.inputs):
                        if value is placeholder:
                            tf_adapter.update_input(consumer, index, new)


def _cloned(tensor, result, replace):
    copy = result.tensor(tensor)
    if copy is not None:
        return copy
    return replace.get(tensor, tensor)


def _tensor_ref(tensor):
    return "%s:%d" % (tensor.op.name, tensor.value_index)


def _add_functions(tf_graph, graph_def):
    """Include the function library when a cloned node calls a function (the
    template's NodeDefs: asking each op for its NodeDef again costs a C call and a
    parse per op)."""
    functions = tf_adapter.function_names(tf_graph)
    if functions and any(node.op in functions or _has_func_attr(node)
                         for node in graph_def.node):
        graph_def.library.CopyFrom(tf_graph.as_graph_def().library)


def _has_func_attr(node):
    for value in node.attr.values():
        if value.HasField("func") or (value.HasField("list") and value.list.func):
            return True
    return False
