"""Which forward tensors gradient checkpointing keeps (the *checkpoints*).

* ``collection``: the tensors of ``tf.get_collection("checkpoints")``;
* ``auto``: the outputs of repeated blocks (sibling name scopes with the same
  op-type histogram, such as transformer layers or ResNet units) when the model
  has them, else a memory-balanced partition of the forward ops into about
  sqrt(L) segments of similar activation bytes, cut where the fewest bytes cross;
* always: tensors that cross from one TaskGraph to another, so that no segment
  spans two pipeline stages (a stage's backward never waits for another stage's
  recomputation).

Selection works on ops: a checkpoint op keeps every output the backward needs.
"""
import collections
import math

from epl.config import ConfigError
from epl.ir.traverse import unique_ops
from epl.protocols.passes import MODEL, Pass
from epl.runtime import gc_graph, graph_records
from epl.ir.features import FeatureSlot

COLLECTION = "checkpoints"
MIN_BLOCK_OPS = 8      # a repeated block has at least this many forward ops
MIN_REPEATS = 2        # ... and at least this many scopes share its histogram


class CheckpointError(ValueError):
    """The checkpoints asked for cannot be used (names the tensor and why)."""


Selection = collections.namedtuple("Selection", ["ops", "method"])
Selection.__doc__ = """Checkpoint ops (creation order) and how they were chosen (for logs)."""


def from_collection(region, graph):
    """Checkpoint ops of the ``checkpoints`` collection's tensors in this call's region.

    Entries may be tensors or tensor names ("scope/op:0"); an entry a build-time
    rewrite replaced (AMP's float16 twin) stands for its replacement. Each
    ``tf.gradients`` call uses the entries between its own variables and losses (a
    GAN's two losses each use their tower's), and records them: an entry no call
    uses is an error when the graph is parallelized (:class:`UnusedCheckpoints`), a
    silently ignored checkpoint would train with the memory the user meant to save.
    """
    entries = graph.get_collection(COLLECTION)
    if not entries:
        raise CheckpointError(
            'gradient_checkpoint.type = "collection" but the tf collection "%s" is empty: '
            'add the forward tensors to keep with tf.add_to_collection("%s", tensor) '
            'before the optimizer computes gradients, or set gradient_checkpoint.type = '
            '"auto"' % (COLLECTION, COLLECTION))
    interior = gc_graph.control_flow_interior(region.ops)
    use = _USES.of(region.view)
    use.losses.append(", ".join(y.name for y in region.ys))
    ops = []
    for entry in entries:
        tensor = graph_records.current_tensor(region.view, _resolve(graph, entry))
        if tensor.op not in region:
            continue
        if id(tensor.op) in interior:
            raise CheckpointError(
                'gradient_checkpoint.type = "collection": checkpoint tensor %r is inside a '
                "tf.while_loop or tf.cond; checkpoint a tensor outside the loop or branch"
                % tensor.name)
        use.used.add(tensor.name)
        ops.append(tensor.op)
    return Selection(unique_ops(ops), "collection")


class _CollectionUse(object):
    """Which collection entries (current tensor names) some gradient call used, and
    the losses of the calls that looked."""

    def __init__(self):
        self.used = set()
        self.losses = []


_USES = FeatureSlot("checkpoints_collection_uses", _CollectionUse)


def unused_entries(view):
    """[(entry name, current tensor name)] of collection entries no call used."""
    use = _USES.get(view)
    if use is None:
        return []
    graph = view.tf_graph
    found = []
    for entry in graph.get_collection(COLLECTION):
        original = _resolve(graph, entry)
        tensor = graph_records.current_tensor(view, original)
        if tensor.name not in use.used:
            found.append((original.name, tensor.name))
    return found


class UnusedCheckpoints(Pass):
    """Refuse ``checkpoints`` collection entries that no ``tf.gradients`` call could use."""

    name = "unused_checkpoints"
    phase = MODEL
    reads = ("view",)
    writes = ()

    def applies(self, ctx):
        return ctx.config.gradient_checkpoint.type == "collection"

    def run(self, ctx):
        unused = unused_entries(ctx.view)
        if not unused:
            return
        losses = _USES.get(ctx.view).losses
        names = ", ".join(repr(name) if name == now else "%r (now %r)" % (name, now)
                          for name, now in unused)
        raise ConfigError(
            'gradient_checkpoint.type = "collection": checkpoint tensor(s) %s (tf collection '
            '"%s") are not between the variables and the loss of any tf.gradients call '
            "(losses: %s): no loss depends on them through the variables being "
            "differentiated, so they cannot be checkpoints; remove them from the collection "
            "(a tf.gradients call inside a tf.while_loop or tf.cond body is not "
            "checkpointed)" % (names, COLLECTION, "; ".join(losses)))


def _resolve(graph, entry):
    """The graph tensor a collection entry stands for (a tensor or its name)."""
    if isinstance(entry, bytes):
        entry = entry.decode()
    if isinstance(entry, str):
        try:
            return graph.get_tensor_by_name(entry)
        except (KeyError, ValueError) as error:
            raise CheckpointError(
                'gradient_checkpoint.type = "collection": the tf collection "%s" names '
                "tensor %r, which this graph does not have (%s)" % (COLLECTION, entry, error))
    op = getattr(entry, "op", None)
    if op is None or not hasattr(entry, "value_index"):
        raise CheckpointError(
            'gradient_checkpoint.type = "collection": the tf collection "%s" holds %r, which '
            "is not a tensor" % (COLLECTION, entry))
    if entry.graph is not graph:
        raise CheckpointError(
            'gradient_checkpoint.type = "collection": checkpoint tensor %r belongs to '
            "another graph" % entry.name)
    return entry


