// A private test hook: forces a kernel path that a launch heuristic
// (cuda/spmm/heuristics.cuh, cuda/attention/heuristics.cuh, the CPU kernels'
// ISA choice in cpu/loops.h) would otherwise choose, so that tests cover every
// path on any graph and machine. Set only through the private
// operator pyg_multihead_agg::_set_kernel_path (csrc/ops.cpp), which
// pyg_multihead_agg/_testing.py wraps as `force_kernel_path`. Every path
// starts at -1: use the heuristic.
//
// Plain C++ without CUDA, compiled into every build.
#pragma once

#include <cstdint>

namespace pyg_multihead_agg {

enum class KernelPath : int {
  kTensorCores,  // 2-byte spmm forward and backward on the tensor cores: 0 / 1
  kTcStaged,     // the tensor-core forward's kernel: registers (0) or staged (1)
  kSplitRows,    // spmm forward, rows narrower than a warp: a row per group (0) or per warp (1)
  kTransposed,   // heads of 4 or 8 lanes: per-entry scalar work in one lane (1) or in all (0)
  kSortFetch,    // 2-byte spmm kernels sort a warp's fetch of short rows by degree: 0 / 1
  kOnepassMin,   // fused forward: rows of more entries take the one-pass path (>= 0)
  kSliceLen,     // sliced passes: rows longer than this are cut into slices of it (>= 1)
  kCpuAvx2,      // CPU kernels: the baseline ISA (0) or AVX2 and FMA (1, where the CPU has them)
  kFetchRounds,  // persistent kernels: rounds of short rows per warp fetch (1..8)
  kCount,
};

// The forced value of `path`, or -1: use the heuristic.
int64_t path_override(KernelPath path);

}  // namespace pyg_multihead_agg
