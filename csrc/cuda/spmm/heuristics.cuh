// Launch choices of the multihead_spmm family, as code, each with the reason
// for its default. Every choice a test must be able to force consults the
// test hook first (csrc/path_overrides.h: -1 there means "decide here").
// Shape and alignment conditions that a kernel needs in order to apply at all
// stay with its launcher; these functions only choose among kernels that
// apply. Measurements: H200, docs/multihead_spmm.md and docs/performance.md.
#pragma once

#include <cstdint>

#include "../utils/config.cuh"
#include "../../path_overrides.h"
#include "../utils/work_list.cuh"

namespace pyg_multihead_agg {

// Whether the 2-byte kernels sort a warp's fetch of short rows by degree
// (FetchOrder; kSortFetch in params.cuh says which kernels can): on by
// default, -5.7% on the bf16 forward on arxiv-like, -1 to -3% on the backward.
inline bool spmm_sort_fetch() {
  const int64_t forced = path_override(KernelPath::kSortFetch);
  return forced < 0 || forced == 1;
}

// The forward gather of rows narrower than a warp (c.G < 32 lanes): split a
// row's entries over the warp's 32 / G groups when the average row has a
// step (kLoadsInFlight / VPL entries) for each group. bf16 4 x 32 measured 20%
// faster split on reddit-like (200 entries a row), 2.5% on products-like (25)
// and 9% slower on arxiv-like (14), where a step per row and group is all
// there is and the split only adds the shuffles. (The backward's dot-gather
// keeps a row per group: split, it spilled under its register cap.)
inline bool spmm_split_rows(const LaneConfig& c, int64_t num_rows, int64_t num_edges) {
  if (c.G >= 32) return false;
  const int64_t forced = path_override(KernelPath::kSplitRows);
  if (forced >= 0) return forced == 1;
  const int64_t subs = 32 / c.G, step = kLoadsInFlight / c.vpl;
  return num_rows > 0 && num_edges >= num_rows * subs * step;
}

// Heads of 4 or 8 lanes (one vector per lane, one feature chunk): the
// gathers, dot-gathers and the SDDMM do an entry's scalar work (weight load,
// index checks, dot reduction) in one lane of the head and shuffle the result
// to the others ("transposed") instead of in every lane: the per-lane float32
// gather issued 53 warp instructions per entry, and the dot-gathers save 17 of
// 24 shuffles per step. On whenever the shape allows it.
inline bool spmm_transposed() {
  const int64_t forced = path_override(KernelPath::kTransposed);
  return forced < 0 || forced == 1;
}

// The tensor-core forward (2-byte types, H * D = 128, when it applies) for rows
// of at most kTcMaxAvgDegree entries on average: bf16 4 x 32 against the
// register kernels, arxiv-like (14 entries a row) -14%, products-like (25) -6%,
// reddit-like (200) +14%.
constexpr int64_t kTcMaxAvgDegree = 64;

inline bool spmm_tensor_cores_forward(int64_t num_rows, int64_t num_edges) {
  const int64_t forced = path_override(KernelPath::kTensorCores);
  if (forced >= 0) return forced == 1;
  return num_edges <= kTcMaxAvgDegree * num_rows;
}

// Of the two tensor-core forward kernels, the staged one (rows copied into
// shared memory) for heads of 32 and 64 features (H <= 4) and the register
// one for heads of 16, where the staged kernel's 16-byte weight rows spill
// (0.171 against 0.128 ms on arxiv-like).
inline bool spmm_tc_staged(int H) {
  const int64_t forced = path_override(KernelPath::kTcStaged);
  if (forced >= 0) return forced == 1;
  return H <= 4;
}

// The tensor-core backward (2-byte types, H * D = 128, when it applies),
// whatever the degrees. Both gradients (bf16 4 x 32 with perm_inv, against the
// dot-gather kernel): arxiv-like 0.285 -> 0.217 ms, products-like 7.18 -> 6.46,
// reddit-like 4.25 -> 3.43; grad_x alone, against the CSC gather: 0.337 ->
// 0.164, 6.00 -> 4.91, 5.91 -> 2.46 ms.
inline bool spmm_tensor_cores_backward() {
  return path_override(KernelPath::kTensorCores) != 0;
}

// Entries per slice of the backward's long CSC rows (dot-gather and
// tensor-core kernels): rows longer than long_threshold(E) (at least 64,
// E / 32768 on large graphs) are cut into slices of that many entries.
inline int64_t spmm_slice_len(int64_t num_edges) {
  const int64_t forced = path_override(KernelPath::kSliceLen);
  return forced > 0 ? forced : long_threshold(num_edges);
}

}  // namespace pyg_multihead_agg
