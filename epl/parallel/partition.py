"""Automatic pipeline stages as pure functions (no TensorFlow).

``auto.auto_parallel=True`` with ``pipeline.num_stages=k`` cuts the user's
forward graph into k stages. The TF side (:mod:`epl.parallel.passes.auto_stages`)
describes the forward ops as :class:`Node` records; everything here is plain
Python, so partitions are unit-tested on hand-made graphs.

How a partition is made:

1. The *core* ops are the ops that compute on the batch: batch sources
   (iterator get-next ops, placeholders) and everything their outputs reach.
   Weights, constants and initializers are not core; they follow the ops that
   use them (step 5).
2. Core ops are put in a topological order (graph order breaks ties). A stage
   is a contiguous run of that order, so data only flows from a stage to the
   same or a later one. Cuts never fall inside a group (a loop or cond body,
   ops colocated with each other).
3. Repeated blocks first: sibling name scopes with identical op-type histograms
   (``layer_0`` .. ``layer_11`` of a transformer, ``dense``, ``dense_1``, ... of
   an MLP) that form a chain (each block feeds the next). Name scopes are user
   structure, read only to *find* blocks; stage membership is then recorded in
   the IR's op table. Each stage gets an equal share of blocks (when the count
   does not divide, the stages with the least other work get one more); ops
   before the first block (embeddings) go to the first stage and ops after the
   last block (the head, the loss) to the last one.
4. Otherwise, costs: each core op's work is estimated from static shapes
   (:func:`op_cost`: float operations of products and convolutions, elements
   produced by everything else), and the order is cut into k runs that
   minimize the largest stage cost.
5. Other ops take the earliest stage of the ops that consume them (a weight
   lives with its first user), else the latest stage of their inputs; groups
   are moved together, and consumers are moved after their producers if a
   group move broke the order.

Example::

    >>> nodes = [Node("x", "Placeholder", (), 1, True, None),
    ...          Node("a/MatMul", "MatMul", (0,), 8, False, None),
    ...          Node("b/MatMul", "MatMul", (1,), 8, False, None)]
    >>> partition(nodes, 2).stage_of
    {'x': 0, 'a/MatMul': 0, 'b/MatMul': 1}
"""
import bisect
import collections
import heapq

from epl.config import ConfigError

BLOCKS, COST = "repeated blocks", "cost"


class PartitionError(ValueError):
    """The model cannot be cut into the requested number of stages."""


class Node(collections.namedtuple("Node", ["name", "type", "inputs", "cost", "source",
                                           "group"])):
    """One forward op: ``inputs`` are indices of the forward ops it reads (data and
    control edges, loop back edges left out); ``cost`` its estimated work;
    ``source`` True for ops that bring a batch in; ``group`` a key shared by ops
    that must stay in one stage (None when free)."""

    __slots__ = ()


class Stage(collections.namedtuple("Stage", ["index", "blocks", "num_ops", "cost"])):
    """Summary of one stage: block scope names, forward op count, core cost."""

    __slots__ = ()


class Partition(collections.namedtuple("Partition", ["method", "stages", "stage_of"])):
    """The result: ``method`` (repeated blocks or cost), one :class:`Stage` per
    stage, and ``stage_of`` {forward op name: stage}. Prints as a table."""

    __slots__ = ()

    @property
    def num_stages(self):
        return len(self.stages)

    def blocks_per_stage(self):
        return [len(stage.blocks) for stage in self.stages]

    def __str__(self):
        total = float(sum(stage.cost for stage in self.stages)) or 1.0
        lines = ["auto parallel: %d stages by %s" % (len(self.stages), self.method)]
        for stage in self.stages:
            blocks = _block_range(stage.blocks)
            lines.append("  stage %d: %s%d ops, cost %.3g (%.1f%%)" % (
                stage.index, "blocks %s; " % blocks if blocks else "", stage.num_ops,
                stage.cost, 100.0 * stage.cost / total))
        return "\n".join(lines)


def _block_range(blocks):
    if len(blocks) <= 2:
        return ", ".join(blocks)
    return "%s .. %s (%d)" % (blocks[0], blocks[-1], len(blocks))


# ---- configuration -------------------------------------------------------------------
def stage_count(config):
    """Stages ``config`` asks for: ``pipeline.num_stages``, 1 when unset."""
    return config.pipeline.num_stages or 1


