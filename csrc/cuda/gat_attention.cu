// CUDA kernels of the fused GAT attention (docs/fused_attention.md): edge
// softmax, Philox dropout and aggregation in one pass per destination row,
// and the backward from the CSC with the attention recomputed from lse.
//
// Two kernel families. The fast path (further down, "all heads of a row per
// group"): a group of lanes owns a whole row of H * D features, as in
// multihead_spmm, when a head is a power-of-two number of 16-byte vectors;
// its forward makes one pass per row with an online softmax, its backward
// walks the CSC with long columns cut into slices. The fallback for other
// shapes (first below): a work item is one (row, head) pair, handled by a
// group of G lanes that owns that head's D features (16-byte vectors when D
// allows, single elements otherwise; VPL vectors per lane). The softmax
// statistics of a head are then a reduction over the group alone. Items are
// numbered r * H + h, so the heads of one row go to neighbouring groups of a
// warp and share its indices and scores in L1.
//
// Fallback forward, per item (i, h): pass 1 over the row's edges, lanes
// striding over edges, computes the exact row maximum and sum of exp
// (online, combined by a butterfly) and so lse; pass 2 gathers x[j, h] with U
// edges in flight per lane and weight exp(leaky_relu(z) - lse) * dropout
// mask. Rows longer than the long-row threshold are processed by a whole
// block, head by head, with the partial statistics and sums combined through
// shared memory in a fixed order (deterministic).
//
// Fallback backward, per item (j, h) of the CSC: x[j, h] is held in
// registers; for each in-edge (i = row[k], e = perm[k]) the group gathers
// grad_out[i, h], takes <grad_out[i, h], x[j, h]> by a butterfly, recomputes
// alpha and the mask, and accumulates grad_x[j, h] and grad_s_src[j, h];
// grad_z[e, h] goes to an E x H buffer (written once per edge), from which a
// second small kernel sums grad_s_dst over the CSR rows. No atomics; fixed
// order.
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <tuple>
#include <type_traits>

#include "../checks.h"
#include "../philox.h"
#include "common.cuh"
#include "dispatch.cuh"

