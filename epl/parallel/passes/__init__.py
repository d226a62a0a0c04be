"""Rewrite passes of the core, one module each; their order is :data:`epl.parallel.rewriter.PASSES`.

The protocol (``Pass``, phases, ``check_order``, ``describe``) is :mod:`epl.protocols.passes`,
re-exported here for the core's passes.
"""
from epl.protocols.passes import (CLASSIFY, LOWER, MODEL, PHASES, REPLICATE,  # noqa: F401
                                  Pass, PassOrderError, check_order, describe)
