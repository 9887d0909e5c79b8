// Parameters of the fused attention kernels (gat_attention,
// gatv2_attention and transformer_attention: one struct, each score policy
// reads its fields, see scores.cuh) and their compile-time tuning (block
// sizes, minimum resident blocks). Run-time launch choices are in
// heuristics.cuh.
#pragma once

#include <ATen/OpMathType.h>

#include <cstdint>
#include <type_traits>

#include "../../philox.h"
#include "../utils/config.cuh"

namespace pyg_multihead_agg {

template <typename scalar_t, typename index_t>
struct AttentionParams {
  using acc_t = at::opmath_type<scalar_t>;
  const index_t* ptr;        // rowptr (forward) or colptr (backward)
  const index_t* idx;        // col (forward) or row (backward)
  const index_t* perm;       // backward: edge id of each CSC entry
  const scalar_t* s_src;     // [N_src, H]
  const scalar_t* s_dst;     // [N_dst, H]
  const scalar_t* s_edge;    // [E, H] or nullptr
  const scalar_t* x;         // [N_src, H, D]: the aggregated (and, GATv2, scored) features
  const scalar_t* grad_out;  // backward: [N_dst, H, D]
  const acc_t* lse_in;       // backward: [N_dst, H]
  const acc_t* delta;        // backward: [N_dst, H]
  const acc_t* grad_lse;     // backward: [N_dst, H] or nullptr
  const scalar_t* bias;      // [H, D] or nullptr (backward: delta from out - bias)
  scalar_t* out;             // forward: [N_dst, H, D]; backward: grad_x [N_src, H, D]
  acc_t* lse_out;            // forward: [N_dst, H]
  scalar_t* grad_s_src;      // backward: [N_src, H]
  acc_t* grad_z;             // backward: [E, H], by edge id or (perm_inv) by CSC entry
                             // (GATv2: by edge id)
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
  // GATv2 (Gatv2Score): the destination features x_r, the edge features in
  // CSR order, att; in the backward grad_z holds the logit gradients and
  // these the rest.
  const scalar_t* x_dst;     // [N_dst, H, D]
  const scalar_t* e_feat;    // [E, H, D] or nullptr
  const scalar_t* att;       // [H, D]
  scalar_t* grad_e_feat;     // backward: [E, H, D] by edge id, or nullptr
  acc_t* att_part;           // backward: [ranges, H * D] grad_att per fetch range
  // The record of a forward that keeps it for its backward (nullptr: none),
  // by edge id (CSR order): each entry's logit and the signs of its z (bit
  // c % 32 of word c / 32). The forward writes them, the backward's CSC pass
  // reads them (its logit gradients may take the logits' place: grad_z).
  acc_t* logits;             // [E, H]
  uint32_t* bits;            // [E, H, W]
  int W;                     // words of bits per head: ceil(D / 32)
  // TransformerConv (TransformerScore): the keys beside x (the values),
  // x_dst the queries, e_feat the edge features; the logit's scale; in the
  // backward grad_z holds the logit gradients, grad_key and part_key (the
  // slices' partial rows) the keys' gradients.
  const scalar_t* key;       // [N_src, H, D]
  scalar_t* grad_key;        // backward: [N_src, H, D]
  acc_t* part_key;           // backward: [slots, H * D]
  acc_t score_scale;         // 1 / sqrt(C) as the layer gives it
};

// ---------------------------------------------------------------------------
// Per-head kernels (the fallback shapes)
// ---------------------------------------------------------------------------

// gat_forward_kernel: two blocks per SM (at most 128 registers) for float32,
// which ptxas fits without spilling; one for the others, which would spill.
template <typename scalar_t>
constexpr int forward_min_blocks() {
  return std::is_same<scalar_t, float>::value ? 2 : 1;
}

// ---------------------------------------------------------------------------
// All-heads kernels (the fast path)
// ---------------------------------------------------------------------------

// attention_rows_kernel: 2 blocks (128 registers), 1 with four vectors per
// lane. Transposed variants: float32 at 3 blocks (80 registers); 2-byte types
// at 2 (128 registers, no spill), as at 3 the bf16 kernel spilled in its step
// loop (80 registers, 19 LDL per step), and 2 measured 0 / -5 / +1.7% on
// arxiv- / products- / reddit-like.
constexpr int kForwardTransposedMinBlocks = 3;
constexpr int kForwardTransposedMinBlocksHalf = 2;

// Policies other than GAT keep their one-pass state and a step's rows in
// either layout: 2 blocks (128 registers) for their transposed pass too.
template <typename scalar_t, int VPL, int kS, bool kScalar = true>
constexpr int forward_rows_min_blocks() {
  if (VPL >= 4) return 1;
  if (kS == 0 || !kScalar) return 2;
  return sizeof(scalar_t) == 2 ? kForwardTransposedMinBlocksHalf : kForwardTransposedMinBlocks;
}

// attention_backward_rows_kernel: blocks of 128 threads. The kernel has no
// block-wide step (slices replace block-wide long rows), so registers, not the
// block size, set the warps per multiprocessor: float32 rows of one vector per
// lane fit 96 registers, 5 blocks = 20 warps instead of 2 x 8 with 256 threads
// (the kernel is latency-bound: more warps, more gathers in flight). Other
// rows: at most 128 registers (4 blocks) or, with 4 vectors per lane, one
// block's worth.
constexpr int kBackwardThreads = 128;
// Transposed variants: float32 at 4 blocks (125 registers); 2-byte types at 5
// (96 registers, 48 bytes of spill), which took 1-2% off bf16 where float32
// lost 1-2%.
constexpr int kBackwardTransposedMinBlocksHalf = 5;

// Policies other than GAT (kScalar false) keep more per entry and per lane
// (att, the grad_att sums). Their per-lane CSC pass at one vector per lane
// takes kRowBlocks blocks in float32 and one fewer in 2-byte types, which
// widen eight channels per vector (the policy's kRowMinBlocks): GATv2, whose
// entry is the record's logit and sign word, 5 and 4 (96 and 128 registers,
// 52 and 8 bytes of spill: 6-12% off its backward on the H200 against 4 and
// 3); the transformer 4 and 3 (at 96 registers its float32 pass spilled 260
// bytes and lost 9-14%). 255 registers at two vectors, one block at four;
// float64 4. Their transposed pass takes kDotBlocks, the policy's
// kTransposedMinBlocks for the dtype: the transformer 4, 3 in 2-byte types
// (128 registers without spills in float32; at 128 in 2-byte types it
// spilled 430-610 bytes); GATv2 3 in float32 (164 registers, steps of
// 8 entries; at 4, 128 registers and 56 bytes of spill, 1.4-1.5% slower), 4.
template <typename scalar_t, int VPL, int kS, bool kScalar = true, int kDotBlocks = 4,
          int kRowBlocks = 4>
constexpr int backward_min_blocks() {
  if (!kScalar && kS != 0) return kDotBlocks;
  if (!kScalar) {
    if (VPL >= 4) return 1;
    if (VPL == 2) return 2;
    return sizeof(scalar_t) == 2 ? kRowBlocks - 1 : (sizeof(scalar_t) == 4 ? kRowBlocks : 4);
  }
  if (kS != 0) return sizeof(scalar_t) == 2 ? kBackwardTransposedMinBlocksHalf : 4;
  return VPL >= 4 ? 1 : (VPL == 1 && sizeof(scalar_t) == 4 ? 5 : 4);
}

}  // namespace pyg_multihead_agg

