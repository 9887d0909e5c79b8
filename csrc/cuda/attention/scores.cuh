// Score policies of the fused attention skeleton. The skeleton
// (forward_rows_kernel.cuh: the row walk, online softmax, dropout,
// aggregation and lse; backward_rows_kernel.cuh: the CSC source pass) is one
// set of kernel templates, instantiated per policy the way flash-attention
// instantiates its kernels per traits. A policy supplies only what differs
// between the layers:
//
//   kStepDivisor   the forward's entries per step are kLoadsInFlight / VPL
//                  divided by this: TransformerScore's entries bring two
//                  vectors beside the source row (the key, the edge's
//                  features), and its full step spilled at 128 registers
//                  (ptxas: 108-444 bytes).
//   kScalar        the score is a function of per-node scalars (GAT), so a
//                  row's statistics can come from a pass that gathers no
//                  feature row: the two-pass forward and the transposed
//                  variants apply. Otherwise every row takes the online pass,
//                  which reads each source row once for its score and its
//                  aggregation.
//   init           per-thread constants (GATv2: this lane's slice of att).
//   load_row       what the score needs of destination row r.
//   Entry,         what it needs of one edge beyond the gathered source
//   load_entry     vector, loaded with it.
//   logit          the entry's logit for this lane's vector k (its head's,
//                  after the nonlinearity), the same in every lane of the
//                  head; called by every lane of the group (it may shuffle),
//                  with the entry's edge id (GATv2 records the logit there).
//   aggregate      acc += w * (the entry's aggregated vector): the gathered
//                  source vector (TransformerScore: plus the edge's features).
//   kEdgelessForward  whether the transposed forward takes its copy without
//                  edge features when there are none (kEdges false).
//   Backward, over the CSC (per source j):
//   Source,        per-source state and its gradient accumulators.
//   load_source
//   BEntry,        what an entry needs beyond grad_out[i] and the row terms
//   load_bentry    (RowAux), loaded with them.
//   backward       the entry's contribution: the aggregation's gradient
//                  w * grad_out[i] plus the score's share of grad_x[j] into
//                  acc, the score's own gradients, and the per-edge logit
//                  gradient for the destination pass; called by every lane
//                  (use: whether the entry and vector exist).
//   end_source     after each pass over a source's entries (a column or a
//                  slice of one), what the score sums per source and adds
//                  to acc and its gradients once (GATv2: leaky_relu''s sums).
//   store_source / store_slice: the score's per-source results.
//   store_range    after each fetch of the work list, the results summed
//                  over a fixed range of sources (GATv2's grad_att shares).
//   The transposed CSC pass (backward_row_transposed_dot, kTransposedDot)
//   splits backward() instead: transposed_step<kS> (entries per step),
//   TEntry / load_tentry (an entry's vectors, in every lane), the logit
//   (logit_part, summed by the pass, or with kRecorded read from the
//   forward's record by one lane: load_record), apply (the entry's vector
//   work with that lane's w, gl and record word) and, with kLateEdges,
//   apply_edges (its edge features' work, after the step's).
//
// TransformerScore, TransformerConv's scaled dot product
// scale * <q[i], k[j] (+ e)>, is the third: a destination row (q[i]) per
// row, the key and edge vectors per entry, a head butterfly for the logit,
// per-channel gradients.
#pragma once

#include <ATen/OpMathType.h>

#include <cstdint>

#include "../utils/index.cuh"
#include "../utils/vec.cuh"
#include "head_lanes.cuh"
#include "params.cuh"
#include "softmax.cuh"

namespace pyg_multihead_agg {

// What the backward needs of destination row i, head h, in one 16-byte load
// (two for float64): written by gat_aux_kernel before the CSC pass.
template <typename acc_t>
struct alignas(4 * sizeof(acc_t)) RowAux {
  acc_t sd, lse, dl, pad;  // s_dst[i, h] (GAT), lse[i, h], delta[i, h] - grad_lse[i, h]
};

// GAT: z = s_src[j] + s_dst[i] (+ s_edge[e]), logit leaky_relu(z), per head.
template <typename scalar_t, typename index_t, int V, int VPL>
struct GatScore {
  using acc_t = at::opmath_type<scalar_t>;
  using Params = AttentionParams<scalar_t, index_t>;
  using Lanes = RowLanes<V, VPL>;
  static constexpr bool kScalar = true;
  static constexpr bool kTransposedDot = false;  // (its own transposed pass)
  static constexpr int kTransposedMinBlocks = 4;
  static constexpr int kRowMinBlocks = 0;  // (scalar scores: backward_min_blocks's own)
  static constexpr int kStepDivisor = 1;

  acc_t sd[VPL];  // s_dst of the row's heads

  __device__ __forceinline__ void init(const Params&, const Lanes&) {}

  __device__ __forceinline__ void load_row(const Params& p, int64_t r, const Lanes& m) {
#pragma unroll
    for (int k = 0; k < VPL; ++k)
      sd[k] = m.valid[k] ? load_value(p.s_dst + r * p.H + m.head[k]) : acc_t(0);
  }

