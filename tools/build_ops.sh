#!/usr/bin/env bash
# Build EPL's C++ op library into epl/lib/ with the flags of the installed TensorFlow.
#   libepl_ops.so        CPU kernels (fused pack/unpack), always attempted
#   libepl_nccl_ops.so   NCCL communicator ops, only where CUDA and NCCL headers exist
# A failed or skipped build is reported, never fatal: EPL falls back to pure TensorFlow.
# Usage: tools/build_ops.sh PYTHON [OUT_DIR]   (OUT_DIR defaults to epl/lib; setup.py's
# build_ext passes its build directory, see setup.py)
set -u
PY="${1:-python}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${2:-$ROOT/epl/lib}"
mkdir -p "$OUT"
# Every message also goes to build_status.txt, which `python -m epl.check_build` reports.
STATUS="$OUT/build_status.txt"
: > "$STATUS"
say() { echo "$*" | tee -a "$STATUS"; }
FLAGS="$("$PY" -c 'import tensorflow as tf; print(" ".join(tf.sysconfig.get_compile_flags() + tf.sysconfig.get_link_flags()))' 2>/dev/null)"
if [ -z "$FLAGS" ]; then
  say "build_ops: TensorFlow not importable with $PY; skipping the C++ op library"; exit 0
fi
CXX="${CXX:-g++}"
if ! command -v "$CXX" >/dev/null 2>&1; then
  say "build_ops: $CXX not found; skipping the C++ op library (EPL uses TF fallbacks)"; exit 0
fi
# -std=c++14 and TF's -D_GLIBCXX_USE_CXX11_ABI=0 (in FLAGS) are both required: without
# either, the build succeeds and tf.load_op_library fails with an undefined symbol.
# TF's own build defines EIGEN_MAX_ALIGN_BYTES=64 but tf.sysconfig does not pass it on;
# we define it so that our Eigen checks agree with TF's (csrc/ops/fused_buffer.cc).
FLAGS="$FLAGS -DEIGEN_MAX_ALIGN_BYTES=64"
if "$CXX" -std=c++14 -shared -fPIC -O3 "$ROOT"/csrc/ops/*.cc $FLAGS -lrt -o "$OUT/libepl_ops.so.tmp" \
    2>"$OUT/build.log"; then
  mv "$OUT/libepl_ops.so.tmp" "$OUT/libepl_ops.so"
  say "build_ops: built $OUT/libepl_ops.so"
else
  rm -f "$OUT/libepl_ops.so.tmp"
  say "build_ops: building the CPU op library failed (see $OUT/build.log); EPL uses TF fallbacks"
fi
bash "$ROOT/tools/build_nccl_ops.sh" "$PY" "$FLAGS" "$OUT" 2>&1 | tee -a "$STATUS"
exit 0
