#!/usr/bin/env bash
# Sets up a virtual environment with everything the package, its tests and
# its examples need, and builds the extension into it. Sourced by
# run_tests.sh and run_example.sh.
#
# A re-run costs about a second when nothing changed: the stamp
# $VENV/.pyg_multihead_agg-setup records a hash of what each step depends on.
#   pip step:  this script, pyproject.toml, setup.py, TORCH_SPEC, WHEELS (and
#              its listing), WITH_TORCH_SPARSE
#   build:     every file under csrc/, setup.py, the installed torch, the build
#              switches (FORCE_CUDA, FORCE_ONLY_CPU, TORCH_CUDA_ARCH_LIST, DEBUG,
#              CC, CXX, CUDA_HOME), and the built .so itself (a .so replaced
#              by anything else is rebuilt)
#
#   VENV=path          the environment (default: .venv in the repository)
#   TORCH_SPEC=spec    which torch (default torch==2.13.0; for a CUDA build on
#                      a GPU machine use e.g. "torch" or a CUDA index URL)
#   WHEELS=dir         prebuilt torch-scatter / torch-sparse wheels
#                      (default: ../shared/wheels if it exists)
#   WITH_TORCH_SPARSE=0|1  install torch-sparse (default 1 when WHEELS exists;
#                      without wheels pip builds it from source, ~20 min)
#   FORCE_SETUP=1      run pip and the build whatever the stamp says
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
WHEELS="${WHEELS:-$ROOT/../shared/wheels}"
if [ -d "$WHEELS" ]; then WITH_TORCH_SPARSE="${WITH_TORCH_SPARSE:-1}"; else WITH_TORCH_SPARSE="${WITH_TORCH_SPARSE:-0}"; fi

say() { echo "[setup] $*"; }
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
STAMP="$VENV/.pyg_multihead_agg-setup"
# One setup at a time per environment (runs in the same checkout share it).
if command -v flock > /dev/null; then
  exec 9> "$STAMP.lock"
  flock 9
fi

hash_stdin() { sha256sum | cut -d' ' -f1; }
stamp_get() { sed -n "s/^$1 //p" "$STAMP" 2>/dev/null || true; }
stamp_set() {  # stamp_set KEY VALUE: replaces that line, keeps the others
  { grep -v "^$1 " "$STAMP" 2>/dev/null || true; echo "$1 $2"; } > "$STAMP.tmp"
  mv "$STAMP.tmp" "$STAMP"
}
if [ "${FORCE_SETUP:-0}" = 1 ]; then rm -f "$STAMP"; fi

deps_key() {
  { cat "$ROOT/scripts/setup_env.sh" "$ROOT/pyproject.toml" "$ROOT/setup.py"
    echo "TORCH_SPEC=$TORCH_SPEC WITH_TORCH_SPARSE=$WITH_TORCH_SPARSE WHEELS=$WHEELS"
    if [ "$WITH_TORCH_SPARSE" = 1 ] && [ -d "$WHEELS" ]; then ls -l "$WHEELS"; fi
  } | hash_stdin
}
build_key() {
  { cd "$ROOT" && find csrc -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    sha256sum setup.py
    cat "$VENV"/lib/python3*/site-packages/torch/version.py 2>/dev/null || true
    echo "FORCE_CUDA=${FORCE_CUDA:-} FORCE_ONLY_CPU=${FORCE_ONLY_CPU:-} DEBUG=${DEBUG:-}"
    echo "TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-} CC=${CC:-} CXX=${CXX:-}"
    echo "CUDA_HOME=${CUDA_HOME:-} nvcc=$(command -v nvcc || true)"
  } | hash_stdin
}
SO="$(compgen -G "$ROOT/pyg_multihead_agg/_C*.so" | head -1 || true)"
so_hash() { cat "$ROOT"/pyg_multihead_agg/_C*.so 2>/dev/null | hash_stdin; }
versions() {  # also proves that the installed package and its .so load
  (cd / && "$PY" -c "import torch, torch_geometric, pyg_multihead_agg as p; \
print('torch', torch.__version__, '| PyG', torch_geometric.__version__, '| pyg_multihead_agg', \
p.__version__)")
}

