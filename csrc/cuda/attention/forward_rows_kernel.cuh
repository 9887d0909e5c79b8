// attention_rows_kernel: the forward of the fused attention skeleton, all
// heads of a destination row per group, for every score policy (scores.cuh:
// GatScore for gat_attention, Gatv2Score for gatv2_attention,
// TransformerScore for transformer_attention).
//
// The lane layout of attention_backward_rows_kernel: a group owns the row's
// H * D features, S lanes per head. Two ways through a row, chosen per row:
//
// * Scalar-score policies (GAT): short rows of at most `onepass_min` entries
//   (by default every short row, see gat_onepass_min() in heuristics.cuh)
//   make two passes: pass 1, the S lanes of each head striding over the row's
//   entries (q, q + S, ...) for the exact maximum and sum of exp, merged by an
//   S-lane butterfly; pass 2, U entries per step, their col loaded once for
//   all heads and x[j] gathered as one coalesced row, weighted by
//   exp(l - lse).
// * Every other row, and every row of the other policies (whose score needs
//   the gathered row itself: one pass reads it once for the score and the
//   aggregation), makes one pass with an online softmax: each step loads U
//   cols, then x[j] and the policy's per-edge inputs together, then the
//   logits; each lane keeps its heads' running maximum, the sum of
//   exp(l - max) before dropout and the accumulated exp(l - max) * mask * x[j],
//   rescaled when the maximum grows. The S lanes of a head see the same
//   logits, so their states agree without shuffles. float32 works in base 2
//   (logits scaled by log2 e, exp2f: one MUFU.EX2 instead of expf's range
//   reduction). Long rows run block-wide, a slice per group, merged in group
//   order.
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

template <typename scalar_t, typename index_t, int V, int VPL>
__device__ __forceinline__ void row_stats_heads(const AttentionParams<scalar_t, index_t>& p,
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

// One step's loads and logits for this lane's heads, shared by the forward
// paths: entries e0..e0+U-1, of which the first `left` are the row's (none
// past it or out of range: ok[u] false), their x vectors, then their logits
// (score.logit: after the score's nonlinearity), stored as out[u][k] =
// finish(use, logit) (kLoadsOnly, policies other than GAT: only the loads;
// kEdges false: the caller knows there are no edge features, and the
// policy's entry loads and adds none).
// Every load is predicated, with no branch in between (see load_vec_if), and
// all of a step's loads come before its arithmetic.
// Entry tests in the index's width (EntryOffset, IndexBound) and row
// addresses by row_at: with 32-bit indices one compare and one IMAD.WIDE
// each instead of 64-bit arithmetic (utils/index.cuh).
template <int U, class Score, bool kLoadsOnly = false, bool kEdges = true, typename scalar_t,
          typename index_t, int V, int VPL, typename Finish>
__device__ __forceinline__ void load_attend_step(bool (&ok)[U], Vec<scalar_t, V> (&xv)[U][VPL],
                                                 typename Score::Entry (&en)[U][VPL],
                                                 at::opmath_type<scalar_t> (&out)[U][VPL],
                                                 const AttentionParams<scalar_t, index_t>& p,
                                                 int64_t e0, EntryOffset<index_t> left,
                                                 const RowLanes<V, VPL>& m, const Score& score,
                                                 unsigned mask, Finish&& finish) {
  index_t j[U];
  const IndexBound<index_t> gathered_ok(p.num_gathered);
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const bool inside = u < left;
    j[u] = load_index_if(inside, p.idx + e0 + u);
    ok[u] = inside && gathered_ok(j[u]);
  }
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const bool use = ok[u] && m.valid[k];
      xv[u][k] = load_vec_if<scalar_t, V>(use, row_at(p.x, j[u], p.HD) + m.feat[k]);
      en[u][k] = score.template load_entry<kEdges>(p, m, k, use, j[u], e0 + u);
      // scalar scores: no shuffle, the logit right after its loads
      if constexpr (Score::kScalar)
        out[u][k] = finish(use, score.logit(p, k, use, en[u][k], xv[u][k], mask, e0 + u));
    }
  if constexpr (!Score::kScalar && !kLoadsOnly) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int k = 0; k < VPL; ++k) {
        const bool use = ok[u] && m.valid[k];
        out[u][k] = finish(use, score.logit(p, k, use, en[u][k], xv[u][k], mask, e0 + u));
      }
  }
}

