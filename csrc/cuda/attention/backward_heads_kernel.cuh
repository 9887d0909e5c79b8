// gat_backward_kernel and gat_delta_kernel: the fused attention backward for
// shapes the all-heads kernels do not take (backward_rows_kernel.cuh).
// Per item (j, h) of the CSC: x[j, h] is held in registers; for each in-edge
// (i = row[k], e = perm[k]) the group gathers grad_out[i, h], takes
// <grad_out[i, h], x[j, h]> by a butterfly, recomputes alpha and the mask,
// and accumulates grad_x[j, h] and grad_s_src[j, h]; grad_z[e, h] goes to an
// E x H buffer (written once per edge), from which the row sums
// (row_sum.cu) add grad_s_dst over the CSR rows. No atomics; fixed order.
// delta[i, h] comes from gat_delta_kernel first.
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

// <a, b> over one head's features (<a, b - c> with c, the bias; see vec_dot):
// each lane's vectors in (k, v) order, then a butterfly over the group. The
// backward's per-edge dot and delta use this same function, so for a row with
// a single edge (alpha = 1, out = x[j]) delta equals the dot bit for bit and
// the score gradients are exactly 0, as in the reference.
template <typename scalar_t, int V, int VPL>
__device__ __forceinline__ at::opmath_type<scalar_t> head_dot(
    const Vec<scalar_t, V> (&a)[VPL], const Vec<scalar_t, V> (&b)[VPL], int G, unsigned mask,
    const Vec<scalar_t, V> (*c)[VPL] = nullptr) {
  using acc_t = at::opmath_type<scalar_t>;
  acc_t dot = 0;
#pragma unroll
  for (int k = 0; k < VPL; ++k) dot_acc(dot, a[k], b[k], c != nullptr ? &(*c)[k] : nullptr);
  for (int off = G >> 1; off > 0; off >>= 1) dot += __shfl_xor_sync(mask, dot, off);
  return dot;
}

// Backward over the CSC entries [lo, hi) of source j, head h (x[j, h] in xr):
// accumulates grad_x (acc) and grad_s_src (gsrc), writes grad_z[e, h].
template <typename scalar_t, typename index_t, int V, int VPL>
__device__ __forceinline__ void attend_backward(at::opmath_type<scalar_t> (&acc)[VPL][V],
                                                at::opmath_type<scalar_t>& gsrc,
                                                const AttentionParams<scalar_t, index_t>& p, int64_t j,
                                                int h, int64_t lo, int64_t hi,
                                                const Vec<scalar_t, V> (&xr)[VPL],
                                                const HeadLanes<VPL>& m, int lane,
                                                unsigned mask) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int U = kLoadsInFlight / VPL;
  const acc_t ss = load_value(p.s_src + j * p.H + h);
  const scalar_t* gh = p.grad_out + static_cast<int64_t>(h) * p.D;
#pragma unroll
  for (int k = 0; k < VPL; ++k)
#pragma unroll
    for (int v = 0; v < V; ++v) acc[k][v] = 0;
  gsrc = 0;
  for (int64_t k0 = lo; k0 < hi; k0 += U) {
    int64_t i[U], e[U];
    bool ok[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool inside = k0 + u < hi;
      i[u] = load_index_if(inside, p.idx + k0 + u);
      e[u] = load_index_if(inside, p.perm + k0 + u);
      ok[u] = inside && in_range(i[u], p.num_gathered) && in_range(e[u], p.num_edges);
    }
    Vec<scalar_t, V> gv[U][VPL];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int k = 0; k < VPL; ++k)
        gv[u][k] = load_vec_if<scalar_t, V>(ok[u] && m.valid[k], gh + i[u] * p.HD + m.feat[k]);
    acc_t z[U], lse[U], dl[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t ih = i[u] * p.H + h;
      const acc_t sdst = load_value_if(ok[u], p.s_dst + ih);
      const acc_t sedge = load_value_if(ok[u] && p.s_edge != nullptr, p.s_edge + e[u] * p.H + h);
      const acc_t lse_i = load_value_if(ok[u], p.lse_in + ih);
      const acc_t delta_i = load_value_if(ok[u], p.delta + ih);
      const acc_t glse_i = load_value_if(ok[u] && p.grad_lse != nullptr, p.grad_lse + ih);
      // Selects, not branches (the loads give 0 when !ok[u]).
      z[u] = ok[u] ? ss + sdst + sedge : ss;
      lse[u] = lse_i;
      dl[u] = delta_i - glse_i;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (k0 + u >= hi) break;  // group-uniform: no shuffles for a partial step's padding
      const acc_t dot = head_dot<scalar_t, V, VPL>(gv[u], xr, p.G, mask);
      if (!ok[u]) continue;
      const acc_t alpha = exp_(leaky(z[u], p.negative_slope) - lse[u]);
      acc_t mk = 1;
      if (p.rng.threshold != 0) mk = p.rng.keep(e[u], h) ? p.scale : acc_t(0);
      const acc_t w = alpha * mk;
#pragma unroll
      for (int k = 0; k < VPL; ++k)
        axpy_vec(acc[k], w, gv[u][k]);
      const acc_t gz =
          alpha * (mk * dot - dl[u]) * (z[u] > acc_t(0) ? acc_t(1) : p.negative_slope);
      gsrc += gz;
      if (lane == 0) p.grad_z[(p.perm_inv != nullptr ? k0 + u : e[u]) * p.H + h] = gz;
    }
  }
}

