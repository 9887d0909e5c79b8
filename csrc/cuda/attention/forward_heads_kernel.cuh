// gat_forward_kernel: the fused attention forward for shapes the all-heads
// kernels do not take (forward_rows_kernel.cuh). A work item is one
// (row, head) pair, handled by a group of G lanes that owns that head's D
// features (16-byte vectors when D allows, single elements otherwise; VPL
// vectors per lane), so the softmax statistics of a head are a reduction over
// the group alone. Items are numbered r * H + h, so the heads of one row go
// to neighbouring groups of a warp and share its indices and scores in L1.
//
// Per item (i, h): pass 1 over the row's edges, lanes striding over edges,
// computes the exact row maximum and sum of exp (online, combined by a
// butterfly) and so lse; pass 2 gathers x[j, h] with U edges in flight per
// lane and weight exp(leaky_relu(z) - lse) * dropout mask. Rows longer than
// the long-row threshold are processed by a whole block, head by head, with
// the partial statistics and sums combined through shared memory in a fixed
// order (deterministic).
#pragma once

#include <ATen/OpMathType.h>

#include <cstdint>
#include <limits>

#include "../utils/config.cuh"
#include "../utils/index.cuh"
#include "../utils/lanes.cuh"
#include "../utils/vec.cuh"
#include "../utils/work_list.cuh"
#include "head_lanes.cuh"
#include "params.cuh"
#include "softmax.cuh"

namespace pyg_multihead_agg {

// Softmax statistics of head h over edges lo + lane, lo + lane + stride, ...
// of destination r (unrolled by 4 so that several col -> s_src chains are in
// flight). Edges with an out-of-range source are skipped.
template <typename scalar_t, typename index_t>
__device__ __forceinline__ void row_stats(const AttentionParams<scalar_t, index_t>& p, int64_t r, int h,
                                          int64_t lo, int64_t hi, int lane, int stride,
                                          at::opmath_type<scalar_t>& mx,
                                          at::opmath_type<scalar_t>& sum) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kU = 4;
  const acc_t sd = load_value(p.s_dst + r * p.H + h);
  mx = -std::numeric_limits<acc_t>::infinity();
  sum = 0;
  for (int64_t e0 = lo + lane; e0 < hi; e0 += static_cast<int64_t>(kU) * stride) {
    acc_t l[kU];
    bool ok[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t e = e0 + static_cast<int64_t>(u) * stride;
      const int64_t j = load_index_if(e < hi, p.idx + e);
      ok[u] = e < hi && in_range(j, p.num_gathered);
      const acc_t ssrc = load_value_if(ok[u], p.s_src + j * p.H + h);
      acc_t z = ok[u] ? ssrc + sd : acc_t(0);
      z += load_value_if(ok[u] && p.s_edge != nullptr, p.s_edge + e * p.H + h);
      l[u] = leaky(z, p.negative_slope);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (ok[u]) merge_stats(mx, sum, l[u], acc_t(1));
  }
}

// Pass 2 of the forward for edges [lo, hi) of destination r, head h, one
// feature chunk: acc = sum_e exp(l[e] - lse) * mask[e] * x[col[e], h, chunk].
template <typename scalar_t, typename index_t, int V, int VPL>
__device__ __forceinline__ void attend(at::opmath_type<scalar_t> (&acc)[VPL][V],
                                       const AttentionParams<scalar_t, index_t>& p, int64_t r, int h,
                                       int64_t lo, int64_t hi, at::opmath_type<scalar_t> lse,
                                       const HeadLanes<VPL>& m) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int U = kLoadsInFlight / VPL;
  const acc_t sd = load_value(p.s_dst + r * p.H + h);
  const scalar_t* xh = p.x + static_cast<int64_t>(h) * p.D;
#pragma unroll
  for (int k = 0; k < VPL; ++k)
#pragma unroll
    for (int v = 0; v < V; ++v) acc[k][v] = 0;
  for (int64_t e0 = lo; e0 < hi; e0 += U) {
    int64_t j[U];
    bool ok[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool inside = e0 + u < hi;
      j[u] = load_index_if(inside, p.idx + e0 + u);
      ok[u] = inside && in_range(j[u], p.num_gathered);
    }
    Vec<scalar_t, V> xv[U][VPL];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int k = 0; k < VPL; ++k)
        xv[u][k] = load_vec_if<scalar_t, V>(ok[u] && m.valid[k], xh + j[u] * p.HD + m.feat[k]);
    acc_t ssrc[U], sedge[U];  // all of the step's loads before any branch
#pragma unroll
    for (int u = 0; u < U; ++u) {
      ssrc[u] = load_value_if(ok[u], p.s_src + j[u] * p.H + h);
      sedge[u] = load_value_if(ok[u] && p.s_edge != nullptr, p.s_edge + (e0 + u) * p.H + h);
    }
    acc_t w[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      w[u] = 0;
      if (ok[u]) {
        acc_t z = ssrc[u] + sd;
        z += sedge[u];
        w[u] = exp_(leaky(z, p.negative_slope) - lse);
        if (p.rng.threshold != 0) w[u] *= p.rng.keep(e0 + u, h) ? p.scale : acc_t(0);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int k = 0; k < VPL; ++k)
        axpy_vec(acc[k], w[u], xv[u][k]);
  }
}

