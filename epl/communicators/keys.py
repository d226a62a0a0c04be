"""Collective group and instance keys derived from stable names.

Every worker builds its own graph, so keys must not depend on the order in
which collectives are created: a group key is a hash of the group's device
list and an instance key a hash of (group, instance name). Collisions inside
one program are detected and reported instead of becoming a silent hang.
"""
import hashlib

_MAX_KEY = 2 ** 31 - 1


def stable_key(*parts):
    """Deterministic positive int32 from strings (same on every worker)."""
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()
    return int(digest[:12], 16) % (_MAX_KEY - 1) + 1


class KeyRegistry(object):
    """Hands out keys and guarantees uniqueness within one parallel program."""

    def __init__(self):
        self._groups = {}      # key -> devices
        self._instances = {}   # key -> (group key, name)

    def group_key(self, devices):
        devices = tuple(devices)
        key = stable_key("group", *devices)
        owner = self._groups.setdefault(key, devices)
        if owner != devices:
            raise RuntimeError("collective group key collision between %s and %s"
                               % (owner, devices))
        return key

    def instance_key(self, group_key, name):
        key = stable_key("instance", str(group_key), name)
        owner = self._instances.setdefault(key, (group_key, name))
        if owner != (group_key, name):
            raise RuntimeError("collective instance key collision between %r and %r"
                               % (owner, (group_key, name)))
        return key
