// attention_backward_rows_kernel and gat_aux_kernel: the backward of the
// fused attention skeleton, all heads of a source row per group, for every
// score policy (scores.cuh).
//
// A group of G lanes owns a whole row of H * D features in 16-byte vectors,
// VPL per lane (vector v = lane + G * k, as in the spmm kernels; padded heads
// for policies other than GAT, see RowLanes); a head spans S lanes, a power
// of two that divides G, so the vectors of head h lie in S aligned lanes of
// one pass k and its dot products are S-lane butterflies. Per CSC entry
// (i = row[k], e = perm[k]) the group loads the two indices once for all
// heads, gathers grad_out[i] as one coalesced row, loads one packed
// (s_dst, lse, delta - grad_lse) per head (RowAux, written by gat_aux_kernel
// first) and what the policy needs of the entry (GAT: s_edge[e]; GATv2:
// x_r[i] and e_feat[e]), and hands them to the policy, which accumulates
// grad_x[j] and its own gradients and writes the per-edge logit gradient
// grad_z[e, 0:H] for the destination pass. The per-head kernel
// (backward_heads_kernel.cuh) loads the indices H times, each head's scores
// from three arrays, and walks a hub column head by head with one block; here
// long columns are cut into slices (SliceList) that any group takes, and
// sum_slices_kernel adds the slices' partial sums in slice order.
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
#include "scores.cuh"
#include "softmax.cuh"

namespace pyg_multihead_agg {

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

// grad_x (acc) of source j over its CSC entries [lo, hi), all heads, and the
// policy's gradients (in score, which has loaded the source).
template <class Score, typename scalar_t, typename index_t, int V, int VPL>
__device__ __forceinline__ void backward_row(at::opmath_type<scalar_t> (&acc)[VPL][V],
                                             Score& score,
                                             const AttentionParams<scalar_t, index_t>& p, int64_t j,
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
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    xr[k] = m.valid[k] ? load_vec<scalar_t, V>(p.x + j * p.HD + m.feat[k])
                       : zero_vec<scalar_t, V>();
#pragma unroll
    for (int v = 0; v < V; ++v) acc[k][v] = 0;
  }
  score.load_source(p, j, m);
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
    typename Score::BEntry be[U][VPL];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int k = 0; k < VPL; ++k)
        be[u][k] = score.load_bentry(p, m, k, ok[u] && m.valid[k], i[u], e[u]);
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
        const int64_t zi = p.perm_inv != nullptr ? k0 + u : static_cast<int64_t>(e[u]);
        score.backward(p, m, k, ok[u] && m.valid[k], q, mask, dot, mk, gv[u][k], xr[k],
                       ax[u][k], be[u][k], acc[k], zi, static_cast<int64_t>(e[u]));
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
  score.end_source(p, m, acc, xr);
}

// The same pass for GAT (scalar scores), one vector per lane and kS = 4 or 8
// lanes per head (the common shapes: float32 heads of 16 or 32 channels,
// bf16/fp16 heads of 32; kS = 8 is float32 only), with the per-entry scalar
// work done once instead of in all kS lanes of a head. backward_row repeats the softmax arithmetic
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
    const AttentionParams<scalar_t, index_t>& p, int64_t j, int64_t lo, int64_t hi,
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
  // by row_at (utils/index.cuh).
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

// The per-lane partial sums d[0..U) of U entries over a head's kS lanes,
// reduced so that lane q holds the whole sum of entry q % U in slot 0, with
// the pairs of lanes_sum (so bit for bit its sums): for U = kS, one
// transposing round per level (transpose_round); for U = kS / 2, the top
// level as a plain butterfly (lanes q and q + U then hold the same sums),
// the others transposing.
template <int kS, int U, typename acc_t>
__device__ __forceinline__ void transpose_sums(acc_t (&d)[U], int q, unsigned mask) {
  static_assert(U == kS || 2 * U == kS, "U = kS or kS / 2");
  if constexpr (U < kS) {
#pragma unroll
    for (int u = 0; u < U; ++u) d[u] += __shfl_xor_sync(mask, d[u], U);
  } else if constexpr (kS == 8) {
    transpose_round<4, 8>(d, q, mask);
  }
  if constexpr (U >= 4) transpose_round<2, U>(d, q, mask);
  transpose_round<1, U>(d, q, mask);
}

