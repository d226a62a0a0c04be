"""``python -m epl.check_build`` (or ``epl-launch --check-build``): what this EPL can use.

In the spirit of ``horovodrun --check-build``: one command that says which
TensorFlow EPL runs on, whether its C++ op library is loaded (or why not), which
collective backends a group of CPU or GPU devices gets, and which devices a
worker has. A user who installed EPL into their own TensorFlow environment learns
at once whether the install built the library::

    $ python -m epl.check_build
    EPL 0.1.0 (/site-packages/epl), Python 3.7.16
    TensorFlow 1.15.5 (distribution tensorflow 1.15.5; CUDA build: no)
    Op library:   [X] loaded (/site-packages/epl/lib/libepl_ops.so)
    NCCL kernels: [ ] not built: GPU builds only (CUDA headers not found)
    ...

The exit status is 0 when TensorFlow imports (EPL can run), 1 otherwise.
"""
import os
import platform
import sys

from epl.version import INSTALL_TENSORFLOW

DISTRIBUTIONS = ("tensorflow", "tensorflow-gpu", "tensorflow-cpu", "nvidia-tensorflow",
                 "intel-tensorflow")


def _mark(ok):
    return "[X]" if ok else "[ ]"


def _distribution():
    """(name, version) of the pip distribution that provides ``tensorflow``, or None."""
    try:
        import pkg_resources
    except ImportError:  # pragma: no cover - setuptools is everywhere pip is
        return None
    for name in DISTRIBUTIONS:
        try:
            return name, pkg_resources.get_distribution(name).version
        except pkg_resources.DistributionNotFound:
            continue
    return None


def tensorflow_line():
    """(line, tf module or None)."""
    try:
        import tensorflow as tf_module
    except Exception as err:  # ImportError, or protobuf's errors on a bad install
        return ("TensorFlow: NOT importable (%s: %s): %s"
                % (type(err).__name__, err, INSTALL_TENSORFLOW)), None
    dist = _distribution()
    cuda = tf_module.test.is_built_with_cuda()
    return ("TensorFlow %s (distribution %s; CUDA build: %s)"
            % (tf_module.__version__, "%s %s" % dist if dist else "unknown",
               "yes" if cuda else "no")), tf_module


def _build_status(lib_dir, keyword):
    """The install's own words about the part of the build named by ``keyword``."""
    path = os.path.join(lib_dir, "build_status.txt")
    if not os.path.exists(path):
        return None
    with open(path) as status:
        lines = [line.strip() for line in status if keyword in line.lower()]
    return lines[-1].replace("build_ops: ", "") if lines else None


def library_lines(library):
    """Op library and NCCL kernels: loaded, or why not."""
    if os.environ.get("EPL_DISABLE_OP_LIBRARY", "") not in ("", "0"):
        reason = "disabled by EPL_DISABLE_OP_LIBRARY=%s" % os.environ["EPL_DISABLE_OP_LIBRARY"]
        return ["Op library:   [ ] %s" % reason, "NCCL kernels: [ ] %s" % reason]
    lines = []
    for label, path, loaded, error, keyword, hint in (
            ("Op library:  ", library.LIBRARY_PATH, library.load() is not None,
             library.load_error(), "op library",
             "build it with a C++ compiler present: pip install . (or make setup)"),
            ("NCCL kernels:", library.NCCL_LIBRARY_PATH, library.nccl_kernels_loaded(),
             library.load_error(nccl=True), "nccl",
             "GPU builds only: needs CUDA and NCCL headers when EPL is installed")):
        if loaded:
            lines.append("%s [X] loaded (%s)" % (label, path))
        elif os.path.exists(path):
            lines.append("%s [ ] failed to load (%s): %s" % (label, path, error))
        else:
            why = _build_status(library.LIB_DIR, keyword) or hint
            lines.append("%s [ ] not built (%s): %s" % (label, path, why))
    return lines


def backend_lines(library):
    """Which backend a group of CPU devices and a group of GPU devices get."""
    from epl.communicators import ring
    try:
        choice = ring.backend_choice()
    except ValueError as err:
        return ["Backends:     %s" % err]
    ops = library.load() is not None
    nccl = library.nccl_kernels_loaded()
    return [
        "Backends (EPL_COLLECTIVE_BACKEND=%s):" % choice,
        "  %s epl_ring     CPU groups: EPL's TCP/shared-memory ring%s"
        % (_mark(ops and choice != "tf"), "" if ops else " (needs the op library)"),
        "  %s nccl         GPU groups%s"
        % (_mark(nccl and choice != "tf"), "" if nccl else " (needs the NCCL kernels)"),
        "  [X] tf           TensorFlow collective ops: every other group",
    ]


def device_line():
    from epl.cluster import ClusterError, VIRTUAL_DEVICES_ENV, local_devices
    try:
        count, kind = local_devices("")
    except ClusterError as err:
        return "Devices:      %s" % err
    if kind == "GPU":
        return "Devices:      %d GPU(s) per worker" % count
    return ("Devices:      no GPU; %d virtual CPU device(s) per worker (%s=%s)"
            % (count, VIRTUAL_DEVICES_ENV, os.environ.get(VIRTUAL_DEVICES_ENV, "unset: 1")))


def report():
    """(lines, exit status)."""
    import epl
    lines = ["EPL %s (%s), Python %s (%s)" % (epl.VERSION, os.path.dirname(epl.__file__),
                                              platform.python_version(), sys.executable)]
    tf_line, tf_module = tensorflow_line()
    lines.append(tf_line)
    if tf_module is None:
        return lines, 1
    from epl.communicators import library
    lines += library_lines(library) + backend_lines(library) + [device_line()]
    return lines, 0


def main():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import logging
    logging.getLogger("epl").setLevel(logging.ERROR)  # the report says it all
    lines, status = report()
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    sys.exit(main())
