"""The per-thread stack of strategy scopes.

Only one scope may be active at a time (the seeds forbid nesting); a default
strategy set with ``set_default_strategy`` applies when no scope is active.
Each scope entry or default change is a *segment* with a fresh id; the IR turns
the segment of each new op into that op's TaskGraph. Thread-local so that
in-process multi-worker tests can build one graph per worker thread.
"""
import collections
import threading


class StrategyError(ValueError, RuntimeError):
    """Invalid strategy arguments or scope usage.

    Both a ValueError and a RuntimeError: code written for the original EPL
    catches RuntimeError for nested scopes."""


Segment = collections.namedtuple("Segment", ["id", "strategy", "is_default"])


class StrategyContext(object):
    """Tracks the active scope and the default strategy of one thread."""

    def __init__(self):
        self._active = None
        self._default = None
        self._ids = {}          # id(strategy) -> (segment id, strategy kept alive)

    def _new_segment(self, strategy, is_default):
        """A segment of ``strategy``; entering the same strategy object again (or a
        scope of the default strategy) continues its TaskGraph, as the seeds say
        each strategy defines one TaskGraph."""
        known = self._ids.get(id(strategy))
        if known is None:
            known = self._ids[id(strategy)] = (len(self._ids), strategy)
        return Segment(known[0], strategy, is_default)

    def enter(self, strategy):
        if self._active is not None:
            raise StrategyError(
                "strategy scopes cannot be nested: entering %r inside %r. Close the outer "
                "scope first; each scope defines its own TaskGraph." % (
                    strategy, self._active.strategy))
        self._active = self._new_segment(strategy, False)

    def exit(self, strategy):
        if self._active is None or self._active.strategy is not strategy:
            raise StrategyError("exiting %r, which is not the active strategy scope" % (strategy,))
        self._active = None

    def set_default(self, strategy):
        if self._active is not None:
            raise StrategyError("set_default_strategy(%r) called inside the scope of %r"
                                % (strategy, self._active.strategy))
        self._default = self._new_segment(strategy, True)
        return self._default

    @property
    def current(self):
        """The segment new ops belong to, or None outside every scope."""
        return self._active if self._active is not None else self._default

    @property
    def default(self):
        return self._default


_LOCAL = threading.local()


def get_context():
    """This thread's strategy context (created on first use)."""
    ctx = getattr(_LOCAL, "context", None)
    if ctx is None:
        ctx = _LOCAL.context = StrategyContext()
    return ctx


def reset_context():
    """Forget all scopes and defaults of this thread (used by ``epl.init``)."""
    _LOCAL.context = StrategyContext()
    return _LOCAL.context
