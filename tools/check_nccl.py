#!/usr/bin/env python
"""Compile, link and load EPL's NCCL kernels on a machine without a GPU (`make check-nccl`).

No GPU exists in development or CI, so the NCCL path (csrc/nccl/) would otherwise reach
its first GPU user never compiled. This check gets as close to a GPU build as a CPU
machine can:

1. installs NVIDIA's CUDA runtime, CUDA compiler headers and NCCL from their PyPI wheels
   into a build-only directory (``.cache/cuda/cu11``, reused while the pins are unchanged;
   never the project's .venv);
2. builds ``epl/lib/libepl_nccl_ops.so`` from every file of csrc/nccl/ against the installed
   TensorFlow's headers, linked to libcudart and libnccl, exactly as ``make setup`` does on a
   GPU host (tools/build_nccl_ops.sh, here in strict mode: any problem fails the check);
3. in a fresh process with no GPU visible and no LD_LIBRARY_PATH, loads it with
   ``tf.load_op_library`` and checks that every NCCL op has a GPU kernel for every type its
   definition allows, with the unique id in host memory; that EPL's own loader sees the
   kernels; and runs the one kernel that needs no GPU (EplNcclUniqueId's CPU kernel, which
   calls ncclGetUniqueId).

``--load`` runs step 3 alone, on whatever library ``make setup`` built (on a GPU host too).
Usage: python tools/check_nccl.py [--cuda 11|12] [--cache DIR] [--load]
"""
from __future__ import print_function

import argparse
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB_DIR = os.path.join(ROOT, "epl", "lib")
# Pinned wheels per CUDA major version. The -nvcc wheels hold no nvcc driver (only ptxas and
# the crt/ headers that cuda_runtime.h includes), which is all the host-only kernels need;
# CUDA 12's headers also include CCCL's <nv/target>.
WHEELS = {
    "11": ("nvidia-cuda-runtime-cu11==11.8.89", "nvidia-cuda-nvcc-cu11==11.8.89",
           "nvidia-nccl-cu11==2.21.5"),
    "12": ("nvidia-cuda-runtime-cu12==12.9.79", "nvidia-cuda-nvcc-cu12==12.9.86",
           "nvidia-cuda-cccl-cu12==12.9.27", "nvidia-nccl-cu12==2.32.3"),
}
STAMP = ".epl-wheels"


def say(message):
    print("check_nccl: %s" % message)
    sys.stdout.flush()


def fail(message):
    say("FAILED: %s" % message)
    sys.exit(1)


def install_wheels(cuda, cache):
    """The directory holding the pinned wheels of ``cuda``, installed once and reused."""
    target = os.path.join(cache, "cu%s" % cuda)
    wanted = "\n".join(WHEELS[cuda]) + "\n"
    stamp = os.path.join(target, STAMP)
    if os.path.exists(stamp) and open(stamp).read() == wanted:
        say("CUDA wheels cached in %s (%s)" % (os.path.relpath(target, ROOT),
                                               ", ".join(WHEELS[cuda])))
        return target
    fresh = target + ".tmp"
    shutil.rmtree(fresh, ignore_errors=True)
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
               "-q", "--target", fresh] + list(WHEELS[cuda])
    say("installing %s into %s" % (", ".join(WHEELS[cuda]), os.path.relpath(target, ROOT)))
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if proc.returncode:
        fail("pip could not install the CUDA wheels:\n%s" % proc.stdout.decode(errors="replace"))
    with open(os.path.join(fresh, STAMP), "w") as out:
        out.write(wanted)
    shutil.rmtree(target, ignore_errors=True)
    os.rename(fresh, target)
    return target


def build(wheels):
    """tools/build_nccl_ops.sh in strict mode, against ``wheels`` only."""
    env = dict(os.environ, EPL_NCCL_STRICT="1", EPL_CUDA_WHEELS=wheels)
    script = os.path.join(ROOT, "tools", "build_nccl_ops.sh")
    if subprocess.call(["bash", script, sys.executable, "", LIB_DIR], env=env):
        fail("building libepl_nccl_ops.so failed (the compiler's messages are above)")