namespace pyg_multihead_agg {
namespace {

template <typename T>
__device__ __forceinline__ T exp_(T v) {
  return exp(v);
}
template <>
__device__ __forceinline__ float exp_(float v) {
  return expf(v);
}
template <typename T>
__device__ __forceinline__ T log_(T v) {
  return log(v);
}
template <>
__device__ __forceinline__ float log_(float v) {
  return logf(v);
}

template <typename scalar_t, typename index_t>
struct GatParams {
  using acc_t = at::opmath_type<scalar_t>;
  const index_t* ptr;        // rowptr (forward) or colptr (backward)
  const index_t* idx;        // col (forward) or row (backward)
  const index_t* perm;       // backward: edge id of each CSC entry
  const scalar_t* s_src;     // [N_src, H]
  const scalar_t* s_dst;     // [N_dst, H]
  const scalar_t* s_edge;    // [E, H] or nullptr
  const scalar_t* x;         // [N_src, H, D]
  const scalar_t* grad_out;  // backward: [N_dst, H, D]
  const acc_t* lse_in;       // backward: [N_dst, H]
  const acc_t* delta;        // backward: [N_dst, H]
  const acc_t* grad_lse;     // backward: [N_dst, H] or nullptr
  const scalar_t* bias;      // [H, D] or nullptr (backward: delta from out - bias)
  scalar_t* out;             // forward: [N_dst, H, D]; backward: grad_x [N_src, H, D]
  acc_t* lse_out;            // forward: [N_dst, H]
  scalar_t* grad_s_src;      // backward: [N_src, H]
  acc_t* grad_z;             // backward: [E, H], by edge id or (perm_inv) by CSC entry
  const index_t* perm_inv;   // backward: CSC entry of each edge, or nullptr
  const void* aux;           // backward, all-heads path: RowAux<acc_t> [N_dst, H]
  acc_t* part_x;             // backward, all-heads path: [slots, H * D] partial grad_x
  acc_t* part_src;           // backward, all-heads path: [slots, H] partial grad_s_src
  int64_t num_rows, num_gathered, num_edges;  // compressed rows, gathered rows, E
  int H, D, HD, G, num_chunks;
  int S, log2S;  // all-heads path: lanes per head (D / V, a power of two <= G)
  int64_t onepass_min;  // all-heads forward: rows longer than this take one pass
  acc_t negative_slope, scale;  // scale: 1 / (1 - p) (0 for p == 1)
  DropoutRng rng;
};

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

template <typename acc_t>
__device__ __forceinline__ acc_t leaky(acc_t z, acc_t slope) {
  return z > acc_t(0) ? z : z * slope;
}

// exp(a - m) for a running maximum m, with exp(-inf - -inf) taken as 0.
template <typename acc_t>
__device__ __forceinline__ acc_t exp_shift(acc_t a, acc_t m) {
  return a == -std::numeric_limits<acc_t>::infinity() ? acc_t(0) : exp_(a - m);
}

// Merges the softmax statistics (max, sum of exp) of two edge sets.
template <typename acc_t>
__device__ __forceinline__ void merge_stats(acc_t& mx, acc_t& sum, acc_t omx, acc_t osum) {
  const acc_t nm = mx > omx ? mx : omx;
  sum = sum * exp_shift(mx, nm) + osum * exp_shift(omx, nm);
  mx = nm;
}

template <typename acc_t>
__device__ __forceinline__ acc_t stats_lse(acc_t mx, acc_t sum, bool nonempty) {
  // As in the reference (and the CPU kernel): -inf for a row without edges;
  // NaN when every score is -inf (0 / 0) or a score is NaN or +inf (a NaN sum).
  if (!nonempty) return -std::numeric_limits<acc_t>::infinity();
  return sum == acc_t(0) ? std::numeric_limits<acc_t>::quiet_NaN() : mx + log_(sum);
}

// Softmax statistics of head h over edges lo + lane, lo + lane + stride, ...
// of destination r (unrolled by 4 so that several col -> s_src chains are in
// flight). Edges with an out-of-range source are skipped.
template <typename scalar_t, typename index_t>
__device__ __forceinline__ void row_stats(const GatParams<scalar_t, index_t>& p, int64_t r, int h,
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

template <typename acc_t>
__device__ __forceinline__ void group_merge_stats(acc_t& mx, acc_t& sum, int G, unsigned mask) {
  for (int off = G >> 1; off > 0; off >>= 1) {
    const acc_t omx = __shfl_xor_sync(mask, mx, off), osum = __shfl_xor_sync(mask, sum, off);
    merge_stats(mx, sum, omx, osum);
  }
}

// Pass 2 of the forward for edges [lo, hi) of destination r, head h, one
// feature chunk: acc = sum_e exp(l[e] - lse) * mask[e] * x[col[e], h, chunk].
template <typename scalar_t, typename index_t, int V, int VPL>
__device__ __forceinline__ void attend(at::opmath_type<scalar_t> (&acc)[VPL][V],
                                       const GatParams<scalar_t, index_t>& p, int64_t r, int h,
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

// Two blocks per SM (at most 128 registers) for float32, which ptxas fits
// without spilling; one for the others, which would spill.
template <typename scalar_t>
constexpr int forward_min_blocks() {
  return std::is_same<scalar_t, float>::value ? 2 : 1;
}

template <typename scalar_t, typename index_t, int V, int VPL>
__global__ void __launch_bounds__(kThreads, forward_min_blocks<scalar_t>())
    gat_forward_kernel(const GatParams<scalar_t, index_t> p, const WorkList wl) {
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

// Backward over the CSC entries [lo, hi) of source j, head h (x[j, h] in xr):
// accumulates grad_x (acc) and grad_s_src (gsrc), writes grad_z[e, h].
template <typename scalar_t, typename index_t, int V, int VPL>
__device__ __forceinline__ void attend_backward(at::opmath_type<scalar_t> (&acc)[VPL][V],
                                                at::opmath_type<scalar_t>& gsrc,
                                                const GatParams<scalar_t, index_t>& p, int64_t j,
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

template <typename scalar_t, typename index_t, int V, int VPL>
__global__ void __launch_bounds__(kThreads, 1)
    gat_backward_kernel(const GatParams<scalar_t, index_t> p, const WorkList wl) {
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

// ---------------------------------------------------------------------------
// Backward, all heads of a source row per group (the fast path)
// ---------------------------------------------------------------------------
//
// A group of G lanes owns a whole row of H * D features in 16-byte vectors,
// VPL per lane (vector v = lane + G * k, as in multihead_spmm); a head spans
// S = D / V lanes, a power of two that divides G, so the vectors of head h lie
// in S aligned lanes of one pass k and its dot products are S-lane
// butterflies. Per CSC entry (i = row[k], e = perm[k]) the group loads the two
// indices once for all heads, gathers grad_out[i] as one coalesced row, loads
// one packed (s_dst, lse, delta - grad_lse) per head, and writes
// grad_z[e, 0:H] as one contiguous store. The per-head kernel above loaded
// the indices H times, each head's scores from three arrays, and walked a hub
// column head by head with one block; here long columns are cut into slices
// (SliceList) that any group takes, and a second kernel adds the slices'
// partial sums in slice order.

// What the backward needs of destination row i, head h, in one 16-byte load
// (two for float64).
template <typename acc_t>
struct alignas(4 * sizeof(acc_t)) RowAux {
  acc_t sd, lse, dl, pad;  // s_dst[i, h], lse[i, h], delta[i, h] - grad_lse[i, h]
};

template <typename acc_t>
__device__ __forceinline__ RowAux<acc_t> load_aux(bool pred, const RowAux<acc_t>* p) {
  // Zeros when !pred, as one predicated load (see load_vec_if).
  RowAux<acc_t> a;
  if constexpr (sizeof(acc_t) == 4) {
    *reinterpret_cast<uint4*>(&a) = RawLoad<16>::load(pred, p);
  } else {
    const auto* q = reinterpret_cast<const uint4*>(p);
    reinterpret_cast<uint4*>(&a)[0] = RawLoad<16>::load(pred, q);
    reinterpret_cast<uint4*>(&a)[1] = RawLoad<16>::load(pred, q + 1);
  }
  return a;
}

// The per-lane <a, b> (vec_dot, common.cuh) is followed by the S-lane butterfly
// of lanes_sum. The aux kernel (delta) and the backward use these same two
// steps, so that a row with a single edge (alpha = 1, out = x[j]) gives
// delta equal to the edge's dot bit for bit and score gradients of exactly 0.
template <typename acc_t>
__device__ __forceinline__ acc_t lanes_sum(acc_t v, int S, unsigned mask) {
  for (int off = S >> 1; off > 0; off >>= 1) v += __shfl_xor_sync(mask, v, off);
  return v;
}

// The vectors of a row this lane owns: feature offset, head, and whether the
// head exists (the padding heads of a group wider than H * S have none).
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

// grad_x (acc) and grad_s_src (gsrc) of source j over its CSC entries
// [lo, hi), all heads; writes grad_z[e, :] of each entry.
template <typename scalar_t, typename index_t, int V, int VPL>
__device__ __forceinline__ void backward_row(at::opmath_type<scalar_t> (&acc)[VPL][V],
                                             at::opmath_type<scalar_t> (&gsrc)[VPL],
                                             const GatParams<scalar_t, index_t>& p, int64_t j,
                                             int64_t lo, int64_t hi, const RowLanes<V, VPL>& m,
                                             int lane, unsigned mask) {
  using acc_t = at::opmath_type<scalar_t>;
  // Entries per step: each brings two 16-byte loads per vector (grad_out and
  // the packed aux), so half the forward's count keeps kLoadsInFlight loads
  // in flight and the kernel within 128 registers (2 blocks per SM).
  constexpr int U = kLoadsInFlight / 2 / VPL > 0 ? kLoadsInFlight / 2 / VPL : 1;
  const auto* aux = static_cast<const RowAux<acc_t>*>(p.aux);
  const int S = p.S, q = lane & (S - 1);
  Vec<scalar_t, V> xr[VPL];
  acc_t ss[VPL];
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    xr[k] = m.valid[k] ? load_vec<scalar_t, V>(p.x + j * p.HD + m.feat[k])
                       : zero_vec<scalar_t, V>();
    ss[k] = m.valid[k] ? load_value(p.s_src + j * p.H + m.head[k]) : acc_t(0);
    gsrc[k] = 0;
#pragma unroll
    for (int v = 0; v < V; ++v) acc[k][v] = 0;
  }
  // With 32-bit indices, the entries' indices one step ahead: a step's
  // gathers wait only for indices loaded during the previous step's
  // arithmetic. (64-bit ones would take 16 more registers: 4 blocks instead
  // of 5, which measured slower than no prefetch.)
  constexpr bool kPrefetch = sizeof(index_t) == 4;
  auto load_indices = [&](int64_t k0, index_t(&ni)[U], index_t(&ne)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool inside = k0 + u < hi;
      ni[u] = load_index_if(inside, p.idx + k0 + u);
      ne[u] = load_index_if(inside, p.perm + k0 + u);
    }
  };
  index_t i[U], e[U];  // the index type: int32 graphs keep half the registers
  if constexpr (kPrefetch) load_indices(lo, i, e);
  for (int64_t k0 = lo; k0 < hi; k0 += U) {
    if constexpr (!kPrefetch) load_indices(k0, i, e);
    bool ok[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      ok[u] = k0 + u < hi && in_range(i[u], p.num_gathered) && in_range(e[u], p.num_edges);
    Vec<scalar_t, V> gv[U][VPL];
    RowAux<acc_t> ax[U][VPL];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int k = 0; k < VPL; ++k) {
        const bool use = ok[u] && m.valid[k];
        gv[u][k] = load_vec_if<scalar_t, V>(
            use, p.grad_out + static_cast<int64_t>(i[u]) * p.HD + m.feat[k]);
        ax[u][k] = load_aux(use, aux + static_cast<int64_t>(i[u]) * p.H + m.head[k]);
      }
    acc_t se[U][VPL];  // s_edge[e, h], added last as in the forward's z
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int k = 0; k < VPL; ++k)
        se[u][k] = load_value_if(ok[u] && m.valid[k] && p.s_edge != nullptr,
                                 p.s_edge + static_cast<int64_t>(e[u]) * p.H + m.head[k]);
    unsigned keep[VPL];
    if (p.rng.threshold != 0)
      draw_keep_bits<U, VPL>(keep, p.rng, p.perm, k0, hi, q, p.log2S, m.head);
    index_t ni[U], ne[U];
    if constexpr (kPrefetch) load_indices(k0 + U, ni, ne);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (k0 + u >= hi) break;  // group-uniform: no shuffles for a partial step's padding
#pragma unroll
      for (int k = 0; k < VPL; ++k) {
        const acc_t dot = lanes_sum(vec_dot<scalar_t, V>(gv[u][k], xr[k]), S, mask);
        const acc_t mk =
            p.rng.threshold != 0 ? keep_scale(keep[k], u, S, p.log2S, mask, p.scale) : acc_t(1);
        if (!(ok[u] && m.valid[k])) continue;
        acc_t z = ss[k] + ax[u][k].sd;
        z += se[u][k];
        const acc_t alpha = exp_(leaky(z, p.negative_slope) - ax[u][k].lse);
        const acc_t w = alpha * mk;
        axpy_vec(acc[k], w, gv[u][k]);
        const acc_t gz =
            alpha * (mk * dot - ax[u][k].dl) * (z > acc_t(0) ? acc_t(1) : p.negative_slope);
        gsrc[k] += gz;
        if (q == 0) {
          const int64_t zi = p.perm_inv != nullptr ? k0 + u : static_cast<int64_t>(e[u]);
          p.grad_z[zi * p.H + m.head[k]] = gz;
        }
      }
    }
    if constexpr (kPrefetch) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        i[u] = ni[u];
        e[u] = ne[u];
      }
    }
  }
}

// The same pass for one vector per lane and kS = 4 or 8 lanes per head (the
// common shapes: float32 heads of 16 or 32 channels, bf16/fp16 heads of 32;
// kS = 8 is float32 only), with the per-entry scalar work done once instead
// of in all kS lanes of a head. backward_row repeats the softmax arithmetic
// (exp, leaky_relu, the logit gradient, the grad_z store) in every lane and
// runs one kS-lane butterfly per entry; ncu measured 152 warp instructions per
// CSC entry there (reddit-like, float32), bound by issue and latency at 5
// warps per scheduler. Here a step of U entries reduces its U dot products
// with one transposing butterfly (7 shuffles instead of 24 for 8 entries over
// 8 lanes: at each level a lane keeps half the entries and sends the other
// half), after which lane q of a head holds the whole dot of entry q (and
// 4 + q when U = 8 and kS = 4). That lane alone loads the entry's row, edge
// id and aux, computes alpha, the dropout mask and the logit gradient and
// stores grad_z; the weights go back to the head's lanes with one shuffle per
// entry. The pairs added are those of lanes_sum, so every dot, alpha, grad_x
// and grad_z is bitwise the same as in backward_row; grad_s_src is summed per
// lane and then over the head's lanes.
template <int kS, typename scalar_t, typename index_t, int V>
__device__ __forceinline__ void backward_row_transposed(
    at::opmath_type<scalar_t> (&acc)[1][V], at::opmath_type<scalar_t> (&gsrc)[1],
    const GatParams<scalar_t, index_t>& p, int64_t j, int64_t lo, int64_t hi,
    const RowLanes<V, 1>& m, int lane, unsigned mask) {
  using acc_t = at::opmath_type<scalar_t>;
  static_assert(kS == 4 || kS == 8, "4 or 8 lanes per head");
  // Entries per step, and per lane and step: 8 (float32), kS otherwise (an
  // unpacked half vector or a float64 one takes twice the registers).
  constexpr int U = sizeof(scalar_t) == 4 ? 8 : kS, kSlots = U / kS;
  const auto* aux = static_cast<const RowAux<acc_t>*>(p.aux);
  const int q = lane & (kS - 1);
  const int head_base = (threadIdx.x & 31) & ~(kS - 1);  // warp lane of the head's lane 0
  const bool valid = m.valid[0];
  const int h = m.head[0];
  const Vec<scalar_t, V> xr = valid ? load_vec<scalar_t, V>(p.x + j * p.HD + m.feat[0])
                                    : zero_vec<scalar_t, V>();
  const acc_t ss = valid ? load_value(p.s_src + j * p.H + h) : acc_t(0);
  acc_t g = 0;
#pragma unroll
  for (int v = 0; v < V; ++v) acc[0][v] = 0;
  // Every index a step needs (StepIndices), one step ahead with 32-bit
  // indices: the rows of all U entries (for the gathers, in every lane) and
  // this lane's own entries' row and edge id (for its aux and grad_z).
  // Offsets from lo in the index's width, 32-bit compares and row addresses
  // by row_at (common.cuh).
  const int HD = p.HD, H = p.H;
  const IndexBound<index_t> gathered_ok(p.num_gathered), edge_ok(p.num_edges);
  using off_t = EntryOffset<index_t>;
  using Step = StepIndices<U, kS, true, index_t>;
  const off_t n = static_cast<off_t>(hi - lo);
  auto load_idx = [&](off_t k0, Step& s_) {  // the CSC's perm is always given here
    s_.template load<true>(p.idx, p.perm, lo, k0, n, q);
  };
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
                                      row_at(p.grad_out, cur.i[u], HD) + m.feat[0]);
    bool ok[kSlots];
    RowAux<acc_t> ax[kSlots];
    acc_t se[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      ok[s] = valid && s * kS + q < left && gathered_ok(cur.iq[s]) && edge_ok(cur.eq[s]);
      ax[s] = load_aux(ok[s], row_at(aux, cur.iq[s], H) + h);
      se[s] = load_value_if(ok[s] && p.s_edge != nullptr, row_at(p.s_edge, cur.eq[s], H) + h);
    }
    Step next;
    if constexpr (kPrefetch) load_idx(k0 + U, next);
    acc_t d[U];
#pragma unroll
    for (int u = 0; u < U; ++u) d[u] = vec_dot<scalar_t, V>(gv[u], xr);
    if constexpr (kS == 8) transpose_round<4, kS>(d, q, mask);
    transpose_round<2, kS>(d, q, mask);
    transpose_round<1, kS>(d, q, mask);
    // Slot s * kS now holds the whole dot of this lane's entry s * kS + q.
    acc_t w[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      acc_t mk = 1;
      if (p.rng.threshold != 0)  // group-uniform
        mk = ok[s] && p.rng.keep(static_cast<int64_t>(cur.eq[s]), h) ? p.scale : acc_t(0);
      acc_t z = ss + ax[s].sd;
      z += se[s];
      const acc_t alpha = exp_(leaky(z, p.negative_slope) - ax[s].lse);
      w[s] = ok[s] ? alpha * mk : acc_t(0);
      const acc_t gz = alpha * (mk * d[s * kS] - ax[s].dl) *
                       (z > acc_t(0) ? acc_t(1) : p.negative_slope);
      if (ok[s]) {
        g += gz;
        const int64_t zi = p.perm_inv != nullptr ? lo + k0 + s * kS + q
                                                 : static_cast<int64_t>(cur.eq[s]);
        p.grad_z[zi * H + h] = gz;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const acc_t wu = __shfl_sync(mask, w[u / kS], head_base + (u % kS));
      axpy_vec(acc[0], wu, gv[u]);
    }
    if constexpr (kPrefetch) cur = next;
  }
  gsrc[0] = lanes_sum(g, kS, mask);
}

