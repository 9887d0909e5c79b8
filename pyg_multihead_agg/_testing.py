"""Private test hook: force the kernels' launch choices.

The CUDA launchers choose a kernel per call from the shapes and the graph
(``csrc/cuda/spmm/heuristics.cuh``, ``csrc/cuda/attention/heuristics.cuh``),
the CPU kernels their instruction set from the processor (``csrc/cpu/loops.h``).
Tests that must cover every path force one here, for the duration of a
``with`` block::

    from pyg_multihead_agg._testing import force_kernel_path

    with force_kernel_path(tensor_cores=0, split_rows=1):
        out = torch.ops.pyg_multihead_agg.multihead_spmm(rowptr, col, weight, x)

A value of ``None`` (or -1) restores the heuristic inside the block. The
previous values come back on exit, also when the block raises. The paths are
process-wide settings, not thread-local. Not part of the public API.
"""
import contextlib
from collections.abc import Iterator
from typing import Optional

import torch

# name -> (smallest, largest) forced value (None: no upper bound), as in
# csrc/path_overrides.cpp.
KERNEL_PATHS = {
    # the 2-byte spmm forward and backward on the tensor cores (H * D = 128)
    "tensor_cores": (0, 1),
    # the tensor-core forward's kernel: registers (0) or rows staged in shared memory (1)
    "tc_staged": (0, 1),
    # spmm forward, rows narrower than a warp: a row per group of lanes (0) or per warp (1)
    "split_rows": (0, 1),
    # heads of 4 or 8 lanes: an entry's scalar work in one lane of the head (1) or all (0)
    "transposed": (0, 1),
    # the 2-byte spmm kernels sort a warp's fetch of short rows by degree (1) or not (0)
    "sort_fetch": (0, 1),
    # fused attention forward: rows of more entries than this take the one-pass path
    "onepass_min": (0, None),
    # sliced backward passes: rows longer than this are cut into slices of this length
    "slice_len": (1, None),
    # CPU kernels: the baseline ISA (0), or AVX2 and FMA (1; where the CPU has them)
    "cpu_avx2": (0, 1),
    # persistent CUDA kernels: rounds of short rows a warp takes per fetch
    # (the heuristic: fewer than 8 only on small graphs)
    "fetch_rounds": (1, 8),
}


def _check(name: str, value: Optional[int]) -> int:
    if name not in KERNEL_PATHS:
        raise ValueError(f"force_kernel_path: unknown kernel path {name!r} "
                         f"(known: {', '.join(KERNEL_PATHS)})")
    if value is None:
        return -1
    low, high = KERNEL_PATHS[name]
    if isinstance(value, bool) or not isinstance(value, int) or not (
            value == -1 or (value >= low and (high is None or value <= high))):
        allowed = f"{low}..{high}" if high is not None else f"an integer >= {low}"
        raise ValueError(f"force_kernel_path: {name} must be None, -1 or {allowed}, "
                         f"got {value!r}")
    return value


@contextlib.contextmanager
def force_kernel_path(**paths: Optional[int]) -> Iterator[None]:
    """Forces the CUDA kernel paths given as keywords (see KERNEL_PATHS) inside
    the block and restores the previous values on exit. Every name and value
    is checked before any is set: an unknown name or a value out of range
    raises ValueError."""
    forced = {name: _check(name, value) for name, value in paths.items()}
    set_path = torch.ops.pyg_multihead_agg._set_kernel_path
    previous = []
    try:
        for name, value in forced.items():
            previous.append((name, set_path(name, value)))
        yield
    finally:
        for name, value in reversed(previous):
            set_path(name, value)
