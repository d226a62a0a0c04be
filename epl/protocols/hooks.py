"""A small, reversible registry of the places where EPL intercepts TensorFlow.

Each :class:`Patch` names a target ``(owner, attribute)`` from
:mod:`epl.tf_adapter` and a function that builds the wrapper from the original.
``install()`` applies every patch once (a second ``epl.init`` never
double-wraps); ``uninstall()`` restores the originals exactly.
"""
import collections
import threading

Patch = collections.namedtuple("Patch", ["concern", "target", "make_wrapper"])


class HookRegistry(object):
    """Installs and removes a fixed list of patches; idempotent both ways."""

    def __init__(self, patches):
        self._patches = list(patches)
        self._originals = {}
        self._lock = threading.Lock()

    @property
    def installed(self):
        return bool(self._originals)

    def install(self):
        with self._lock:
            if self._originals:
                return False
            for patch in self._patches:
                owner, attr = patch.target
                original = _own_attribute(owner, attr)
                self._originals[patch.target] = original
                wrapper = patch.make_wrapper(_unwrap(getattr(owner, attr)
                                                     if original is _INHERITED else original))
                setattr(owner, attr, _rewrap(original, wrapper))
            return True

    def uninstall(self):
        with self._lock:
            for (owner, attr), original in self._originals.items():
                if original is _INHERITED:
                    delattr(owner, attr)
                else:
                    setattr(owner, attr, original)
            self._originals.clear()

    def concerns(self):
        return sorted(set(p.concern for p in self._patches))


# A class attribute the class inherits (TF 2.x's Graph._add_op lives in its C++ base class):
# the wrapper is set on the class itself, and uninstall deletes it again.
_INHERITED = object()


def _own_attribute(owner, attr):
    """``owner``'s own attribute (a class's descriptor, not the bound lookup), or _INHERITED."""
    if not isinstance(owner, type):
        return getattr(owner, attr)
    if attr in owner.__dict__:
        return owner.__dict__[attr]
    getattr(owner, attr)  # AttributeError names the missing target
    return _INHERITED


def _unwrap(attribute):
    """Plain function behind a staticmethod/classmethod descriptor."""
    if isinstance(attribute, (staticmethod, classmethod)):
        return attribute.__func__
    return attribute


def _rewrap(original, wrapper):
    if isinstance(original, staticmethod):
        return staticmethod(wrapper)
    if isinstance(original, classmethod):
        return classmethod(wrapper)
    return wrapper