#ifndef PMA_TRANSPOSED_MIN_BLOCKS
#define PMA_TRANSPOSED_MIN_BLOCKS 5
#endif

// Blocks of 128 threads: the kernel has no block-wide step (slices replace
// block-wide long rows), so registers, not the block size, set the warps per
// multiprocessor: float32 rows of one vector per lane fit 96 registers, 5
// blocks = 20 warps instead of 2 x 8 with 256 threads (the kernel is
// latency-bound: more warps, more gathers in flight). Other rows: at most 128
// registers (4 blocks) or, with 4 vectors per lane, one block's worth.
constexpr int kBackwardThreads = 128;

template <typename scalar_t, int VPL, int kS>
constexpr int backward_min_blocks() {
  // Transposed: float32 at 4 blocks (125 registers); 2-byte types at
  // PMA_TRANSPOSED_MIN_BLOCKS = 5 (96 registers, 48 bytes of spill), which
  // took 1-2% off bf16 on the H200 where float32 lost 1-2% (session 7).
  if (kS != 0) return sizeof(scalar_t) == 2 ? PMA_TRANSPOSED_MIN_BLOCKS : 4;
  return VPL >= 4 ? 1 : (VPL == 1 && sizeof(scalar_t) == 4 ? 5 : 4);
}

// kS = 4 or 8: backward_row_transposed for heads of kS lanes (VPL = 1); kS =
// 0: backward_row.
template <typename scalar_t, typename index_t, int V, int VPL, int kS>
__global__ void __launch_bounds__(kBackwardThreads, backward_min_blocks<scalar_t, VPL, kS>())
    gat_backward_rows_kernel(const GatParams<scalar_t, index_t> p, const SliceList sl) {
  using acc_t = at::opmath_type<scalar_t>;
  const int G = p.G, lane = threadIdx.x & (G - 1);
  const unsigned mask = group_mask(G);
  const RowLanes<V, VPL> m(lane, G, p.log2S, p.H);
  const bool leader = (lane & (p.S - 1)) == 0;
  // One pass over the entries [lo, hi) of column j.
  auto pass = [&](acc_t(&acc)[VPL][V], acc_t(&gsrc)[VPL], int64_t j, int64_t lo, int64_t hi) {
    if constexpr (kS != 0) {
      static_assert(VPL == 1, "one vector per lane");
      backward_row_transposed<kS>(acc, gsrc, p, j, lo, hi, m, lane, mask);
    } else {
      backward_row(acc, gsrc, p, j, lo, hi, m, lane, mask);
    }
  };
  auto slice = [&](int64_t slot, int64_t j, int64_t lo, int64_t hi) {
    acc_t acc[VPL][V], gsrc[VPL];
    pass(acc, gsrc, j, lo, hi);
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      if (!m.valid[k]) continue;
      store_vec<acc_t, V>(p.part_x + slot * p.HD + m.feat[k], acc[k]);
      if (leader) p.part_src[slot * p.H + m.head[k]] = gsrc[k];
    }
  };
  auto row = [&](int64_t j, int64_t lo, int64_t hi) {
    acc_t acc[VPL][V], gsrc[VPL];
    pass(acc, gsrc, j, lo, hi);
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      if (!m.valid[k]) continue;
      store_vec<scalar_t, V>(p.out + j * p.HD + m.feat[k], acc[k]);
      if (leader) p.grad_s_src[j * p.H + m.head[k]] = static_cast<scalar_t>(gsrc[k]);
    }
  };
  for_each_slice_or_row(p.ptr, p.num_edges, sl, G, slice, row);
}

// aux[i, h] = (s_dst, lse, delta - grad_lse) with delta[i, h] = <grad_out[i, h],
// out[i, h] - bias[h]>, one group per destination row, in the lane layout of
// gat_backward_rows_kernel (vec_dot, then lanes_sum; without a bias the
// subtracted vector is zero, so a single-edge row's delta is still its dot
// bit for bit).
template <typename scalar_t, typename index_t, int V, int VPL>
__global__ void __launch_bounds__(kThreads)
    gat_aux_kernel(const GatParams<scalar_t, index_t> p, const scalar_t* __restrict__ out,
                   RowAux<at::opmath_type<scalar_t>>* __restrict__ aux) {
  using acc_t = at::opmath_type<scalar_t>;
  const int G = p.G, lane = threadIdx.x & (G - 1);
  const unsigned mask = group_mask(G);
  const RowLanes<V, VPL> m(lane, G, p.log2S, p.H);
  const bool leader = (lane & (p.S - 1)) == 0;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * (kThreads / G);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads / G) + threadIdx.x / G;
       i < p.num_gathered; i += groups) {  // the bound is group-uniform
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const int64_t offset = i * p.HD + m.feat[k];
      const auto g = m.valid[k] ? load_vec<scalar_t, V>(p.grad_out + offset)
                                : zero_vec<scalar_t, V>();
      const auto o = m.valid[k] ? load_vec<scalar_t, V>(out + offset) : zero_vec<scalar_t, V>();
      const auto b = load_vec_if<scalar_t, V>(m.valid[k] && p.bias != nullptr, p.bias + m.feat[k]);
      const acc_t d = lanes_sum(vec_dot<scalar_t, V>(g, o, &b), p.S, mask);
      if (leader && m.valid[k]) {
        const int64_t ih = i * p.H + m.head[k];
        RowAux<acc_t> a;
        a.sd = load_value(p.s_dst + ih);
        a.lse = p.lse_in[ih];
        a.dl = d - (p.grad_lse != nullptr ? p.grad_lse[ih] : acc_t(0));
        a.pad = 0;
        aux[ih] = a;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Forward, all heads of a destination row per group (the fast path)
// ---------------------------------------------------------------------------
//
// The lane layout of gat_backward_rows_kernel: a group owns the row's H * D
// features, S lanes per head. Two ways through a row, chosen per row:
//
// * Short rows of at most `onepass_min` entries (by default every short row,
//   see onepass_min() on the host) make two passes: pass 1, the S lanes of
//   each head striding over the row's entries (q, q + S, ...) for the exact
//   maximum and sum of exp, merged by an S-lane butterfly; pass 2, U entries
//   per step, their col loaded once for all heads and x[j] gathered as one
//   coalesced row, weighted by exp(l - lse).
// * Longer short rows and the block-wide long rows make one pass with an online
//   softmax: each step loads U cols, then x[j] and s_src[j] together; each
//   lane keeps its heads' running maximum, the sum of exp(l - max) before
//   dropout and the accumulated exp(l - max) * mask * x[j], rescaled when the
//   maximum grows. The S lanes of a head see the same scores, so their states
//   agree without shuffles. float32 works in base 2 (logits scaled by log2 e,
//   exp2f: one MUFU.EX2 instead of expf's range reduction).
//
// Session 3 ran every row through the two passes (1.9x the time of the plain
// aggregation); one pass for every row (session 4) measured 6-13% slower on
// products-like (short rows) and at most 7% faster on reddit-like.

// Pass 1 for this lane's heads over entries lo + q, lo + q + S, ... < hi.
template <typename scalar_t, typename index_t, int V, int VPL>
__device__ __forceinline__ void row_stats_heads(const GatParams<scalar_t, index_t>& p,
                                                int64_t lo, int64_t hi, int q,
                                                const RowLanes<V, VPL>& m,
                                                const at::opmath_type<scalar_t> (&sd)[VPL],
                                                at::opmath_type<scalar_t> (&mx)[VPL],
                                                at::opmath_type<scalar_t> (&sum)[VPL]) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kU = 4;
  const int S = p.S;
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    mx[k] = -std::numeric_limits<acc_t>::infinity();
    sum[k] = 0;
  }
  for (int64_t e0 = lo + q; e0 < hi; e0 += static_cast<int64_t>(kU) * S) {
    // In phases, each free of branches: the kU indices, then their scores,
    // then the arithmetic (two round trips of latency per step).
    index_t j[kU];
    bool ok[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) j[u] = load_index_if(e0 + u * S < hi, p.idx + e0 + u * S);
    acc_t ssrc[kU][VPL], sedge[kU][VPL];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t e = e0 + static_cast<int64_t>(u) * S;
      ok[u] = e < hi && in_range(j[u], p.num_gathered);
#pragma unroll
      for (int k = 0; k < VPL; ++k) {
        const bool use = ok[u] && m.valid[k];
        ssrc[u][k] = load_value_if(use, p.s_src + static_cast<int64_t>(j[u]) * p.H + m.head[k]);
        sedge[u][k] = load_value_if(use && p.s_edge != nullptr, p.s_edge + e * p.H + m.head[k]);
      }
    }
    acc_t l[kU][VPL];
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int k = 0; k < VPL; ++k) {
        acc_t z = ok[u] && m.valid[k] ? ssrc[u][k] + sd[k] : acc_t(0);
        z += sedge[u][k];
        l[u][k] = leaky(z, p.negative_slope);
      }
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int k = 0; k < VPL; ++k)
        if (ok[u]) merge_stats(mx[k], sum[k], l[u][k], acc_t(1));
  }
}