def automatic(region):
    """Repeated blocks if the model has them, else a memory-balanced partition."""
    candidates = [op for op in region.ops if region.may_recompute(op)]
    blocks = repeated_blocks(region, candidates)
    if blocks:
        prefixes, ops = blocks
        shown = ", ".join(prefixes[:3]) + (", ..." if len(prefixes) > 3 else "")
        return Selection(ops, "auto: outputs of %d repeated blocks (%s)"
                         % (len(prefixes), shown))
    ops, cuts = balanced(region, candidates)
    return Selection(ops, "auto: memory-balanced partition into %d segments" % (cuts + 1))


def stage_crossings(region):
    """Recomputable ops read by an op of another TaskGraph (pipeline stage)."""
    result = []
    for op in region.ops:
        if not region.may_recompute(op):
            continue
        taskgraph = region.taskgraph(op)
        if any(region.taskgraph(c) != taskgraph for c in region.consumers(op)):
            result.append(op)
    return result


# ---- repeated blocks ----------------------------------------------------------------
def repeated_blocks(region, candidates):
    """``(scope prefixes, exit ops)`` of the best family of repeated blocks, or None.

    For every name-scope depth, the forward ops under each scope prefix form a
    group; groups with the same op-type histogram (and at least MIN_BLOCK_OPS
    ops) repeat when MIN_REPEATS or more share it. The depth whose repeated
    groups cover the most ops wins (the shallower on ties: whole layers rather
    than their parts). A block's exits are its recomputable ops read by
    forward ops outside the block.
    """
    allowed = set(id(op) for op in candidates)
    by_depth = collections.defaultdict(lambda: collections.defaultdict(list))
    for op in region.ops:
        if not region.selectable(op):
            continue
        parts = op.name.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            by_depth[depth]["/".join(parts[:depth])].append(op)
    best = None
    for depth in sorted(by_depth):
        groups = by_depth[depth]
        families = collections.defaultdict(list)
        for prefix, members in groups.items():
            if sum(1 for op in members if id(op) in allowed) >= MIN_BLOCK_OPS:
                families[_histogram(members)].append(prefix)
        repeated = sorted(p for prefixes in families.values() if len(prefixes) >= MIN_REPEATS
                          for p in prefixes)
        covered = sum(len(groups[p]) for p in repeated)
        if repeated and (best is None or covered > best[0]):
            best = (covered, repeated, groups)
    if best is None:
        return None
    _, prefixes, groups = best
    exits = []
    for prefix in prefixes:
        members = set(id(op) for op in groups[prefix])
        exits.extend(op for op in groups[prefix] if id(op) in allowed and any(
            id(c) not in members for c in region.consumers(op)))
    exits = [op for op in exits if region.boundary(op)]
    return (prefixes, gc_graph.by_creation(unique_ops(exits))) if exits else None


def _histogram(ops):
    return frozenset(collections.Counter(op.type for op in ops).items())


# ---- memory-balanced partition -------------------------------------------------------
def balanced(region, candidates):
    """Checkpoint ops cutting the forward ops into ~sqrt(L) segments of similar bytes.

    Levels are longest-path depths over the region. Each recomputable op's
    outputs count as activation bytes at its level and cross every level
    boundary up to its last reader. Boundaries are placed near equal shares of
    the cumulative bytes, each at the boundary within a window that the fewest
    bytes cross; the recomputable ops crossing it become checkpoints. Returns
    (checkpoint ops, number of boundaries).
    """
    depth = _depths(region)
    if not candidates or not depth:
        return [], 0
    count = max(depth.values()) + 1
    allowed = set(id(op) for op in candidates)
    activation = [0] * count
    crossing = [0] * (count + 1)
    spans = []
    for op in region.ops:
        if id(op) not in allowed:
            continue
        size = sum(gc_graph.static_bytes(t) for t in op.outputs)
        level = depth[id(op)]
        activation[level] += size
        readers = [depth[id(c)] for c in region.consumers(op)]
        last = max(readers) if readers else level
        if last > level and region.boundary(op):
            crossing[level] += size
            crossing[last] -= size
            spans.append((level, last, op))
    cut = []
    running = 0
    for level in range(count):
        running += crossing[level]
        cut.append(running)
    chosen = _choose_boundaries(activation, cut)
    picked = [op for level, last, op in spans if any(level <= b < last for b in chosen)]
    return gc_graph.by_creation(picked), len(chosen)


def _choose_boundaries(activation, cut):
    """Level boundaries (after level b) for about sqrt(L) balanced segments."""
    count = len(activation)
    segments = int(round(math.sqrt(count)))
    total = float(sum(activation))
    if segments < 2 or total <= 0:
        return []
    window = max(0, count // (3 * segments))
    cumulative, running = [], 0
    for value in activation:
        running += value
        cumulative.append(running)
    chosen = []
    for part in range(1, segments):
        target = total * part / segments
        ideal = next(i for i, value in enumerate(cumulative) if value >= target)
        options = [b for b in range(ideal - window, ideal + window + 1)
                   if 0 <= b < count - 1 and cut[b] > 0 and (not chosen or b > chosen[-1])]
        if options:
            chosen.append(min(options, key=lambda b: (cut[b], abs(b - ideal))))
    return chosen


def _depths(region):
    depth = {}
    for op in region.ops:
        depth[id(op)] = max([depth.get(id(t.op), -1) for t in op.inputs] + [-1]) + 1
    return depth
