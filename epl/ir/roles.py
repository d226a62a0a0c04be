"""Which user ops are cloned per replica and which stay shared.

Shared (never cloned, placed on the worker's host CPU):
  * the input pipeline: datasets, iterators, queues and everything feeding
    them; each clone of a get-next op pulls its own batch from the shared iterator;
  * placeholders (every replica sees the fed value);
  * the global step variable and the ops that read or bump it directly;
  * summaries (written once, from replica 0 or from merged tensors);
  * lookup tables (vocabulary feature columns, ``tf.lookup``): one table per
    worker on its host CPU, which every copy's lookups read (tables have CPU
    kernels only, and the user's table initializer fills the one table).
Everything else in the forward, backward and apply phases is cloned, including
variables: each replica owns a copy kept identical by the initial broadcast
and by identical updates.
"""
import collections

from epl import tf_adapter
from epl.ir.phase import Phase
from epl.ir.traverse import ancestors, unique_ops

GET_NEXT_TYPES = frozenset([
    "IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional",
    "QueueDequeue", "QueueDequeueV2", "QueueDequeueMany", "QueueDequeueManyV2",
    "QueueDequeueUpTo", "QueueDequeueUpToV2", "ReaderRead", "ReaderReadV2",
    "ReaderReadUpTo", "ReaderReadUpToV2"])
PLACEHOLDER_TYPES = frozenset(["Placeholder", "PlaceholderV2", "PlaceholderWithDefault"])
VARIABLE_TYPES = frozenset(["VariableV2", "Variable", "VarHandleOp"])
RESOURCE_VARIABLE_TYPES = frozenset(["VarHandleOp"])
TABLE_TYPES = frozenset([
    "HashTable", "HashTableV2", "MutableHashTable", "MutableHashTableV2",
    "MutableHashTableOfTensors", "MutableHashTableOfTensorsV2", "MutableDenseHashTable",
    "MutableDenseHashTableV2"])


def is_summary(op):
    return op.type.endswith("Summary") or op.type in ("MergeSummary", "WriteSummary")


def is_variable(op):
    return op.type in VARIABLE_TYPES


def input_pipeline_ops(tf_graph):
    """Names of ops that produce or drive the input pipeline (shared by replicas).

    Found from the graph's structure: the iterator/queue feeding each get-next
    op and everything upstream of it, plus every op producing a ``variant``
    (dataset) tensor and its ancestors, plus other users of iterator handles
    (MakeIterator and friends).
    """
    ops = tf_graph.get_operations()
    get_next = [op for op in ops if op.type in GET_NEXT_TYPES and op.inputs]
    roots = [op.inputs[0].op for op in get_next]
    roots += [op for op in ops if any(t.dtype == tf_adapter.tf.variant for t in op.outputs)]
    names = ancestors(roots)
    # the handles' readers, from the handles' consumers (not a second scan of every op's
    # inputs: each input's op name is a TF call)
    for handle in unique_ops(op.inputs[0].op for op in get_next):
        for output in handle.outputs:
            names.update(op.name for op in output.consumers() if op.type not in GET_NEXT_TYPES)
    return names


def global_step_ops(tf_graph):
    """The global step variable plus ops reading or updating it directly."""
    step = tf_adapter.global_step_tensor(tf_graph)
    if step is None:
        return set()
    var_op = step.op
    # its readers from its outputs' consumers (not every op's inputs: a TF call each)
    names = {var_op.name}
    names.update(op.name for output in var_op.outputs for op in output.consumers())
    for op in tf_graph.get_operations():
        if op.name not in names and tf_adapter.colocation_root(op) == var_op.name:
            names.add(op.name)
    return names


def _initializers(tf_graph):
    result = []
    for key in (tf_adapter.tf.GraphKeys.GLOBAL_VARIABLES, tf_adapter.tf.GraphKeys.LOCAL_VARIABLES):
        result += [v.initializer for v in tf_graph.get_collection(key)]
    return result


def step_roots(view):
    """Ops a training step needs: updates, gradients, losses and merged outputs."""
    roots = []
    for call in view.apply_calls:
        for grad, var in call:
            tensors = [grad.values, grad.indices] if hasattr(grad, "indices") else [grad]
            roots += [t.op for t in tensors]
    for call in view.gradient_calls:
        roots += [getattr(y, "op", y) for y in call.ys]
    for tensors in view.collections.values():
        roots += [t.op for t in tensors]
    return roots


Roles = collections.namedtuple("Roles", [
    "cloned", "shared", "variables", "global_step", "pinned", "step", "init_only"])
Roles.__doc__ = """Roles of the user's ops.

cloned: ordered list of tf.Operation copied per copy; shared: names never copied
(input pipeline, placeholders, global step, summaries); variables: cloned
variable ops; global_step: the step variable and its direct users; pinned:
cloned ops that stay on the host (the user placed them on a CPU, or they read a
lookup table); step: names of the
ops a training step runs (ancestors of gradients, losses and merged outputs);
init_only: names of ops that only compute variables' initial values (copies'
variables are initialized by EPL's broadcast, so these are never copied)."""


def initializers_of(tf_graph, names):
    """{variable op name: its initializer op} for the named variables."""
    found = {}
    for key in (tf_adapter.tf.GraphKeys.GLOBAL_VARIABLES, tf_adapter.tf.GraphKeys.LOCAL_VARIABLES):
        for var in tf_graph.get_collection(key):
            if var.op.name in names:
                found[var.op.name] = var.initializer
    return found


def classify(view, keep_init=()):
    """Split the view's step ops into cloned and shared sets (op names).

    ``keep_init`` names variables whose initializers every copy needs (shards).
    Returns :data:`Roles`.
    """
    tf_graph = view.tf_graph
    step = global_step_ops(tf_graph)
    shared = input_pipeline_ops(tf_graph) | step
    needed = ancestors(step_roots(view))
    init_only = ancestors(_initializers(tf_graph)) - needed
    # Sharded variables are initialized by each copy (every shard is its own root).
    init_only -= ancestors(initializers_of(tf_graph, keep_init).values())
    helpers = set()
    for spec in view.specialized.values():
        helpers |= spec.helpers
    cloned, variables, pinned = [], [], set()
    for op in tf_graph.get_operations():
        info = view.info(op)
        if info is None or info.phase not in Phase.STEP or info.copy or info.micro_batch:
            continue
        specialized = op.name in view.specialized  # built per copy, whatever its type
        if not specialized and (op.name in shared or op.type in PLACEHOLDER_TYPES
                                or op.type in TABLE_TYPES or is_summary(op)):
            shared.add(op.name)
            continue
        if (op.name in init_only and not is_variable(op)) or op.name in helpers:
            continue
        cloned.append(op)
        # a table's readers run where the table is. A specialized op was placed on
        # copy 0's device by its builder (a split layer's collective): not the user's
        # pin, even when compute devices are CPUs
        if (not specialized and "CPU" in op.device.upper()) or \
                any(t.op.type in TABLE_TYPES for t in op.inputs):
            pinned.add(op.name)
        if is_variable(op):
            variables.append(op)
    return Roles(cloned, shared, variables, step, pinned, needed, init_only)
