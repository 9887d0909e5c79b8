// Lane layouts of a group of lanes within a warp: which vectors of a row a
// lane owns, the group's shuffle mask, the transposing butterfly of per-entry
// dot products, and the block-wide sum of a long row's slices.
#pragma once

#include <ATen/OpMathType.h>

#include <cstdint>

#include "config.cuh"

namespace pyg_multihead_agg {

// Mask of the G lanes of this thread's group, for the shuffles of one group
// while other groups of the warp run other rows.
__device__ __forceinline__ unsigned group_mask(int G) {
  if (G == 32) return 0xffffffffu;
  const int lane = threadIdx.x & 31;
  return ((1u << G) - 1u) << (lane & ~(G - 1));
}

// Which vectors of a row this lane owns in one feature chunk: vector
// v = chunk * G * VPL + lane + G * k for k < VPL (spmm/gather_kernel.cuh).
template <int VPL>
struct LaneMap {
  int feat[VPL];   // first feature of the vector within the row
  int head[VPL];   // its head (>= H for the padding vectors of the last chunk)
  bool valid[VPL];
};

template <int V, int VPL>
__device__ __forceinline__ LaneMap<VPL> lane_map(int chunk, int lane, int G, int D, int HD) {
  LaneMap<VPL> m;
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    const int v = chunk * G * VPL + lane + G * k;
    m.feat[k] = v * V;
    m.head[k] = v * V / D;
    m.valid[k] = v * V < HD;
  }
  return m;
}

// The transposing butterfly of the per-entry dot products (the attention
// backward's backward_row_transposed, the spmm dot_entries_transposed): d[u]
// holds this lane's partial dot of entry u, and a head spans kS lanes (q = the
// lane's index within them). Round OFF (kS / 2, ..., 1), within each block of
// kS slots: the first 2 * OFF slots are live, and the pairs (u, u + OFF) of
// the first OFF are reduced, the lane with bit OFF of q set keeping entry
// u + OFF (and sending u), its partner the reverse; slot u then holds the
// pair's sum. After all rounds slot b * kS holds the whole dot of entry
// b * kS + q: 7 shuffles for 8 entries over 8 lanes instead of 24 for 8
// butterflies, each lane left with its own entries. Each sum adds the same
// pairs as a butterfly xor-ing OFF = kS / 2, ..., 1, so the dots are bitwise
// those of one.
template <int OFF, int kS, int U, typename acc_t>
__device__ __forceinline__ void transpose_round(acc_t (&d)[U], int q, unsigned mask) {
  const bool hi = (q & OFF) != 0;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (u % kS >= OFF) continue;  // compile-time
    const acc_t send = hi ? d[u] : d[u + OFF];
    const acc_t keep = hi ? d[u + OFF] : d[u];
    d[u] = keep + __shfl_xor_sync(mask, send, OFF);
  }
}


// The contiguous slice of [lo, hi) that group `group` of `groups` (a power of
// two: a shift, not a 64-bit division, which would be a subroutine call) takes
// in a long row.
__device__ __forceinline__ void group_slice(int64_t lo, int64_t hi, int group, int groups,
                                            int64_t& slo, int64_t& shi) {
  const int64_t len = (hi - lo + groups - 1) >> (__ffs(groups) - 1);
  slo = min(hi, lo + group * len);
  shi = min(hi, slo + len);
}

// Sums the groups' partial rows of one feature chunk in group order (fixed, so
// deterministic) and writes them. red holds kThreads * VPL * V values: group g's
// value of feature chunk_feat + q at red[g * G * VPL * V + q].
template <typename scalar_t, typename acc_t, int V, int VPL>
__device__ __forceinline__ void block_reduce_store(acc_t* red, const acc_t (&acc)[VPL][V], int G,
                                                   int lane, int chunk_feat, int HD,
                                                   scalar_t* __restrict__ out_row) {
  const int cwe = G * VPL * V, groups = kThreads / G, group = threadIdx.x / G;
#pragma unroll
  for (int k = 0; k < VPL; ++k)
#pragma unroll
    for (int v = 0; v < V; ++v) red[group * cwe + (k * G + lane) * V + v] = acc[k][v];
  __syncthreads();
  for (int q = threadIdx.x; q < cwe; q += kThreads) {
    if (chunk_feat + q < HD) {
      acc_t s = 0;
      for (int g = 0; g < groups; ++g) s += red[g * cwe + q];
      out_row[chunk_feat + q] = static_cast<scalar_t>(s);
    }
  }
  __syncthreads();
}

}  // namespace pyg_multihead_agg
