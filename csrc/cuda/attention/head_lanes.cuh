// Lane layouts of the attention kernels: the lanes of one head (per-head
// kernels), the heads of a row (all-heads kernels), their sums, and the
// dropout bits each lane draws for its head.
#pragma once

#include <cstdint>

#include "../../philox.h"
#include "../utils/index.cuh"

namespace pyg_multihead_agg {

// The features of one head a lane owns in one chunk: v = chunk * G * VPL +
// lane + G * k (in vectors), the first feature v * V within the head.
template <int VPL>
struct HeadLanes {
  int feat[VPL];
  bool valid[VPL];
};

template <int V, int VPL>
__device__ __forceinline__ HeadLanes<VPL> head_lanes(int chunk, int lane, int G, int D) {
  HeadLanes<VPL> m;
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    m.feat[k] = (chunk * G * VPL + lane + G * k) * V;
    m.valid[k] = m.feat[k] < D;
  }
  return m;
}

// The per-lane <a, b> (vec_dot, utils/vec.cuh) is followed by the S-lane butterfly
// of lanes_sum. The aux kernel (delta) and the backward use these same two
// steps, so that a row with a single edge (alpha = 1, out = x[j]) gives
// delta equal to the edge's dot bit for bit and score gradients of exactly 0.
template <typename acc_t>
__device__ __forceinline__ acc_t lanes_sum(acc_t v, int S, unsigned mask) {
  for (int off = S >> 1; off > 0; off >>= 1) v += __shfl_xor_sync(mask, v, off);
  return v;
}

// The vectors of a row this lane owns: feature offset, head, and whether the
// vector exists (the padding heads of a group wider than H * S have none).
// Heads of exactly S vectors (D = S * V): vector v = lane + G * k is feature
// v * V. Padded heads (the second constructor: D a multiple of V below
// S * V): lane q of a head owns features q * V .. q * V + V - 1 of it, and the
// lanes past the head's D / V vectors own none (valid false; they still take
// part in the head's butterflies, with zeros).
template <int V, int VPL>
struct RowLanes {
  int feat[VPL], head[VPL];
  bool valid[VPL];
  __device__ __forceinline__ RowLanes(int lane, int G, int log2S, int H) {
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const int v = lane + G * k;
      feat[k] = v * V;
      head[k] = v >> log2S;
      valid[k] = head[k] < H;
    }
  }
  __device__ __forceinline__ RowLanes(int lane, int G, int log2S, int H, int D) {
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const int v = lane + G * k, q = v & ((1 << log2S) - 1);
      head[k] = v >> log2S;
      feat[k] = head[k] * D + q * V;
      valid[k] = head[k] < H && q * V < D;
    }
  }
};

// Dropout masks of one step of U entries [k0, k0 + U) (edge ids perm[k], or k
// itself without perm) for this lane's heads: lane q of a head draws entries
// q, q + S, ... (bit r of keep[k]: entry r * S + q), so each (entry, head)
// mask is drawn once per group (one Philox call per lane and step when
// S >= U) instead of by all S lanes of the head; keep_scale hands the bits on.
template <int U, int VPL, typename index_t>
__device__ __forceinline__ void draw_keep_bits(unsigned (&keep)[VPL], const DropoutRng& rng,
                                               const index_t* perm, int64_t k0, int64_t hi,
                                               int q, int log2S, const int (&head)[VPL]) {
#pragma unroll
  for (int k = 0; k < VPL; ++k) keep[k] = 0;
  for (int r = 0; (r << log2S) < U; ++r) {
    const int u = (r << log2S) + q;
    if (u < U && k0 + u < hi) {
      const int64_t e = perm != nullptr ? load_index(perm + k0 + u) : k0 + u;
#pragma unroll
      for (int k = 0; k < VPL; ++k)
        if (rng.keep(e, head[k])) keep[k] |= 1u << r;
    }
  }
}

// The dropout factor (scale or 0) of entry u of the step for this lane's head,
// from the lane that drew it (called by every lane of the group).
template <typename acc_t>
__device__ __forceinline__ acc_t keep_scale(unsigned keep, int u, int S, int log2S,
                                            unsigned mask, acc_t scale) {
  const int head_base = (threadIdx.x & 31) & ~(S - 1);  // warp lane of the head's first lane
  const unsigned bits = __shfl_sync(mask, keep, head_base + (u & (S - 1)));
  return (bits >> (u >> log2S)) & 1u ? scale : acc_t(0);
}

}  // namespace pyg_multihead_agg