// One step's loads for this lane's heads, shared by both forward paths:
// entries e0..e0+U-1 (none past hi or out of range: ok[u] false), their x
// vectors and logits z = s_src + s_dst + s_edge before leaky_relu (0 for
// those entries and for padding vectors; + 0 without edge scores), stored as
// out[u][k] = finish(use, z). Every load is predicated, with no branch in
// between (see load_vec_if).
template <int U, typename scalar_t, typename index_t, int V, int VPL, typename Finish>
__device__ __forceinline__ void load_attend_step(bool (&ok)[U], Vec<scalar_t, V> (&xv)[U][VPL],
                                                 at::opmath_type<scalar_t> (&out)[U][VPL],
                                                 const GatParams<scalar_t, index_t>& p,
                                                 int64_t e0, int64_t hi,
                                                 const RowLanes<V, VPL>& m,
                                                 const at::opmath_type<scalar_t> (&sd)[VPL],
                                                 Finish&& finish) {
  using acc_t = at::opmath_type<scalar_t>;
  index_t j[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const bool inside = e0 + u < hi;
    j[u] = load_index_if(inside, p.idx + e0 + u);
    ok[u] = inside && in_range(j[u], p.num_gathered);
  }
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const bool use = ok[u] && m.valid[k];
      xv[u][k] =
          load_vec_if<scalar_t, V>(use, p.x + static_cast<int64_t>(j[u]) * p.HD + m.feat[k]);
      const acc_t ssrc =
          load_value_if(use, p.s_src + static_cast<int64_t>(j[u]) * p.H + m.head[k]);
      acc_t z = use ? ssrc + sd[k] : acc_t(0);
      z += load_value_if(use && p.s_edge != nullptr, p.s_edge + (e0 + u) * p.H + m.head[k]);
      out[u][k] = finish(use, z);
    }
}

// Pass 2 for this lane's heads over entries [lo, hi):
// acc = sum_e exp(l[e] - lse) * mask[e] * x[col[e], h].
template <typename scalar_t, typename index_t, int V, int VPL>
__device__ __forceinline__ void attend_heads(at::opmath_type<scalar_t> (&acc)[VPL][V],
                                             const GatParams<scalar_t, index_t>& p, int64_t lo,
                                             int64_t hi, int q, unsigned mask,
                                             const RowLanes<V, VPL>& m,
                                             const at::opmath_type<scalar_t> (&sd)[VPL],
                                             const at::opmath_type<scalar_t> (&lse)[VPL]) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int U = kLoadsInFlight / VPL;
#pragma unroll
  for (int k = 0; k < VPL; ++k)
#pragma unroll
    for (int v = 0; v < V; ++v) acc[k][v] = 0;
  for (int64_t e0 = lo; e0 < hi; e0 += U) {
    bool ok[U];
    Vec<scalar_t, V> xv[U][VPL];
    acc_t z[U][VPL];
    load_attend_step<U>(ok, xv, z, p, e0, hi, m, sd, [](bool, acc_t zk) { return zk; });
    unsigned keep[VPL];
    if (p.rng.threshold != 0)
      draw_keep_bits<U, VPL, index_t>(keep, p.rng, nullptr, e0, hi, q, p.log2S, m.head);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (e0 + u >= hi) break;  // group-uniform
#pragma unroll
      for (int k = 0; k < VPL; ++k) {
        const acc_t mk = p.rng.threshold != 0
                             ? keep_scale(keep[k], u, p.S, p.log2S, mask, p.scale)
                             : acc_t(1);
        if (!(ok[u] && m.valid[k])) continue;
        const acc_t w = exp_(leaky(z[u][k], p.negative_slope) - lse[k]) * mk;
        axpy_vec(acc[k], w, xv[u][k]);
      }
    }
  }
}