namespace {  // internal linkage: each instance is launched by one .cu
template <typename scalar_t, typename index_t, int V, int VPL>
__global__ void __launch_bounds__(kThreads, forward_min_blocks<scalar_t>())
    gat_forward_kernel(const AttentionParams<scalar_t, index_t> p, const WorkList wl) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t red[kThreads * VPL * V];
  __shared__ acc_t s_mx[kThreads], s_sum[kThreads];
  const int G = p.G, lane = threadIdx.x & (G - 1);
  const int group = threadIdx.x / G, groups = kThreads / G;
  const unsigned mask = group_mask(G);

  auto short_item = [&](int64_t item, int64_t r, int64_t lo, int64_t hi) {
    const int h = static_cast<int>(item - r * p.H);
    acc_t mx, sum;
    row_stats(p, r, h, lo, hi, lane, G, mx, sum);
    group_merge_stats(mx, sum, G, mask);
    const acc_t lse = stats_lse(mx, sum, hi > lo);
    if (lane == 0) p.lse_out[r * p.H + h] = lse;
    for (int chunk = 0; chunk < p.num_chunks; ++chunk) {
      const auto m = head_lanes<V, VPL>(chunk, lane, G, p.D);
      acc_t acc[VPL][V];
      attend(acc, p, r, h, lo, hi, lse, m);
#pragma unroll
      for (int k = 0; k < VPL; ++k)
        if (m.valid[k]) store_vec<scalar_t, V>(p.out + r * p.HD + h * p.D + m.feat[k], acc[k]);
    }
  };
  // A long row: every head in turn with the whole block, each group on a
  // contiguous slice of the edges.
  auto long_row = [&](int64_t r, int64_t lo, int64_t hi) {
    int64_t slo, shi;
    group_slice(lo, hi, group, groups, slo, shi);
    for (int h = 0; h < p.H; ++h) {
      acc_t mx, sum;
      row_stats(p, r, h, slo, shi, lane, G, mx, sum);
      group_merge_stats(mx, sum, G, mask);
      if (lane == 0) {
        s_mx[group] = mx;
        s_sum[group] = sum;
      }
      __syncthreads();
      mx = s_mx[0];
      sum = s_sum[0];
      for (int g = 1; g < groups; ++g) merge_stats(mx, sum, s_mx[g], s_sum[g]);
      const acc_t lse = stats_lse(mx, sum, true);  // (a long row has edges)
      if (threadIdx.x == 0) p.lse_out[r * p.H + h] = lse;
      for (int chunk = 0; chunk < p.num_chunks; ++chunk) {
        const auto m = head_lanes<V, VPL>(chunk, lane, G, p.D);
        acc_t acc[VPL][V];
        attend(acc, p, r, h, slo, shi, lse, m);
        block_reduce_store<scalar_t, acc_t, V, VPL>(red, acc, G, lane, chunk * G * VPL * V, p.D,
                                                    p.out + r * p.HD + h * p.D);
      }
      __syncthreads();  // s_mx / s_sum are read before the next head writes them
    }
  };
  for_each_work_item(p.ptr, p.num_edges, wl, G, p.H, short_item, long_row);
}
}  // namespace

}  // namespace pyg_multihead_agg