// Pass 2 for this lane's heads over entries [lo, hi) (scalar-score
// policies): acc = sum_e exp(l[e] - lse) * mask[e] * x[col[e], h].
template <class Score, typename scalar_t, typename index_t, int V, int VPL>
__device__ __forceinline__ void attend_heads(at::opmath_type<scalar_t> (&acc)[VPL][V],
                                             const AttentionParams<scalar_t, index_t>& p, int64_t lo,
                                             int64_t hi, int q, unsigned mask,
                                             const RowLanes<V, VPL>& m, const Score& score,
                                             const at::opmath_type<scalar_t> (&lse)[VPL]) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int U = kLoadsInFlight / VPL / Score::kStepDivisor > 0
                        ? kLoadsInFlight / VPL / Score::kStepDivisor : 1;
#pragma unroll
  for (int k = 0; k < VPL; ++k)
#pragma unroll
    for (int v = 0; v < V; ++v) acc[k][v] = 0;
  for (int64_t e0 = lo; e0 < hi; e0 += U) {
    const auto left = static_cast<EntryOffset<index_t>>(hi - e0);  // > 0
    bool ok[U];
    Vec<scalar_t, V> xv[U][VPL];
    typename Score::Entry en[U][VPL];
    acc_t l[U][VPL];
    load_attend_step<U>(ok, xv, en, l, p, e0, left, m, score, mask,
                        [](bool, acc_t lk) { return lk; });
    unsigned keep[VPL];
    if (p.rng.threshold != 0)
      draw_keep_bits<U, VPL, index_t>(keep, p.rng, nullptr, e0, hi, q, p.log2S, m.head);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u >= left) break;  // group-uniform