// attend_heads for one vector per lane and heads of kS = 4 or 8 lanes, with
// each entry's scalar work done once instead of in all kS lanes of its head
// (as backward_row_transposed): lane q of a head loads the row and s_src (and
// s_edge) of entry q (and q + 4 when kS = 4) of a step of 8, computes its
// weight exp(l - lse) * mask, and the weights go back to the head's lanes
// with one shuffle per entry. The same expressions in the same order, so out
// is bitwise that of attend_heads (ncu, session 6: the fused forward issued
// 86 warp instructions per entry on reddit-like, float32).
template <int kS, typename scalar_t, typename index_t, int V>
__device__ __forceinline__ void attend_heads_transposed(
    at::opmath_type<scalar_t> (&acc)[1][V], const GatParams<scalar_t, index_t>& p, int64_t lo,
    int64_t hi, int q, unsigned mask, const RowLanes<V, 1>& m,
    const at::opmath_type<scalar_t> (&sd)[1], const at::opmath_type<scalar_t> (&lse)[1]) {
  using acc_t = at::opmath_type<scalar_t>;
  static_assert(kS == 4 || kS == 8, "4 or 8 lanes per head");
  constexpr int U = 8, kSlots = U / kS;
  const int head_base = (threadIdx.x & 31) & ~(kS - 1);  // warp lane of the head's lane 0
  const bool valid = m.valid[0];
  const int h = m.head[0];
#pragma unroll
  for (int v = 0; v < V; ++v) acc[0][v] = 0;
  // Offsets from lo in the index's width, 32-bit compares and row
  // addresses by row_at (common.cuh).
  const int HD = p.HD, H = p.H;
  const IndexBound<index_t> gathered_ok(p.num_gathered);
  using off_t = EntryOffset<index_t>;
  const off_t n = static_cast<off_t>(hi - lo);
  for (off_t k0 = 0; k0 < n; k0 += U) {
    const off_t left = n - k0;  // > 0; the step's entries u < left are the row's
    const index_t* idx = p.idx + lo + k0;
    index_t j[U], jq[kSlots];
#pragma unroll
    for (int u = 0; u < U; ++u) j[u] = load_index_if(u < left, idx + u);
#pragma unroll
    for (int s = 0; s < kSlots; ++s) jq[s] = load_index_if(s * kS + q < left, idx + s * kS + q);
    Vec<scalar_t, V> xv[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      xv[u] = load_vec_if<scalar_t, V>(valid && u < left && gathered_ok(j[u]),
                                      row_at(p.x, j[u], HD) + m.feat[0]);
    acc_t w[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int64_t e = lo + k0 + s * kS + q;
      const bool use = valid && s * kS + q < left && gathered_ok(jq[s]);
      const acc_t ssrc = load_value_if(use, row_at(p.s_src, jq[s], H) + h);
      acc_t z = use ? ssrc + sd[0] : acc_t(0);
      z += load_value_if(use && p.s_edge != nullptr, p.s_edge + e * p.H + h);
      acc_t mk = 1;
      if (p.rng.threshold != 0) mk = p.rng.keep(e, h) ? p.scale : acc_t(0);  // uniform branch
      const acc_t wk = exp_(leaky(z, p.negative_slope) - lse[0]) * mk;
      w[s] = use ? wk : acc_t(0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const acc_t wu = __shfl_sync(mask, w[u / kS], head_base + (u % kS));
      axpy_vec(acc[0], wu, xv[u]);
    }
  }
}

// Softmax arithmetic of the one-pass forward: float32 in base 2 (logits
// scaled by log2 e, exp2f), float64 in base e.
template <typename acc_t>
struct OnlineUnits {
  static __device__ __forceinline__ acc_t scale() { return acc_t(1); }
  static __device__ __forceinline__ acc_t exp(acc_t v) { return ::exp(v); }
  static __device__ __forceinline__ acc_t lse(acc_t mx, acc_t sum) { return mx + ::log(sum); }
};
template <>
struct OnlineUnits<float> {
  static __device__ __forceinline__ float scale() { return 1.4426950408889634f; }
  static __device__ __forceinline__ float exp(float v) { return exp2f(v); }
  static __device__ __forceinline__ float lse(float mx, float sum) {
    return (mx + log2f(sum)) * 0.6931471805599453f;
  }
};

// exp(a - m) in the units above, with exp(-inf - -inf) taken as 0.
template <typename acc_t>
__device__ __forceinline__ acc_t online_shift(acc_t a, acc_t m) {
  return a == -std::numeric_limits<acc_t>::infinity() ? acc_t(0)
                                                      : OnlineUnits<acc_t>::exp(a - m);
}

// lse of the one-pass state (mx, sum), with stats_lse's conventions.
template <typename acc_t>
__device__ __forceinline__ acc_t online_lse(acc_t mx, acc_t sum, bool nonempty) {
  if (!nonempty) return -std::numeric_limits<acc_t>::infinity();
  return sum == acc_t(0) ? std::numeric_limits<acc_t>::quiet_NaN()
                         : OnlineUnits<acc_t>::lse(mx, sum);
}

// The one-pass state of this lane's heads over entries [lo, hi) of a row with
// destination scores sd: running maximum mx (scaled units), sum of exp(l -
// mx), and acc = sum_e exp(l[e] - mx) * mask[e] * x[col[e], h] (not yet
// normalised).
template <typename scalar_t, typename index_t, int V, int VPL>
__device__ __forceinline__ void attend_heads_online(at::opmath_type<scalar_t> (&acc)[VPL][V],
                                                    at::opmath_type<scalar_t> (&mx)[VPL],
                                                    at::opmath_type<scalar_t> (&sum)[VPL],
                                                    const GatParams<scalar_t, index_t>& p,
                                                    int64_t lo, int64_t hi, int q, unsigned mask,
                                                    const RowLanes<V, VPL>& m,
                                                    const at::opmath_type<scalar_t> (&sd)[VPL]) {
  using acc_t = at::opmath_type<scalar_t>;
  using Units = OnlineUnits<acc_t>;
  constexpr int U = kLoadsInFlight / VPL;
  const acc_t scale = Units::scale(), slope = p.negative_slope;
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    mx[k] = -std::numeric_limits<acc_t>::infinity();
    sum[k] = 0;
#pragma unroll
    for (int v = 0; v < V; ++v) acc[k][v] = 0;
  }
  for (int64_t e0 = lo; e0 < hi; e0 += U) {
    bool ok[U];
    Vec<scalar_t, V> xv[U][VPL];
    acc_t l[U][VPL];
    load_attend_step<U>(ok, xv, l, p, e0, hi, m, sd, [&](bool use, acc_t z) {
      return use ? leaky(z, slope) * scale : -std::numeric_limits<acc_t>::infinity();
    });
    unsigned keep[VPL];
    if (p.rng.threshold != 0)
      draw_keep_bits<U, VPL, index_t>(keep, p.rng, nullptr, e0, hi, q, p.log2S, m.head);
    // The step's maximum; the state is rescaled only when it grows. A NaN
    // score never wins a comparison but reaches sum and acc through its
    // weight below.
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      acc_t nm = mx[k];
#pragma unroll
      for (int u = 0; u < U; ++u) nm = l[u][k] > nm ? l[u][k] : nm;
      if (nm > mx[k]) {
        const acc_t c = online_shift(mx[k], nm);
        sum[k] *= c;
#pragma unroll
        for (int v = 0; v < V; ++v) acc[k][v] *= c;
        mx[k] = nm;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (e0 + u >= hi) break;  // group-uniform
#pragma unroll
      for (int k = 0; k < VPL; ++k) {
        const acc_t mk = p.rng.threshold != 0
                             ? keep_scale(keep[k], u, p.S, p.log2S, mask, p.scale)
                             : acc_t(1);
        if (!(ok[u] && m.valid[k])) continue;
        const acc_t w = online_shift(l[u][k], mx[k]);
        sum[k] += w;
        const acc_t wm = w * mk;
        axpy_vec(acc[k], wm, xv[u][k]);
      }
    }
  }
}

// Resident blocks per SM asked of ptxas for gat_forward_rows_kernel: 2
// (128 registers), 1 with four vectors per lane, and
// PMA_FORWARD_TRANSPOSED_MIN_BLOCKS(_HALF) for the transposed variants
// (float32 / 16-bit types). The bf16 one spilled in its step loop at 3 blocks
// (80 registers, 19 LDL per step); at 2 (128 registers, no spill) session 9
// measured it 0 / -5 / +1.7% (arxiv / products / reddit-like).
#ifndef PMA_FORWARD_TRANSPOSED_MIN_BLOCKS
#define PMA_FORWARD_TRANSPOSED_MIN_BLOCKS 3
#endif
#ifndef PMA_FORWARD_TRANSPOSED_MIN_BLOCKS_HALF
#define PMA_FORWARD_TRANSPOSED_MIN_BLOCKS_HALF 2
#endif
template <typename scalar_t, int VPL, int kS>
constexpr int forward_rows_min_blocks() {
  if (VPL >= 4) return 1;
  if (kS == 0) return 2;
  return sizeof(scalar_t) == 2 ? PMA_FORWARD_TRANSPOSED_MIN_BLOCKS_HALF
                               : PMA_FORWARD_TRANSPOSED_MIN_BLOCKS;
}

// kS = 4 or 8: the two-pass rows' second pass by attend_heads_transposed
// (one vector per lane); kS = 0: attend_heads.
template <typename scalar_t, typename index_t, int V, int VPL, int kS>
__global__ void __launch_bounds__(kThreads, forward_rows_min_blocks<scalar_t, VPL, kS>())
    gat_forward_rows_kernel(const GatParams<scalar_t, index_t> p, const WorkList wl) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t red[kThreads * VPL * V];
  // per (group, head) statistics of a long row's slices
  // (groups * head slots = 256 * VPL / S entries)
  __shared__ acc_t s_mx[kThreads * VPL], s_sum[kThreads * VPL];
  const int G = p.G, lane = threadIdx.x & (G - 1), S = p.S, q = lane & (S - 1);
  const int group = threadIdx.x / G, groups = kThreads / G;
  const unsigned mask = group_mask(G);
  const RowLanes<V, VPL> m(lane, G, p.log2S, p.H);
  auto load_sd = [&](int64_t r, acc_t(&sd)[VPL]) {
#pragma unroll
    for (int k = 0; k < VPL; ++k)
      sd[k] = m.valid[k] ? load_value(p.s_dst + r * p.H + m.head[k]) : acc_t(0);
  };
  auto short_row = [&](int64_t, int64_t r, int64_t lo, int64_t hi) {
    acc_t sd[VPL], mx[VPL], sum[VPL], acc[VPL][V];
    load_sd(r, sd);
    if (hi - lo <= p.onepass_min) {  // group-uniform
      acc_t lse[VPL];
      row_stats_heads(p, lo, hi, q, m, sd, mx, sum);
#pragma unroll
      for (int k = 0; k < VPL; ++k) {
        group_merge_stats(mx[k], sum[k], S, mask);
        lse[k] = stats_lse(mx[k], sum[k], hi > lo);
        if (q == 0 && m.valid[k]) p.lse_out[r * p.H + m.head[k]] = lse[k];
      }
      if constexpr (kS != 0) {
        static_assert(VPL == 1, "one vector per lane");
        attend_heads_transposed<kS>(acc, p, lo, hi, q, mask, m, sd, lse);
      } else {
        attend_heads(acc, p, lo, hi, q, mask, m, sd, lse);
      }
    } else {
      attend_heads_online(acc, mx, sum, p, lo, hi, q, mask, m, sd);
#pragma unroll
      for (int k = 0; k < VPL; ++k) {
        if (q == 0 && m.valid[k]) p.lse_out[r * p.H + m.head[k]] = online_lse(mx[k], sum[k], true);
        // A row whose scores are all -inf gives 0 / 0 = NaN, as exp(l - lse)
        // does in the reference.
        const acc_t inv = acc_t(1) / sum[k];
#pragma unroll
        for (int v = 0; v < V; ++v) acc[k][v] *= inv;
      }
    }
#pragma unroll
    for (int k = 0; k < VPL; ++k)
      if (m.valid[k]) store_vec<scalar_t, V>(p.out + r * p.HD + m.feat[k], acc[k]);
  };
  // A long row: each group takes a contiguous slice of the entries (all
  // heads) with its own one-pass state; the states are merged over the
  // groups in group order through shared memory: the maxima and sums first,
  // then the rows, each scaled by exp(m_g - M) / total, by block_reduce_store.
  auto long_row = [&](int64_t r, int64_t lo, int64_t hi) {
    int64_t slo, shi;
    group_slice(lo, hi, group, groups, slo, shi);
    const int slots = p.G / S * VPL;  // head slots per group
    acc_t sd[VPL], mx[VPL], sum[VPL], acc[VPL][V];
    load_sd(r, sd);
    attend_heads_online(acc, mx, sum, p, slo, shi, q, mask, m, sd);
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      if (q == 0) {
        s_mx[group * slots + m.head[k]] = mx[k];
        s_sum[group * slots + m.head[k]] = sum[k];
      }
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      acc_t row_mx = s_mx[m.head[k]];
      for (int g = 1; g < groups; ++g) {
        const acc_t o = s_mx[g * slots + m.head[k]];
        row_mx = o > row_mx ? o : row_mx;
      }
      acc_t row_sum = 0;
      for (int g = 0; g < groups; ++g)
        row_sum += s_sum[g * slots + m.head[k]] * online_shift(s_mx[g * slots + m.head[k]], row_mx);
      if (group == 0 && q == 0 && m.valid[k])
        p.lse_out[r * p.H + m.head[k]] = online_lse(row_mx, row_sum, true);
      const acc_t f = online_shift(mx[k], row_mx) * (acc_t(1) / row_sum);
#pragma unroll
      for (int v = 0; v < V; ++v) acc[k][v] *= f;
    }
    block_reduce_store<scalar_t, acc_t, V, VPL>(red, acc, G, lane, 0, p.HD, p.out + r * p.HD);
    // (block_reduce_store ends with a barrier: s_mx / s_sum are free again)
  };
  for_each_work_item(p.ptr, p.num_edges, wl, G, 1, short_row, long_row);
}