def check_config(config):
    """Refuse ``pipeline.num_stages`` without ``auto.auto_parallel``: nothing else reads
    it, so it would be silently ignored (use strategy scopes to define stages)."""
    if config.pipeline.num_stages is not None and not config.auto.auto_parallel:
        raise ConfigError(
            "pipeline.num_stages=%r is only read by automatic parallelism, which is off: "
            "set auto.auto_parallel=True to let EPL cut the model into stages, or remove "
            "pipeline.num_stages and define stages with epl.replicate(...) scopes"
            % (config.pipeline.num_stages,))


def check_devices(num_stages, worker_num, devices_per_worker):
    """Every device is used: the stages of one pipeline take one device each, and
    data parallelism runs ``total / num_stages`` pipelines. Returns that count."""
    total = worker_num * devices_per_worker
    if total % num_stages:
        divisors = [d for d in range(1, total + 1) if total % d == 0]
        raise PartitionError(
            "pipeline.num_stages=%d does not divide the job's %d devices (%d worker(s) x %d): "
            "auto.auto_parallel runs total/num_stages pipeline replicas of one device per "
            "stage; use num_stages in %s" % (num_stages, total, worker_num,
                                             devices_per_worker, divisors))
    return total // num_stages


# ---- cost model ----------------------------------------------------------------------
def _elements(shape):
    """Elements of a static shape (None dims count 1: the batch scales every op alike);
    1 for an unknown rank."""
    if shape is None:
        return 1
    count = 1
    for dim in shape:
        count *= dim if dim is not None and dim >= 0 else 1
    return count


def _dim(shape, index):
    if shape is None or len(shape) < abs(index) or shape[index] is None:
        return 1
    return shape[index]


def op_cost(op_type, input_shapes, output_shapes, attrs=None):
    """Estimated work of one op from static shapes (``None`` dims count as 1).

    MatMul and BatchMatMul: ``2 * k`` float operations per output element;
    Conv2D/Conv3D: ``2 * prod(filter dims except the last)`` per output element;
    depthwise convolutions: ``2 * prod(filter spatial dims)`` per output element;
    everything else: one unit per element it produces (its memory traffic).
    Never less than 1.

    >>> op_cost("MatMul", [(None, 64), (64, 32)], [(None, 32)])
    4096
    """
    attrs = attrs or {}
    out = sum(_elements(shape) for shape in output_shapes) if output_shapes else 1
    first = input_shapes[0] if input_shapes else None
    if op_type == "MatMul":
        k = _dim(first, -2 if attrs.get("transpose_a") else -1)
        return max(1, 2 * k * out)
    if op_type in ("BatchMatMul", "BatchMatMulV2"):
        k = _dim(first, -2 if attrs.get("adj_x") else -1)
        return max(1, 2 * k * out)
    if op_type in ("Conv2D", "Conv3D") and len(input_shapes) > 1 and input_shapes[1]:
        return max(1, 2 * out * _elements(input_shapes[1][:-1]))
    if op_type == "DepthwiseConv2dNative" and len(input_shapes) > 1 and input_shapes[1]:
        return max(1, 2 * out * _elements(input_shapes[1][:-2]))
    return max(1, out)


# ---- repeated blocks -----------------------------------------------------------------
class Block(collections.namedtuple("Block", ["scope", "members"])):
    """One repeated block: its name scope and the indices of its ops."""

    __slots__ = ()


def block_families(names, types, min_blocks=2, min_ops=2):
    """Families of repeated blocks, best first.

    A family is the sibling name scopes under one parent scope whose ops have
    identical op-type histograms (at least ``min_blocks`` of them, ``min_ops``
    ops each). Families covering more ops come first. Each family is a list of
    :class:`Block` in graph order.
    """
    histograms = collections.defaultdict(collections.Counter)
    members = collections.defaultdict(list)
    for index, (name, op_type) in enumerate(zip(names, types)):
        scopes = name.split("/")[:-1]
        for depth in range(1, len(scopes) + 1):
            key = tuple(scopes[:depth])
            histograms[key][op_type] += 1
            members[key].append(index)
    siblings = collections.defaultdict(list)
    for key, histogram in histograms.items():
        siblings[(key[:-1], frozenset(histogram.items()))].append(key)
    families = []
    for (_, signature), keys in siblings.items():
        size = sum(count for _, count in signature)
        if len(keys) < min_blocks or size < min_ops:
            continue
        blocks = [Block("/".join(key), tuple(members[key])) for key in keys]
        blocks.sort(key=lambda block: block.members[0])
        families.append(blocks)
    families.sort(key=lambda f: (-len(f) * len(f[0].members), -len(f), f[0].members[0]))
    return families


