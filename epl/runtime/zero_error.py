"""The error ZeRO raises (its own module: ZeRO's checkpoint support raises it too, and
``epl.runtime.zero`` imports that support)."""


class ZeroError(ValueError):
    """ZeRO cannot partition this program as asked."""