// delta[i, h] = <grad_out[i, h, :], out[i, h, :] - bias[h, :]>, one group per
// (row, head) with the lane layout of the backward kernel (see head_dot).
template <typename scalar_t, typename index_t, int V, int VPL>
__global__ void __launch_bounds__(kThreads)
    gat_delta_kernel(const GatParams<scalar_t, index_t> p, const scalar_t* __restrict__ out,
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

// grad_s_dst[i, h] = sum over the CSR row i of grad_z[e, h]: one warp per
// (row, head), lanes over the edges, a butterfly at the end (fixed order).
// For H > 32; otherwise row_sum_sliced_kernel.
template <typename scalar_t, typename index_t, typename acc_t>
__global__ void __launch_bounds__(kThreads)
    row_sum_kernel(const index_t* __restrict__ rowptr, const acc_t* __restrict__ grad_z,
                   const index_t* __restrict__ perm_inv, scalar_t* __restrict__ grad_s_dst,
                   int64_t num_rows, int64_t num_edges, int H) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
  for (int64_t item = blockIdx.x * static_cast<int64_t>(kThreads / 32) + threadIdx.x / 32;
       item < num_rows * H; item += warps) {
    const int64_t i = item / H;
    const int h = static_cast<int>(item - i * H);
    int64_t lo, hi;
    row_range(rowptr, i, num_edges, lo, hi);
    acc_t s = 0;
    if (perm_inv == nullptr) {
#pragma unroll 4
      for (int64_t e = lo + lane; e < hi; e += 32) s += grad_z[e * H + h];
    } else {
      for (int64_t e = lo + lane; e < hi; e += 32) {
        const int64_t k = load_index(perm_inv + e);
        if (in_range(k, num_edges)) s += grad_z[k * H + h];
      }
    }
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) grad_s_dst[item] = static_cast<scalar_t>(s);
  }
}

