"""Rewrite the forward graph of one ``tf.gradients`` call so that painted ops run in float16.

Runs before TensorFlow builds the gradients, so the backward graph is derived
from the float16 ops. The forward *region* is every op on a data path from a
differentiated variable (``xs``) to a loss (``ys``), in the FORWARD phase,
outside while loops and conds. Ops are painted by :mod:`epl.runtime.amp_paint`;
each float16 op is a new op of the same type and attributes with ``T=half``:

* a float32 input from an activation gets one cast per (tensor, TaskGraph);
* a float32 input that only depends on weights and constants (a variable read)
  gets a cast of its own per consuming op, with control dependencies on that
  op's other inputs: the float16 copy of a weight is made just before its
  use and freed after it, never kept (no float16 variables exist);
* float32 consumers of a float16 result (outside the painted ops, FORWARD
  phase) are rewired to one cast back to float32 per (tensor, TaskGraph).

The original float32 ops stay in the graph without consumers, so they only run
if a tensor the user holds is fetched. Every new op is registered in the
TaskGraph of the op it serves (``view.building``), so pipelines and replicas
treat it like the user's own ops.
"""
import collections
import contextlib

from epl import tf_adapter
from epl.ir.phase import Phase
from epl.ir.traverse import CONTROL_FLOW_TYPES as _CONTROL_FLOW, control_flow_interior
from epl.runtime import amp_lists, graph_records
from epl.runtime.amp_paint import paint
from epl.tf_adapter import tf

HALF_SUFFIX = "_EPL_AMP_fp16"
CAST_SUFFIX = "_EPL_AMP_cast_fp16"
BACK_SUFFIX = "_EPL_AMP_cast_fp32"
RECAST_SUFFIX = "_EPL_AMP_recast_fp16"
_WEIGHT_SOURCES = frozenset(["Const", "VariableV2", "Variable", "VarHandleOp"])
_VARIABLE_READS = frozenset(["ReadVariableOp", "ResourceGather"])
_FED = frozenset(["Placeholder", "PlaceholderV2", "PlaceholderWithDefault"])

Conversion = collections.namedtuple("Conversion", ["converted", "kept", "weight_casts"])
Conversion.__doc__ = """What one conversion did: ``converted`` [(original op name, float16 op
name)], ``kept`` [(op name, reason)] for allow-listed ops left in float32,
``weight_casts`` the float16 casts of weights made for one use each."""


def scope(view, taskgraph, phase):
    """Ops created inside belong to ``taskgraph`` and ``phase`` (unknown TaskGraph: the
    phase alone, and the IR assigns the TaskGraph as it does for the user's ops)."""
    if taskgraph is not None:
        return view.building(taskgraph, phase)
    if view.phase != phase:
        return view.phase_scope(phase)
    return contextlib.nullcontext()


@contextlib.contextmanager
def clean_context(tf_graph):
    """No name scope, device, colocation or control dependencies of the call site
    (``minimize`` under ``control_dependencies(UPDATE_OPS)`` must not reach new
    forward ops, or they would wait on ops that depend on them)."""
    with tf_graph.as_default(), tf_graph.name_scope(None), tf_graph.device(None), \
            tf_graph.colocate_with(None, ignore_existing=True), \
            tf_graph.control_dependencies(None):
        yield


def typed_indices(op, args, count):
    """Indices of ``op``'s inputs or outputs (``args`` of its OpDef, ``count`` of them)
    typed by the attribute ``T``, or None when the op has a ref or type-list argument."""
    indices, index = [], 0
    for arg in args:
        if arg.is_ref or arg.type_list_attr:
            return None
        size = op.get_attr(arg.number_attr) if arg.number_attr else 1
        if arg.type_attr == "T":
            indices.extend(range(index, index + size))
        index += size
    return indices if index == count else None


