// The launcher of GATv2's backward (launch_gatv2_backward_rows,
// launchers.cuh): gat_aux_kernel (the row terms), the CSC source pass
// attention_backward_rows_kernel<Gatv2Score> over the forward's record
// (grad_x_l, grad_e_feat, the x_l and e_feat shares of grad_att summed per
// fixed range of sources, and per edge the logit gradient), the destination
// pass gatv2_dst_rows_kernel (grad_x_r and x_r's share of grad_att), and the
// slices' sums. The CSC pass is backward_row_transposed_dot for heads of
// 4 or 8 lanes at one vector per lane, backward_row for the others.
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/TensorOptions.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>

#include "../utils/config.cuh"
#include "../utils/dispatch.cuh"
#include "../utils/lanes.cuh"
#include "../utils/sum_slices.cuh"
#include "../utils/work_list.cuh"
#include "backward_rows_kernel.cuh"
#include "backward_rows_launch.cuh"
#include "head_lanes.cuh"
#include "heuristics.cuh"
#include "launchers.cuh"
#include "params.cuh"
#include "scores.cuh"

namespace pyg_multihead_agg {
namespace {

// grad_x_r[i, h, c] = att[h, c] * t[i, h, c], t[i, h, c] = the sum over the
// CSR row i of grad_z[e, h] * (1 if z[e, h, c] > 0 else negative_slope),
// from the logit gradients the CSC pass stored and the forward's signs (by
// edge id: read in order), and x_r's share of grad_att, the sum over rows
// of x_r[i] * t[i] (leaky_relu(z) = s * z, z = x_l[j] + x_r[i] (+ e_feat):
// the CSC pass adds the rest), per fetch range as the CSC pass's shares
// (att_part). No feature row is gathered; each row reads its own x_r[i]
// before its gradient is written, so grad_x_r may take x_r's memory. The
// lane layout of the forward (padded heads); long rows in slices, their
// partial rows in `part` (t is linear in the entries: a slice's share of
// grad_att and of grad_x_r is its own).
template <typename scalar_t, typename index_t, int V, int VPL>
__global__ void __launch_bounds__(kBackwardThreads)
    gatv2_dst_rows_kernel(const AttentionParams<scalar_t, index_t> p, const index_t* rowptr,
                          scalar_t* __restrict__ grad_x_dst,
                          at::opmath_type<scalar_t>* __restrict__ part,
                          at::opmath_type<scalar_t>* __restrict__ att_part, const SliceList sl) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int U = kLoadsInFlight / 2;
  const int G = p.G, lane = threadIdx.x & (G - 1), q = lane & (p.S - 1);
  const RowLanes<V, VPL> m(lane, G, p.log2S, p.H, p.D);
  const int shift = (q * V) & 31, word = (q * V) >> 5;
  acc_t at[VPL][V], ga[VPL][V];
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    const auto a = m.valid[k] ? load_vec<scalar_t, V>(p.att + m.feat[k]) : zero_vec<scalar_t, V>();
    widen(a, at[k]);
#pragma unroll
    for (int v = 0; v < V; ++v) ga[k][v] = 0;
  }
  // t over the entries [lo, hi) of row r, its share of grad_att, then
  // att * t in t.
  auto pass = [&](acc_t(&t)[VPL][V], int64_t r, int64_t lo, int64_t hi) {
#pragma unroll
    for (int k = 0; k < VPL; ++k)
#pragma unroll
      for (int v = 0; v < V; ++v) t[k][v] = 0;
    for (int64_t e0 = lo; e0 < hi; e0 += U) {
      acc_t gl[U][VPL];
      uint32_t bits[U][VPL];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int k = 0; k < VPL; ++k) {
          const bool use = e0 + u < hi && m.valid[k];
          const int64_t zh = (e0 + u) * p.H + m.head[k];
          gl[u][k] = load_value_if(use, p.grad_z + zh);
          bits[u][k] = RawLoad<4>::load(use, p.bits + zh * p.W + word);
        }
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int k = 0; k < VPL; ++k)
#pragma unroll
          for (int v = 0; v < V; ++v)
            t[k][v] += gl[u][k] * ((bits[u][k] >> (shift + v)) & 1u ? acc_t(1) : p.negative_slope);
    }
    // (a row without entries adds nothing, not even a non-finite x_r[i] * 0)
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const auto x = m.valid[k] && hi > lo
                         ? load_vec<scalar_t, V>(p.x_dst + r * p.HD + m.feat[k])
                         : zero_vec<scalar_t, V>();
      acc_t xw[V];
      widen(x, xw);
