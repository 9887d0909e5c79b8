// Parameters of the multihead_spmm family's kernels and their compile-time
// tuning: block sizes, minimum resident blocks (register caps), steps and
// stages. Run-time launch choices are in heuristics.cuh.
#pragma once

#include <ATen/OpMathType.h>

#include <cstdint>

#include "../utils/config.cuh"

namespace pyg_multihead_agg {

// Gather: out[r] = sum_{e in row r} weight[wperm ? wperm[e] : e] * x[idx[e]]
// (the forward on the CSR; grad_x on the CSC with wperm = perm).
template <typename scalar_t, typename index_t>
struct GatherParams {
  const index_t* ptr;      // [num_rows + 1]
  const index_t* idx;      // [E] gathered row of x per entry
  const index_t* wperm;    // [E] or nullptr: weight row per entry
  const scalar_t* weight;  // [E, H]
  const scalar_t* x;       // [num_src, H, D]
  scalar_t* out;           // [num_rows, H, D]
  int64_t num_rows, num_src, num_edges;
  int H, D, HD, G, num_chunks;
  // Rows narrower than a warp (G < 32): when true, the 32 / G groups of a
  // warp split the entries of one row (steps of U entries, round robin) and
  // sum their partial rows with shuffles; when false, each group takes a
  // row of its own. Rows of different lengths in one warp leave lanes idle
  // (a bf16 row of 4 x 32 features is 16 lanes: 24.7 active threads per warp
  // on products-like), one row per warp does not.
  bool split;
};

// Dot-gather: for each entry k of compressed row r, with e = perm ? perm[k] : k
// and the gathered row g = gathered[idx[k]],
//     dot_out[e, h] = <rowval[r, h, :], g[h, :]>                      (all h)
//     acc_out[r]   += weight[e, h] * g[h, :]        (when weight is given)
// The backward over the CSC (rowval = x, gathered = grad_out, perm) computes
// grad_weight and grad_x in one pass, or grad_x alone (no rowval, no
// dot_out); the SDDMM over the CSR (rowval = a, gathered = b, no perm, no
// weight) computes its output.
template <typename scalar_t, typename index_t>
struct DotParams {
  const index_t* ptr;          // [num_rows + 1]
  const index_t* idx;          // [E] gathered row per entry
  const index_t* perm;         // [E] or nullptr: edge id per entry
  const scalar_t* rowval;      // [num_rows, H, D]
  const scalar_t* gathered;    // [num_gathered, H, D]
  const scalar_t* weight;      // [E, H] or nullptr
  scalar_t* acc_out;           // [num_rows, H, D] when weight
  scalar_t* dot_out;           // [E, H]: by edge id e, or by entry k when dot_by_entry
  at::opmath_type<scalar_t>* part;  // [slots, H * D] sliced rows' partial acc_out (weight)
  int64_t num_rows, num_gathered, num_edges;
  int H, D, HD, G, S, num_chunks;
  // dot_out by entry: row k holds entry k's dots (the CSC order the kernel
  // walks), for a gather into edge order (gather_rows_kernel) afterwards.
  bool dot_by_entry;
};

// ---------------------------------------------------------------------------
// gather_kernel
// ---------------------------------------------------------------------------

// Resident blocks per SM asked of ptxas for the transposed variants of
// gather_kernel: 80 registers, 24 warps per SM instead of 16 (float32 without
// spill, bf16 with 32 bytes outside the step loop). The per-lane gather ran at
// 25% occupancy, register-bound, with under one eligible warp per scheduler
// (Nsight Compute; docs/performance.md, "Occupancy and registers").
constexpr int kGatherTransposedMinBlocks = 3;

template <int kS>
constexpr int gather_min_blocks() {
  return kS != 0 ? kGatherTransposedMinBlocks : kMinBlocks;
}

// Which kernels may sort their fetches of short rows by degree (FetchOrder):
// those of 2-byte types (the forward's transposed gathers when a warp runs
// several rows, the backward's dot-gathers): -5.7% on the bf16 forward on
// arxiv-like, -1 to -3% on the backward. float32 and float64 kernels, whose
// registers are at their caps, spill around their step loops with even an
// unused sort path compiled in (and a warp of 128 float32 features is one
// group). The attention kernels do not sort: 3-7% slower forward, no faster
// backward.
template <typename scalar_t>
constexpr bool kSortFetch = sizeof(scalar_t) == 2;

// ---------------------------------------------------------------------------
// dot_gather_kernel
// ---------------------------------------------------------------------------

// Blocks of 128 threads and no block-wide step: long rows are cut into
// slices (SliceList) that any group takes, each writing its partial acc_out
// row to a scratch slot, summed in slice order by sum_slices_kernel. (Run
// block-wide, the long rows of a reddit-like CSC left one SM at 1.57x the
// average.) Registers then set the warps per multiprocessor.
constexpr int kDotThreads = 128;

// Entries per step of the transposed variants, every dtype: 8, twice a
// 4-lane head, so that a 2-byte step has the loads in flight of a float32
// one and half the per-step overhead per entry of a 4-entry step; it fits
// 128 registers at 4 blocks (dot_min_blocks).
constexpr int kDotStep = 8;

// Resident blocks per SM of dot_gather_kernel.
// - Transposed variants: 4 (128 registers, no spill). float32 at 5 blocks
//   (96 registers, 72-88 bytes of spill) measured 1-3% slower; 2-byte types
//   fit 128 registers because each gathered row is widened once for its dot
//   and its accumulation, and measured 4-8% faster than at 3 blocks.
// - float32, one vector per lane: 96 registers, 5 blocks = 20 warps; half
//   types with two vectors per lane would spill ~140 bytes under 128
//   registers, so they get 3 blocks (12 warps).
template <typename scalar_t, int VPL, int kS, int kU>
constexpr int dot_min_blocks() {
  if (kS != 0) return 4;
  if (VPL >= 4) return 1;
  if (VPL == 2 && sizeof(scalar_t) == 2) return 3;
  return VPL == 1 && sizeof(scalar_t) == 4 ? 5 : 4;
}

// ---------------------------------------------------------------------------
// Tensor-core kernels (2-byte types, H * D = 128)
// ---------------------------------------------------------------------------

// tc_gather_kernel (registers): 2 blocks, 116-128 registers.
constexpr int kTcMinBlocks = 2;
// tc_gather_staged_kernel: a ring of two 4-KB stages a warp (one chunk in
// flight while the previous one is multiplied), 3 blocks at 80 registers.
constexpr int kTcStages = 2;
constexpr int kTcStagedMinBlocks = 3;
// tc_dot_gather_kernel: two stages a warp; three (104 KB of ring a block)
// measured 1-7% slower, the bytes in flight do not bound it. Both gradients
// at 2 blocks; grad_x alone (kDots = false) at 2 blocks too, 2-5% faster than
// 3 blocks at 80 registers with spill.
constexpr int kTcDotStages = 2;
constexpr int kTcDotMinBlocks = 2;
constexpr int kTcGradXMinBlocks = 2;

}  // namespace pyg_multihead_agg