#pragma unroll
      for (int k = 0; k < VPL; ++k) {
        const acc_t mk = p.rng.threshold != 0
                             ? keep_scale(keep[k], u, p.S, p.log2S, mask, p.scale)
                             : acc_t(1);
        if (!(ok[u] && m.valid[k])) continue;
        const acc_t w = exp_(l[u][k] - lse[k]) * mk;
        score.aggregate(p, acc[k], w, xv[u][k], en[u][k]);
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
// is bitwise that of attend_heads (with the work in every lane, the float32
// forward issued 86 warp instructions per entry on reddit-like).
template <int kS, typename scalar_t, typename index_t, int V>
__device__ __forceinline__ void attend_heads_transposed(
    at::opmath_type<scalar_t> (&acc)[1][V], const AttentionParams<scalar_t, index_t>& p, int64_t lo,
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
  // addresses by row_at (utils/index.cuh).
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

// The one-pass state of this lane's heads over entries [lo, hi) of a row
// (score: the policy with the row loaded): running maximum mx (scaled
// units), sum of exp(l - mx), and acc = sum_e exp(l[e] - mx) * mask[e] *
// x[col[e], h] (the policy's aggregate: TransformerScore adds the edge's
// features) (not yet normalised).
template <class Score, typename scalar_t, typename index_t, int V, int VPL>
__device__ __forceinline__ void attend_heads_online(at::opmath_type<scalar_t> (&acc)[VPL][V],
                                                    at::opmath_type<scalar_t> (&mx)[VPL],
                                                    at::opmath_type<scalar_t> (&sum)[VPL],
                                                    const AttentionParams<scalar_t, index_t>& p,
                                                    int64_t lo, int64_t hi, int q, unsigned mask,
                                                    const RowLanes<V, VPL>& m,
                                                    const Score& score) {
  using acc_t = at::opmath_type<scalar_t>;
  using Units = OnlineUnits<acc_t>;
  constexpr int U = kLoadsInFlight / VPL / Score::kStepDivisor > 0
                        ? kLoadsInFlight / VPL / Score::kStepDivisor : 1;
  const acc_t scale = Units::scale();
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    mx[k] = -std::numeric_limits<acc_t>::infinity();
    sum[k] = 0;
#pragma unroll
    for (int v = 0; v < V; ++v) acc[k][v] = 0;
  }
  for (int64_t e0 = lo; e0 < hi; e0 += U) {
    const auto left = static_cast<EntryOffset<index_t>>(hi - e0);  // > 0
    bool ok[U];
    Vec<scalar_t, V> xv[U][VPL];
    typename Score::Entry en[U][VPL];
    acc_t l[U][VPL];
    load_attend_step<U>(ok, xv, en, l, p, e0, left, m, score, mask, [&](bool use, acc_t lk) {
      return use ? lk * scale : -std::numeric_limits<acc_t>::infinity();
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
      if (u >= left) break;  // group-uniform
#pragma unroll
      for (int k = 0; k < VPL; ++k) {
        const acc_t mk = p.rng.threshold != 0
                             ? keep_scale(keep[k], u, p.S, p.log2S, mask, p.scale)
                             : acc_t(1);
        if (!(ok[u] && m.valid[k])) continue;
        const acc_t w = online_shift(l[u][k], mx[k]);
        sum[k] += w;
        const acc_t wm = w * mk;
        score.aggregate(p, acc[k], wm, xv[u][k], en[u][k]);
      }
    }
  }
}

// The head sums of U parts over the kS lanes of a head, transposed (kS and
// U powers of two): at each of the first min(log2 kS, log2 U) levels of
// lanes_sum's butterfly (offsets kS / 2, kS / 4, ...) a lane keeps the half
// of its values whose top entry bit is its lane bit of the offset and adds
// its partner's value of the same entry; the levels after those are
// lanes_sum's own. Each level adds the same two subtree sums as lanes_sum
// (a + b = b + a, exactly), so every head sum is lanes_sum's, bit for bit,
// with U / 2 + U / 4 + ... shuffles a step instead of log2 kS per entry.
// Lane q ends with kSlots = max(U / kS, 1) sums: slot t is entry
// entry(q, t); entry u is in slot slot(u) of lane owner(u) (and, where kS >
// U, of the kS / U lanes after it).
template <int kS, int U>
struct TransposedSum {
  static constexpr int kL = kS == 8 ? 3 : (kS == 4 ? 2 : (kS == 2 ? 1 : 0));
  static constexpr int kB = U == 8 ? 3 : (U == 4 ? 2 : (U == 2 ? 1 : 0));
  static_assert((1 << kL) == kS && (1 << kB) == U, "powers of two up to 8");
  static constexpr int kSlots = kB > kL ? U / kS : 1;
  static constexpr int kDup = kB < kL ? kS / U : 1;  // lanes holding each entry
  static __device__ __forceinline__ int entry(int q, int t) {
    return kB <= kL ? q >> (kL - kB) : q * kSlots + t;
  }
  static constexpr int owner(int u) { return kB <= kL ? u << (kL - kB) : u / kSlots; }
  static constexpr int slot(int u) { return kB <= kL ? 0 : u % kSlots; }

  template <int kOff, int kN, typename acc_t>
  static __device__ __forceinline__ void level(acc_t (&v)[U], int q, unsigned mask) {
    if constexpr (kOff > 0) {
      if constexpr (kN > 1) {
        constexpr int kHalf = kN / 2;
        const bool upper = (q & kOff) != 0;
#pragma unroll
        for (int t = 0; t < kHalf; ++t) {
          const acc_t keep = upper ? v[t + kHalf] : v[t];
          const acc_t send = upper ? v[t] : v[t + kHalf];
          v[t] = keep + __shfl_xor_sync(mask, send, kOff);
        }
        level<kOff / 2, kHalf>(v, q, mask);
      } else {
        v[0] += __shfl_xor_sync(mask, v[0], kOff);
        level<kOff / 2, 1>(v, q, mask);
      }
    }
  }
  // v[u]: this lane's part of entry u; afterwards v[t], t < kSlots: the sums
  template <typename acc_t>
  static __device__ __forceinline__ void sum(acc_t (&v)[U], int q, unsigned mask) {
    level<kS / 2, U>(v, q, mask);
  }
};

// attend_heads_online for policies other than GAT (their logit a sum over
// the head's channels), one vector per lane and heads of kS = 4 or 8 lanes,
// with each entry's scalar work done once instead of in all kS lanes of its
// head: the step's parts go through one transposing butterfly
// (TransposedSum), the lane that ends with an entry's logit records it (a
// step's logits in one coalesced store), scales it and, once the head's
// maximum is merged (a max butterfly per step), computes its weight (and
// draws its dropout mask); the step's weights go back to the head's lanes in
// one block of shuffles (two with dropout). The same expressions in the same
// order as attend_heads_online (the maximum is exact, sum and acc take the
// weights in entry order), so out, lse and the record are bitwise its.
// kEdges false (no edge features, the caller's uniform branch): no edge
// vector loaded or added (GATv2 float32 heads of 8 lanes: 11 of 82 warp
// instructions an entry).
template <int kS, bool kEdges, class Score, typename scalar_t, typename index_t, int V>
__device__ __forceinline__ void attend_heads_online_transposed(
    at::opmath_type<scalar_t> (&acc)[1][V], at::opmath_type<scalar_t> (&mx)[1],
    at::opmath_type<scalar_t> (&sum)[1], const AttentionParams<scalar_t, index_t>& p, int64_t lo,
    int64_t hi, int q, unsigned mask, const RowLanes<V, 1>& m, const Score& score) {
  using acc_t = at::opmath_type<scalar_t>;
  using Units = OnlineUnits<acc_t>;
  constexpr int U = kLoadsInFlight / Score::kStepDivisor;
  using TS = TransposedSum<kS, U>;
  constexpr acc_t kNegInf = -std::numeric_limits<acc_t>::infinity();
  const acc_t scale = Units::scale();
  const int head_base = (threadIdx.x & 31) & ~(kS - 1);  // warp lane of the head's lane 0
  const int h = m.head[0];
  const bool records = h < p.H && (q & (TS::kDup - 1)) == 0;  // the first lane of an entry
  const IndexBound<index_t> gathered_ok(p.num_gathered);
  mx[0] = kNegInf;
  sum[0] = 0;
#pragma unroll
  for (int v = 0; v < V; ++v) acc[0][v] = 0;
  for (int64_t e0 = lo; e0 < hi; e0 += U) {
    const auto left = static_cast<EntryOffset<index_t>>(hi - e0);  // > 0
    bool ok[U];
    Vec<scalar_t, V> xv[U][1];
    typename Score::Entry en[U][1];
    acc_t unused[U][1];
    load_attend_step<U, Score, true, kEdges>(ok, xv, en, unused, p, e0, left, m, score, mask,
                                             [](bool, acc_t lk) { return lk; });
    // this lane's parts of the step's logits and its sign bits of their z
    // (entry u's at bit u * V of the step's words)
    acc_t v[U];
    uint32_t bits[Score::template kStepWords<U>] = {};
#pragma unroll
    for (int u = 0; u < U; ++u) {
      uint32_t b;
      v[u] = score.template lane_part_bits<kEdges>(p, 0, en[u][0], xv[u][0], b);
      bits[(u * V) >> 5] |= b << ((u * V) & 31);
    }
    TS::sum(v, q, mask);
    // this lane's entries: logit (recorded), scaled, the step's maximum
    acc_t l[TS::kSlots], smax = kNegInf;
    int ent[TS::kSlots];
    int64_t et[TS::kSlots];
    bool use[TS::kSlots];
#pragma unroll
    for (int t = 0; t < TS::kSlots; ++t) {
      const int u = TS::entry(q, t);
      ent[t] = u;
      et[t] = e0 + u;
      const index_t j = load_index_if(u < left, p.idx + et[t]);
      use[t] = u < left && gathered_ok(j) && records;
      const acc_t lt = Score::head_logit(p, v[t]);
      score.record_logit(p, use[t], h, et[t], lt);
      l[t] = u < left && gathered_ok(j) ? lt * scale : kNegInf;
      smax = l[t] > smax ? l[t] : smax;  // (a NaN never wins)
    }
    score.template record_signs<kS, U, TS::kSlots>(p, bits, mask, head_base, h, ent, et, use);
#pragma unroll
    for (int off = kS / 2; off > 0; off >>= 1) {
      const acc_t o = __shfl_xor_sync(mask, smax, off);
      smax = o > smax ? o : smax;
    }
    if (smax > mx[0]) {
      const acc_t c = online_shift(mx[0], smax);
      sum[0] *= c;
#pragma unroll
      for (int v2 = 0; v2 < V; ++v2) acc[0][v2] *= c;
      mx[0] = smax;
    }
    acc_t w[TS::kSlots], wm[TS::kSlots];
#pragma unroll
    for (int t = 0; t < TS::kSlots; ++t) {
      w[t] = online_shift(l[t], mx[0]);
      acc_t mk = 1;
      if (p.rng.threshold != 0) mk = p.rng.keep(et[t], h) ? p.scale : acc_t(0);  // uniform branch
      wm[t] = w[t] * mk;
    }
    // the weights to the head's lanes, all of the step's in one block of
    // shuffles (one convergence check), then the entries in order
    acc_t wu[U], wmu[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      wu[u] = __shfl_sync(mask, w[TS::slot(u)], head_base + TS::owner(u));
    if (p.rng.threshold != 0) {  // uniform
#pragma unroll
      for (int u = 0; u < U; ++u)
        wmu[u] = __shfl_sync(mask, wm[TS::slot(u)], head_base + TS::owner(u));
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) wmu[u] = wu[u];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u >= left) break;  // group-uniform
      if (!(ok[u] && m.valid[0])) continue;
      sum[0] += wu[u];
      score.template aggregate<kEdges>(p, acc[0], wmu[u], xv[u][0], en[u][0]);
    }
  }
}

// block_reduce_store for padded heads (RowLanes' second constructor): sums
// the groups' partial rows in group order and writes each lane's valid
// features, lane (k, l) of the group owning features feat of the row.
template <typename scalar_t, typename acc_t, int V, int VPL>
__device__ __forceinline__ void block_reduce_store_padded(acc_t* red, const acc_t (&acc)[VPL][V],
                                                          int G, int lane, int log2S, int H,
                                                          int D, scalar_t* __restrict__ out_row) {
  const int cwe = G * VPL * V, groups = kThreads / G, group = threadIdx.x / G;
#pragma unroll
  for (int k = 0; k < VPL; ++k)
#pragma unroll
    for (int v = 0; v < V; ++v) red[group * cwe + (k * G + lane) * V + v] = acc[k][v];
  __syncthreads();
  for (int t = threadIdx.x; t < cwe; t += kThreads) {
    const int vec = t / V, head = vec >> log2S, c = (vec & ((1 << log2S) - 1)) * V + t % V;
    if (head < H && c < D) {
      acc_t s = 0;
      for (int g = 0; g < groups; ++g) s += red[g * cwe + t];
      out_row[head * D + c] = static_cast<scalar_t>(s);
    }
  }
  __syncthreads();
}

namespace {  // internal linkage: each instance is launched by one .cu
// Score: the policy (scores.cuh). kS = 4 or 8 (heads of kS lanes, one vector
// per lane): scalar-score policies take the two-pass rows' second pass by
// attend_heads_transposed, the others the online pass by
// attend_heads_online_transposed; kS = 0: attend_heads, attend_heads_online.
// Policies whose score needs the gathered row take the online pass for every
// row and pad heads of fewer than S vectors.
template <template <typename, typename, int, int> class ScoreT, typename scalar_t,
          typename index_t, int V, int VPL, int kS>
__global__ void __launch_bounds__(
    kThreads,
    forward_rows_min_blocks<scalar_t, VPL, kS, ScoreT<scalar_t, index_t, V, VPL>::kScalar>())
    attention_rows_kernel(const AttentionParams<scalar_t, index_t> p, const WorkList wl) {
  using acc_t = at::opmath_type<scalar_t>;
  using Score = ScoreT<scalar_t, index_t, V, VPL>;
  __shared__ acc_t red[kThreads * VPL * V];
  // per (group, head) statistics of a long row's slices
  // (groups * head slots = 256 * VPL / S entries)
  __shared__ acc_t s_mx[kThreads * VPL], s_sum[kThreads * VPL];
  const int G = p.G, lane = threadIdx.x & (G - 1), S = p.S, q = lane & (S - 1);
  const int group = threadIdx.x / G, groups = kThreads / G;
  const unsigned mask = group_mask(G);
  const auto m = score_lanes<Score, V, VPL>(lane, G, p.log2S, p.H, p.D);
  Score score;
  score.init(p, m);
  auto short_row = [&](int64_t, int64_t r, int64_t lo, int64_t hi) {
    acc_t mx[VPL], sum[VPL], acc[VPL][V];
    score.load_row(p, r, m);
    bool two_pass = false;
    if constexpr (Score::kScalar) two_pass = hi - lo <= p.onepass_min;  // group-uniform
    if (two_pass) {
      if constexpr (Score::kScalar) {
        acc_t lse[VPL];
        row_stats_heads(p, lo, hi, q, m, score.sd, mx, sum);
#pragma unroll
        for (int k = 0; k < VPL; ++k) {
          group_merge_stats(mx[k], sum[k], S, mask);
          lse[k] = stats_lse(mx[k], sum[k], hi > lo);
          if (q == 0 && m.valid[k]) p.lse_out[r * p.H + m.head[k]] = lse[k];
        }
        if constexpr (kS != 0) {
          static_assert(VPL == 1, "one vector per lane");
          attend_heads_transposed<kS>(acc, p, lo, hi, q, mask, m, score.sd, lse);
        } else {
          attend_heads(acc, p, lo, hi, q, mask, m, score, lse);
        }
      }
    } else {
      if constexpr (!Score::kScalar && kS != 0) {
        static_assert(VPL == 1, "one vector per lane");
        // uniform: a copy of the pass without edge features
        if (!Score::kEdgelessForward || p.e_feat != nullptr) {
          attend_heads_online_transposed<kS, true>(acc, mx, sum, p, lo, hi, q, mask, m, score);
        } else {
          attend_heads_online_transposed<kS, false>(acc, mx, sum, p, lo, hi, q, mask, m, score);
        }
      } else {
        attend_heads_online(acc, mx, sum, p, lo, hi, q, mask, m, score);
      }
#pragma unroll
      for (int k = 0; k < VPL; ++k) {
        if (q == 0 && m.valid[k])
          p.lse_out[r * p.H + m.head[k]] = online_lse(mx[k], sum[k], hi > lo);
        // A row whose scores are all -inf gives 0 / 0 = NaN, as exp(l - lse)
        // does in the reference; a row without edges gives 0.
        // (scalar scores: rows without edges take the two passes)
        const acc_t inv = Score::kScalar || hi > lo ? acc_t(1) / sum[k] : acc_t(0);
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
  // then the rows, each scaled by exp(m_g - M) / total, by block_reduce_store
  // (whose features are the row's H * D: padding lanes add zeros).
  auto long_row = [&](int64_t r, int64_t lo, int64_t hi) {
    int64_t slo, shi;
    group_slice(lo, hi, group, groups, slo, shi);
    const int slots = p.G / S * VPL;  // head slots per group
    acc_t mx[VPL], sum[VPL], acc[VPL][V];
    score.load_row(p, r, m);
    if constexpr (!Score::kScalar && kS != 0) {
      if (!Score::kEdgelessForward || p.e_feat != nullptr) {  // uniform
        attend_heads_online_transposed<kS, true>(acc, mx, sum, p, slo, shi, q, mask, m, score);
      } else {
        attend_heads_online_transposed<kS, false>(acc, mx, sum, p, slo, shi, q, mask, m, score);
      }
    } else {
      attend_heads_online(acc, mx, sum, p, slo, shi, q, mask, m, score);
    }
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
    if constexpr (Score::kScalar) {
      block_reduce_store<scalar_t, acc_t, V, VPL>(red, acc, G, lane, 0, p.HD, p.out + r * p.HD);
    } else {  // padded heads: the lanes' features are not contiguous
      block_reduce_store_padded<scalar_t, acc_t, V, VPL>(red, acc, G, lane, p.log2S, p.H, p.D,
                                                         p.out + r * p.HD);
    }
    // (block_reduce_store ends with a barrier: s_mx / s_sum are free again)
  };
  for_each_work_item(p.ptr, p.num_edges, wl, G, 1, short_row, long_row);
}
}  // namespace

}  // namespace pyg_multihead_agg