def _block_counts(num_blocks, num_stages, first_extra, last_extra):
    """Blocks per stage: equal shares; when they do not divide, one more block for the
    stages with the least other work (middle stages, then the lighter end)."""
    base, extra = divmod(num_blocks, num_stages)
    attached = [0.0] * num_stages
    attached[0] += first_extra
    attached[-1] += last_extra
    middle = (num_stages - 1) / 2.0
    order = sorted(range(num_stages), key=lambda s: (attached[s], abs(s - middle), s))
    counts = [base] * num_stages
    for stage in order[:extra]:
        counts[stage] += 1
    return counts


# ---- graph helpers -------------------------------------------------------------------
def topological_order(nodes):
    """Indices in a topological order of the input edges, graph order breaking ties.
    Nodes on a cycle (there should be none) are appended in graph order."""
    pending = [0] * len(nodes)
    consumers = [[] for _ in nodes]
    for index, node in enumerate(nodes):
        for source in set(node.inputs):
            if source != index:
                pending[index] += 1
                consumers[source].append(index)
    ready = [i for i, count in enumerate(pending) if count == 0]
    heapq.heapify(ready)
    order, placed = [], [False] * len(nodes)
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        placed[index] = True
        for consumer in consumers[index]:
            pending[consumer] -= 1
            if pending[consumer] == 0:
                heapq.heappush(ready, consumer)
    order += [i for i, done in enumerate(placed) if not done]
    return order


def _consumers(nodes):
    result = [[] for _ in nodes]
    for index, node in enumerate(nodes):
        for source in set(node.inputs):
            if source != index:
                result[source].append(index)
    return result


def batch_dependent(nodes, consumers=None):
    """Indices of batch sources and of every op their outputs reach."""
    consumers = consumers or _consumers(nodes)
    found = set(i for i, node in enumerate(nodes) if node.source)
    stack = list(found)
    while stack:
        for consumer in consumers[stack.pop()]:
            if consumer not in found:
                found.add(consumer)
                stack.append(consumer)
    return found


def _allowed_cuts(core_order, nodes):
    """Positions p (1..n-1) of the core order where a cut may go (between p-1 and p):
    not inside any group's span."""
    span = {}
    for position, index in enumerate(core_order):
        group = nodes[index].group
        if group is not None:
            low, _ = span.get(group, (position, position))
            span[group] = (low, position)
    blocked = [0] * (len(core_order) + 1)
    for low, high in span.values():
        if high > low:
            blocked[low + 1] += 1      # cuts at low+1 .. high would split the group
            blocked[high + 1] -= 1
    allowed, running = [], blocked[0]
    for position in range(1, len(core_order)):
        running += blocked[position]
        if running == 0:
            allowed.append(position)
    return allowed


# ---- cutting -------------------------------------------------------------------------
def linear_partition(costs, num_stages, allowed=None):
    """Cut positions (sorted, ``num_stages - 1`` of them) splitting ``costs`` into
    non-empty contiguous runs at ``allowed`` positions (default: anywhere) so that
    the largest run's sum is as small as possible.

    >>> linear_partition([1, 1, 1, 1, 4], 2)
    [4]
    """
    allowed = list(range(1, len(costs))) if allowed is None else sorted(allowed)
    if num_stages - 1 > len(allowed):
        raise PartitionError("cannot cut %d units into %d stages"
                             % (len(allowed) + 1, num_stages))
    if num_stages == 1:
        return []
    bounds = [0] + allowed + [len(costs)]
    units = [float(sum(costs[a:b])) for a, b in zip(bounds, bounds[1:])]
    low, high = max(units), sum(units)
    for _ in range(100):
        if high - low <= 1e-9 * max(high, 1.0):
            break
        middle = (low + high) / 2.0
        if len(_greedy(units, middle)) < num_stages:
            high = middle
        else:
            low = middle
    chosen = _best_of(units, num_stages, high)
    return [bounds[u] for u in chosen]


