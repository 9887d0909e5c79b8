#!/usr/bin/env bash
# Prepares, on this CPU machine, the git-ignored inputs that the GPU machine
# cannot fetch itself (it reaches no network), under .device/:
#   .device/data          a copy of the shared datasets (Cora: gpu_check.sh cora)
#   .device/sampler_site  torch-sparse's and torch-scatter's CPU operators
#                         built for the device's torch and Python
#                         (scripts/build_sampler_device.sh): NeighborLoader's
#                         sampler for gpu_check.sh minibatch and
#                         scripts/ogb_device.sh minibatch
# Carry both (`carry: [".device/data", ".device/sampler_site"]`);
# gpu_check.sh and ogb_device.sh put the sampler on PYTHONPATH themselves.
#   scripts/prepare_device.sh
# Env: SHARED_DATA (default ../shared/data), TORCH_VERSION (the device's,
# default 2.11.0), CROSS_BUILD_DIR (the torch wheel's headers and libraries,
# shared with scripts/cross_build_device.sh; default
# /tmp/cross_build_$TORCH_VERSION), TORCH_SPARSE / TORCH_SCATTER (versions,
# default 0.6.18 / 2.1.2).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VER="${TORCH_VERSION:-2.11.0}"
WORK="${CROSS_BUILD_DIR:-/tmp/cross_build_$VER}"
PIP="${PIP:-$([ -x .venv/bin/pip ] && echo .venv/bin/pip || echo pip)}"
mkdir -p .device
if [ ! -d .device/data ]; then
  cp -r "${SHARED_DATA:-$ROOT/../shared/data}" .device/data
  echo "[prepare] .device/data"
fi
# The torch wheel of the device's version: headers and the libraries the
# sampler's operators link against.
if [ ! -e "$WORK/torch/lib/libtorch_python.so" ]; then
  mkdir -p "$WORK/wheel"
  ls "$WORK"/wheel/torch-"$VER"-*.whl > /dev/null 2>&1 \
    || "$PIP" download -q "torch==$VER" --no-deps -d "$WORK/wheel"
  (cd "$WORK" && unzip -q -o wheel/torch-"$VER"-*.whl 'torch/include/*' 'torch/lib/libc10.so' \
    'torch/lib/libtorch.so' 'torch/lib/libtorch_cpu.so' 'torch/lib/libtorch_python.so' \
    'torch/lib/libc10_cuda.so' 'torch/lib/libtorch_cuda.so')
  echo "[prepare] torch $VER headers and libraries in $WORK/torch"
fi
SITE=.device/sampler_site
for pkg in "torch-scatter==${TORCH_SCATTER:-2.1.2}" "torch-sparse==${TORCH_SPARSE:-0.6.18}"; do
  name="${pkg%%==*}"; name="${name//-/_}"
  [ -d "$SITE/$name" ] && continue
  sdist=$(ls "$WORK"/sdist/"$name"-*.tar.gz 2> /dev/null | head -1 || true)
  if [ -z "$sdist" ]; then
    "$PIP" download -q --no-deps --no-build-isolation --no-binary :all: "$pkg" -d "$WORK/sdist"
    sdist=$(ls "$WORK"/sdist/"$name"-*.tar.gz | head -1)
  fi
  TORCH_DIR="$WORK/torch" bash scripts/build_sampler_device.sh "$sdist" "$SITE"
  echo "[prepare] $SITE/$name"
done
du -sh .device/data "$SITE"