// grad_s_dst for H up to 32. A row's grad_z[lo:hi, :] is contiguous: the
// first W = (32 / H) * H lanes of a warp stride over it by W, so that lane l
// sums elements l, l + W, ... (all of head l % H), and the lanes of a head are
// added in a fixed order (a butterfly when H divides 32, else lane h adds
// lanes h + H, h + 2H, ... in turn), leaving head h's sum in lane h. One warp
// per short row, or per slice of a long row (a SliceList over the CSR rows,
// as the backward's over the CSC), the slices' partial sums added in slice
// order by sum_slices_kernel: fixed order, and no hub row runs in one warp.
// (Session 8: row_sum_kernel took 119 us on arxiv-like and 0.55 ms on
// reddit-like, bound by the hub rows, one warp per head; session 9 extended
// the sliced sums from powers of two to every H up to 32, as a second
// instance, kDividesWarp = false: the power-of-two one keeps its constant
// stride and butterfly, which a runtime stride in the same kernel had made
// 6-16% slower, the fused backward 1-1.6%, in calls 2 and 3.)
template <typename scalar_t, typename index_t, typename acc_t, bool kDividesWarp>
__global__ void __launch_bounds__(kThreads)
    row_sum_sliced_kernel(const index_t* __restrict__ rowptr, const acc_t* __restrict__ grad_z,
                          const index_t* __restrict__ perm_inv, scalar_t* __restrict__ grad_s_dst,
                          acc_t* __restrict__ part, int64_t num_edges, int H,
                          const SliceList sl) {
  const int lane = threadIdx.x & 31;
  // z[first], z[first + stride], ... below n, added in that order, 8
  // predicated loads at a time (the added zeros change no sum). Written as
  // an unrolled loop, a short row (56 values on arxiv-like: two per lane)
  // ran the loop's remainder, one load after the other.
  auto strided_sum = [&](const acc_t* z, int64_t n, int first, int stride) {
    constexpr int kBatch = 8;
    acc_t s = 0;
    for (int64_t k = first; k < n; k += static_cast<int64_t>(stride) * kBatch) {
      acc_t v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) v[b] = load_value_if(k + b * stride < n, z + k + b * stride);
#pragma unroll
      for (int b = 0; b < kBatch; ++b) s += v[b];
    }
    return s;
  };
  // The same sum with grad_z in CSC order: element k of the row is head
  // k % H of edge lo + k / H, at grad_z[perm_inv[edge] * H + k % H]. The
  // stride is a multiple of H, so a lane keeps its head and steps over
  // edges; same elements in the same order, so the same sums. 8 edge
  // positions, then 8 values, in flight.
  auto strided_sum_inv = [&](int64_t lo, int64_t n, int first, int stride) {
    constexpr int kBatch = 8;
    const int h = first % H, estride = stride / H;
    const int64_t edges = n / H;
    acc_t s = 0;
    for (int64_t e = first / H; e < edges; e += static_cast<int64_t>(estride) * kBatch) {
      index_t k[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        k[b] = load_index_if(e + b * estride < edges, perm_inv + lo + e + b * estride);
      acc_t v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        v[b] = load_value_if(e + b * estride < edges && in_range(k[b], num_edges),
                             grad_z + static_cast<int64_t>(k[b]) * H + h);
#pragma unroll
      for (int b = 0; b < kBatch; ++b) s += v[b];
    }
    return s;
  };
  auto sum = [&](int64_t lo, int64_t hi) {
    const acc_t* z = grad_z + lo * H;
    const int64_t n = (hi - lo) * H;
    acc_t s = 0;
    if constexpr (kDividesWarp) {  // W = 32
      s = perm_inv != nullptr ? strided_sum_inv(lo, n, lane, 32) : strided_sum(z, n, lane, 32);
      for (int off = 16; off >= H; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      return s;
    } else {
      const int per_head = 32 / H, W = per_head * H;
      if (lane < W) s = perm_inv != nullptr ? strided_sum_inv(lo, n, lane, W)
                                            : strided_sum(z, n, lane, W);
      acc_t t = s;
      for (int j = 1; j < per_head; ++j) t += __shfl_down_sync(0xffffffffu, s, j * H);
      return t;
    }
  };
  auto slice = [&](int64_t slot, int64_t, int64_t lo, int64_t hi) {
    const acc_t s = sum(lo, hi);
    if (lane < H) part[slot * H + lane] = s;
  };
  auto row = [&](int64_t r, int64_t lo, int64_t hi) {
    const acc_t s = sum(lo, hi);
    if (lane < H) grad_s_dst[r * H + lane] = static_cast<scalar_t>(s);
  };
  for_each_slice_or_row(rowptr, num_edges, sl, 32, slice, row);
}

// ---------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------

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

// The all-heads kernels (gat_forward_rows_kernel, gat_backward_rows_kernel)
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

// Short rows of the all-heads forward with more entries than this take the
// one-pass (online softmax) path, the others the two passes; block-wide long
// rows always take one pass. By default no short row does: on the H200 the
// two passes were faster on products-like (16.7 ms against 17.9 with the
// threshold at 4 * S and 18.7 with one pass for every row) and as fast on
// reddit-like (10.6 / 10.4 / 10.4 ms; benchmarks/KERNEL_NOTES.md, session
// 4). The environment variable PYG_MULTIHEAD_AGG_ONEPASS_MIN sets it (a
// tuning knob for benchmarks and tests: 0 = one pass for every non-empty
// row; empty rows always take the two-pass branch, which writes out = 0 and
// lse = -inf).
int64_t onepass_min() {
  return env_int("PYG_MULTIHEAD_AGG_ONEPASS_MIN", std::numeric_limits<int64_t>::max());
}


template <typename scalar_t, typename index_t>
void launch_gat_forward(GatParams<scalar_t, index_t> p, const at::TensorOptions& options) {
  constexpr int kVec = vec_width<scalar_t>();
  const bool aligned = is_aligned(p.x, 16) && is_aligned(p.out, 16);
  const auto rc = row_config<scalar_t>(p.H, p.D, aligned);
  if (rc.ok) {  // all heads of a row per group
    p.G = rc.G;
    p.S = rc.S;
    p.log2S = rc.log2S;
    p.num_chunks = 1;
    p.onepass_min = onepass_min();
    at::Tensor storage;
    const WorkList wl = make_work_list(p.ptr, p.num_rows, p.num_edges, storage, options);
    auto stream = c10::cuda::getCurrentCUDAStream();
    const bool transposed = transposed_dots();
    VPL_SWITCH(rc.vpl, kVPL, [&] {
      auto run = [&](auto kernel) {
        kernel<<<persistent_grid(kernel, p.num_rows, p.G), kThreads, 0, stream>>>(p, wl);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      };
      constexpr bool kOne = kVPL == 1;
      if (transposed && kOne && p.S == 8) {
        run(gat_forward_rows_kernel<scalar_t, index_t, kVec, kVPL, kOne ? 8 : 0>);
      } else if (transposed && kOne && p.S == 4) {
        run(gat_forward_rows_kernel<scalar_t, index_t, kVec, kVPL, kOne ? 4 : 0>);
      } else {
        run(gat_forward_rows_kernel<scalar_t, index_t, kVec, kVPL, 0>);
      }
    });
    return;
  }
  const auto c = head_config<scalar_t>(p.D, aligned);
  p.G = c.G;
  p.num_chunks = c.num_chunks;
  at::Tensor storage;
  const WorkList wl = make_work_list(p.ptr, p.num_rows, p.num_edges, storage, options);
  auto stream = c10::cuda::getCurrentCUDAStream();
  auto launch = [&](auto kernel) {
    kernel<<<persistent_grid(kernel, p.num_rows * p.H, p.G), kThreads, 0, stream>>>(p, wl);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  if (c.vectorised) {
    VPL_SWITCH(c.vpl, kVPL, [&] { launch(gat_forward_kernel<scalar_t, index_t, kVec, kVPL>); });
  } else {
    launch(gat_forward_kernel<scalar_t, index_t, 1, kMaxVPL>);
  }
}

// delta (from out and grad_out), then the CSC pass; both with one lane layout.
// The all-heads path when row_config allows it, else the per-head kernels.
template <typename scalar_t, typename index_t>
void launch_gat_backward(GatParams<scalar_t, index_t> p, const scalar_t* out,
                         scalar_t* grad_dst, const index_t* rowptr,
                         const at::TensorOptions& options) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kVec = vec_width<scalar_t>();
  const bool aligned = is_aligned(p.x, 16) && is_aligned(p.out, 16) &&
                       is_aligned(p.grad_out, 16) && is_aligned(out, 16);
  auto stream = c10::cuda::getCurrentCUDAStream();
  const auto acc_options = options.dtype(c10::CppTypeToScalarType<acc_t>::value);
  at::Tensor storage, aux, delta, part_x, part_src;
  const auto rc = row_config<scalar_t>(p.H, p.D, aligned);
  if (rc.ok) {
    p.G = rc.G;
    p.S = rc.S;
    p.log2S = rc.log2S;
    p.num_chunks = 1;
    int64_t max_slots = 0;
    // 2-byte types: every column longer than a quarter of the work lists'
    // threshold (E / 131072 entries, at least 64: ~470 on products-like,
    // ~360 on reddit-like) is cut into slices of that length. A group walks
    // a column of up to that many entries alone, and the longest of them
    // form the grid's tail. Session 19's sweep (call 1) measured bf16 9.21 -> 8.91
    // ms (products-like) and 5.34 -> 4.96 ms (reddit-like) at a quarter,
    // arxiv-like worse below 64 entries, float32 within 1%. The bound on
    // the partial rows' scratch grows with it (4x: ~130 MB on products-like),
    // so float32 keeps the work lists' threshold.
    constexpr int64_t kSliceDiv = sizeof(scalar_t) == 2 ? 4 : 1;
    const SliceList sl = make_slice_list(p.ptr, p.num_rows, p.num_edges, storage, options,
                                         max_slots, kSliceDiv);
    aux = at::empty({p.num_gathered * p.H * 4}, acc_options);
    part_x = at::empty({max_slots * p.HD}, acc_options);
    part_src = at::empty({max_slots * p.H}, acc_options);
    p.aux = aux.data_ptr();
    p.part_x = part_x.data_ptr<acc_t>();
    p.part_src = part_src.data_ptr<acc_t>();
    const int aux_blocks = static_cast<int>(std::max<int64_t>(
        1, std::min<int64_t>((p.num_gathered + kThreads / p.G - 1) / (kThreads / p.G),
                             num_sms() * 32LL)));
    VPL_SWITCH(rc.vpl, kVPL, [&] {
      gat_aux_kernel<scalar_t, index_t, kVec, kVPL><<<aux_blocks, kThreads, 0, stream>>>(
          p, out, static_cast<RowAux<acc_t>*>(aux.data_ptr()));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      auto run = [&](auto kernel) {
        kernel<<<persistent_grid(kernel, p.num_rows, p.G, 0, kBackwardThreads), kBackwardThreads,
                 0, stream>>>(p, sl);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      };
      const bool transposed = kVPL == 1 && transposed_dots();
      // (kS = 8 only for float32: 2- and 8-byte types spill there.)
      constexpr bool kWide = sizeof(scalar_t) == 4;
      if (transposed && kWide && p.S == 8) {
        run(gat_backward_rows_kernel<scalar_t, index_t, kVec, kVPL, kVPL == 1 && kWide ? 8 : 0>);
      } else if (transposed && p.S == 4) {
        run(gat_backward_rows_kernel<scalar_t, index_t, kVec, kVPL, kVPL == 1 ? 4 : 0>);
      } else {
        run(gat_backward_rows_kernel<scalar_t, index_t, kVec, kVPL, 0>);
      }
    });
    // grad_x[j] and grad_s_src[j] of every sliced column j: its slices' sum
    launch_sum_slices(p.ptr, p.num_edges, sl, p.part_x, p.out, p.HD, p.part_src,
                      p.grad_s_src, p.H);
  } else {
    const auto c = head_config<scalar_t>(p.D, aligned);
    TORCH_CHECK(c.num_chunks <= 1, "gat_attention_backward: the CUDA kernel supports heads of "
                "at most ", 32 * kMaxVPL * (c.vectorised ? kVec : 1),
                " channels for this dtype, got ", p.D);
    p.G = c.G;
    p.num_chunks = 1;
    const WorkList wl = make_work_list(p.ptr, p.num_rows, p.num_edges, storage, options);
    delta = at::empty({p.num_gathered, p.H}, acc_options);
    const int64_t delta_items = p.num_gathered * p.H;
    const int delta_blocks = static_cast<int>(std::max<int64_t>(
        1, std::min<int64_t>((delta_items + kThreads / p.G - 1) / (kThreads / p.G),
                             num_sms() * 32LL)));
    auto launch = [&](auto delta_kernel, auto kernel) {
      delta_kernel<<<delta_blocks, kThreads, 0, stream>>>(p, out, delta.data_ptr<acc_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      p.delta = delta.data_ptr<acc_t>();
      kernel<<<persistent_grid(kernel, p.num_rows * p.H, p.G), kThreads, 0, stream>>>(p, wl);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (c.vectorised) {
      VPL_SWITCH(c.vpl, kVPL, [&] {
        launch(gat_delta_kernel<scalar_t, index_t, kVec, kVPL>,
               gat_backward_kernel<scalar_t, index_t, kVec, kVPL>);
      });
    } else {
      launch(gat_delta_kernel<scalar_t, index_t, 1, kMaxVPL>,
             gat_backward_kernel<scalar_t, index_t, 1, kMaxVPL>);
    }
  }
  // grad_s_dst[i, h]: the sum of grad_z over the CSR row i
  if (p.H <= 32) {
    at::Tensor rs_storage;
    int64_t rs_slots = 0;
    const SliceList rsl = make_slice_list(rowptr, p.num_gathered, p.num_edges, rs_storage,
                                          options, rs_slots);
    const at::Tensor rs_part = at::empty({rs_slots * p.H}, acc_options);
    auto launch_rows = [&](auto kernel) {
      kernel<<<persistent_grid(kernel, p.num_gathered, 32), kThreads, 0, stream>>>(
          rowptr, p.grad_z, p.perm_inv, grad_dst, rs_part.data_ptr<acc_t>(), p.num_edges, p.H,
          rsl);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (32 % p.H == 0) {
      launch_rows(row_sum_sliced_kernel<scalar_t, index_t, acc_t, true>);
    } else {
      launch_rows(row_sum_sliced_kernel<scalar_t, index_t, acc_t, false>);
    }
    launch_sum_slices<scalar_t, index_t, acc_t>(rowptr, p.num_edges, rsl,
                                                rs_part.data_ptr<acc_t>(), grad_dst, p.H,
                                                nullptr, nullptr, 0);
    return;
  }
  const int64_t warps = p.num_gathered * p.H;
  const int blocks = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>((warps + kThreads / 32 - 1) / (kThreads / 32), num_sms() * 16LL)));
  row_sum_kernel<scalar_t, index_t, acc_t><<<blocks, kThreads, 0, stream>>>(
      rowptr, p.grad_z, p.perm_inv, grad_dst, p.num_gathered, p.num_edges, p.H);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

DropoutRng make_rng(double dropout_p, const std::optional<at::Tensor>& philox) {
  DropoutRng rng;
  rng.threshold = dropout_threshold(dropout_p);
  if (rng.threshold != 0) {
    const auto key = philox->contiguous();
    rng.seed = static_cast<uint64_t>(key.data_ptr<int64_t>()[0]);
    rng.offset = static_cast<uint64_t>(key.data_ptr<int64_t>()[1]);
  }
  return rng;
}

template <typename acc_t>
acc_t dropout_scale(double p) {
  return p >= 1.0 ? acc_t(0) : static_cast<acc_t>(1.0 / (1.0 - p));
}

std::tuple<at::Tensor, at::Tensor> gat_attention_cuda(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& s_src,
    const at::Tensor& s_dst, const std::optional<at::Tensor>& s_edge, const at::Tensor& x,
    double negative_slope, double dropout_p, const std::optional<at::Tensor>& philox,
    const std::optional<at::Tensor>& /*colptr*/, const std::optional<at::Tensor>& /*row*/,
    const std::optional<at::Tensor>& /*perm*/, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& /*perm_inv*/) {
  const auto s =
      check_gat_attention(rowptr, col, s_src, s_dst, s_edge, x, dropout_p, philox, bias);
  TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor for the CUDA kernel");
  const c10::cuda::CUDAGuard guard(x.device());
  TORCH_CHECK(s.H * s.D <= INT_MAX, "heads * channels must be below 2^31");
  const auto lse_dtype = at::toOpMathType(x.scalar_type());
  const bool has_bias = bias.has_value() && bias->defined();
  if (s.N_dst == 0 || s.H == 0 || s.E == 0) {
    auto out = at::zeros({s.N_dst, s.H, s.D}, x.options());
    if (has_bias) out.add_(*bias);
    return {out, at::full({s.N_dst, s.H}, -std::numeric_limits<double>::infinity(),
                          x.options().dtype(lse_dtype))};
  }
  // Every row is written by the kernel (rows without edges get zeros, -inf).
  auto out = at::empty({s.N_dst, s.H, s.D}, x.options());
  auto lse = at::empty({s.N_dst, s.H}, x.options().dtype(lse_dtype));
  const auto rowptr_c = rowptr.contiguous(), col_c = col.contiguous();
  const auto src_c = s_src.contiguous(), dst_c = s_dst.contiguous(), x_c = x.contiguous();
  const bool has_edge = s_edge.has_value() && s_edge->defined();
  const auto edge_c = has_edge ? s_edge->contiguous() : at::Tensor();
  FLOAT_SWITCH(x.scalar_type(), "gat_attention", [&] {
    INDEX_SWITCH(rowptr.scalar_type(), "gat_attention", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      GatParams<scalar_t, index_t> p{};
      p.ptr = rowptr_c.data_ptr<index_t>();
      p.idx = col_c.data_ptr<index_t>();
      p.s_src = src_c.data_ptr<scalar_t>();
      p.s_dst = dst_c.data_ptr<scalar_t>();
      p.s_edge = has_edge ? edge_c.data_ptr<scalar_t>() : nullptr;
      p.x = x_c.data_ptr<scalar_t>();
      p.out = out.data_ptr<scalar_t>();
      p.lse_out = lse.data_ptr<acc_t>();
      p.num_rows = s.N_dst;
      p.num_gathered = s.N_src;
      p.num_edges = s.E;
      p.H = static_cast<int>(s.H);
      p.D = static_cast<int>(s.D);
      p.HD = static_cast<int>(s.H * s.D);
      p.negative_slope = static_cast<acc_t>(negative_slope);
      p.scale = dropout_scale<acc_t>(dropout_p);
      p.rng = make_rng(dropout_p, philox);
      launch_gat_forward(p, rowptr.options());
    });
  });
  // The bias: one in-place elementwise pass over out (the kernels' long rows
  // store through block_reduce_store, shared with multihead_spmm). No second
  // [N_dst, H, D] tensor; NaN rows stay NaN, rows without edges get bias.
  if (has_bias) out.add_(*bias);
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gat_attention_backward_cuda(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& colptr,
    const at::Tensor& row, const at::Tensor& perm, const at::Tensor& s_src,
    const at::Tensor& s_dst, const std::optional<at::Tensor>& s_edge, const at::Tensor& x,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& grad_out,
    const std::optional<at::Tensor>& grad_lse, double negative_slope, double dropout_p,
    const std::optional<at::Tensor>& philox, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& perm_inv) {
  const auto s = check_gat_attention_backward(rowptr, col, colptr, row, perm, s_src, s_dst,
                                              s_edge, x, out, lse, grad_out, grad_lse, dropout_p,
                                              philox, bias, perm_inv);
  TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor for the CUDA kernel");
  const c10::cuda::CUDAGuard guard(x.device());
  const bool has_edge = s_edge.has_value() && s_edge->defined();
  const auto acc_dtype = at::toOpMathType(x.scalar_type());
  if (s.E == 0 || s.H == 0 || s.N_dst == 0 || s.N_src == 0) {
    return {at::zeros({s.N_src, s.H, s.D}, x.options()), at::zeros({s.N_src, s.H}, x.options()),
            at::zeros({s.N_dst, s.H}, x.options()),
            at::zeros({has_edge ? s.E : 0, s.H}, x.options())};
  }
  // The kernels write every source's and every row's gradient, and every
  // entry of grad_z when the CSC is valid, so grad_z is not zero-filled (an
  // [E, H] float32 memset, 0.2-0.3 ms on reddit- and products-like; a
  // malformed CSC leaves it, and so the gradients, meaningless, as the CUDA
  // kernels' other outputs: docs/robustness.md). With perm_inv, grad_z is
  // indexed by CSC entry: written in the order the
  // kernel walks the CSC (runs of consecutive entries) instead of at random
  // edge ids, whose 16-byte pieces of 32-byte sectors cost 2.3-2.9 ms of the
  // backward on products- and reddit-like (session 13, without the stores),
  // and read back through perm_inv by the row sums.
  const bool has_inv = perm_inv.has_value() && perm_inv->defined();
  const auto inv_c = has_inv ? perm_inv->contiguous() : at::Tensor();
  auto grad_x = at::empty({s.N_src, s.H, s.D}, x.options());
  auto grad_src = at::empty({s.N_src, s.H}, x.options());
  auto grad_dst = at::empty({s.N_dst, s.H}, x.options());
  auto grad_z = at::empty({s.E, s.H}, x.options().dtype(acc_dtype));
  const auto go = grad_out.contiguous(), out_c = out.contiguous();
  const auto lse_c = lse.contiguous();
  const bool has_glse = grad_lse.has_value() && grad_lse->defined();
  const auto glse_c = has_glse ? grad_lse->contiguous() : at::Tensor();
  const auto rowptr_c = rowptr.contiguous(), colptr_c = colptr.contiguous();
  const auto row_c = row.contiguous(), perm_c = perm.contiguous();
  const auto src_c = s_src.contiguous(), dst_c = s_dst.contiguous(), x_c = x.contiguous();
  const auto edge_c = has_edge ? s_edge->contiguous() : at::Tensor();
  // The bias, contiguous and 16-byte aligned for the delta kernels' vector
  // loads (a copy of [H, D] elements when it is not).
  at::Tensor bias_c;
  if (bias.has_value() && bias->defined()) {
    bias_c = bias->contiguous();
    if (!is_aligned(bias_c.data_ptr(), 16)) bias_c = bias_c.clone();
  }
  FLOAT_SWITCH(x.scalar_type(), "gat_attention_backward", [&] {
    INDEX_SWITCH(rowptr.scalar_type(), "gat_attention_backward", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      GatParams<scalar_t, index_t> p{};
      p.ptr = colptr_c.data_ptr<index_t>();
      p.idx = row_c.data_ptr<index_t>();
      p.perm = perm_c.data_ptr<index_t>();
      p.perm_inv = has_inv ? inv_c.data_ptr<index_t>() : nullptr;
      p.s_src = src_c.data_ptr<scalar_t>();
      p.s_dst = dst_c.data_ptr<scalar_t>();
      p.s_edge = has_edge ? edge_c.data_ptr<scalar_t>() : nullptr;
      p.x = x_c.data_ptr<scalar_t>();
      p.grad_out = go.data_ptr<scalar_t>();
      p.lse_in = lse_c.data_ptr<acc_t>();
      p.grad_lse = has_glse ? glse_c.data_ptr<acc_t>() : nullptr;
      p.bias = bias_c.defined() ? bias_c.data_ptr<scalar_t>() : nullptr;
      p.out = grad_x.data_ptr<scalar_t>();
      p.grad_s_src = grad_src.data_ptr<scalar_t>();
      p.grad_z = grad_z.data_ptr<acc_t>();
      p.num_rows = s.N_src;
      p.num_gathered = s.N_dst;
      p.num_edges = s.E;
      p.H = static_cast<int>(s.H);
      p.D = static_cast<int>(s.D);
      p.HD = static_cast<int>(s.H * s.D);
      p.negative_slope = static_cast<acc_t>(negative_slope);
      p.scale = dropout_scale<acc_t>(dropout_p);
      p.rng = make_rng(dropout_p, philox);
      launch_gat_backward(p, out_c.data_ptr<scalar_t>(), grad_dst.data_ptr<scalar_t>(),
                          rowptr_c.data_ptr<index_t>(), colptr.options());
    });
  });
  // grad_s_edge by edge id: grad_z gathered through perm_inv (an
  // out-of-range entry of a malformed perm_inv gives 0, reads nothing).
  if (has_edge && has_inv) {
    auto by_edge = at::empty({s.E, s.H}, grad_z.options());
    INDEX_SWITCH(perm_inv->scalar_type(), "gat_attention_backward", [&] {
      launch_gather_rows<index_t>(grad_z, inv_c, by_edge);
    });
    grad_z = by_edge;
  }
  auto grad_edge = has_edge ? grad_z.to(x.scalar_type()) : at::empty({0, s.H}, x.options());
  return {grad_x, grad_src, grad_dst, grad_edge};
}

}  // namespace

TORCH_LIBRARY_IMPL(pyg_multihead_agg, CUDA, m) {
  m.impl("gat_attention", &gat_attention_cuda);
  m.impl("gat_attention_backward", &gat_attention_backward_cuda);
}

}  // namespace pyg_multihead_agg