def load_in_fresh_process():
    """Step 3 in a child process: no GPU visible, no LD_LIBRARY_PATH, nothing preloaded."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("LD_LIBRARY_PATH", None)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    if subprocess.call([sys.executable, os.path.abspath(__file__), "--load"], env=env):
        os.remove(os.path.join(LIB_DIR, "libepl_nccl_ops.so"))  # never leave a failed build
        say("removed epl/lib/libepl_nccl_ops.so")
        sys.exit(1)


def mapped_libraries(names):
    """{name: path} of the shared objects of this process whose file name starts with a name."""
    found = {}
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            base = os.path.basename(path)
            for name in names:
                if base.startswith(name + ".so"):
                    found.setdefault(name, path)
    return found


def allowed_types(op_def):
    """Types attr ``T`` allows (DataType enums), or None for an op without ``T``."""
    for attr in op_def.attr:
        if attr.name == "T":
            return set(attr.allowed_values.list.type)
    return None


def check_kernels(op_def, kernel_defs, dtype_name):
    """Problems with the GPU kernels of one op, and its one-line summary."""
    problems = []
    gpu = [k for k in kernel_defs if k.device_type == "GPU"]
    if not gpu:
        return ["%s has no GPU kernel" % op_def.name], "%s: no GPU kernel" % op_def.name
    args = set(a.name for a in list(op_def.input_arg) + list(op_def.output_arg))
    for kernel in gpu:
        if "unique_id" in args and "unique_id" not in kernel.host_memory_arg:
            problems.append("%s's GPU kernel keeps unique_id in device memory (the kernel "
                            "reads it on the host)" % op_def.name)
    types = [c.allowed_values.list.type[0] for k in gpu for c in k.constraint if c.name == "T"]
    wanted = allowed_types(op_def)
    if wanted is not None:
        missing = wanted - set(types)
        if missing:
            problems.append("%s has no GPU kernel for T in %s" % (
                op_def.name, sorted(dtype_name(t) for t in missing)))
        if len(types) != len(set(types)):
            problems.append("%s registers a GPU kernel twice for one type" % op_def.name)
    devices = sorted(set(k.device_type for k in kernel_defs))
    listed = " ".join(dtype_name(t) for t in sorted(types)) if types else "-"
    return problems, "%-22s devices %-8s GPU T: %s" % (op_def.name, ",".join(devices), listed)


def run_unique_id(ops, tf):
    """EplNcclUniqueId's CPU kernel: ncclGetUniqueId runs without a GPU."""
    with tf.Graph().as_default():
        with tf.device("/device:CPU:0"):
            first = ops.epl_nccl_unique_id(communicator="check/a")
            other = ops.epl_nccl_unique_id(communicator="check/b")
        with tf.Session() as sess:
            a1, a2, b = sess.run(first), sess.run(first), sess.run(other)
    if not a1.any() or (a1 != a2).any() or (a1 == b).all():
        fail("EplNcclUniqueId: expected a non-zero id, equal on every run of one communicator "
             "and distinct across communicators; got %s, %s, %s" % (a1, a2, b))
    say("ran EplNcclUniqueId on CPU (ncclGetUniqueId): stable per communicator, distinct "
        "across communicators")


def load_checks():
    """Step 3: load both libraries and check what they register."""
    import tensorflow.compat.v1 as tf
    # The kernel registry has no public API in TF 1.15; tools sit outside EPL's layers.
    from tensorflow.python.framework import kernels
    path = os.path.join(LIB_DIR, "libepl_nccl_ops.so")
    if not os.path.exists(path):
        fail("%s does not exist (make check-nccl builds it; make setup on a GPU host)" % path)
    ops = tf.load_op_library(os.path.join(LIB_DIR, "libepl_ops.so"))
    try:
        nccl = tf.load_op_library(path)
    except Exception as err:  # the reason is what this check is for
        fail("tf.load_op_library(%s): %s" % (path, err))
    gpus = tf.config.experimental.list_physical_devices("GPU")
    say("loaded %s with tf.load_op_library (TensorFlow %s, %d GPU(s) visible)"
        % (os.path.relpath(path, ROOT), tf.VERSION, len(gpus)))
    libs = mapped_libraries(("libcudart", "libnccl", "libcuda"))
    for name in ("libcudart", "libnccl"):
        if name not in libs:
            fail("%s is not loaded with libepl_nccl_ops.so" % name)
        say("  %s from %s" % (name, libs[name]))
    say("  libcuda (the driver): %s" % libs.get("libcuda", "not loaded (opened at the first "
                                                           "CUDA call)"))
    if list(nccl.OP_LIST.op):
        fail("libepl_nccl_ops.so defines ops %s; op definitions belong in libepl_ops.so"
             % [op.name for op in nccl.OP_LIST.op])
    op_defs = [op for op in ops.OP_LIST.op if op.name.startswith("EplNccl")]
    if not op_defs:
        fail("libepl_ops.so defines no EplNccl* op")
    dtype_name = lambda enum: tf.as_dtype(enum).name
    problems, gpu_kernels = [], 0
    for op_def in op_defs:
        registered = list(kernels.get_registered_kernels_for_op(op_def.name).kernel)
        found, line = check_kernels(op_def, registered, dtype_name)
        problems += found
        gpu_kernels += sum(1 for k in registered if k.device_type == "GPU")
        say("  " + line)
    if problems:
        fail("; ".join(problems))
    from epl.communicators import library
    if not library.nccl_kernels_loaded():
        fail("EPL's loader (epl.communicators.library) did not load the NCCL kernels")
    say("%d NCCL ops, %d GPU kernels registered; EPL's loader reports the NCCL kernels loaded"
        % (len(op_defs), gpu_kernels))
    run_unique_id(ops, tf)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cuda", choices=sorted(WHEELS), default="11",
                        help="CUDA major version of the wheels (default 11)")
    parser.add_argument("--cache", default=os.environ.get(
        "EPL_CUDA_CACHE", os.path.join(ROOT, ".cache", "cuda")),
        help="where the wheels are installed (default .cache/cuda, or $EPL_CUDA_CACHE)")
    parser.add_argument("--load", action="store_true",
                        help="only load and check epl/lib/libepl_nccl_ops.so as built")
    args = parser.parse_args()
    if args.load:
        load_checks()
        return
    start = time.time()
    wheels = install_wheels(args.cuda, os.path.abspath(args.cache))
    installed = time.time()
    build(wheels)
    built = time.time()
    load_in_fresh_process()
    say("OK in %.1f s (wheels %.1f s, compile and link %.1f s, load and check %.1f s)"
        % (time.time() - start, installed - start, built - installed, time.time() - built))


if __name__ == "__main__":
    main()
