// Launch choices of the fused GAT attention, as code, each with the reason
// for its default. Every choice a test must be able to force consults the
// test hook first (csrc/path_overrides.h: -1 there means "decide here").
// Measurements: H200, docs/gat_attention.md and docs/performance.md.
#pragma once

#include <cstdint>
#include <limits>

#include "../utils/config.cuh"
#include "../utils/dispatch.cuh"
#include "../../path_overrides.h"
#include "../utils/work_list.cuh"

namespace pyg_multihead_agg {

// Lanes per head and vectors per lane for a head of D features.
struct HeadConfig {
  bool vectorised;
  int G, vpl, num_chunks;
};

template <typename scalar_t>
HeadConfig head_config(int64_t D, bool aligned) {
  constexpr int kVec = vec_width<scalar_t>();
  HeadConfig c;
  c.vectorised = aligned && D % kVec == 0;
  if (c.vectorised) {
    const int64_t dv = D / kVec;
    c.G = dv <= 32 ? next_pow2(dv) : 32;
    c.vpl = dv <= 32 ? 1 : (dv <= 64 ? 2 : kMaxVPL);
    c.num_chunks = static_cast<int>((dv + c.G * c.vpl - 1) / (c.G * c.vpl));
  } else {  // single elements, 4 per lane
    c.G = next_pow2((D + kMaxVPL - 1) / kMaxVPL);
    c.vpl = kMaxVPL;
    c.num_chunks = static_cast<int>((D + c.G * kMaxVPL - 1) / (c.G * kMaxVPL));
  }
  return c;
}

// The all-heads GAT kernels (attention_rows_kernel, attention_backward_rows_kernel)
// apply when a head is a whole number of 16-byte vectors, S = D / V of them,
// S a power of two of at most 32, and a row fits 4 vectors per lane:
// H * S <= 128. Other shapes take the per-head kernels.
struct RowConfig {
  bool ok;
  int G, vpl, S, log2S;
};

template <typename scalar_t>
RowConfig row_config(int64_t H, int64_t D, bool aligned) {
  constexpr int kVec = vec_width<scalar_t>();
  RowConfig c{};
  const int64_t S = D / kVec;
  c.ok = aligned && D % kVec == 0 && S >= 1 && S <= 32 && (S & (S - 1)) == 0 &&
         H * S <= 32 * kMaxVPL;
  if (!c.ok) return c;
  c.S = static_cast<int>(S);
  c.log2S = __builtin_ctz(c.S);
  c.G = next_pow2(H * S);  // at most 32
  const int64_t vpl = (H * S + c.G - 1) / c.G;
  c.vpl = vpl == 1 ? 1 : (vpl == 2 ? 2 : kMaxVPL);
  return c;
}

// The GATv2 kernels (Gatv2Score) take the all-heads layout with padded
// heads: S = next_pow2(D / V) lanes per head (D a multiple of V: entry.cu
// pads other heads with zero channels), H * S <= 128. Wider rows raise.
template <typename scalar_t>
RowConfig gatv2_row_config(int64_t H, int64_t D) {
  constexpr int kVec = vec_width<scalar_t>();
  RowConfig c{};
  const int64_t nv = D / kVec;
  c.ok = D % kVec == 0 && nv >= 1 && nv <= 32;
  if (!c.ok) return c;
  c.S = next_pow2(nv);
  c.ok = H * c.S <= 32 * kMaxVPL;
  if (!c.ok) return c;
  c.log2S = __builtin_ctz(c.S);
  c.G = next_pow2(H * c.S);
  const int64_t vpl = (H * c.S + c.G - 1) / c.G;
  c.vpl = vpl == 1 ? 1 : (vpl == 2 ? 2 : kMaxVPL);
  return c;
}

// Short rows of the all-heads forward with more entries than this take the
// one-pass (online softmax) path, the others the two passes; block-wide long
// rows always take one pass. By default no short row does: the two passes were
// faster on products-like (16.7 ms against 17.9 with the threshold at 4 * S
// and 18.7 with one pass for every row) and as fast on reddit-like (10.6 /
// 10.4 / 10.4 ms). Rows without edges always take the two-pass branch, which
// writes out = 0 and lse = -inf.
inline int64_t gat_onepass_min() {
  const int64_t forced = path_override(KernelPath::kOnepassMin);
  return forced >= 0 ? forced : std::numeric_limits<int64_t>::max();
}

// Heads of 4 or 8 lanes (one vector per lane): the all-heads forward's second
// pass and the backward do an entry's softmax arithmetic in one lane of the
// head, after a transposing butterfly of the dots in the backward, instead of
// in every lane (152 warp instructions per CSC entry in the float32 backward
// on reddit-like, 86 per entry in the forward). On whenever the shape allows.
inline bool gat_transposed() {
  const int64_t forced = path_override(KernelPath::kTransposed);
  return forced < 0 || forced == 1;
}

// Entries per slice of the all-heads backward's long CSC columns. 2-byte
// types cut every column longer than a quarter of the work lists' threshold
// (E / 131072 entries, at least 64: ~470 on products-like, ~360 on
// reddit-like) into slices of that length: a group walks a column of up to
// that many entries alone, and the longest of them form the grid's tail.
// bf16 measured 9.21 -> 8.91 ms (products-like) and 5.34 -> 4.96 ms
// (reddit-like) at a quarter, arxiv-like worse below 64 entries, float32
// within 1%. The partial rows' scratch grows with it (4x: ~130 MB on
// products-like), so float32 and float64 keep the work lists' threshold.
template <typename scalar_t>
int64_t gat_backward_slice_len(int64_t num_edges) {
  const int64_t forced = path_override(KernelPath::kSliceLen);
  if (forced > 0) return forced;
  return long_threshold(num_edges, sizeof(scalar_t) == 2 ? 4 : 1);
}

// Entries per slice of the row sums' long CSR rows (grad_s_dst): the work
// lists' threshold.
inline int64_t gat_row_sum_slice_len(int64_t num_edges) {
  const int64_t forced = path_override(KernelPath::kSliceLen);
  return forced > 0 ? forced : long_threshold(num_edges);
}

}  // namespace pyg_multihead_agg
