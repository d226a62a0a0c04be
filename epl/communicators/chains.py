"""Re-order a communicator's chains of collectives to follow the pipeline schedule.

Backends that need every member to run a group's collectives in one order (EPL's ring,
NCCL) chain each member's ops with control edges in build order. Build order is the
repetition's: all of micro-batch 0 (its forward's collectives, then its backward's),
then micro-batch 1, ... A schedule that runs micro-batch 1's forward before micro-batch
0's backward (PreferForward) orders the stage functions the other way, and the two
orders together are a cycle (a split stage's backward collective of micro-batch 0 ->
chain -> its forward collective of micro-batch 1 -> the forward call -> the schedule's
barrier -> the backward call of micro-batch 0 -> that backward collective).
:func:`reorder` sorts each chain by the rank its ops' actions have in the schedule
(stable, so ops of one action keep their build order), which is the same on every
member of a group: their copies run the same stage's schedule.
"""
from epl import tf_adapter


def reorder(graph, op_names, rank):
    """Re-link the control-edge chains among ``op_names`` (one per device, or per
    device and control-flow frame) so their ops run in order of ``rank(op)`` (stable;
    None: the rank of the op before it in the chain). A chain whose ranked ops belong
    to different (stage, copy) pairs keeps its order (ranks compare only within one
    stage's schedule). Returns (old last op, new last op) of each chain that changed."""
    ops = [graph.get_operation_by_name(name) for name in op_names]
    tails = []
    for chain in _chains(ops):
        keys = _keys(chain, rank)
        if keys is None:
            continue
        order = [op for _, _, op in sorted(zip(keys, range(len(chain)), chain),
                                           key=lambda item: item[:2])]
        if order != chain:
            _relink(chain, order)
            tails.append((chain[-1], order[-1]))
    return tails


def _chains(ops):
    """Maximal chains (lists in run order) of ops linked by a control edge from one op
    of ``ops`` to the next on the same device."""
    members = set(ops)
    after = {}
    has_before = set()
    for op in ops:
        for control in op.control_inputs:
            if control in members and control.device == op.device:
                after[control] = op
                has_before.add(op)
    chains = []
    for op in ops:
        if op in has_before or op not in after:
            continue
        chain = [op]
        while chain[-1] in after:
            chain.append(after[chain[-1]])
        chains.append(chain)
    return chains


def _keys(chain, rank):
    """Sort keys of ``chain``'s ops, or None when they cannot be compared."""
    keys, owners, current = [], set(), -1
    for op in chain:
        found = rank(op)
        if found is not None:
            owner, current = found
            owners.add(owner)
        keys.append(current)
    return keys if len(owners) == 1 else None


def _relink(chain, order):
    """Replace the chain's control edges by edges along ``order``."""
    previous = dict(zip(chain[1:], chain[:-1]))
    for op in chain:
        old = previous.get(op)
        if old is not None:
            kept = [c for c in op.control_inputs if c is not old]
            tf_adapter.remove_control_inputs(op)
            tf_adapter.add_control_inputs(op, kept)
    for before, op in zip(order, order[1:]):
        tf_adapter.add_control_inputs(op, [before])