// The transposed pass for policies other than GAT (Score::kTransposedDot),
// one vector per lane and heads of kS = 4 or 8 lanes (padded heads too: a
// lane past the head's D / V vectors holds zeros and still takes its entry's
// scalar work). backward_row runs a kS-lane butterfly per entry for
// <grad_out[i], x[j]> (and the transformer's logit) and the softmax
// arithmetic in every lane; here a step of U entries reduces the dots with
// transposing butterflies (transpose_sums: 7 shuffles per dot and step of 4
// where backward_row takes 12 at kS = 8), lane q of a head does entry q %
// U's scalar work (its aux, the logit: summed from the policy's logit_part,
// or read from GATv2's record with the entry's sign word; the dropout mask,
// alpha, the logit gradient; lanes q < U store grad_z) and hands w, gl (and
// the word) to the head's lanes in one block of shuffles; the policy's
// apply() does the entry's vector work in every lane. U is the policy's
// transposed_step: the transformer's entries bring three row vectors each
// (grad_out[i], the policy's row of i, e_feat[e]), so 4 (eight would hold
// 96 registers of loads in flight); GATv2's one, so kS (float32 heads of 8
// lanes: 55 SASS instructions an entry instead of 72 at 4, and twice the
// gathers in flight a warp). The pairs added are lanes_sum's, so every
// logit, alpha, gradient and grad_z is bitwise backward_row's. kEdges false
// (no edge features or their gradient, the caller's uniform branch): no
// edge vector loaded, added or stored, no edge id shared.
template <int kS, bool kEdges, class Score, typename scalar_t, typename index_t, int V>
__device__ __forceinline__ void backward_row_transposed_dot(
    at::opmath_type<scalar_t> (&acc)[1][V], Score& score,
    const AttentionParams<scalar_t, index_t>& p, int64_t j, int64_t lo, int64_t hi,
    const RowLanes<V, 1>& m, int lane, unsigned mask) {
  using acc_t = at::opmath_type<scalar_t>;
  static_assert(kS == 4 || kS == 8, "4 or 8 lanes per head");
  constexpr int U = Score::template transposed_step<kS>();  // entries per step
  constexpr bool kRecorded = Score::kRecorded;
  const auto* aux = static_cast<const RowAux<acc_t>*>(p.aux);
  const int q = lane & (kS - 1), qe = q & (U - 1);  // qe: this lane's entry of a step
  const int head_base = (threadIdx.x & 31) & ~(kS - 1);  // warp lane of the head's lane 0
  const bool valid = m.valid[0];
  const int h = m.head[0];
  const bool head_ok = h < p.H;  // a padded head's lanes past D / V are not valid, but work
  const Vec<scalar_t, V> xr[1] = {valid ? load_vec<scalar_t, V>(p.x + j * p.HD + m.feat[0])
                                        : zero_vec<scalar_t, V>()};
#pragma unroll
  for (int v = 0; v < V; ++v) acc[0][v] = 0;
  score.load_source(p, j, m);
  const int HD = p.HD, H = p.H;
  const bool edge_vectors = kEdges && p.e_feat != nullptr;  // group-uniform
  // kLateEdges (GATv2): the edge features' work after the step's vector
  // work, the only use of every entry's edge id there.
  constexpr bool kLate = Score::kLateEdges;
  const bool edge_ids =
      kEdges && (edge_vectors || p.grad_e_feat != nullptr || (!kLate && p.perm_inv == nullptr));
  const IndexBound<index_t> gathered_ok(p.num_gathered), edge_ok(p.num_edges);
  using off_t = EntryOffset<index_t>;
  using Step = StepIndices<U, U, true, index_t>;  // lane q's own entry: qe
  const off_t n = static_cast<off_t>(hi - lo);
  auto load_idx = [&](off_t k0, Step& s_) {  // the CSC's perm is always given here
    s_.template load<true>(p.idx, p.perm, lo, k0, n, qe);
  };
  constexpr bool kPrefetch = sizeof(index_t) == 4;
  Step cur;
  if constexpr (kPrefetch) load_idx(0, cur);
  for (off_t k0 = 0; k0 < n; k0 += U) {
    const off_t left = n - k0;  // > 0; the step's entries u < left are the row's
    if constexpr (!kPrefetch) load_idx(k0, cur);
    // Every entry's edge id in every lane (lane u of the head loaded entry
    // u's), for the edge vectors' loads and stores and (without perm_inv)
    // the per-edge words the policy stores.
    index_t eu[U];
    auto share_ids = [&] {
#pragma unroll
      for (int u = 0; u < U; ++u) eu[u] = __shfl_sync(mask, cur.eq[0], head_base + u);
    };
#pragma unroll
    for (int u = 0; u < U; ++u) eu[u] = 0;
    if (!kLate && edge_ids) share_ids();
    Vec<scalar_t, V> gv[U];
    typename Score::TEntry te[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool use = valid && u < left && gathered_ok(cur.i[u]);
      gv[u] = load_vec_if<scalar_t, V>(use, row_at(p.grad_out, cur.i[u], HD) + m.feat[0]);
      te[u] = score.template load_tentry<kEdges>(p, m, use && (!edge_vectors || edge_ok(eu[u])),
                                                 cur.i[u], eu[u]);
    }
    const bool ok = head_ok && qe < left && gathered_ok(cur.iq[0]) && edge_ok(cur.eq[0]);
    const RowAux<acc_t> ax = load_aux(ok, row_at(aux, cur.iq[0], H) + h);
    acc_t logit = 0;
    uint32_t word = 0;
    if constexpr (kRecorded) score.load_record(p, ok, cur.eq[0], h, logit, word);
    Step next;
    if constexpr (kPrefetch) load_idx(k0 + U, next);
    acc_t d[U], l[U], de[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      d[u] = vec_dot<scalar_t, V>(gv[u], xr[0]);
      if constexpr (!kRecorded) l[u] = score.template logit_part<kEdges>(p, 0, te[u], xr[0]);
      // + <grad_out[i], e_feat[e]> (the transformer), summed apart as its
      // backward() does
      if constexpr (Score::kEdgeDot && kEdges)
        de[u] = edge_vectors ? vec_dot<scalar_t, V>(gv[u], te[u].ef) : acc_t(0);
    }
    transpose_sums<kS>(d, q, mask);
    if constexpr (!kRecorded) {
      transpose_sums<kS>(l, q, mask);
      logit = score.scaled_logit(p, l[0]);
    }
    acc_t dot = d[0];
    if constexpr (Score::kEdgeDot && kEdges) {
      if (edge_vectors) {  // group-uniform
        transpose_sums<kS>(de, q, mask);
        dot += de[0];
      }
    }
    acc_t mk = 1;
    if (p.rng.threshold != 0)  // group-uniform
      mk = ok && p.rng.keep(static_cast<int64_t>(cur.eq[0]), h) ? p.scale : acc_t(0);
    const acc_t alpha = exp_(logit - ax.lse);
    const acc_t gl_own = alpha * (mk * dot - ax.dl);
    const acc_t w = ok ? alpha * mk : acc_t(0);
    const acc_t gl = ok ? gl_own : acc_t(0);
    if (ok && q < U) {
      // GATv2's logit gradient takes its logit's place, by edge id
      const int64_t zi = p.perm_inv != nullptr && !kRecorded ? lo + k0 + qe
                                                             : static_cast<int64_t>(cur.eq[0]);
      p.grad_z[zi * H + h] = gl_own;
    }
    // The step's w, gl (and record words) to the head's lanes in one block
    // of shuffles: one convergence check.
    acc_t wu[U], glu[U];
    uint32_t wordu[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      wu[u] = __shfl_sync(mask, w, head_base + u);
      glu[u] = __shfl_sync(mask, gl, head_base + u);
      wordu[u] = kRecorded ? __shfl_sync(mask, word, head_base + u) : 0u;
    }
    // Entry u's own test, as lane u made it for w and gl, from the edge ids
    // where this lane has them (without them, with perm_inv given, the
    // policy stores nothing per edge).
    auto stores = [&](int u) {
      bool entry_ok = u < left && gathered_ok(cur.i[u]);
      if (edge_ids) entry_ok = entry_ok && edge_ok(eu[u]);
      return valid && entry_ok;
    };
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t zi = p.perm_inv != nullptr ? lo + k0 + u : static_cast<int64_t>(eu[u]);
      score.template apply<kEdges>(p, m, 0, q, mask, !kLate && stores(u), wu[u], glu[u],
                                   wordu[u], gv[u], xr[0], te[u], acc[0],
                                   static_cast<int64_t>(eu[u]), zi);
    }
    if (kLate && edge_ids) {  // group-uniform
      share_ids();
#pragma unroll
      for (int u = 0; u < U; ++u)
        score.apply_edges(p, m, 0, q, stores(u), glu[u], wordu[u], static_cast<int64_t>(eu[u]));
    }
    if constexpr (kPrefetch) cur = next;
  }
  score.end_source(p, m, acc, xr);
}