class ForwardConverter(object):
    """Converts the forward region of ``tf.gradients`` calls of one graph.

    ``created`` (a set shared by every call on the graph) collects the ops AMP made,
    so a second call never converts them again; ``device_kind`` ("CPU"/"GPU") is
    where ops without an explicit device will run.
    """

    def __init__(self, view, device_kind, created):
        self.view = view
        self.graph = view.tf_graph
        self.device_kind = device_kind
        self.created = created
        self._weights = {}
        self._interior = None

    # ---- which ops ------------------------------------------------------------
    def region(self, ys, xs):
        """Forward ops on a data path from ``xs`` to ``ys``, in creation order."""
        upstream, stack = set(), [y.op for y in ys]
        while stack:
            op = stack.pop()
            if op in upstream:
                continue
            upstream.add(op)
            stack.extend(t.op for t in op.inputs)
        found, stack = set(), [x.op for x in xs if getattr(x, "op", None) is not None]
        while stack:
            op = stack.pop()
            for tensor in op.outputs:
                for consumer in tensor.consumers():
                    if consumer in upstream and consumer not in found:
                        found.add(consumer)
                        stack.append(consumer)
        return sorted(found, key=tf_adapter.op_id)

    def kinds(self, region, protected):
        """({op: list kind or None}, [(allow-listed op name, why it stays float32)])."""
        kinds, kept = {}, []
        for op in region:
            kind = amp_lists.kind_of(op.type)
            if kind in (None, amp_lists.DENY):
                kinds[op] = kind
                continue
            reason = self._why_not(op, kind, protected)
            kinds[op] = kind if reason is None else None
            if reason is not None and kind == amp_lists.ALLOW:
                kept.append((op.name, reason))
        return kinds, kept

    def _why_not(self, op, kind, protected):
        info = self.view.info(op)
        if op.name in self.created:
            return "made by AMP"
        if info is None or info.phase != Phase.FORWARD or info.copy or info.micro_batch:
            return "not a forward op of the model"
        if op.type in _CONTROL_FLOW or op.name in self._control_flow_interior():
            return "inside a while loop or cond"
        if any(t in protected for t in op.outputs):
            return "its output is a loss or is differentiated against"
        if tf_adapter.touches_state(op):
            return "stateful"
        try:
            if op.get_attr("T") != tf.float32:
                return "not float32"
        except ValueError:
            return "no type attribute T"
        if self._typed_inputs(op) is None or self._typed_outputs(op) is None:
            return "unsupported signature"
        if not amp_lists.has_half_kernel(op.type, self._device_kind_of(op)):
            return "no float16 kernel on %s" % self._device_kind_of(op)
        if kind != amp_lists.ALLOW and all(self.weight_derived(op.inputs[i].op)
                                           for i in self._typed_inputs(op)):
            return "reads only weights"
        return None

    def _device_kind_of(self, op):
        device = op.device.upper()
        for kind in ("GPU", "CPU"):
            if ":%s:" % kind in device or device.endswith(kind):
                return kind
        return self.device_kind

    def _control_flow_interior(self):
        if self._interior is None:
            loop, branch = control_flow_interior(self.graph)
            self._interior = loop | branch
        return self._interior

    @staticmethod
    def _typed_inputs(op):
        return typed_indices(op, op.op_def.input_arg, len(op.inputs))

    @staticmethod
    def _typed_outputs(op):
        return typed_indices(op, op.op_def.output_arg, len(op.outputs))

    def weight_derived(self, op, depth=0):
        """True for ops computed from variables and constants only (a weight read,
        a transposed weight): their float16 casts are made per use, just in time."""
        known = self._weights.get(op)
        if known is not None:
            return known
        if op.type in _WEIGHT_SOURCES:
            result = True
        elif op.type in _FED or not op.inputs or depth > 32 or \
                (op.op_def.is_stateful and op.type not in _VARIABLE_READS):
            result = False  # placeholders, input pipelines, random ops
        else:
            result = all(self.weight_derived(t.op, depth + 1) for t in op.inputs)
        self._weights[op] = result
        return result

    # ---- rewriting ----------------------------------------------------------------
    def convert(self, ys, xs, protected):
        """Paint and rewrite the region between ``xs`` and ``ys``; returns a Conversion.

        ``protected`` tensors (losses, xs, grad_ys, stop_gradients) keep their
        producing op in float32 so that ``tf.gradients`` still finds them."""
        region = self.region(ys, xs)
        kinds, kept = self.kinds(region, protected)
        fanout = collections.defaultdict(list)
        for op in region:
            indices = self._typed_inputs(op) or []
            for index in indices:
                producer = op.inputs[index].op
                if producer in kinds:
                    fanout[producer].append(op)
        half = paint(kinds, fanout).half
        ordered = [op for op in region if op in half]
        rewrite = _Rewrite(self, half)
        with clean_context(self.graph):
            for op in ordered:
                rewrite.half_op(op)
            for op in ordered:
                rewrite.rewire_consumers(op)
        return Conversion(rewrite.converted, kept, rewrite.weight_casts)

    def recast_for_backward(self, conversion):
        """Gradient ops that read a forward weight cast (the gradient of ``x @ w``
        reads ``w``) get a cast of their own, made once their other inputs are
        ready: a float16 weight copy never lives from the forward pass to the
        backward pass."""
        with clean_context(self.graph):
            for cast in conversion.weight_casts:
                tensor = cast.outputs[0]
                for consumer in list(tensor.consumers()):
                    info = self.view.info(consumer)
                    if info is None or info.phase != Phase.BACKWARD:
                        continue
                    others = [t.op for t in consumer.inputs
                              if t is not tensor and not self.weight_derived(t.op)]
                    with scope(self.view, info.taskgraph, Phase.BACKWARD), \
                            self.graph.control_dependencies(others):
                        fresh = tf.cast(cast.inputs[0], tf.float16,
                                        name=consumer.name + RECAST_SUFFIX)
                    self.created.add(fresh.op.name)
                    if consumer.device:
                        tf_adapter.set_device(fresh.op, consumer.device)
                    for index, value in enumerate(consumer.inputs):
                        if value is tensor:
                            tf_adapter.update_input(consumer, index, fresh)