# 1. Dependencies.
DEPS_KEY="$(deps_key)"
if [ "$(stamp_get deps)" = "$DEPS_KEY" ]; then
  say "dependencies: unchanged since the last setup, pip skipped"
else
  pip_install() { "$PY" -m pip install --disable-pip-version-check "$@"; }
  say "dependencies 1/4: pip, setuptools, wheel"
  pip_install --upgrade pip setuptools wheel
  say "dependencies 2/4: $TORCH_SPEC"
  pip_install "$TORCH_SPEC"
  say "dependencies 3/4: ninja, torch-geometric, pytest, hypothesis, ruff, tqdm, matplotlib, ogb"
  pip_install ninja torch-geometric pytest hypothesis ruff tqdm matplotlib ogb
  if [ "$WITH_TORCH_SPARSE" = "1" ]; then
    if [ -d "$WHEELS" ]; then
      say "dependencies 4/4: torch-scatter, torch-sparse (wheels from $WHEELS)"
      pip_install --find-links "$WHEELS" torch-scatter torch-sparse
    else
      say "dependencies 4/4: torch-scatter, torch-sparse (built from source, ~20 min)"
      pip_install --no-build-isolation torch-scatter torch-sparse
    fi
  else
    say "dependencies 4/4: torch-sparse skipped (WITH_TORCH_SPARSE=0)"
  fi
  stamp_set deps "$DEPS_KEY"
fi

# 2. The extension, built against the torch installed above. Rebuilt when any
# input changed; a .so without a stamp (an environment set up before stamps)
# is kept only if it is newer than every source and loads.
BUILD_KEY="$(build_key)"
if [ "$(stamp_get build)" = "$BUILD_KEY" ] && [ -n "$SO" ] && [ "$(stamp_get so)" = "$(so_hash)" ]; then
  say "extension: csrc/ and setup.py unchanged since the last build, build skipped"
  echo "$(stamp_get versions)"
elif [ -z "$(stamp_get build)" ] && [ -n "$SO" ] \
    && [ -z "$(find "$ROOT/csrc" "$ROOT/setup.py" -newer "$SO" -print -quit)" ] \
    && VERSIONS="$(versions 2> /dev/null)"; then
  say "extension: the existing build is newer than every source, kept"
  echo "$VERSIONS"
  stamp_set build "$BUILD_KEY"; stamp_set so "$(so_hash)"; stamp_set versions "$VERSIONS"
else
  BUILD_LOG="$VENV/.pyg_multihead_agg-build.log"
  say "extension: compiling csrc/ with ${MAX_JOBS:-$(nproc)} jobs: about 2 minutes on 2 cores"\
" for the CPU kernels, and about 2 more on 16 cores for the CUDA kernels where torch has CUDA"\
" (full log: $BUILD_LOG)"
  # ninja's progress lines, by source file; everything else goes to the log.
  if ! MAX_JOBS="${MAX_JOBS:-$(nproc)}" "$PY" -m pip install --disable-pip-version-check -v \
      --no-build-isolation -e "$ROOT" 2>&1 | tee "$BUILD_LOG" \
      | sed -nuE 's#^\s*(\[[0-9]+/[0-9]+\]) .* -c ([^ ]+) .*#  \1 \2#p'; then
    tail -40 "$BUILD_LOG"
    say "build failed; full log: $BUILD_LOG" >&2
    exit 1
  fi
  VERSIONS="$(versions)"
  echo "$VERSIONS"
  stamp_set build "$BUILD_KEY"; stamp_set so "$(so_hash)"; stamp_set versions "$VERSIONS"
fi
if command -v flock > /dev/null; then exec 9>&-; fi
