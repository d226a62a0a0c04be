"""Loads EPL's C++ op library (``epl/lib/libepl_ops.so``) when it was built.

``make setup`` builds it from ``csrc/``; without it every op has a pure
TensorFlow fallback, so EPL works either way. ``EPL_DISABLE_OP_LIBRARY=1``
forces the fallbacks (tests compare both paths).
"""
import logging
import os

LOG = logging.getLogger("epl")
LIBRARY_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib",
                            "libepl_ops.so")
_STATE = {}


def load():
    """The loaded op module, or None (not built, disabled, or failed to load)."""
    if os.environ.get("EPL_DISABLE_OP_LIBRARY", "") not in ("", "0"):
        return None
    if "module" not in _STATE:
        _STATE["module"] = _load()
    return _STATE["module"]


def _load():
    if not os.path.exists(LIBRARY_PATH):
        LOG.debug("EPL op library not built (%s); using TensorFlow fallbacks", LIBRARY_PATH)
        return None
    from epl.tf_adapter import tf
    try:
        return tf.load_op_library(LIBRARY_PATH)
    except Exception as err:  # a stale or ABI-mismatched build must not break EPL
        LOG.warning("EPL op library %s failed to load (%s); using TensorFlow fallbacks",
                    LIBRARY_PATH, err)
        return None