// The destination passes of GATv2 and the transformer (their _dst_rows
// kernels): pass(acc, lo, hi) sums CSR entries [lo, hi) into acc in the lane
// layout m; a long row's slices store their sums in part (for
// launch_sum_slices), the other rows theirs in out.
template <typename scalar_t, typename index_t, int V, int VPL, class Pass>
__device__ __forceinline__ void for_each_dst_row(const index_t* rowptr, int64_t num_edges,
                                                 const SliceList& sl, int G,
                                                 const RowLanes<V, VPL>& m, int64_t HD,
                                                 at::opmath_type<scalar_t>* __restrict__ part,
                                                 scalar_t* __restrict__ out, Pass&& pass) {
  using acc_t = at::opmath_type<scalar_t>;
  auto slice = [&](int64_t slot, int64_t, int64_t lo, int64_t hi) {
    acc_t acc[VPL][V];
    pass(acc, lo, hi);
#pragma unroll
    for (int k = 0; k < VPL; ++k)
      if (m.valid[k]) store_vec<acc_t, V>(part + slot * HD + m.feat[k], acc[k]);
  };
  auto row = [&](int64_t r, int64_t lo, int64_t hi) {
    acc_t acc[VPL][V];
    pass(acc, lo, hi);
#pragma unroll
    for (int k = 0; k < VPL; ++k)
      if (m.valid[k]) store_vec<scalar_t, V>(out + r * HD + m.feat[k], acc[k]);
  };
  for_each_slice_or_row(rowptr, num_edges, sl, G, slice, row);
}