class _Rewrite(object):
    """The ops of one conversion: float16 twins, casts and casts back."""

    def __init__(self, converter, half):
        self.converter = converter
        self.view = converter.view
        self.graph = converter.graph
        self.half = half
        self.twins = {}          # float32 tensor -> float16 twin
        self.same = {}           # other output of a converted op -> the twin's output
        self.twin_ops = {}       # converted op -> its twin
        self.casts = {}          # (float32 tensor, taskgraph) -> shared float16 cast
        self.backs = {}          # (float16 twin, taskgraph) -> float32 cast back
        self.converted = []      # (original op name, twin op name)
        self.weight_casts = []   # casts of weights, one per consuming twin

    def _taskgraph(self, op):
        info = self.view.info(op)
        return info.taskgraph if info is not None else None

    def _made(self, op):
        self.converter.created.add(op.name)
        return op

    def half_op(self, op):
        """Create ``op``'s float16 twin and remember its float16 outputs."""
        taskgraph = self._taskgraph(op)
        inputs = list(op.inputs)
        typed = ForwardConverter._typed_inputs(op)
        weights = []
        with scope(self.view, taskgraph, Phase.FORWARD):
            for index, tensor in enumerate(inputs):
                if index not in typed:
                    inputs[index] = self.same.get(tensor, tensor)
                elif tensor in self.twins:
                    inputs[index] = self.twins[tensor]
                elif tensor.dtype.base_dtype == tf.float16:
                    continue
                elif self.converter.weight_derived(tensor.op):
                    weights.append(index)
                else:
                    inputs[index] = self._shared_cast(tensor, op, taskgraph)
            others = [inputs[i].op for i in range(len(inputs))
                      if i not in weights and not self.converter.weight_derived(inputs[i].op)]
            for index in weights:
                inputs[index] = self._weight_cast(inputs[index], op, others)
            twin = self._twin(op, inputs)
        typed_out = ForwardConverter._typed_outputs(op)
        for index, tensor in enumerate(op.outputs):
            table = self.twins if index in typed_out else self.same
            table[tensor] = twin.outputs[index]
        self.twin_ops[op] = twin
        self.converted.append((op.name, twin.name))
        graph_records.record_replacement(self.view, op, twin)

    def _twin(self, op, inputs):
        attrs = dict(op.node_def.attr)
        attrs["T"] = tf.AttrValue(type=tf.float16.as_datatype_enum)
        typed_out = set(ForwardConverter._typed_outputs(op))
        dtypes = [tf.float16 if i in typed_out else t.dtype for i, t in enumerate(op.outputs)]
        twin = self._made(self.graph.create_op(op.type, inputs, dtypes,
                                               name=op.name + HALF_SUFFIX, attrs=attrs))
        tf_adapter.add_control_inputs(twin, [self.twin_ops.get(c, c) for c in op.control_inputs])
        if op.device:
            tf_adapter.set_device(twin, op.device)
        return twin

    def _cast(self, tensor, dtype, name, device):
        cast = tf.cast(tensor, dtype, name=name)
        self._made(cast.op)
        if device:
            tf_adapter.set_device(cast.op, device)
        return cast

    def _shared_cast(self, tensor, consumer, taskgraph):
        key = (tensor, taskgraph)
        if key not in self.casts:
            self.casts[key] = self._cast(tensor, tf.float16, tensor.op.name + CAST_SUFFIX,
                                         consumer.device)
        return self.casts[key]

    def _weight_cast(self, tensor, consumer, others):
        """A weight's float16 copy for one consumer, made once its other inputs are ready."""
        with self.graph.control_dependencies(others):
            cast = self._cast(tensor, tf.float16, consumer.name + CAST_SUFFIX, consumer.device)
        self.weight_casts.append(cast.op)
        return cast

    def rewire_consumers(self, op):
        """Point the forward ops that read ``op`` and stay float32 at its twin: at a cast
        back of its float16 outputs, straight at its other outputs (batch norm's
        float32 statistics)."""
        for tensor in op.outputs:
            for consumer in list(tensor.consumers()):
                if consumer in self.half or consumer.name in self.converter.created:
                    continue
                info = self.view.info(consumer)
                if info is not None and info.phase != Phase.FORWARD:
                    continue
                if tensor in self.twins:
                    new = self._cast_back(self.twins[tensor], op, self._taskgraph(consumer),
                                          consumer)
                else:
                    new = self.same[tensor]
                for index, value in enumerate(consumer.inputs):
                    if value is tensor:
                        tf_adapter.update_input(consumer, index, new)

    def _cast_back(self, twin, producer, taskgraph, consumer):
        key = (twin, taskgraph)
        if key not in self.backs:
            with scope(self.view, taskgraph, Phase.FORWARD):
                self.backs[key] = self._cast(twin, tf.float32, producer.name + BACK_SUFFIX,
                                             consumer.device)
        return self.backs[key]
