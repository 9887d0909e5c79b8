// dot_gather_kernel: per-entry dot products and, with a weight, the gather,
// in one pass over a compressed row (DotParams in params.cuh): the spmm
// backward over the CSC (grad_weight and grad_x, or either alone) and the
// SDDMM over the CSR. rowval[r] is loaded once per row (per chunk) into
// registers. Needs D / V to be a power of two: a head's vectors then fill
// S = min(D / V, G) aligned lanes (for a fixed k), and its dot is a butterfly
// over S lanes. The lane layout is gather_kernel's (gather_kernel.cuh).
//
// Long rows (a CSC's hubs) are cut into slices that any group takes
// (SliceList, utils/work_list.cuh), with sum_slices_kernel adding each row's
// slice partials in slice order: no block-wide step, so the kernel runs
// 128-thread blocks sized by its registers.
#pragma once

#include <ATen/OpMathType.h>

#include <cstdint>

#include "../utils/config.cuh"
#include "../utils/index.cuh"
#include "../utils/lanes.cuh"
#include "../utils/vec.cuh"
#include "../utils/work_list.cuh"
#include "params.cuh"

namespace pyg_multihead_agg {

template <int U, typename scalar_t, typename index_t, int V, int VPL>
__device__ __forceinline__ void dot_step(at::opmath_type<scalar_t> (&acc)[VPL][V],
                                         const Vec<scalar_t, V> (&rv)[VPL], int64_t e0,
                                         int64_t hi, const DotParams<scalar_t, index_t>& p,
                                         const LaneMap<VPL>& m, const bool (&last)[VPL],
                                         unsigned mask, bool leader) {
  using acc_t = at::opmath_type<scalar_t>;
  const bool with_weight = p.weight != nullptr;
  index_t src[U], e[U];  // the index type: int32 graphs keep half the registers
  bool ok[U], e_ok[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const bool inside = e0 + u < hi;  // the last step of a row is partial
    src[u] = load_index_if(inside, p.idx + e0 + u);
    const index_t pe = load_index_if(inside && p.perm != nullptr, p.perm + e0 + u);  // no branch
    e[u] = p.perm != nullptr ? pe : static_cast<index_t>(e0 + u);
    e_ok[u] = inside && in_range(e[u], p.num_edges);
    ok[u] = e_ok[u] && in_range(src[u], p.num_gathered);
  }
  Vec<scalar_t, V> gv[U][VPL];
  acc_t w[U][VPL];
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const bool load = ok[u] && m.valid[k];
      gv[u][k] = load_vec_if<scalar_t, V>(
          load, p.gathered + static_cast<int64_t>(src[u]) * p.HD + m.feat[k]);
      w[u][k] = load_value_if(load && with_weight,
                              p.weight + static_cast<int64_t>(e[u]) * p.H + m.head[k]);
    }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (e0 + u >= hi) break;  // group-uniform: no shuffles for the padding of a partial step
    acc_t run = 0;
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      acc_t g[V], r[V];
      widen(gv[u][k], g);
      widen(rv[k], r);
#pragma unroll
      for (int v = 0; v < V; ++v) {
        acc[k][v] += w[u][k] * g[v];
        run += g[v] * r[v];
      }
      // `last` is the same for all lanes of the group, so the shuffles are
      // group-uniform. Vectors k that share a head were summed into `run`.
      if (last[k]) {
        for (int off = p.S >> 1; off > 0; off >>= 1) run += __shfl_xor_sync(mask, run, off);
        if (leader && m.valid[k] && e_ok[u] && p.dot_out != nullptr) {
          const int64_t out_row = p.dot_by_entry ? e0 + u : static_cast<int64_t>(e[u]);
          p.dot_out[out_row * p.H + m.head[k]] = static_cast<scalar_t>(run);
        }
        run = 0;
      }
    }
  }
}

