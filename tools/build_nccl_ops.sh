#!/usr/bin/env bash
# Build csrc/nccl/ (NCCL collective kernels) into libepl_nccl_ops.so for GPU builds of TensorFlow.
# Compiled only when CUDA headers and nccl.h exist; otherwise skipped with a message. Never fatal.
# The op definitions are in libepl_ops.so (csrc/ops/nccl_op_defs.cc), built by build_ops.sh.
# Usage: tools/build_nccl_ops.sh PYTHON "TF_FLAGS" [OUT_DIR]   (OUT_DIR defaults to epl/lib)
# Finds headers/libraries in $CUDA_HOME, nvcc's CUDA, /usr/local/cuda, $NCCL_HOME, the system
# include dirs and the nvidia-nccl-cu* wheel. Use the CUDA your TensorFlow was built with.
set -u
PY="$1"; FLAGS="$2"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${3:-$ROOT/epl/lib}"
SRC=$(ls "$ROOT"/csrc/nccl/*.cc 2>/dev/null)
[ -n "$SRC" ] || exit 0
find_dir() {  # first directory among the arguments that contains file $1
  local file="$1"; shift
  for dir in "$@"; do [ -n "$dir" ] && [ -e "$dir/$file" ] && { echo "$dir"; return 0; }; done
  return 1
}
NVCC="$(command -v nvcc || true)"
NVCC_CUDA="$( [ -n "$NVCC" ] && dirname "$(dirname "$(readlink -f "$NVCC")")")"
CUDA_INC="$(find_dir cuda_runtime.h "${CUDA_HOME:-}/include" "${NVCC_CUDA:-}/include" \
  /usr/local/cuda/include)"
PY_NCCL="$("$PY" -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)"
NCCL_INC="$(find_dir nccl.h "${NCCL_HOME:-}/include" /usr/include /usr/local/include \
  "${PY_NCCL:+$PY_NCCL/include}")"
if [ -z "$CUDA_INC" ] || [ -z "$NCCL_INC" ]; then
  echo "build_ops: skipping NCCL ops (GPU builds only): $( [ -z "$CUDA_INC" ] && echo 'CUDA headers' || echo 'nccl.h') not found"
  exit 0
fi
CUDA_LIB="$(find_dir libcudart.so "$CUDA_INC/../lib64" "$CUDA_INC/../lib" /usr/local/cuda/lib64 \
  /usr/lib/x86_64-linux-gnu)"
NCCL_LIB="$(find_dir libnccl.so.2 "$NCCL_INC/../lib" "$NCCL_INC/../lib64" /usr/lib/x86_64-linux-gnu \
  /usr/local/lib)"
if [ -z "$CUDA_LIB" ] || [ -z "$NCCL_LIB" ]; then
  echo "build_ops: skipping NCCL ops: $( [ -z "$CUDA_LIB" ] && echo 'libcudart.so' || echo 'libnccl.so.2') not found"
  exit 0
fi
# TF's headers include CUDA as third_party/gpus/cuda/include/...: point that at CUDA_INC in a
# temporary include dir (never inside the installed TensorFlow).
SHIM="$(mktemp -d)"
trap 'rm -rf "$SHIM"' EXIT
mkdir -p "$SHIM/third_party/gpus/cuda"
ln -s "$(cd "$CUDA_INC" && pwd)" "$SHIM/third_party/gpus/cuda/include"
mkdir -p "$OUT"
CXX="${CXX:-g++}"
# -std=c++14 plus TF's -D_GLIBCXX_USE_CXX11_ABI=0 (in FLAGS), as for libepl_ops.so.
if "$CXX" -std=c++14 -shared -fPIC -O2 -DGOOGLE_CUDA=1 -I"$SHIM" -I"$CUDA_INC" -I"$NCCL_INC" \
    $SRC $FLAGS -L"$CUDA_LIB" -lcudart -L"$NCCL_LIB" -l:libnccl.so.2 \
    -Wl,-rpath,"$NCCL_LIB" -Wl,-rpath,"$CUDA_LIB" \
    -o "$OUT/libepl_nccl_ops.so.tmp" 2>"$OUT/build_nccl.log"; then
  mv "$OUT/libepl_nccl_ops.so.tmp" "$OUT/libepl_nccl_ops.so"
  echo "build_ops: built $OUT/libepl_nccl_ops.so (NCCL $(grep -m1 '^#define NCCL_VERSION_CODE' "$NCCL_INC/nccl.h" | awk '{print $3}'); runs only where a GPU exists)"
else
  rm -f "$OUT/libepl_nccl_ops.so.tmp"
  echo "build_ops: compiling NCCL ops failed (see $OUT/build_nccl.log); GPU collectives use TF"
fi
exit 0