def _greedy(units, cap):
    """Unit indices where runs start (after the first) when runs are filled to ``cap``."""
    starts, running = [], 0.0
    for index, cost in enumerate(units):
        if running and running + cost > cap * (1 + 1e-12):
            starts.append(index)
            running = 0.0
        running += cost
    return starts


def _best_of(units, num_stages, cap):
    """The more even of two optimal cuts: nearest to equal shares if that reaches the
    optimum ``cap``, else the greedy one split until it has enough runs."""
    even = _even_cuts(units, num_stages)
    if even is not None and _largest(units, even) <= cap * (1 + 1e-9):
        return even
    starts = _greedy(units, cap)
    while len(starts) < num_stages - 1:
        starts = _split_largest(units, starts)
    return starts


def _even_cuts(units, num_stages):
    prefix = [0.0]
    for cost in units:
        prefix.append(prefix[-1] + cost)
    total, cuts = prefix[-1], []
    for stage in range(1, num_stages):
        target = total * stage / num_stages
        at = bisect.bisect_left(prefix, target, 1, len(units))
        if at > 1 and target - prefix[at - 1] <= prefix[at] - target:
            at -= 1
        low = (cuts[-1] + 1) if cuts else 1
        high = len(units) - (num_stages - stage)
        at = min(max(at, low), high)
        if at < low:
            return None
        cuts.append(at)
    return cuts


def _largest(units, starts):
    bounds = [0] + list(starts) + [len(units)]
    return max(sum(units[a:b]) for a, b in zip(bounds, bounds[1:]))


def _split_largest(units, starts):
    bounds = [0] + list(starts) + [len(units)]
    runs = [(sum(units[a:b]), a, b) for a, b in zip(bounds, bounds[1:]) if b - a > 1]
    _, a, b = max(runs)
    half, running, at = sum(units[a:b]) / 2.0, 0.0, a + 1
    for index in range(a, b - 1):
        running += units[index]
        at = index + 1
        if running >= half:
            break
    return sorted(list(starts) + [at])


# ---- the partition -------------------------------------------------------------------
def partition(nodes, num_stages, min_block_share=0.5):
    """Cut ``nodes`` (forward ops, see :class:`Node`) into ``num_stages`` stages.

    Returns a :class:`Partition`. Raises :class:`PartitionError` when the model
    has no batch computation or fewer cuttable units than stages.
    """
    consumers = _consumers(nodes)
    core = batch_dependent(nodes, consumers)
    if not core:
        raise PartitionError("auto.auto_parallel found no op that computes on the input "
                             "batch (no iterator get-next or placeholder reaches the model)")
    order = topological_order(nodes)
    core_order = [i for i in order if i in core]
    allowed = _allowed_cuts(core_order, nodes)
    if num_stages - 1 > len(allowed):
        raise PartitionError(
            "pipeline.num_stages=%d exceeds the %d unit(s) this model can be cut into "
            "(%d ops compute on the batch; loop and cond bodies and colocated ops stay "
            "together); use at most %d stages" % (num_stages, len(allowed) + 1,
                                                  len(core_order), len(allowed) + 1))
    costs = [float(nodes[i].cost) for i in core_order]
    position = dict((index, p) for p, index in enumerate(core_order))
    found = _block_cuts(nodes, num_stages, core_order, position, costs, allowed,
                        consumers, min_block_share)
    if found is not None:
        method, (cuts, blocks) = BLOCKS, found
    else:
        method, cuts, blocks = COST, linear_partition(costs, num_stages, allowed), None
    stages = [None] * len(nodes)
    for p, index in enumerate(core_order):
        stages[index] = bisect.bisect_right(cuts, p)
    _place_the_rest(nodes, stages, order, consumers)
    _settle(nodes, stages, order)
    return _result(nodes, stages, num_stages, method, blocks, core)


