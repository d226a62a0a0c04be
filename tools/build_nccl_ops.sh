#!/usr/bin/env bash
# Build csrc/nccl/ (NCCL communicator ops) for GPU builds of TensorFlow.
# Compiled only when CUDA headers and nccl.h exist; otherwise skipped with a message.
# Usage: tools/build_nccl_ops.sh PYTHON "TF_FLAGS"
set -u
PY="$1"; FLAGS="$2"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$ROOT/epl/lib"
SRC=$(ls "$ROOT"/csrc/nccl/*.cc 2>/dev/null)
[ -n "$SRC" ] || exit 0
find_dir() {  # first directory among the arguments that contains file $1
  local file="$1"; shift
  for dir in "$@"; do [ -n "$dir" ] && [ -f "$dir/$file" ] && { echo "$dir"; return 0; }; done
  return 1
}
NVCC="$(command -v nvcc || true)"
CUDA_INC="$(find_dir cuda_runtime.h "${CUDA_HOME:-}/include" \
  "$( [ -n "$NVCC" ] && dirname "$(dirname "$NVCC")")/include" /usr/local/cuda/include)"
PY_NCCL="$("$PY" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "include"))' 2>/dev/null || true)"
NCCL_INC="$(find_dir nccl.h "${NCCL_HOME:-}/include" /usr/include /usr/local/include "$PY_NCCL")"
if [ -z "$CUDA_INC" ] || [ -z "$NCCL_INC" ]; then
  echo "build_ops: skipping NCCL ops (GPU builds only): $( [ -z "$CUDA_INC" ] && echo 'CUDA headers' || echo 'nccl.h') not found"
  exit 0
fi
CXX="${CXX:-g++}"
if "$CXX" -std=c++14 -shared -fPIC -O2 -DGOOGLE_CUDA=1 -I"$CUDA_INC" -I"$NCCL_INC" $SRC $FLAGS \
    -o "$OUT/libepl_nccl_ops.so.tmp" 2>"$OUT/build_nccl.log"; then
  mv "$OUT/libepl_nccl_ops.so.tmp" "$OUT/libepl_nccl_ops.so"
  echo "build_ops: built epl/lib/libepl_nccl_ops.so (loads only where libnccl and a GPU exist)"
else
  rm -f "$OUT/libepl_nccl_ops.so.tmp"
  echo "build_ops: compiling NCCL ops failed (see epl/lib/build_nccl.log); GPU collectives use TF"
fi
