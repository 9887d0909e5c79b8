#!/usr/bin/env bash
# Builds pyg_multihead_agg/_C.abi3.so on this CPU machine for the GPU machine's
# torch (2.11.0+cu130, sm_90a), with the flags its setup.py build uses there,
# so that a device call can skip its build: carry the .so
# (`carry: ["pyg_multihead_agg/_C.abi3.so"]`) and run with PYTHONPATH=$PWD
# (scripts/sanitize.sh with SANITIZE_BUILD=0). Needs nvcc 13.x and the torch
# wheel of the device's version (headers and the five libraries it links
# against); the .so is abi3 (Python >= 3.10), so the local Python's headers do.
#   scripts/cross_build_device.sh [TORCH_VERSION (default 2.11.0)]
# Afterwards a local CPU build must be restored (`pip install -e .`), unless
# OUT_SO puts the .so elsewhere.
# For a device call: OUT_SO=.device/prebuilt/_C.abi3.so.xz, carry
# .device/prebuilt, run `PREBUILT=1 bash scripts/gpu_check.sh ...` (about
# 2 minutes of device time less than building there).
# Env: MAX_JOBS (parallel nvcc processes, default nproc), NVCC_EXTRA (more
# nvcc flags), REBUILD (the sources to compile: .cu files by path under
# csrc/cuda without .cu, e.g. "spmm/entry attention/row_sum", .cpp files by
# path under csrc without .cpp, e.g. "autograd cpu/transformer_attention";
# the other objects are taken from OBJ_DIR as they are), OBJ_DIR (default
# $WORK/obj) and OUT_SO
# (default the package's .so).
set -euo pipefail
VER="${1:-2.11.0}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${CROSS_BUILD_DIR:-/tmp/cross_build_$VER}"
O="${OBJ_DIR:-$WORK/obj}"; mkdir -p "$O"
OUT_SO="${OUT_SO:-}"; REBUILD="${REBUILD:-all}"
if [ ! -d "$WORK/torch/include" ]; then
  pip download "torch==$VER" --no-deps -d "$WORK/wheel"
  (cd "$WORK" && unzip -q -o wheel/torch-"$VER"-*.whl 'torch/include/*' 'torch/lib/libc10.so' \
    'torch/lib/libtorch.so' 'torch/lib/libtorch_cpu.so' 'torch/lib/libc10_cuda.so' \
    'torch/lib/libtorch_cuda.so')
fi
T="$WORK/torch"
PY="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
CUDA="${CUDA_HOME:-/usr/local/cuda}"
INC="-I$T/include -I$T/include/torch/csrc/api/include -I$CUDA/include -I$PY"
DEF="-DWITH_CUDA -DTORCH_API_INCLUDE_EXTENSION_H -DPy_LIMITED_API=0x030A0000 -DTORCH_EXTENSION_NAME=_C"
CXXF="-fno-strict-overflow -DNDEBUG -O3 -fPIC -std=c++17 -D_GLIBCXX_USE_CXX11_ABI=1"
NVF="-D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__"
NVF="$NVF -D__CUDA_NO_HALF2_OPERATORS__ --expt-relaxed-constexpr --compiler-options -fPIC -O3"
NVF="$NVF -lineinfo -gencode=arch=compute_90a,code=sm_90a -ccbin /usr/bin/gcc -std=c++17"
NVF="$NVF ${NVCC_EXTRA:-}"
cd "$ROOT"
OUT_SO="${OUT_SO:-$ROOT/pyg_multihead_agg/_C.abi3.so}"
[ "$REBUILD" = all ] && rm -f "$O"/*.o
JOBS="${MAX_JOBS:-$(nproc)}"
# One object per .cu, named by its path (csrc/cuda/spmm/entry.cu -> cuda_spmm_entry.o).
cu=()
for f in csrc/cuda/*/*.cu; do
  name="${f#csrc/cuda/}"; name="${name%.cu}"
  [ "$REBUILD" = all ] || [[ " $REBUILD " == *" $name "* ]] || continue
  cu+=("$f")
done
nvcc_one() {
  local f="$1" name="${1#csrc/cuda/}"
  name="${name%.cu}"
  # shellcheck disable=SC2086
  "$CUDA/bin/nvcc" $INC -c "$f" -o "$O/cuda_${name//\//_}.o" $NVF $DEF
}
export -f nvcc_one
export CUDA INC NVF DEF O
if [ ${#cu[@]} -gt 0 ]; then
  printf '%s\n' "${cu[@]}" | xargs -P "$JOBS" -I{} bash -c 'nvcc_one "$1"' _ {} &
  nvcc_pid=$!
fi
# The C++ sources (the CPU kernels, the schemas and the test hook's registry).
for f in csrc/*.cpp csrc/cpu/*.cpp; do
  name="${f#csrc/}"; name="${name%.cpp}"
  [ "$REBUILD" = all ] || [[ " $REBUILD " == *" $name "* ]] || continue
  # shellcheck disable=SC2086
  g++ $CXXF $INC $DEF -c "$f" -o "$O/$(echo "${f#csrc/}" | tr / _ | sed 's/\.cpp$//').o"
done
if [ -n "${nvcc_pid:-}" ]; then wait "$nvcc_pid"; fi
# An OUT_SO ending in .xz is written compressed: the .so (about 95 MB) is
# over the device tool's 64 MiB carry limit, its xz about 9 MB
# (scripts/gpu_check.sh with PREBUILT=1 unpacks .device/prebuilt/_C.abi3.so.xz).
LINK_TO="$OUT_SO"; [[ "$OUT_SO" == *.xz ]] && LINK_TO="$O/_C.abi3.so"
g++ -shared -Wl,-O1 -Wl,-Bsymbolic-functions "$O"/*.o -L"$T/lib" -L"$CUDA/lib64" -lc10 -ltorch \
  -ltorch_cpu -lcudart -lc10_cuda -ltorch_cuda -o "$LINK_TO"
if [ "$LINK_TO" != "$OUT_SO" ]; then
  mkdir -p "$(dirname "$OUT_SO")" && xz -T0 -6 -c "$LINK_TO" > "$OUT_SO" && rm -f "$LINK_TO"
fi
echo "built $OUT_SO for torch $VER (sm_90a)"