#pragma unroll
      for (int v = 0; v < V; ++v) {
        ga[k][v] += xw[v] * t[k][v];
        t[k][v] *= at[k][v];
      }
    }
  };
  auto slice = [&](int64_t slot, int64_t r, int64_t lo, int64_t hi) {
    acc_t t[VPL][V];
    pass(t, r, lo, hi);
#pragma unroll
    for (int k = 0; k < VPL; ++k)
      if (m.valid[k]) store_vec<acc_t, V>(part + slot * p.HD + m.feat[k], t[k]);
  };
  auto row = [&](int64_t r, int64_t lo, int64_t hi) {
    acc_t t[VPL][V];
    pass(t, r, lo, hi);
#pragma unroll
    for (int k = 0; k < VPL; ++k)
      if (m.valid[k]) store_vec<scalar_t, V>(grad_x_dst + r * p.HD + m.feat[k], t[k]);
  };
  auto fetch_done = [&](int64_t range) {
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      if (m.valid[k]) store_vec<acc_t, V>(att_part + range * p.HD + m.feat[k], ga[k]);
#pragma unroll
      for (int v = 0; v < V; ++v) ga[k][v] = 0;
    }
  };
  for_each_slice_or_row(rowptr, p.num_edges, sl, G, slice, row, fetch_done);
}

}  // namespace

template <typename scalar_t, typename index_t>
at::Tensor launch_gatv2_backward_rows(AttentionParams<scalar_t, index_t> p, const scalar_t* out,
                                      scalar_t* grad_x_dst, const index_t* rowptr,
                                      const RowConfig& rc, const at::TensorOptions& options) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kVec = vec_width<scalar_t>();
  const auto acc_options = options.dtype(c10::CppTypeToScalarType<acc_t>::value);
  const BackwardScratch b =
      prepare_backward_rows(p, out, rc, gat_backward_slice_len<scalar_t>(p.num_edges), options);
  // grad_att summed per fetch range of the CSC pass (sources, then slices;
  // fetch_ranges in work_list.cuh), a row each, then per fetch range of the
  // destination pass (rows, then slices); the caller sums the rows.
  // (zero-filled: a range past the slices reserved is never fetched)
  const int rounds = fetch_rounds(p.num_rows, p.G, b.sl.forced_rounds);  // as the pass takes them
  const int64_t ranges =
      fetch_ranges(p.num_rows, p.G, rounds) + fetch_ranges(b.max_slots, p.G, rounds);
  const DstScratch dst = prepare_dst_rows(p, rowptr, options);
  const int dst_rounds = fetch_rounds(dst.sl.num_rows, p.G, dst.sl.forced_rounds);
  const int64_t dst_ranges = fetch_ranges(dst.sl.num_rows, p.G, dst_rounds) +
                             fetch_ranges(dst.part.numel() / p.HD, p.G, dst_rounds);
  at::Tensor att_part = at::zeros({ranges + dst_ranges, p.HD}, acc_options);
  p.att_part = att_part.data_ptr<acc_t>();
  auto stream = c10::cuda::getCurrentCUDAStream();
  VPL_SWITCH(rc.vpl, kVPL, [&] {
    launch_backward_rows_pass<Gatv2Score, scalar_t, index_t, kVec, kVPL>(p, b.sl);
    // grad_x_l[j] of every sliced column j: its slices' sum
    launch_sum_slices(p.ptr, p.num_edges, b.sl, p.part_x, p.out, p.HD,
                      static_cast<const acc_t*>(nullptr), static_cast<scalar_t*>(nullptr), 0);
    auto kernel = gatv2_dst_rows_kernel<scalar_t, index_t, kVec, kVPL>;
    kernel<<<persistent_grid(kernel, p.num_gathered, p.G, 0, kBackwardThreads), kBackwardThreads,
             0, stream>>>(p, rowptr, grad_x_dst, dst.part.data_ptr<acc_t>(),
                          p.att_part + ranges * p.HD, dst.sl);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  launch_sum_slices(rowptr, p.num_edges, dst.sl, dst.part.data_ptr<acc_t>(), grad_x_dst, p.HD,
                    static_cast<const acc_t*>(nullptr), static_cast<scalar_t*>(nullptr), 0);
  return att_part;
}

#define INSTANTIATE(scalar_t, index_t)                                                     \
  template at::Tensor launch_gatv2_backward_rows<scalar_t, index_t>(                       \
      AttentionParams<scalar_t, index_t>, const scalar_t*, scalar_t*, const index_t*,      \
      const RowConfig&, const at::TensorOptions&);
FOR_EACH_FLOAT_AND_INDEX(INSTANTIATE)
#undef INSTANTIATE

}  // namespace pyg_multihead_agg
