"""Painting: which nodes of the forward region run in float16 (pure, no TensorFlow).

The region is a directed graph of data edges between forward ops. Each node has
a kind from :mod:`epl.runtime.amp_lists` (ALLOW, INFER, DENY, CLEAR) or None
(a node that cannot or must not change: unlisted, stateful, no float16
kernel, a variable read, ...). Painting, in the order of TF's grappler AMP:

1. deny spreads forward: every INFER node downstream of a DENY node, and every
   CLEAR node on the way from a DENY node to an INFER or DENY node, is denied;
2. ALLOW nodes are float16;
3. INFER and CLEAR nodes (not denied) that lie between two float16 nodes (reached
   downstream from one and upstream from another, through INFER and CLEAR
   nodes) become float16;
4. CLEAR nodes connected to float16 nodes through CLEAR nodes (either
   direction) become float16.

Example::

    >>> kinds = {"mm1": ALLOW, "bias": INFER, "relu": CLEAR, "mm2": ALLOW, "xent": DENY}
    >>> edges = {"mm1": ["bias"], "bias": ["relu"], "relu": ["mm2"], "mm2": ["xent"]}
    >>> sorted(paint(kinds, edges).half)
    ['bias', 'mm1', 'mm2', 'relu']
"""
import collections

from epl.runtime.amp_lists import ALLOW, CLEAR, DENY, INFER

Painting = collections.namedtuple("Painting", ["half", "denied"])
Painting.__doc__ = "Nodes that run in float16, and nodes held in float32 by a deny-list op."


def paint(kinds, fanout):
    """``Painting`` of the nodes of ``kinds`` ({node: kind or None}), with data
    edges ``fanout`` ({node: [consumer, ...]}; edges to unknown nodes are ignored)."""
    fanout = dict((n, [c for c in fanout.get(n, ()) if c in kinds]) for n in kinds)
    fanin = dict((n, []) for n in kinds)
    for node, consumers in fanout.items():
        for consumer in consumers:
            fanin[consumer].append(node)
    denied = _spread_deny(kinds, fanout, fanin)
    half = set(n for n, kind in kinds.items() if kind == ALLOW)
    passable = lambda n: kinds[n] in (INFER, CLEAR) and n not in denied
    between = _reach(half, fanout, passable) & _reach(half, fanin, passable)
    half |= between
    neighbours = lambda n: fanin[n] + fanout[n]
    half |= _reach(half, _Both(neighbours), lambda n: kinds[n] == CLEAR and n not in denied)
    return Painting(half, denied)


class _Both(object):
    """Edges in both directions, looked up like a dict."""

    def __init__(self, neighbours):
        self._neighbours = neighbours

    def __getitem__(self, node):
        return self._neighbours(node)


def _spread_deny(kinds, fanout, fanin):
    """DENY nodes, the INFER nodes downstream of them, and the CLEAR nodes on the way
    from them to INFER or DENY nodes."""
    leads = _reach([n for n, k in kinds.items() if k in (INFER, DENY)], fanin,
                   lambda n: kinds[n] == CLEAR)
    deny = [n for n, kind in kinds.items() if kind == DENY]
    spreads = lambda n: kinds[n] == INFER or (kinds[n] == CLEAR and n in leads)
    spread = _reach(deny, fanout, spreads)
    return set(deny) | spread


def _reach(starts, edges, passable):
    """Nodes reached from ``starts`` along ``edges`` through ``passable`` nodes
    (the starts themselves only when reached again)."""
    found, stack = set(), list(starts)
    while stack:
        node = stack.pop()
        for nxt in edges[node]:
            if nxt not in found and passable(nxt):
                found.add(nxt)
                stack.append(nxt)
    return found