namespace {  // internal linkage: each instance is launched by one .cu
template <typename scalar_t, typename index_t, int V, int VPL>
__global__ void __launch_bounds__(kThreads, 1)
    gat_backward_kernel(const AttentionParams<scalar_t, index_t> p, const WorkList wl) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t red[kThreads * VPL * V];
  __shared__ acc_t s_gsrc[kThreads];
  const int G = p.G, lane = threadIdx.x & (G - 1);
  const int group = threadIdx.x / G, groups = kThreads / G;
  const unsigned mask = group_mask(G);
  const auto m = head_lanes<V, VPL>(0, lane, G, p.D);  // one chunk (checked on the host)

  auto load_x = [&](int64_t j, int h, Vec<scalar_t, V>(&xr)[VPL]) {
#pragma unroll
    for (int k = 0; k < VPL; ++k)
      xr[k] = m.valid[k] ? load_vec<scalar_t, V>(p.x + j * p.HD + h * p.D + m.feat[k])
                         : zero_vec<scalar_t, V>();
  };
  auto short_item = [&](int64_t item, int64_t j, int64_t lo, int64_t hi) {
    const int h = static_cast<int>(item - j * p.H);
    Vec<scalar_t, V> xr[VPL];
    load_x(j, h, xr);
    acc_t acc[VPL][V], gsrc;
    attend_backward(acc, gsrc, p, j, h, lo, hi, xr, m, lane, mask);
#pragma unroll
    for (int k = 0; k < VPL; ++k)
      if (m.valid[k]) store_vec<scalar_t, V>(p.out + j * p.HD + h * p.D + m.feat[k], acc[k]);
    if (lane == 0) p.grad_s_src[j * p.H + h] = static_cast<scalar_t>(gsrc);
  };
  auto long_col = [&](int64_t j, int64_t lo, int64_t hi) {
    int64_t slo, shi;
    group_slice(lo, hi, group, groups, slo, shi);
    for (int h = 0; h < p.H; ++h) {
      Vec<scalar_t, V> xr[VPL];
      load_x(j, h, xr);
      acc_t acc[VPL][V], gsrc;
      attend_backward(acc, gsrc, p, j, h, slo, shi, xr, m, lane, mask);
      if (lane == 0) s_gsrc[group] = gsrc;
      block_reduce_store<scalar_t, acc_t, V, VPL>(red, acc, G, lane, 0, p.D,
                                                  p.out + j * p.HD + h * p.D);
      if (threadIdx.x == 0) {
        acc_t s = 0;
        for (int g = 0; g < groups; ++g) s += s_gsrc[g];
        p.grad_s_src[j * p.H + h] = static_cast<scalar_t>(s);
      }
      __syncthreads();
    }
  };
  for_each_work_item(p.ptr, p.num_edges, wl, G, p.H, short_item, long_col);
}
}  // namespace

namespace {  // internal linkage: each instance is launched by one .cu
// delta[i, h] = <grad_out[i, h, :], out[i, h, :] - bias[h, :]>, one group per
// (row, head) with the lane layout of the backward kernel (see head_dot).
template <typename scalar_t, typename index_t, int V, int VPL>
__global__ void __launch_bounds__(kThreads)
    gat_delta_kernel(const AttentionParams<scalar_t, index_t> p, const scalar_t* __restrict__ out,
                     at::opmath_type<scalar_t>* __restrict__ delta) {
  const int G = p.G, lane = threadIdx.x & (G - 1);
  const unsigned mask = group_mask(G);
  const auto m = head_lanes<V, VPL>(0, lane, G, p.D);
  const int64_t groups = static_cast<int64_t>(gridDim.x) * (kThreads / G);
  const int64_t num_items = p.num_gathered * p.H;  // destination rows x heads
  for (int64_t item = blockIdx.x * static_cast<int64_t>(kThreads / G) + threadIdx.x / G;
       item < num_items; item += groups) {  // the bound is group-uniform
    const int64_t offset = item * p.D;  // [i, h, 0] of a [N_dst, H, D] tensor
    const int64_t bias_offset = (item % p.H) * p.D;  // [h, 0] of the bias [H, D]
    Vec<scalar_t, V> g[VPL], o[VPL], b[VPL];
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      g[k] = m.valid[k] ? load_vec<scalar_t, V>(p.grad_out + offset + m.feat[k])
                        : zero_vec<scalar_t, V>();
      o[k] = m.valid[k] ? load_vec<scalar_t, V>(out + offset + m.feat[k])
                        : zero_vec<scalar_t, V>();
      b[k] = load_vec_if<scalar_t, V>(m.valid[k] && p.bias != nullptr,
                                      p.bias + bias_offset + m.feat[k]);
    }
    const auto d = head_dot<scalar_t, V, VPL>(g, o, G, mask, &b);
    if (lane == 0) delta[item] = d;
  }
}
}  // namespace

}  // namespace pyg_multihead_agg