namespace {  // internal linkage: each instance is launched by one .cu
// ScoreT: the policy (scores.cuh). kS = 4 or 8: for heads of kS lanes (VPL =
// 1), backward_row_transposed (GAT) or backward_row_transposed_dot (the
// transformer); kS = 0: backward_row.
template <template <typename, typename, int, int> class ScoreT, typename scalar_t,
          typename index_t, int V, int VPL, int kS>
__global__ void __launch_bounds__(kBackwardThreads,
                                  backward_min_blocks<
                                      scalar_t, VPL, kS, ScoreT<scalar_t, index_t, V, VPL>::kScalar,
                                      ScoreT<scalar_t, index_t, V, VPL>::kTransposedMinBlocks,
                                      ScoreT<scalar_t, index_t, V, VPL>::kRowMinBlocks>())
    attention_backward_rows_kernel(const AttentionParams<scalar_t, index_t> p,
                                   const SliceList sl) {
  using acc_t = at::opmath_type<scalar_t>;
  using Score = ScoreT<scalar_t, index_t, V, VPL>;
  const int G = p.G, lane = threadIdx.x & (G - 1);
  const unsigned mask = group_mask(G);
  const auto m = score_lanes<Score, V, VPL>(lane, G, p.log2S, p.H, p.D);
  const bool leader = (lane & (p.S - 1)) == 0;
  Score score;
  score.init(p, m);
  // One pass over the entries [lo, hi) of column j.
  auto pass = [&](acc_t(&acc)[VPL][V], int64_t j, int64_t lo, int64_t hi) {
    if constexpr (kS != 0 && Score::kScalar) {
      static_assert(VPL == 1, "one vector per lane");
      backward_row_transposed<kS>(acc, score.gsrc, p, j, lo, hi, m, lane, mask);
    } else if constexpr (kS != 0) {
      static_assert(VPL == 1 && Score::kTransposedDot,
                    "one vector per lane, a policy with a transposed pass");
      // (a copy without edge features where the step's entries carry them:
      // the transformer's; GATv2's come after the step, kLateEdges)
      if constexpr (Score::kLateEdges) {
        backward_row_transposed_dot<kS, true>(acc, score, p, j, lo, hi, m, lane, mask);
      } else if (p.e_feat != nullptr || p.grad_e_feat != nullptr) {  // uniform
        backward_row_transposed_dot<kS, true>(acc, score, p, j, lo, hi, m, lane, mask);
      } else {
        backward_row_transposed_dot<kS, false>(acc, score, p, j, lo, hi, m, lane, mask);
      }
    } else {
      backward_row(acc, score, p, j, lo, hi, m, lane, mask);
    }
  };
  auto slice = [&](int64_t slot, int64_t j, int64_t lo, int64_t hi) {
    acc_t acc[VPL][V];
    pass(acc, j, lo, hi);
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      if (!m.valid[k]) continue;
      store_vec<acc_t, V>(p.part_x + slot * p.HD + m.feat[k], acc[k]);
      score.store_slice(p, slot, m, k, leader);
    }
  };
  auto row = [&](int64_t j, int64_t lo, int64_t hi) {
    acc_t acc[VPL][V];
    pass(acc, j, lo, hi);
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      if (!m.valid[k]) continue;
      store_vec<scalar_t, V>(p.out + j * p.HD + m.feat[k], acc[k]);
      score.store_source(p, j, m, k, leader);
    }
  };
  auto fetch_done = [&](int64_t range) {
#pragma unroll
    for (int k = 0; k < VPL; ++k)
      if (m.valid[k]) score.store_range(p, range, m, k);
  };
  for_each_slice_or_row(p.ptr, p.num_edges, sl, G, slice, row, fetch_done);
}
}  // namespace

