// What the launchers of the all-heads backward share (backward_rows.cu for
// GAT, gatv2_backward.cu for GATv2, transformer_backward.cu): the sliced work
// list of the CSC, the row terms (gat_aux_kernel) and the slices' partial
// rows of grad_x, and the launch of attention_backward_rows_kernel in the
// pass the head layout takes.
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/TensorOptions.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>

#include "../utils/config.cuh"
#include "../utils/work_list.cuh"
#include "backward_rows_kernel.cuh"
#include "heuristics.cuh"
#include "params.cuh"

namespace pyg_multihead_agg {

// The scratch of one backward: keeps the work list's and the partial rows'
// storage alive until the launches that read them are queued.
struct BackwardScratch {
  SliceList sl;
  int64_t max_slots = 0;
  at::Tensor storage, aux, part_x;
};

// Sets the lane layout of p, builds the CSC's slice list (slices of
// slice_len entries), the partial rows of grad_x and the row terms, and
// launches gat_aux_kernel; `out` is the forward's output.
template <typename scalar_t, typename index_t>
BackwardScratch prepare_backward_rows(AttentionParams<scalar_t, index_t>& p, const scalar_t* out,
                                      const RowConfig& rc, int64_t slice_len,
                                      const at::TensorOptions& options) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kVec = vec_width<scalar_t>();
  const auto acc_options = options.dtype(c10::CppTypeToScalarType<acc_t>::value);
  p.G = rc.G;
  p.S = rc.S;
  p.log2S = rc.log2S;
  p.num_chunks = 1;
  BackwardScratch b;
  b.sl = make_slice_list(p.ptr, p.num_rows, p.num_edges, slice_len, false, b.storage, options,
                         b.max_slots);
  b.aux = at::empty({p.num_gathered * p.H * 4}, acc_options);
  b.part_x = at::empty({b.max_slots * p.HD}, acc_options);
  p.aux = b.aux.data_ptr();
  p.part_x = b.part_x.data_ptr<acc_t>();
  const int aux_blocks = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>((p.num_gathered + kThreads / p.G - 1) / (kThreads / p.G),
                           num_sms() * 32LL)));
  VPL_SWITCH(rc.vpl, kVPL, [&] {
    gat_aux_kernel<scalar_t, index_t, kVec, kVPL>
        <<<aux_blocks, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
            p, out, static_cast<RowAux<acc_t>*>(b.aux.data_ptr()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return b;
}

// The destination pass's slices (the CSR's long rows) and their partial
// rows; keeps their storage alive until the launches that read them are
// queued.
struct DstScratch {
  SliceList sl;
  at::Tensor storage, part;
};

template <typename scalar_t, typename index_t>
DstScratch prepare_dst_rows(const AttentionParams<scalar_t, index_t>& p, const index_t* rowptr,
                            const at::TensorOptions& options) {
  using acc_t = at::opmath_type<scalar_t>;
  DstScratch d;
  int64_t slots = 0;
  d.sl = make_slice_list(rowptr, p.num_gathered, p.num_edges, gat_row_sum_slice_len(p.num_edges),
                         false, d.storage, options, slots);
  d.part = at::empty({slots * p.HD}, options.dtype(c10::CppTypeToScalarType<acc_t>::value));
  return d;
}

// One launch of a persistent attention_backward_rows_kernel instance.
template <typename Kernel, typename scalar_t, typename index_t>
void launch_backward_rows_kernel(Kernel kernel, const AttentionParams<scalar_t, index_t>& p,
                                 const SliceList& sl) {
  kernel<<<persistent_grid(kernel, p.num_rows, p.G, 0, kBackwardThreads), kBackwardThreads, 0,
           c10::cuda::getCurrentCUDAStream()>>>(p, sl);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The CSC pass of policy ScoreT for this head layout: with one vector per
// lane, heads of 8 lanes (4-byte types only: 2- and 8-byte vectors spill
// there) and of 4 lanes take the transposed pass of the policies that have
// one (backward_row_transposed for GAT, backward_row_transposed_dot for
// GATv2 and the transformer), the others backward_row.
template <template <typename, typename, int, int> class ScoreT, typename scalar_t,
          typename index_t, int V, int VPL>
void launch_backward_rows_pass(const AttentionParams<scalar_t, index_t>& p, const SliceList& sl) {
  using Score = ScoreT<scalar_t, index_t, V, VPL>;
  auto run = [&](auto kernel) { launch_backward_rows_kernel(kernel, p, sl); };
  constexpr bool kWide = sizeof(scalar_t) == 4;
  if constexpr (VPL == 1 && (Score::kScalar || Score::kTransposedDot)) {
    if (gat_transposed() && kWide && p.S == 8) {
      return run(attention_backward_rows_kernel<ScoreT, scalar_t, index_t, V, VPL, kWide ? 8 : 0>);
    }
    if (gat_transposed() && p.S == 4) {
      return run(attention_backward_rows_kernel<ScoreT, scalar_t, index_t, V, VPL, 4>);
    }
  }
  run(attention_backward_rows_kernel<ScoreT, scalar_t, index_t, V, VPL, 0>);
}

}  // namespace pyg_multihead_agg