template <typename scalar_t, typename index_t, int V, int VPL>
__device__ __forceinline__ void dot_entries(at::opmath_type<scalar_t> (&acc)[VPL][V],
                                            int64_t r, int64_t lo, int64_t hi,
                                            const DotParams<scalar_t, index_t>& p,
                                            const LaneMap<VPL>& m, int lane) {
  constexpr int U = kLoadsInFlight / VPL;
  Vec<scalar_t, V> rv[VPL];  // kept in the input dtype: half the registers for half types
  bool last[VPL];
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    rv[k] = m.valid[k] && p.dot_out != nullptr
                ? load_vec<scalar_t, V>(p.rowval + r * p.HD + m.feat[k])
                : zero_vec<scalar_t, V>();
#pragma unroll
    for (int v = 0; v < V; ++v) acc[k][v] = 0;
    // Heads span G * k-consecutive vectors only when D / V >= G, and then the
    // whole group shares m.head[k]; otherwise every k is a head of its own.
    last[k] = k == VPL - 1 || m.head[k + (k < VPL - 1 ? 1 : 0)] != m.head[k];
  }
  const unsigned mask = group_mask(p.G);
  const bool leader = (lane & (p.S - 1)) == 0;
  for (int64_t e = lo; e < hi; e += U) dot_step<U>(acc, rv, e, hi, p, m, last, mask, leader);
}

// dot_entries for one vector per lane and heads of kS = 4 or 8 lanes, with
// the per-entry scalar work done once instead of in all kS lanes of a head:
// a step of U entries reduces its U dot products with one transposing
// butterfly (transpose_round), after which lane q of a head holds the whole
// dot of entry q (and q + 4 when U = 2 kS) and alone loads that entry's edge
// id and weight and stores its dot; the weights go back to the head's lanes
// with one shuffle per entry. Same sums, so dot_out and acc_out are bitwise
// those of dot_entries. (An entry whose edge id is out of range adds
// 0 * gathered row instead of nothing: only a malformed perm has one.)
template <int kS, int kU, typename scalar_t, typename index_t, int V>
__device__ __forceinline__ void dot_entries_transposed(at::opmath_type<scalar_t> (&acc)[1][V],
                                                       int64_t r, int64_t lo, int64_t hi,
                                                       const DotParams<scalar_t, index_t>& p,
                                                       const LaneMap<1>& m, int lane) {
  using acc_t = at::opmath_type<scalar_t>;
  static_assert(kS == 4 || kS == 8, "4 or 8 lanes per head");
  // Entries per step: kU (kDotStep in params.cuh).
  constexpr int U = kU, kSlots = U / kS;
  static_assert(U % kS == 0, "whole slots");
  const bool with_weight = p.weight != nullptr;
  const unsigned mask = group_mask(p.G);
  const int q = lane & (kS - 1);
  const int head_base = (threadIdx.x & 31) & ~(kS - 1);  // warp lane of the head's lane 0
  const bool valid = m.valid[0];
  const int h = m.head[0], HD = p.HD, H = p.H;
  const IndexBound<index_t> gathered_ok(p.num_gathered), edge_ok(p.num_edges);
  const scalar_t* gathered = p.gathered + m.feat[0];
  const scalar_t* weight = with_weight ? p.weight + h : p.weight;
  const bool with_dots = p.dot_out != nullptr;
  scalar_t* dot_out = with_dots ? p.dot_out + h : p.dot_out;
  const Vec<scalar_t, V> rv = valid && with_dots
                                  ? load_vec<scalar_t, V>(p.rowval + r * p.HD + m.feat[0])
                                  : zero_vec<scalar_t, V>();
#pragma unroll
  for (int v = 0; v < V; ++v) acc[0][v] = 0;
  // A step's indices (StepIndices), one step ahead with 32-bit ones: the
  // gathered rows of all U entries and this lane's own entries' row and edge id.
  using off_t = EntryOffset<index_t>;
  using Step = StepIndices<U, kS, true, index_t>;
  const off_t n = static_cast<off_t>(hi - lo);
  auto load_idx = [&](off_t k0, Step& s_) { s_.load(p.idx, p.perm, lo, k0, n, q); };
  constexpr bool kPrefetch = sizeof(index_t) == 4;
  Step cur;
  if constexpr (kPrefetch) load_idx(0, cur);
  for (off_t k0 = 0; k0 < n; k0 += U) {
    const off_t left = n - k0;  // > 0; the step's entries u < left are the row's
    if constexpr (!kPrefetch) load_idx(k0, cur);
    Vec<scalar_t, V> gv[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      gv[u] = load_vec_if<scalar_t, V>(valid && u < left && gathered_ok(cur.i[u]),
                                      row_at(gathered, cur.i[u], HD));
    bool ok[kSlots];
    acc_t wq[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      ok[s] = valid && s * kS + q < left && gathered_ok(cur.iq[s]) && edge_ok(cur.eq[s]);
      wq[s] = load_value_if(ok[s] && with_weight, row_at(weight, cur.eq[s], H));
    }
    Step next;
    if constexpr (kPrefetch) load_idx(k0 + U, next);
    // 2-byte types widen each gathered row once and use it at once for its
    // dot and (with a weight) its accumulation, so that no widened row
    // outlives its entry (128 registers at 4 blocks). float32 accumulates
    // after the stores: the other order measured 1.1-1.2% slower on
    // arxiv-like. Same sums either way.
    constexpr bool kFuseAcc = sizeof(scalar_t) == 2;
    acc_t wu[U];
    if (kFuseAcc && with_weight) {  // uniform
#pragma unroll
      for (int u = 0; u < U; ++u) wu[u] = __shfl_sync(mask, wq[u / kS], head_base + (u % kS));
    }
    acc_t d[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      d[u] = vec_dot(gv[u], rv);
      if (kFuseAcc && with_weight) axpy_vec(acc[0], wu[u], gv[u]);
    }
    if constexpr (kS == 8) transpose_round<4, kS>(d, q, mask);
    transpose_round<2, kS>(d, q, mask);
    transpose_round<1, kS>(d, q, mask);
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (!ok[s] || !with_dots) continue;
      if (p.dot_by_entry) {  // uniform
        store_once(dot_out + (lo + k0 + s * kS + q) * H, static_cast<scalar_t>(d[s * kS]));
      } else {
        *row_at(dot_out, cur.eq[s], H) = static_cast<scalar_t>(d[s * kS]);
      }
    }
    if (!kFuseAcc && with_weight) {  // uniform
#pragma unroll
      for (int u = 0; u < U; ++u)
        axpy_vec(acc[0], __shfl_sync(mask, wq[u / kS], head_base + (u % kS)), gv[u]);
    }
    if constexpr (kPrefetch) cur = next;
  }
}