namespace {  // internal linkage: each instance is launched by one .cu
// aux[i, h] = (s_dst, lse, delta - grad_lse) with delta[i, h] = <grad_out[i, h],
// out[i, h] - bias[h]>, one group per destination row, in the lane layout of
// attention_backward_rows_kernel (padded: the GATv2 layout) (vec_dot, then lanes_sum; without a bias the
// subtracted vector is zero, so a single-edge row's delta is still its dot
// bit for bit).
template <typename scalar_t, typename index_t, int V, int VPL>
__global__ void __launch_bounds__(kThreads)
    gat_aux_kernel(const AttentionParams<scalar_t, index_t> p, const scalar_t* __restrict__ out,
                   RowAux<at::opmath_type<scalar_t>>* __restrict__ aux) {
  using acc_t = at::opmath_type<scalar_t>;
  const int G = p.G, lane = threadIdx.x & (G - 1);
  const unsigned mask = group_mask(G);
  // (padded lanes: the same vectors as the unpadded layout when D = S * V)
  const RowLanes<V, VPL> m(lane, G, p.log2S, p.H, p.D);
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
        a.sd = p.s_dst != nullptr ? load_value(p.s_dst + ih) : acc_t(0);  // GAT only
        a.lse = p.lse_in[ih];
        a.dl = d - (p.grad_lse != nullptr ? p.grad_lse[ih] : acc_t(0));
        a.pad = 0;
        aux[ih] = a;
      }
    }
  }
}
}  // namespace

}  // namespace pyg_multihead_agg
