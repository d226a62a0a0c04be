"""Loads EPL's C++ op libraries (``epl/lib/``) when they were built.

``make setup`` builds ``libepl_ops.so`` from ``csrc/ops`` (CPU kernels, plus the
NCCL op definitions so NCCL graphs can be built anywhere) and, where CUDA and
NCCL headers exist, ``libepl_nccl_ops.so`` from ``csrc/nccl`` (GPU kernels
only). Without them every op has a pure TensorFlow fallback and GPU groups use
TF's collectives, so EPL works either way. ``EPL_DISABLE_OP_LIBRARY=1`` forces
the fallbacks for both (tests compare both paths).
"""
import logging
import os

from epl import tf_adapter

LOG = logging.getLogger("epl")
_BASE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib")


def _library_dir():
    """Where this TensorFlow's build is: a source tree holds TF1's in epl/lib/ and a later
    TF's in epl/lib/tf<major>/ (tools/build_ops.sh); an installed EPL has only its own
    TF's build, in epl/lib/."""
    own = os.path.join(_BASE_DIR, tf_adapter.OP_LIBRARY_SUBDIR)
    return own if os.path.exists(os.path.join(own, "libepl_ops.so")) else _BASE_DIR


LIB_DIR = _library_dir()
LIBRARY_PATH = os.path.join(LIB_DIR, "libepl_ops.so")
NCCL_LIBRARY_PATH = os.path.join(LIB_DIR, "libepl_nccl_ops.so")
STAMP = "built_for.txt"   # "tensorflow <version> <git version>", by tools/build_ops.sh
_STATE = {}


def load():
    """The loaded op module, or None (not built, disabled, or failed to load)."""
    if os.environ.get("EPL_DISABLE_OP_LIBRARY", "") not in ("", "0"):
        return None
    if "module" not in _STATE:
        _STATE["module"] = _load()
    return _STATE["module"]


def built_for(lib_dir):
    """The TensorFlow (``"<version> <git version>"``) the libraries of ``lib_dir`` were built
    for, from the ``built_for.txt`` that tools/build_ops.sh writes; None without one."""
    try:
        with open(os.path.join(lib_dir, STAMP)) as stamp:
            words = stamp.read().split()
    except OSError:
        return None
    return " ".join(words[1:]) if words[:1] == ["tensorflow"] else None


def this_tensorflow():
    tf = tf_adapter.tf
    return "%s %s" % (tf.version.VERSION, tf.version.GIT_VERSION)


def stale_reason(lib_dir):
    """Why the libraries of ``lib_dir`` must not be loaded into this TensorFlow, or None.

    A library built against another TensorFlow can load and then crash the process,
    not fail cleanly, so one without a record of its TensorFlow is not loaded either."""
    built, running = built_for(lib_dir), this_tensorflow()
    if built == running:
        return None
    return ("built for %s, but this is TensorFlow %s: not loaded. Rebuild it for this "
            "TensorFlow: pip install . again (or make setup in a source tree)"
            % ("TensorFlow %s" % built if built else "an unknown TensorFlow (no %s)" % STAMP,
               running))


def _load():
    if not os.path.exists(LIBRARY_PATH):
        LOG.warning("EPL op library not built (%s): collectives and gradient buffers use "
                    "TensorFlow's ops; `python -m epl.check_build` says why", LIBRARY_PATH)
        return None
    stale = stale_reason(LIB_DIR)
    if stale:
        _STATE["error"] = stale
        LOG.warning("EPL op library %s %s; using TensorFlow fallbacks", LIBRARY_PATH, stale)
        return None
    try:
        return tf_adapter.tf.load_op_library(LIBRARY_PATH)
    except Exception as err:  # a stale or ABI-mismatched build must not break EPL
        _STATE["error"] = str(err)
        LOG.warning("EPL op library %s failed to load (%s); using TensorFlow fallbacks",
                    LIBRARY_PATH, err)
        return None


def load_error(nccl=False):
    """Why the op library (or the NCCL kernels) failed to load, if it did."""
    return _STATE.get("nccl_error" if nccl else "error")


def load_nccl():
    """The loaded NCCL kernel library, or None (not built, disabled, or failed to load).

    Its kernels belong to op definitions in ``libepl_ops.so``, so that one is
    loaded first; without it the NCCL library is not loaded at all.
    """
    if load() is None:
        return None
    if "nccl" not in _STATE:
        _STATE["nccl"] = _load_nccl()
    return _STATE["nccl"]


def nccl_kernels_loaded():
    """True when EPL's NCCL GPU kernels are registered in this process."""
    return load_nccl() is not None


def _load_nccl():
    if not os.path.exists(NCCL_LIBRARY_PATH):
        LOG.debug("EPL NCCL kernels not built (%s); GPU groups use TF collectives",
                  NCCL_LIBRARY_PATH)
        return None
    try:
        return tf_adapter.tf.load_op_library(NCCL_LIBRARY_PATH)
    except Exception as err:  # e.g. libnccl or CUDA missing at run time: keep EPL working
        _STATE["nccl_error"] = str(err)
        LOG.warning("EPL NCCL kernels %s failed to load (%s); GPU groups use TF collectives",
                    NCCL_LIBRARY_PATH, err)
        return None
