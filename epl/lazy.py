"""Lazy exports for EPL's packages.

``epl``, ``epl.ir`` and ``epl.profiler`` name their public objects in a table and
load each one on first access (PEP 562), so that ``epl-launch``, the plan printer
and the pure memory estimate start without importing TensorFlow or matplotlib.
One helper keeps the three packages' behaviour identical (the error text, caching
the loaded value in the package, ``dir()``). Base floor: imports nothing of EPL.
"""
import importlib


def lazy_exports(package, exports, namespace, extra=()):
    """(``__getattr__``, ``__dir__``, ``__all__``) for ``package``.

    ``exports`` maps a public name to the module that defines it; ``namespace`` is
    the package's ``globals()``, where a loaded value is cached so that the next
    access is a plain attribute read. ``extra`` names attributes defined eagerly.
    """
    public = sorted(exports) + list(extra)

    def __getattr__(name):
        module = exports.get(name)
        if module is None:
            raise AttributeError("module %r has no attribute %r" % (package, name))
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__():
        return public

    return __getattr__, __dir__, public