def _block_cuts(nodes, num_stages, core_order, position, costs, allowed, consumers,
                min_block_share):
    """(cut positions, blocks per stage) from the best usable family, or None."""
    names = [n.name for n in nodes]
    types = [n.type for n in nodes]
    allowed = set(allowed)
    total = sum(costs) or 1.0
    for family in block_families(names, types):
        blocks = []
        for block in family:
            mine = sorted(position[i] for i in block.members if i in position)
            if mine:
                blocks.append((mine[0], mine[-1], block.scope, mine))
        blocks.sort()
        if len(blocks) < max(num_stages, 2):
            continue
        if sum(costs[p] for b in blocks for p in b[3]) < min_block_share * total:
            continue
        block_costs = [sum(costs[p] for p in b[3]) for b in blocks]
        if max(block_costs) > 2 * min(block_costs):
            continue    # same op types, very different shapes: not a repeated layer
        if not _is_chain(blocks, core_order, consumers):
            continue
        first = sum(costs[:blocks[0][0]])
        last = sum(costs[blocks[-1][1] + 1:])
        counts = _block_counts(len(blocks), num_stages, first, last)
        starts = [sum(counts[:s]) for s in range(1, num_stages)]
        cuts = [blocks[b][0] for b in starts]
        if all(cut in allowed for cut in cuts):
            grouped, at = [], 0
            for count in counts:
                grouped.append(tuple(b[2] for b in blocks[at:at + count]))
                at += count
            return cuts, grouped
    return None


def _is_chain(blocks, core_order, consumers):
    """Blocks follow each other in the order and each one feeds the next."""
    for (_, high, _, _), (low, _, _, _) in zip(blocks, blocks[1:]):
        if high >= low:
            return False
    position = dict((index, p) for p, index in enumerate(core_order))
    for this, following in zip(blocks, blocks[1:]):
        targets = set(core_order[p] for p in following[3])
        limit = following[1]
        stack = [core_order[p] for p in this[3]]
        seen = set(stack)
        reached = False
        while stack and not reached:
            for consumer in consumers[stack.pop()]:
                if consumer in targets:
                    reached = True
                    break
                if consumer not in seen and position.get(consumer, limit + 1) <= limit:
                    seen.add(consumer)
                    stack.append(consumer)
        if not reached:
            return False
    return True


def _place_the_rest(nodes, stages, order, consumers):
    """Non-core ops: earliest stage of their consumers, else latest of their inputs,
    else the first stage (repeated until nothing changes)."""
    changed = True
    while changed:
        changed = False
        for index in reversed(order):
            if stages[index] is None:
                known = [stages[c] for c in consumers[index] if stages[c] is not None]
                if known:
                    stages[index] = min(known)
                    changed = True
        for index in order:
            if stages[index] is None:
                known = [stages[i] for i in nodes[index].inputs if stages[i] is not None]
                if known:
                    stages[index] = max(known)
                    changed = True
    for index, stage in enumerate(stages):
        if stage is None:
            stages[index] = 0


def _settle(nodes, stages, order):
    """Groups share one stage (the latest of their members) and no op comes before
    an input's stage; stages only grow, so this ends."""
    groups = collections.defaultdict(list)
    for index, node in enumerate(nodes):
        if node.group is not None:
            groups[node.group].append(index)
    changed = True
    while changed:
        changed = False
        for members in groups.values():
            top = max(stages[i] for i in members)
            for index in members:
                if stages[index] != top:
                    stages[index] = top
                    changed = True
        for index in order:
            top = max([stages[index]] + [stages[i] for i in nodes[index].inputs])
            if top != stages[index]:
                stages[index] = top
                changed = True


def _result(nodes, stages, num_stages, method, blocks, core):
    counts = [0] * num_stages
    costs = [0.0] * num_stages
    for index, stage in enumerate(stages):
        counts[stage] += 1
        if index in core:
            costs[stage] += nodes[index].cost
    empty = [s for s in range(num_stages) if not counts[s]]
    if empty:
        raise PartitionError("auto.auto_parallel left stage(s) %s without ops" % empty)
    summary = tuple(Stage(s, blocks[s] if blocks else (), counts[s], costs[s])
                    for s in range(num_stages))
    stage_of = dict((node.name, stages[i]) for i, node in enumerate(nodes))
    return Partition(method, summary, stage_of)


def check_order(nodes, stage_of):
    """[(producer, consumer)] forward edges that go from a later stage to an earlier one."""
    wrong = []
    for node in nodes:
        for source in node.inputs:
            producer = nodes[source].name
            if stage_of[producer] > stage_of[node.name]:
                wrong.append((producer, node.name))
    return wrong