  struct Entry {
    acc_t ssrc, sedge;
  };
  template <bool kEdges = true>  // (GAT's edge scores are scalars: always read)
  __device__ __forceinline__ Entry load_entry(const Params& p, const Lanes& m, int k, bool use,
                                              index_t j, int64_t e) const {
    Entry en;
    en.ssrc = load_value_if(use, p.s_src + static_cast<int64_t>(j) * p.H + m.head[k]);
    en.sedge = load_value_if(use && p.s_edge != nullptr, p.s_edge + e * p.H + m.head[k]);
    return en;
  }
  __device__ __forceinline__ acc_t logit(const Params& p, int k, bool use, const Entry& en,
                                         const Vec<scalar_t, V>&, unsigned, int64_t) const {
    acc_t z = use ? en.ssrc + sd[k] : acc_t(0);
    z += en.sedge;
    return leaky(z, p.negative_slope);
  }
  __device__ __forceinline__ void aggregate(const Params&, acc_t (&acc)[V], acc_t w,
                                            const Vec<scalar_t, V>& xv, const Entry&) const {
    axpy_vec(acc, w, xv);
  }

  // Backward. gsrc: grad_s_src of the source's heads.
  acc_t ss[VPL], gsrc[VPL];

  __device__ __forceinline__ void load_source(const Params& p, int64_t j, const Lanes& m) {
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      ss[k] = m.valid[k] ? load_value(p.s_src + j * p.H + m.head[k]) : acc_t(0);
      gsrc[k] = 0;
    }
  }

  struct BEntry {
    acc_t se;  // s_edge[e, h], added last as in the forward's z
  };
  __device__ __forceinline__ BEntry load_bentry(const Params& p, const Lanes& m, int k, bool use,
                                                index_t, index_t e) const {
    return {load_value_if(use && p.s_edge != nullptr,
                          p.s_edge + static_cast<int64_t>(e) * p.H + m.head[k])};
  }

  __device__ __forceinline__ void backward(const Params& p, const Lanes& m, int k, bool use, int q,
                                           unsigned, acc_t dot, acc_t mk,
                                           const Vec<scalar_t, V>& gv, const Vec<scalar_t, V>&,
                                           const RowAux<acc_t>& ax, const BEntry& be,
                                           acc_t (&acc)[V], int64_t zi, int64_t) {
    if (!use) return;
    acc_t z = ss[k] + ax.sd;
    z += be.se;
    const acc_t alpha = exp_(leaky(z, p.negative_slope) - ax.lse);
    const acc_t w = alpha * mk;
    axpy_vec(acc, w, gv);
    const acc_t gz = alpha * (mk * dot - ax.dl) * (z > acc_t(0) ? acc_t(1) : p.negative_slope);
    gsrc[k] += gz;
    if (q == 0) p.grad_z[zi * p.H + m.head[k]] = gz;
  }
  __device__ __forceinline__ void end_source(const Params&, const Lanes&, acc_t (&)[VPL][V],
                                             const Vec<scalar_t, V> (&)[VPL]) {}

  __device__ __forceinline__ void store_source(const Params& p, int64_t j, const Lanes& m, int k,
                                               bool leader) const {
    if (leader) p.grad_s_src[j * p.H + m.head[k]] = static_cast<scalar_t>(gsrc[k]);
  }
  __device__ __forceinline__ void store_slice(const Params& p, int64_t slot, const Lanes& m,
                                              int k, bool leader) const {
    if (leader) p.part_src[slot * p.H + m.head[k]] = gsrc[k];
  }
  __device__ __forceinline__ void store_range(const Params&, int64_t, const Lanes&, int) {}
};

// GATv2: z[c] = x_l[j, c] + x_r[i, c] (+ e_feat[e, c]) per channel, logit
// sum_c att[c] * leaky_relu(z[c]) over the head: each lane sums its V
// channels, then the head's S lanes (lanes_sum). A forward for training
// records each entry's logit and the signs of its z (p.logits, p.bits), so
// that the backward's CSC pass gathers one row per entry (grad_out[i]), as
// GAT's, instead of rebuilding z from x_r[i] as well.
template <typename scalar_t, typename index_t, int V, int VPL>
struct Gatv2Score {
  using acc_t = at::opmath_type<scalar_t>;
  using Params = AttentionParams<scalar_t, index_t>;
  using Lanes = RowLanes<V, VPL>;
  static constexpr bool kScalar = false;
  // The CSC pass: backward_row_transposed_dot for heads of 4 or 8 lanes, the
  // logit and the signs read from the record by the entry's lane;
  // backward_row for the other layouts.
  static constexpr bool kTransposedDot = true;
  static constexpr bool kRecorded = true;
  static constexpr bool kEdgeDot = false;
  // (backward_min_blocks) float32 steps of 8 entries: 164 registers without
  // spills at 3 blocks (at 4: 128 and 56 bytes of spill, 1.4-1.5% slower on
  // products-like, both at 46 GB of DRAM reads: a latency-bound pass)
  static constexpr int kTransposedMinBlocks = sizeof(scalar_t) == 4 ? 3 : 4;
  static constexpr int kRowMinBlocks = 5;  // (backward_min_blocks)
  static constexpr int kStepDivisor = 1;
  // The transposed forward's copy without edge features (its kEdges false)
  // in float32 and float64; in 2-byte types the copy beside the edge one
  // took the bf16 pass from 13.7 to 14.5 ms on products-like (H100).
  static constexpr bool kEdgelessForward = sizeof(scalar_t) != 2;

