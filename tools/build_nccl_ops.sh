#!/usr/bin/env bash
# Build csrc/nccl/ (NCCL collective kernels) into libepl_nccl_ops.so for GPU builds of TensorFlow.
# Compiled only when CUDA headers and nccl.h exist; otherwise skipped with a message.
# The op definitions are in libepl_ops.so (csrc/ops/nccl_op_defs.cc), built by build_ops.sh.
# Usage: tools/build_nccl_ops.sh PYTHON ["TF_FLAGS"] [OUT_DIR]
#   TF_FLAGS defaults to the installed TensorFlow's compile and link flags; OUT_DIR to epl/lib.
# Where headers and libraries are looked for, first match wins:
#   $EPL_CUDA_WHEELS (a `pip install --target` directory holding NVIDIA's nvidia-cuda-runtime-cu*,
#   nvidia-cuda-nvcc-cu* and nvidia-nccl-cu* wheels; tools/check_nccl.py sets it), $CUDA_HOME,
#   nvcc's CUDA, /usr/local/cuda, $NCCL_HOME, the system include dirs, and those wheels installed
#   in PYTHON's environment. Use the CUDA your TensorFlow was built with.
# Never fatal (make setup goes on without NCCL kernels) unless EPL_NCCL_STRICT=1: then a missing
# header or library or a failed compile exits 1 and prints why (make check-nccl).
# A previous libepl_nccl_ops.so is removed first, so epl/lib never keeps one built from other
# sources.
set -u
PY="$1"; FLAGS="${2:-}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${3:-$ROOT/epl/lib}"
STRICT="${EPL_NCCL_STRICT:-0}"
WHEELS="${EPL_CUDA_WHEELS:-}"
SRC=$(ls "$ROOT"/csrc/nccl/*.cc 2>/dev/null | grep -v '\.cu\.cc$')
[ -n "$SRC" ] || exit 0
rm -f "$OUT/libepl_nccl_ops.so"
give_up() {  # the reason; fatal only in strict mode
  echo "build_ops: $*"
  [ "$STRICT" = 1 ] && exit 1
  exit 0
}
CUDA_SRC=$(ls "$ROOT"/csrc/*/*.cu "$ROOT"/csrc/*/*.cu.cc 2>/dev/null)
if [ -n "$CUDA_SRC" ]; then
  give_up "skipping NCCL ops: CUDA sources ($(echo $CUDA_SRC | xargs -n1 basename | xargs))" \
    "need nvcc, which this script does not run yet (see docs/gpu.md)"
fi
find_dir() {  # first directory among the arguments that contains file $1
  local file="$1"; shift
  for dir in "$@"; do [ -n "$dir" ] && [ -e "$dir/$file" ] && { echo "$dir"; return 0; }; done
  return 1
}
find_lib() {  # "DIR FILE" of the first lib$1.so or lib$1.so.N in the directories given
  local name="$1"; shift
  for dir in "$@"; do
    [ -n "$dir" ] && [ -d "$dir" ] || continue
    for file in "$dir/lib$name.so" "$dir"/lib"$name".so.[0-9]*; do
      [ -e "$file" ] && { echo "$dir $(basename "$file")"; return 0; }
    done
  done
  return 1
}
wheel_dir() {  # nvidia/$1 of NVIDIA's wheels: in $EPL_CUDA_WHEELS, else in PYTHON's environment
  if [ -n "$WHEELS" ]; then
    [ -d "$WHEELS/nvidia/$1" ] && echo "$WHEELS/nvidia/$1"
    return 0
  fi
  "$PY" -c "import nvidia.$1 as m; print(list(m.__path__)[0])" 2>/dev/null || true
}
if [ -z "$FLAGS" ]; then
  FLAGS="$("$PY" -c 'import tensorflow as tf; print(" ".join(tf.sysconfig.get_compile_flags() + tf.sysconfig.get_link_flags()))' 2>/dev/null)"
  [ -n "$FLAGS" ] || give_up "skipping NCCL ops: TensorFlow not importable with $PY"
  case " $FLAGS " in  # as build_ops.sh does, see there
    *" -DEIGEN_MAX_ALIGN_BYTES="*) ;;
    *) FLAGS="$FLAGS -DEIGEN_MAX_ALIGN_BYTES=64" ;;
  esac
fi
case " $FLAGS " in  # TF 2.x names its standard (c++17) in FLAGS; TF 1.15 needs c++14
  *"-std=c++"*) ;;
  *) FLAGS="-std=c++14 $FLAGS" ;;
esac
W_RUNTIME="$(wheel_dir cuda_runtime)"; W_NVCC="$(wheel_dir cuda_nvcc)"; W_NCCL="$(wheel_dir nccl)"
NVCC="$(command -v nvcc || true)"
NVCC_CUDA="$( [ -n "$NVCC" ] && dirname "$(dirname "$(readlink -f "$NVCC")")")"
if [ -n "$WHEELS" ]; then  # a wheel directory is all that is searched: no mixing with other CUDAs
  CUDA_INC="$(find_dir cuda_runtime.h "${W_RUNTIME:+$W_RUNTIME/include}")"
  NCCL_INC="$(find_dir nccl.h "${W_NCCL:+$W_NCCL/include}")"
else
  CUDA_INC="$(find_dir cuda_runtime.h "${CUDA_HOME:-}/include" "${NVCC_CUDA:-}/include" \
    /usr/local/cuda/include "${W_RUNTIME:+$W_RUNTIME/include}")"
  NCCL_INC="$(find_dir nccl.h "${NCCL_HOME:-}/include" /usr/include /usr/local/include \
    "${W_NCCL:+$W_NCCL/include}")"
fi
if [ -z "$CUDA_INC" ] || [ -z "$NCCL_INC" ]; then
  give_up "skipping NCCL ops (GPU builds only): $( [ -z "$CUDA_INC" ] && echo 'CUDA headers (cuda_runtime.h)' || echo 'nccl.h') not found${WHEELS:+ in $WHEELS}"
fi
# cuda_runtime.h includes crt/host_config.h: in a toolkit's include dir, in the wheels under
# nvidia-cuda-nvcc-cu*'s include dir.
CRT_INC="$(find_dir crt/host_config.h "$CUDA_INC" "${W_NVCC:+$W_NVCC/include}")"
[ -n "$CRT_INC" ] || give_up "skipping NCCL ops: crt/host_config.h not found (CUDA's compiler headers; the nvidia-cuda-nvcc-cu* wheel has them)"
# CUDA 12's cuda_fp16.h includes <nv/target> (CCCL: in a toolkit's include dir, in the wheels
# under nvidia-cuda-cccl-cu12); CUDA 11 needs none.
W_CCCL="$(wheel_dir cuda_cccl)"
CCCL_INC="$(find_dir nv/target "$CUDA_INC" "${W_CCCL:+$W_CCCL/include}")"
CUDART="$(find_lib cudart "$CUDA_INC/../lib64" "$CUDA_INC/../lib" /usr/local/cuda/lib64 \
  /usr/lib/x86_64-linux-gnu)"
NCCL="$(find_lib nccl "$NCCL_INC/../lib" "$NCCL_INC/../lib64" /usr/lib/x86_64-linux-gnu \
  /usr/local/lib)"
if [ -z "$CUDART" ] || [ -z "$NCCL" ]; then
  give_up "skipping NCCL ops: $( [ -z "$CUDART" ] && echo 'libcudart.so' || echo 'libnccl.so') not found next to $( [ -z "$CUDART" ] && echo "$CUDA_INC" || echo "$NCCL_INC")"
fi
CUDA_LIB="$(cd "${CUDART% *}" && pwd)"; NCCL_LIB="$(cd "${NCCL% *}" && pwd)"
# TF's headers include CUDA as third_party/gpus/cuda/include/...: point that at CUDA_INC in a
# temporary include dir (never inside the installed TensorFlow).
SHIM="$(mktemp -d)"
trap 'rm -rf "$SHIM"' EXIT
mkdir -p "$SHIM/third_party/gpus/cuda"
ln -s "$(cd "$CUDA_INC" && pwd)" "$SHIM/third_party/gpus/cuda/include"
mkdir -p "$OUT"
CXX="${CXX:-g++}"
# TF's standard and ABI flags (in FLAGS), as for libepl_ops.so. The rpath
# finds libcudart and libnccl where they were linked; libcuda (the driver) is opened by libcudart
# only at the first CUDA call, so the library loads on machines without a GPU driver too.
CMD=("$CXX" -shared -fPIC -O2 -DGOOGLE_CUDA=1 -I"$SHIM" -I"$CUDA_INC" -I"$CRT_INC"
     ${CCCL_INC:+-I"$CCCL_INC"} -I"$NCCL_INC" $SRC $FLAGS
     -L"$CUDA_LIB" -l:"${CUDART#* }" -L"$NCCL_LIB" -l:"${NCCL#* }"
     -Wl,-rpath,"$NCCL_LIB" -Wl,-rpath,"$CUDA_LIB" -o "$OUT/libepl_nccl_ops.so.tmp")
[ "$STRICT" = 1 ] && echo "build_ops: ${CMD[*]}"
if "${CMD[@]}" 2>"$OUT/build_nccl.log"; then
  mv "$OUT/libepl_nccl_ops.so.tmp" "$OUT/libepl_nccl_ops.so"
  NCCL_VERSION="$(awk '/^#define NCCL_VERSION_CODE/ {print $3; exit}' "$NCCL_INC/nccl.h")"
  CUDART_VERSION="$(awk '/^#define CUDART_VERSION/ {print $3; exit}' "$CUDA_INC/cuda_runtime_api.h")"
  echo "build_ops: built $OUT/libepl_nccl_ops.so (NCCL $NCCL_VERSION, CUDA runtime" \
    "$CUDART_VERSION; runs only where a GPU exists)"
else
  rm -f "$OUT/libepl_nccl_ops.so.tmp"
  [ "$STRICT" = 1 ] && cat "$OUT/build_nccl.log"
  give_up "compiling NCCL ops failed (see $OUT/build_nccl.log)$( [ "$STRICT" = 1 ] || echo '; GPU collectives use TF')"
fi
exit 0
