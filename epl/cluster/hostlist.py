"""Slurm's compressed host lists and task counts, as pure functions.

Slurm writes the nodes of a job as ``node[01-04,07],gpu-a[1-2]``: names separated
by commas, where a bracket holds numbers and ranges whose zero padding is kept
(the width of a range is that of its lower bound, as in Slurm). A name may hold
several brackets (``rack[1-2]-n[1-2]`` is four names, the last bracket varying
fastest). Tasks per node come as ``2(x3),1`` (three nodes with 2 tasks, then one
with 1).

Example::

    >>> expand("node[01-03,07],login")
    ['node01', 'node02', 'node03', 'node07', 'login']
    >>> tasks_per_node("2(x2),1")
    [2, 2, 1]
"""
import itertools
import re

from epl.cluster.common import ClusterError

_NAME = re.compile(r"^[A-Za-z0-9._-]*$")
_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")
MAX_HOSTS = 1 << 20   # a typo such as node[1-99999999] must not exhaust memory


class HostlistError(ClusterError):
    """A host list or task count that is not in Slurm's form."""


def expand(text, what="host list"):
    """The host names of a Slurm host list, in order (duplicates kept)."""
    if not isinstance(text, str) or not text.strip():
        raise HostlistError("%s %r is empty; expected names like node[01-04,07]"
                            % (what, text))
    hosts = []
    for item in _top_level_items(text, what):
        hosts.extend(_expand_name(item, text, what))
        if len(hosts) > MAX_HOSTS:
            raise HostlistError("%s %r names more than %d hosts" % (what, text, MAX_HOSTS))
    return hosts


def _top_level_items(text, what):
    """Split at the commas outside brackets; brackets must balance and not nest."""
    items, start, depth = [], 0, 0
    for position, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if depth not in (0, 1):
            raise HostlistError("%s %r: unbalanced or nested '%s' at position %d"
                                % (what, text, char, position))
        if char == "," and depth == 0:
            items.append(text[start:position])
            start = position + 1
    if depth:
        raise HostlistError("%s %r: '[' without ']'" % (what, text))
    items.append(text[start:])
    for item in items:
        if not item.strip():
            raise HostlistError("%s %r has an empty name (two commas, or a comma at an end)"
                                % (what, text))
    return [item.strip() for item in items]


def _expand_name(item, text, what):
    """One name with zero or more bracket groups -> its names (last group fastest)."""
    parts = re.split(r"\[([^\]]*)\]", item)
    literals, groups = parts[0::2], parts[1::2]
    for literal in literals:
        if not _NAME.match(literal):
            raise HostlistError("%s %r: %r is not a host name (letters, digits, '.', '_', "
                                "'-')" % (what, text, literal))
    choices = [_numbers(group, text, what) for group in groups]
    names = []
    for picked in itertools.product(*choices):
        name = literals[0] + "".join(number + literal
                                     for number, literal in zip(picked, literals[1:]))
        names.append(name)
    return names


def _numbers(group, text, what):
    """``01-03,7`` -> ['01', '02', '03', '7'] (padding from each range's lower bound)."""
    found = []
    for part in group.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise HostlistError("%s %r: [%s] must hold numbers and ranges such as 01-04, "
                                "got %r" % (what, text, group, part))
        high = high if dash else low
        if int(high) < int(low):
            raise HostlistError("%s %r: range %s ends before it starts" % (what, text, part))
        if int(high) - int(low) >= MAX_HOSTS:
            raise HostlistError("%s %r: range %s names more than %d hosts"
                                % (what, text, part, MAX_HOSTS))
        width = len(low)
        found.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return found


def tasks_per_node(text, what="tasks per node"):
    """``2(x3),1`` -> [2, 2, 2, 1]: Slurm's task counts, one per node."""
    counts = []
    for part in (text or "").split(","):
        match = _COUNT.match(part.strip())
        if not match or int(match.group(1)) < 1:
            raise HostlistError("%s %r: expected counts such as 2(x3),1, got %r"
                                % (what, text, part))
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts
