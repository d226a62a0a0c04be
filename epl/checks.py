"""The one place EPL checks counts (device counts, micro-batches, stages, splits).

A count is an int (numpy ints included) but never a bool (True is not a
count), at least ``minimum``. Every layer raises its own error class so that
callers can catch what they expect, with one message shape:
``"<what> must be an integer >= <minimum>, got <value>"``.
"""
import numbers


def is_integer(value):
    """True for ints and numpy ints, but not bools."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_count(value, minimum=1):
    """True for an integer (not a bool) that is at least ``minimum``."""
    return is_integer(value) and value >= minimum


def check_count(value, what, error=ValueError, minimum=1):
    """Return ``int(value)``, or raise ``error`` naming ``what`` and the value."""
    if not is_count(value, minimum):
        raise error("%s must be an integer >= %d, got %r" % (what, minimum, value))
    return int(value)
