#!/usr/bin/env bash
# Builds the CPU operators of torch-sparse (what PyG's NeighborLoader samples
# with when pyg-lib is absent) and of torch-scatter (which torch-sparse
# imports) on this CPU machine for the GPU machine's Python and torch, so that
# a device call need not build them there (several minutes of device time):
# carry the output folder and put it on PYTHONPATH (scripts/ogb_device.sh
# does, from SAMPLER_SITE).
#   scripts/build_sampler_device.sh SDIST OUT_DIR     (once per package)
# SDIST: a source archive (`pip download --no-deps --no-build-isolation
# --no-binary :all: torch-sparse==0.6.18` or `torch-scatter==2.1.2`); OUT_DIR
# gets the package (its Python files and one _<name>_cpu.so per operator
# library).
# Env: TORCH_DIR (the device torch's headers and libraries, unpacked from its
# wheel by scripts/cross_build_device.sh; default /tmp/cross_build_2.11.0/torch),
# PY_INCLUDE (the device Python's headers, default a local 3.12's: python3.12
# or pyenv's), JOBS
# (parallel compilers, default nproc).
set -euo pipefail
SDIST="${1:?usage: scripts/build_sampler_device.sh SDIST OUT_DIR}"
DEST="${2:?usage: scripts/build_sampler_device.sh SDIST OUT_DIR}"
T="${TORCH_DIR:-/tmp/cross_build_2.11.0/torch}"
PYI="${PY_INCLUDE:-$(python3.12 -c 'import sysconfig; print(sysconfig.get_paths()["include"])' \
  2> /dev/null || ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/include/python3.12 | head -1)}"
[ -f "$PYI/Python.h" ] || { echo "no Python 3.12 headers (set PY_INCLUDE)" >&2; exit 1; }
for lib in libc10 libtorch libtorch_cpu libtorch_python; do
  [ -e "$T/lib/$lib.so" ] || { echo "missing $T/lib/$lib.so (unpack it from the torch wheel)" >&2; exit 1; }
done
WORK="$(mktemp -d)"; trap 'rm -rf "$WORK"' EXIT
tar xzf "$SDIST" -C "$WORK"
S="$(ls -d "$WORK"/torch_s*-*)"
PKG="$(basename "$S" | sed 's/-[0-9].*$//')"  # torch_sparse or torch_scatter
OUT="$DEST/$PKG"
mkdir -p "$OUT" "$WORK/obj"
cp -r "$S/$PKG/." "$OUT/"
# The flags of torch-sparse's setup.py for a CPU build, with torch's ABI.
FLAGS="-O3 -fPIC -std=c++17 -D_GLIBCXX_USE_CXX11_ABI=1 -DWITH_PYTHON -DTORCH_API_INCLUDE_EXTENSION_H \
  -fopenmp -DAT_PARALLEL_OPENMP -Wno-sign-compare -I$T/include -I$T/include/torch/csrc/api/include \
  -I$PYI -I$S/csrc -I$S/csrc/cpu -I$S/third_party/parallel-hashmap"
build() {
  local name=$1 objs="" src obj
  for src in "$S/csrc/$name.cpp" "$S/csrc/cpu/${name}_cpu.cpp"; do
    [ -f "$src" ] || continue
    obj="$WORK/obj/$(basename "$src" .cpp).o"
    g++ $FLAGS -DTORCH_EXTENSION_NAME="_${name}_cpu" -c "$src" -o "$obj"
    objs="$objs $obj"
  done
  g++ -shared -s $objs -L"$T/lib" -lc10 -ltorch -ltorch_cpu -ltorch_python -o "$OUT/_${name}_cpu.so"
  echo "built _${name}_cpu.so"
}
export -f build; export S T OUT FLAGS WORK
ls "$S"/csrc/*.cpp | xargs -n1 basename | sed 's/\.cpp$//' \
  | xargs -P "${JOBS:-$(nproc)}" -I{} bash -c 'build {}'