  acc_t at[VPL][V];  // this lane's channels of att (0 for padding lanes)
  acc_t xr[VPL][V];  // forward: x_r of the row

  __device__ __forceinline__ void init(const Params& p, const Lanes& m) {
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const auto a = m.valid[k] ? load_vec<scalar_t, V>(p.att + m.feat[k]) : zero_vec<scalar_t, V>();
      widen(a, at[k]);
#pragma unroll
      for (int v = 0; v < V; ++v) ga_range[k][v] = ts[k][v] = 0;
    }
  }

  __device__ __forceinline__ void load_row(const Params& p, int64_t r, const Lanes& m) {
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const auto x = m.valid[k] ? load_vec<scalar_t, V>(p.x_dst + r * p.HD + m.feat[k])
                                : zero_vec<scalar_t, V>();
      widen(x, xr[k]);
    }
  }

  struct Entry {
    Vec<scalar_t, V> ef;
  };
  // (kEdges false: no edge features, none loaded)
  template <bool kEdges = true>
  __device__ __forceinline__ Entry load_entry(const Params& p, const Lanes& m, int k, bool use,
                                              index_t, int64_t e) const {
    if constexpr (!kEdges) {
      return {zero_vec<scalar_t, V>()};
    } else {
      return {load_vec_if<scalar_t, V>(use && p.e_feat != nullptr,
                                       p.e_feat + e * p.HD + m.feat[k])};
    }
  }

  // sum over this lane's channels of att * leaky_relu(z), z = xl + xr + ef
  // (kEdges false: z = xl + xr).
  template <bool kEdges = true>
  __device__ __forceinline__ acc_t lane_logit(const Params& p, const acc_t (&a)[V],
                                              const Vec<scalar_t, V>& xl, const acc_t (&r)[V],
                                              const Vec<scalar_t, V>& ef, acc_t (&z)[V]) const {
    acc_t xw[V], ew[V];
    widen(xl, xw);
    widen(ef, ew);
    acc_t part = 0;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      z[v] = xw[v] + r[v];
      if constexpr (kEdges) z[v] += ew[v];
      part += a[v] * leaky(z[v], p.negative_slope);
    }
    return part;
  }

  // The signs of this lane's V channels of z (channels c0 .. c0 + V - 1,
  // c0 = q * V) at their place in their byte of the head's word, OR-ed over
  // the lanes that share the byte (V < 8: one shuffle for float32, two for
  // float64, none for 16-bit types); every lane of the group calls it. Each
  // byte is then stored by its first lane: an OR over all the lanes of a
  // word (a runtime-bounded butterfly, or one redux.sync) put its latency on
  // every entry and made the record cost half the forward.
  static __device__ __forceinline__ uint32_t sign_byte(const acc_t (&z)[V], int c0, int S,
                                                       unsigned mask) {
    uint32_t sign = 0;
#pragma unroll
    for (int v = 0; v < V; ++v) sign |= (z[v] > acc_t(0) ? 1u : 0u) << v;
    sign <<= (c0 & 7);
#pragma unroll
    for (int off = 1; off < 8 / V; off <<= 1)
      if (off < S) sign |= __shfl_xor_sync(mask, sign, off);  // (uniform)
    return sign;
  }

  // The forward's logit in two halves, so that the transposed forward
  // (attend_heads_online_transposed) can sum a step's partials over the head
  // in one transposing butterfly: lane_part, this lane's part of entry e's
  // logit (with p.logits set, a forward whose backward reads the record, its
  // sign bits go to the record: the first lane of each byte of the head's
  // words stores the byte, a predicated store with no divergent branch; lane
  // q and the head of vector k as RowLanes lays them out; little-endian
  // words: channel c is bit c & 7 of byte (c & 31) >> 3 of word c >> 5), and
  // head_logit, the logit from the head's sum of the parts; record_logit
  // stores it (pred: the lane that writes entry e's logit of `head`).
  __device__ __forceinline__ acc_t lane_part(const Params& p, int k, bool use, const Entry& en,
                                             const Vec<scalar_t, V>& xv, unsigned mask,
                                             int64_t e) const {
    acc_t z[V];
    const acc_t part = lane_logit(p, at[k], xv, xr[k], en.ef, z);
    if (p.logits != nullptr) {  // uniform
      const int lane = threadIdx.x & (p.G - 1), c0 = (lane & (p.S - 1)) * V;
      const uint32_t sign = sign_byte(z, c0, p.S, mask);
      const int head = (lane + p.G * k) >> p.log2S;
      auto* byte_at = reinterpret_cast<char*>(p.bits + head * p.W + (c0 >> 5)) + ((c0 & 31) >> 3);
      store_if(use && (c0 & 7) == 0,
               reinterpret_cast<uint8_t*>(byte_at + entry_offset(e) *
                                                        static_cast<uint32_t>(p.H * p.W * 4)),
               static_cast<uint8_t>(sign));
    }
    return part;
  }
  static __device__ __forceinline__ acc_t head_logit(const Params&, acc_t sum) { return sum; }
  __device__ __forceinline__ void record_logit(const Params& p, bool pred, int head, int64_t e,
                                               acc_t l) const {
    if (p.logits != nullptr) {  // uniform
      auto* logit_at = reinterpret_cast<char*>(p.logits + head);
      store_if(pred, reinterpret_cast<acc_t*>(
                         logit_at + entry_offset(e) * static_cast<uint32_t>(p.H * sizeof(acc_t))),
               l);
    }
  }
  // Entry e's records lie e times their per-entry strides from entry 0's:
  // one wide multiply-add each (e < 2^31 with int32 indices, whose rowptr
  // holds E).
  static __device__ __forceinline__ uint64_t entry_offset(int64_t e) {
    return sizeof(index_t) == 4 ? static_cast<uint32_t>(e) : static_cast<uint64_t>(e);
  }

  // The transposed forward's part of entry e's logit, with this lane's sign
  // bits of its z (bit v: channel c0 + v) for record_signs.
  template <bool kEdges = true>
  __device__ __forceinline__ acc_t lane_part_bits(const Params& p, int k, const Entry& en,
                                                  const Vec<scalar_t, V>& xv,
                                                  uint32_t& bits) const {
    acc_t z[V];
    const acc_t part = lane_logit<kEdges>(p, at[k], xv, xr[k], en.ef, z);
    bits = 0;
#pragma unroll
    for (int v = 0; v < V; ++v) bits |= (z[v] > acc_t(0) ? 1u : 0u) << v;
    return part;
  }
  template <int U>
  static constexpr int kStepWords = (U * V + 31) / 32;
  // The transposed forward's sign record of a step, in whole words: lane
  // q's bits of all U entries (`bits`, entry u's at bit u * V) go to every
  // lane of the head (a shuffle per lane and word), and each lane puts
  // together the head's words of its own entries ent[t] (channel l * V + v
  // from lane l's bit v) and stores them (use[t]): a step's words in kSlots
  // coalesced stores, no per-entry shuffle. (Heads of kS lanes hold kS * V
  // channels, D in (kS * V / 2, kS * V]: W = ceil(kS * V / 32) words, all
  // written.)
  template <int kS, int U, int kSlots>
  __device__ __forceinline__ void record_signs(const Params& p,
                                               const uint32_t (&bits)[kStepWords<U>],
                                               unsigned mask, int head_base, int h,
                                               const int (&ent)[kSlots],
                                               const int64_t (&et)[kSlots],
                                               const bool (&use)[kSlots]) const {
    constexpr int kHW = (kS * V + 31) / 32;
    if (p.logits == nullptr) return;  // uniform
    uint32_t hw[kSlots][kHW] = {};
#pragma unroll
    for (int l = 0; l < kS; ++l) {
      uint32_t wl[kStepWords<U>];
#pragma unroll
      for (int i = 0; i < kStepWords<U>; ++i) wl[i] = __shfl_sync(mask, bits[i], head_base + l);
#pragma unroll
      for (int t = 0; t < kSlots; ++t) {
        const int bit = ent[t] * V;
        const uint32_t word = kStepWords<U> == 1 || bit < 32 ? wl[0] : wl[kStepWords<U> - 1];
        const uint32_t b = (word >> (bit & 31)) & ((1u << V) - 1);
        hw[t][(l * V) >> 5] |= b << ((l * V) & 31);
      }
    }
#pragma unroll
    for (int t = 0; t < kSlots; ++t)
#pragma unroll
      for (int w = 0; w < kHW; ++w) {
        auto* word_at = reinterpret_cast<char*>(p.bits + h * kHW + w);
        store_if(use[t], reinterpret_cast<uint32_t*>(
                             word_at + entry_offset(et[t]) * static_cast<uint32_t>(p.H * kHW * 4)),
                 hw[t][w]);
      }
  }

  // The per-lane forward's logit: the head's lanes sum the parts
  // (lanes_sum) and lane q = 0 of the head records it.
  __device__ __forceinline__ acc_t logit(const Params& p, int k, bool use, const Entry& en,
                                         const Vec<scalar_t, V>& xv, unsigned mask,
                                         int64_t e) const {
    const acc_t l = head_logit(p, lanes_sum(lane_part(p, k, use, en, xv, mask, e), p.S, mask));
    const int lane = threadIdx.x & (p.G - 1);
    record_logit(p, use && (lane & (p.S - 1)) == 0, (lane + p.G * k) >> p.log2S, e, l);
    return l;
  }
  template <bool = true>
  __device__ __forceinline__ void aggregate(const Params&, acc_t (&acc)[V], acc_t w,
                                            const Vec<scalar_t, V>& xv, const Entry&) const {
    axpy_vec(acc, w, xv);
  }

  // Backward. ga_range: this lane's channels of grad_att summed over the
  // entries of the current fetch range, in the order the group walks them
  // (a fixed range of sources, whichever warp takes it). No per-source
  // share: a register per channel less. ts: the source's sum of gl * s per
  // channel (s = leaky_relu'(z)), which end_source multiplies by att (into
  // grad_x_l[j]) and by x_l[j] (into ga_range) once per pass instead of per
  // entry.
  acc_t ga_range[VPL][V];
  acc_t ts[VPL][V];

  __device__ __forceinline__ void load_source(const Params&, int64_t, const Lanes&) {}

  // The entry's record, loaded with grad_out[i]: its logit and the word of
  // its signs that holds this lane's channels (by edge id: a sector per
  // entry and array). No x_r[i] gather and no z: x_r[i]'s share of grad_att
  // is the destination pass's. A plain load: the logit gradient may be
  // written in the logit's place (p.grad_z == p.logits), by this lane,
  // after this load. e_feat[e] is loaded where it is used (backward).
  struct BEntry {
    acc_t l;
    uint32_t word;
  };
  __device__ __forceinline__ BEntry load_bentry(const Params& p, const Lanes& m, int k, bool use,
                                                index_t, index_t e) const {
    const int64_t eh = static_cast<int64_t>(e) * p.H + m.head[k];
    const int c0 = (threadIdx.x & (p.S - 1)) * V;
    BEntry be;
    be.l = use ? p.logits[eh] : acc_t(0);
    be.word = RawLoad<4>::load(use, p.bits + eh * p.W + (c0 >> 5));
    return be;
  }

  // With w = alpha * m, the logit gradient gl = alpha * (m * dot - dl) and
  // s = leaky_relu'(z) per channel (from the record's signs): acc += w *
  // grad_out[i], ts += gl * s (end_source adds att * ts to grad_x_l[j] and
  // x_l[j] * ts to ga_range: leaky_relu(z) = s * z, and x_r[i]'s term is the
  // destination pass's), ga_range += gl * s * e_feat[e], grad_e_feat[e] =
  // gl * s * att; gl goes to grad_z[e, h] for the destination pass
  // (gatv2_dst_rows_kernel).
  __device__ __forceinline__ void backward(const Params& p, const Lanes& m, int k, bool use, int q,
                                           unsigned, acc_t dot, acc_t mk,
                                           const Vec<scalar_t, V>& gv, const Vec<scalar_t, V>&,
                                           const RowAux<acc_t>& ax, const BEntry& be,
                                           acc_t (&acc)[V], int64_t, int64_t e) {
    if (!use) return;
    const acc_t alpha = exp_(be.l - ax.lse);
    const acc_t gl = alpha * (mk * dot - ax.dl);
    const uint32_t sign = be.word >> ((q * V) & 31);
    vector_terms(p, k, alpha * mk, gl, sign, gv, acc);
    if (p.e_feat != nullptr || p.grad_e_feat != nullptr) edge_terms(p, m, k, gl, sign, e);
    if (q == 0) p.grad_z[e * p.H + m.head[k]] = gl;
  }

  // An entry's vector work, in both passes (sign: this lane's bits of the
  // record's word from bit 0).
  __device__ __forceinline__ void vector_terms(const Params& p, int k, acc_t w, acc_t gl,
                                               uint32_t sign, const Vec<scalar_t, V>& gv,
                                               acc_t (&acc)[V]) {
    const acc_t gn = gl * p.negative_slope;
    acc_t gw[V];
    widen(gv, gw);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      acc[v] += w * gw[v];
      ts[k][v] += (sign >> v) & 1u ? gl : gn;
    }
  }
  // Its edge features' terms, where there are edge features.
  __device__ __forceinline__ void edge_terms(const Params& p, const Lanes& m, int k, acc_t gl,
                                             uint32_t sign, int64_t e) {
    const acc_t gn = gl * p.negative_slope;
    acc_t gs[V];
#pragma unroll
    for (int v = 0; v < V; ++v) gs[v] = (sign >> v) & 1u ? gl : gn;
    if (p.e_feat != nullptr) {
      acc_t ew[V];
      widen(load_vec<scalar_t, V>(p.e_feat + e * p.HD + m.feat[k]), ew);
#pragma unroll
      for (int v = 0; v < V; ++v) ga_range[k][v] += gs[v] * ew[v];
    }
    if (p.grad_e_feat != nullptr) {
      acc_t gz[V];
#pragma unroll
      for (int v = 0; v < V; ++v) gz[v] = gs[v] * at[k][v];
      store_vec<scalar_t, V>(p.grad_e_feat + e * p.HD + m.feat[k], gz);
    }
  }

  __device__ __forceinline__ void end_source(const Params&, const Lanes&, acc_t (&acc)[VPL][V],
                                             const Vec<scalar_t, V> (&xj)[VPL]) {
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      acc_t xw[V];
      widen(xj[k], xw);
#pragma unroll
      for (int v = 0; v < V; ++v) {
        acc[k][v] += ts[k][v] * at[k][v];
        ga_range[k][v] += ts[k][v] * xw[v];
        ts[k][v] = 0;
      }
    }
  }

  // The transposed pass: no vector of the entry beyond grad_out[i] (the edge
  // features come after the step's vector work, apply_edges), the record
  // loaded by the entry's lane (a plain load of the logit, whose place its
  // gradient may take).
  static constexpr bool kLateEdges = true;
  template <int kS>
  static constexpr int transposed_step() { return kS; }
  struct TEntry {};
  template <bool = true>
  __device__ __forceinline__ TEntry load_tentry(const Params&, const Lanes&, bool, index_t,
                                                index_t) const {
    return {};
  }
  // (The transposed pass's heads hold at most 32 channels: one word, W = 1.)
  __device__ __forceinline__ void load_record(const Params& p, bool ok, index_t e, int h,
                                              acc_t& l, uint32_t& word) const {
    l = ok ? row_at(p.logits, e, p.H)[h] : acc_t(0);
    word = RawLoad<4>::load(ok, row_at(p.bits, e, p.H) + h);
  }
  template <bool = true>
  __device__ __forceinline__ void apply(const Params& p, const Lanes&, int k, int q, unsigned,
                                        bool, acc_t w, acc_t gl, uint32_t word,
                                        const Vec<scalar_t, V>& gv, const Vec<scalar_t, V>&,
                                        const TEntry&, acc_t (&acc)[V], int64_t, int64_t) {
    vector_terms(p, k, w, gl, word >> (q * V), gv, acc);
  }
  __device__ __forceinline__ void apply_edges(const Params& p, const Lanes& m, int k, int q,
                                              bool store, acc_t gl, uint32_t word, int64_t e) {
    if (store) edge_terms(p, m, k, gl, word >> (q * V), e);
  }

  // grad_att is stored once per fetch range (store_range): att_part has a
  // row per range, not per source.
  __device__ __forceinline__ void store_source(const Params&, int64_t, const Lanes&, int,
                                               bool) {}
  __device__ __forceinline__ void store_slice(const Params&, int64_t, const Lanes&, int,
                                              bool) {}
  __device__ __forceinline__ void store_range(const Params& p, int64_t range, const Lanes& m,
                                              int k) {
    store_vec<acc_t, V>(p.att_part + range * p.HD + m.feat[k], ga_range[k]);
#pragma unroll
    for (int v = 0; v < V; ++v) ga_range[k][v] = 0;
  }
};