namespace {  // internal linkage: each instance is launched by one .cu
// kS = 4 or 8: dot_entries_transposed (one vector per lane, one chunk);
// kS = 0: dot_entries.
template <typename scalar_t, typename index_t, int V, int VPL, int kS, int kU = kDotStep>
__global__ void __launch_bounds__(kDotThreads, dot_min_blocks<scalar_t, VPL, kS, kU>())
    dot_gather_kernel(const DotParams<scalar_t, index_t> p, const SliceList sl) {
  using acc_t = at::opmath_type<scalar_t>;
  const int G = p.G, lane = threadIdx.x & (G - 1);
  const bool with_weight = p.weight != nullptr;
  // Entries [lo, hi) of row r; acc_out's row (slot < 0) or a slice's partial.
  auto entries = [&](int64_t slot, int64_t r, int64_t lo, int64_t hi) {
    for (int chunk = 0; chunk < p.num_chunks; ++chunk) {
      const auto m = lane_map<V, VPL>(chunk, lane, G, p.D, p.HD);
      acc_t acc[VPL][V];
      if constexpr (kS != 0) {
        static_assert(VPL == 1, "one vector per lane");
        dot_entries_transposed<kS, kU>(acc, r, lo, hi, p, m, lane);
      } else {
        dot_entries(acc, r, lo, hi, p, m, lane);
      }
      if (!with_weight) continue;
#pragma unroll
      for (int k = 0; k < VPL; ++k) {
        if (!m.valid[k]) continue;
        if (slot >= 0) {
          store_vec<acc_t, V>(p.part + slot * p.HD + m.feat[k], acc[k]);
        } else {
          store_vec<scalar_t, V>(p.acc_out + r * p.HD + m.feat[k], acc[k]);
        }
      }
    }
  };
  auto row = [&](int64_t r, int64_t lo, int64_t hi) { entries(-1, r, lo, hi); };
  for_each_slice_or_row<kSortFetch<scalar_t>>(p.ptr, p.num_edges, sl, G, entries, row);
}
}  // namespace

}  // namespace pyg_multihead_agg
