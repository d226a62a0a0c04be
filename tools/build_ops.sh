#!/usr/bin/env bash
# Build EPL's C++ op library into epl/lib/ with the flags of the installed TensorFlow.
#   libepl_ops.so        CPU kernels (fused pack/unpack), always attempted
#   libepl_nccl_ops.so   NCCL communicator ops, only where CUDA and NCCL headers exist
# A failed or skipped build is reported, never fatal: EPL falls back to pure TensorFlow.
# Usage: tools/build_ops.sh PYTHON [OUT_DIR]   (setup.py's build_ext passes its build directory,
# see setup.py). OUT_DIR defaults to epl/lib for TensorFlow 1 and to epl/lib/tf<major> for later
# TensorFlows, so a TF1 and a TF2 environment sharing one source tree (.venv and .venv-tf2) each
# keep their own build; epl/communicators/library.py looks there first.
# A library is only ever used with the TensorFlow it was built for: OUT's previous libraries are
# removed first (a skipped or failed build leaves none, never one built for another environment's
# TensorFlow: a second `pip install .` from the same tree reuses build/), and a new one is stamped
# with its TensorFlow's version in built_for.txt, which epl/communicators/library.py checks before
# loading it.
set -u
PY="${1:-python}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TF_ID="$("$PY" -c 'import tensorflow as tf; print(tf.version.VERSION, tf.version.GIT_VERSION)' 2>/dev/null)"
TF_MAJOR="${TF_ID%%.*}"
if [ "${TF_MAJOR:-1}" = "1" ]; then OUT="${2:-$ROOT/epl/lib}"; else OUT="${2:-$ROOT/epl/lib/tf$TF_MAJOR}"; fi
mkdir -p "$OUT"
rm -f "$OUT/libepl_ops.so" "$OUT/libepl_nccl_ops.so" "$OUT/built_for.txt"
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
# The C++ standard and the ABI must be TF's: TF 1.15 needs -std=c++14 with its
# -D_GLIBCXX_USE_CXX11_ABI=0 (in FLAGS); without either, the build succeeds and
# tf.load_op_library fails with an undefined symbol. TF 2.x passes its own --std=c++17 and
# ABI flag in FLAGS. TF 1.15's build defines EIGEN_MAX_ALIGN_BYTES=64 but tf.sysconfig does
# not pass it on (2.x does); we define it so that our Eigen checks agree with TF's
# (csrc/ops/fused_buffer.cc).
case " $FLAGS " in
  *"-std=c++"*) ;;
  *) FLAGS="-std=c++14 $FLAGS" ;;
esac
case " $FLAGS " in
  *" -DEIGEN_MAX_ALIGN_BYTES="*) ;;
  *) FLAGS="$FLAGS -DEIGEN_MAX_ALIGN_BYTES=64" ;;
esac
if "$CXX" -shared -fPIC -O3 "$ROOT"/csrc/ops/*.cc $FLAGS -lrt -o "$OUT/libepl_ops.so.tmp" \
    2>"$OUT/build.log"; then
  mv "$OUT/libepl_ops.so.tmp" "$OUT/libepl_ops.so"
  echo "tensorflow $TF_ID" > "$OUT/built_for.txt"
  say "build_ops: built $OUT/libepl_ops.so for TensorFlow $TF_ID"
else
  rm -f "$OUT/libepl_ops.so.tmp"
  say "build_ops: building the CPU op library failed (see $OUT/build.log); EPL uses TF fallbacks"
fi
bash "$ROOT/tools/build_nccl_ops.sh" "$PY" "$FLAGS" "$OUT" 2>&1 | tee -a "$STATUS"
exit 0