// TransformerConv: logit scale * <q[i], k[j] (+ e_feat[e])> per head (each
// lane sums its V channels of q * (k + e), then the head's S lanes:
// lanes_sum, recomputed bit for bit in the backward), aggregation of
// v[j] (+ e_feat[e]). x is the values, x_dst the queries, key the keys.
template <typename scalar_t, typename index_t, int V, int VPL>
struct TransformerScore {
  using acc_t = at::opmath_type<scalar_t>;
  using Params = AttentionParams<scalar_t, index_t>;
  using Lanes = RowLanes<V, VPL>;
  static constexpr bool kScalar = false;
  static constexpr int kStepDivisor = 2;
  static constexpr bool kEdgelessForward = true;  // (Gatv2Score's)

  // sum over this lane's channels of q * (k + e) (kEdges false: q * k).
  template <bool kEdges = true>
  static __device__ __forceinline__ acc_t lane_dot(const acc_t (&q)[V], const acc_t (&k)[V],
                                                   const Vec<scalar_t, V>& ef) {
    acc_t ew[V];
    widen(ef, ew);
    acc_t part = 0;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      acc_t kc = k[v];
      if constexpr (kEdges) kc += ew[v];
      part += q[v] * kc;
    }
    return part;
  }

  acc_t xq[VPL][V];  // forward: the row's query

  __device__ __forceinline__ void init(const Params&, const Lanes&) {}

  __device__ __forceinline__ void load_row(const Params& p, int64_t r, const Lanes& m) {
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const auto x = m.valid[k] ? load_vec<scalar_t, V>(p.x_dst + r * p.HD + m.feat[k])
                                : zero_vec<scalar_t, V>();
      widen(x, xq[k]);
    }
  }

  struct Entry {
    Vec<scalar_t, V> kv, ef;
  };
  template <bool kEdges = true>  // (false: no edge features, none loaded)
  __device__ __forceinline__ Entry load_entry(const Params& p, const Lanes& m, int k, bool use,
                                              index_t j, int64_t e) const {
    Entry en;
    en.kv = load_vec_if<scalar_t, V>(use, p.key + static_cast<int64_t>(j) * p.HD + m.feat[k]);
    en.ef = kEdges ? load_vec_if<scalar_t, V>(use && p.e_feat != nullptr,
                                              p.e_feat + e * p.HD + m.feat[k])
                   : zero_vec<scalar_t, V>();
    return en;
  }

  // The logit's halves for the transposed forward (as Gatv2Score's; no
  // record) and the per-lane forward's logit.
  template <bool kEdges = true>
  __device__ __forceinline__ acc_t lane_part(const Params&, int k, bool, const Entry& en,
                                             const Vec<scalar_t, V>&, unsigned, int64_t) const {
    acc_t kw[V];
    widen(en.kv, kw);
    return lane_dot<kEdges>(xq[k], kw, en.ef);
  }
  static __device__ __forceinline__ acc_t head_logit(const Params& p, acc_t sum) {
    return sum * p.score_scale;
  }
  __device__ __forceinline__ void record_logit(const Params&, bool, int, int64_t, acc_t) const {}
  template <bool kEdges = true>
  __device__ __forceinline__ acc_t lane_part_bits(const Params& p, int k, const Entry& en,
                                                  const Vec<scalar_t, V>& xv,
                                                  uint32_t& bits) const {
    bits = 0;
    return lane_part<kEdges>(p, k, true, en, xv, 0u, 0);
  }
  template <int U>
  static constexpr int kStepWords = 1;
  template <int kS, int U, int kSlots>
  __device__ __forceinline__ void record_signs(const Params&, const uint32_t (&)[1], unsigned, int,
                                               int, const int (&)[kSlots],
                                               const int64_t (&)[kSlots],
                                               const bool (&)[kSlots]) const {}
  __device__ __forceinline__ acc_t logit(const Params& p, int k, bool use, const Entry& en,
                                         const Vec<scalar_t, V>& xv, unsigned mask,
                                         int64_t e) const {
    return head_logit(p, lanes_sum(lane_part(p, k, use, en, xv, mask, e), p.S, mask));
  }
  template <bool kEdges = true>
  __device__ __forceinline__ void aggregate(const Params& p, acc_t (&acc)[V], acc_t w,
                                            const Vec<scalar_t, V>& xv, const Entry& en) const {
    axpy_vec(acc, w, xv);
    if (kEdges && p.e_feat != nullptr) axpy_vec(acc, w, en.ef);  // uniform
  }

  // Backward. kj: the source's key; gk: its gradient.
  acc_t kj[VPL][V], gk[VPL][V];

  __device__ __forceinline__ void load_source(const Params& p, int64_t j, const Lanes& m) {
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const auto x = m.valid[k] ? load_vec<scalar_t, V>(p.key + j * p.HD + m.feat[k])
                                : zero_vec<scalar_t, V>();
      widen(x, kj[k]);
#pragma unroll
      for (int v = 0; v < V; ++v) gk[k][v] = 0;
    }
  }

  struct BEntry {
    Vec<scalar_t, V> qv, ef;  // q[i] and e_feat[e] of the entry
  };
  __device__ __forceinline__ BEntry load_bentry(const Params& p, const Lanes& m, int k, bool use,
                                                index_t i, index_t e) const {
    BEntry be;
    be.qv = load_vec_if<scalar_t, V>(use, p.x_dst + static_cast<int64_t>(i) * p.HD + m.feat[k]);
    be.ef = load_vec_if<scalar_t, V>(use && p.e_feat != nullptr,
                                     p.e_feat + static_cast<int64_t>(e) * p.HD + m.feat[k]);
    return be;
  }

  // With w = alpha * m and the logit gradient gl = alpha * (m * <grad_out[i],
  // v[j] + e> - dl): acc += w * grad_out[i] (grad_v[j]), gk += gl * scale *
  // q[i], grad_e_feat[e] = w * grad_out[i] + gl * scale * q[i]; gl goes to
  // grad_z[zi, h] for the destination pass (grad_q, transformer_dst_rows_kernel).
  __device__ __forceinline__ void backward(const Params& p, const Lanes& m, int k, bool use, int q,
                                           unsigned mask, acc_t dot, acc_t mk,
                                           const Vec<scalar_t, V>& gv, const Vec<scalar_t, V>&,
                                           const RowAux<acc_t>& ax, const BEntry& be,
                                           acc_t (&acc)[V], int64_t zi, int64_t e) {
    acc_t qw[V];
    widen(be.qv, qw);
    const acc_t l = lanes_sum(lane_dot(qw, kj[k], be.ef), p.S, mask) * p.score_scale;
    if (p.e_feat != nullptr) dot += lanes_sum(vec_dot<scalar_t, V>(gv, be.ef), p.S, mask);
    if (!use) return;
    const acc_t alpha = exp_(l - ax.lse);
    const acc_t w = alpha * mk;
    const acc_t gl = alpha * (mk * dot - ax.dl);
    if (q == 0) p.grad_z[zi * p.H + m.head[k]] = gl;
    entry_grads(p, m, k, p.grad_e_feat != nullptr, w, gl * p.score_scale, gv, qw, acc, e);
  }

  // acc += w * grad_out[i] (grad_v[j]), gk += gs * q[i], as explicit FMAs: the
  // same bits in backward() and in both copies of the transposed pass's
  // apply(), whether or not the entry's grad_e_feat (their sum) is stored.
  __device__ __forceinline__ void entry_grads(const Params& p, const Lanes& m, int k,
                                              bool store_e, acc_t w, acc_t gs,
                                              const Vec<scalar_t, V>& gv, const acc_t (&qw)[V],
                                              acc_t (&acc)[V], int64_t e) {
    acc_t gw[V];
    widen(gv, gw);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      acc[v] = fma_(w, gw[v], acc[v]);
      gk[k][v] = fma_(gs, qw[v], gk[k][v]);
    }
    if (store_e) {
      acc_t ge[V];
#pragma unroll
      for (int v = 0; v < V; ++v) ge[v] = fma_(gs, qw[v], w * gw[v]);
      store_vec<scalar_t, V>(p.grad_e_feat + e * p.HD + m.feat[k], ge);
    }
  }

  // The transposed CSC pass (backward_row_transposed_dot) splits backward()
  // in three: every lane's part of the entry's logit (the lane_dot that
  // lanes_sum would add up), one lane's scalar work (in the pass), and the
  // entry's vector work with that lane's w and gl. The sums are backward()'s,
  // so both passes give the same bits.
  static constexpr bool kTransposedDot = true;
  static constexpr bool kRecorded = false;  // the logit from logit_part
  static constexpr int kTransposedMinBlocks = sizeof(scalar_t) == 2 ? 3 : 4;
  static constexpr int kRowMinBlocks = 4;  // (backward_min_blocks)
  static constexpr bool kEdgeDot = true;  // dot += <grad_out[i], e_feat[e]>
  using TEntry = BEntry;
  // (kEdges false: no edge features, none loaded or stored)
  template <bool kEdges = true>
  __device__ __forceinline__ TEntry load_tentry(const Params& p, const Lanes& m, bool use,
                                                index_t i, index_t e) const {
    if constexpr (kEdges) {
      return load_bentry(p, m, 0, use, i, e);
    } else {
      TEntry te;
      te.qv = load_vec_if<scalar_t, V>(use, p.x_dst + static_cast<int64_t>(i) * p.HD + m.feat[0]);
      te.ef = zero_vec<scalar_t, V>();
      return te;
    }
  }
  __device__ __forceinline__ void load_record(const Params&, bool, index_t, int, acc_t&,
                                              uint32_t&) const {}
  static constexpr bool kLateEdges = false;  // (apply does the edge features' work)
  template <int kS>
  static constexpr int transposed_step() { return 4; }
  __device__ __forceinline__ void apply_edges(const Params&, const Lanes&, int, int, bool, acc_t,
                                              uint32_t, int64_t) {}
  template <bool kEdges = true>
  __device__ __forceinline__ acc_t logit_part(const Params&, int k, const BEntry& be,
                                              const Vec<scalar_t, V>&) const {
    acc_t qw[V];
    widen(be.qv, qw);
    return lane_dot<kEdges>(qw, kj[k], be.ef);
  }
  __device__ __forceinline__ acc_t scaled_logit(const Params& p, acc_t l) const {
    return l * p.score_scale;
  }
  template <bool kEdges = true>
  __device__ __forceinline__ void apply(const Params& p, const Lanes& m, int k, int, unsigned,
                                        bool store, acc_t w, acc_t gl, uint32_t,
                                        const Vec<scalar_t, V>& gv, const Vec<scalar_t, V>&,
                                        const BEntry& be, acc_t (&acc)[V], int64_t e, int64_t) {
    acc_t qw[V];
    widen(be.qv, qw);
    entry_grads(p, m, k, kEdges && store && p.grad_e_feat != nullptr, w, gl * p.score_scale, gv,
                qw, acc, e);
  }

  __device__ __forceinline__ void end_source(const Params&, const Lanes&, acc_t (&)[VPL][V],
                                             const Vec<scalar_t, V> (&)[VPL]) {}
  __device__ __forceinline__ void store_source(const Params& p, int64_t j, const Lanes& m, int k,
                                               bool) const {
    store_vec<scalar_t, V>(p.grad_key + j * p.HD + m.feat[k], gk[k]);
  }
  __device__ __forceinline__ void store_slice(const Params& p, int64_t slot, const Lanes& m,
                                              int k, bool) const {
    store_vec<acc_t, V>(p.part_key + slot * p.HD + m.feat[k], gk[k]);
  }
  __device__ __forceinline__ void store_range(const Params&, int64_t, const Lanes&, int) {}
};

// The lane layout of a policy's kernels: heads of exactly S vectors for
// scalar scores (GAT's D = S * V), padded heads for the others.
template <class Score, int V, int VPL>
__device__ __forceinline__ RowLanes<V, VPL> score_lanes(int lane, int G, int log2S, int H, int D) {
  if constexpr (Score::kScalar) {
    return RowLanes<V, VPL>(lane, G, log2S, H);
  } else {
    return RowLanes<V, VPL>(lane, G, log2S, H, D);
  }
}

}  // namespace pyg_multihead_agg
