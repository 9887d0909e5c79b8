// The launchers of attention_rows_kernel (launch_gat_forward_rows,
// launch_gatv2_forward_rows and launch_transformer_forward_rows, declared in
// launchers.cuh). Included by the forward_rows_*.cu, gatv2_forward_*.cu and
// transformer_forward_*.cu files, each of which instantiates one of them for
// its dtypes.
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/TensorOptions.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>

#include "../utils/config.cuh"
#include "../utils/dispatch.cuh"
#include "../utils/work_list.cuh"
#include "forward_rows_kernel.cuh"
#include "heuristics.cuh"
#include "launchers.cuh"
#include "params.cuh"
#include "scores.cuh"

namespace pyg_multihead_agg {

// Every policy's launch: p's lane layout from rc, the work list, and the
// kernel for the head layout: heads of 8 or 4 lanes at one vector per lane
// take kS = S (each entry's scalar work in one lane of its head:
// attend_heads_transposed for GAT's two-pass rows, attend_heads_online_transposed
// for the other policies) unless force_kernel_path(transposed=0) says
// otherwise; onepass_min: GAT's rows of more entries take the online pass.
template <template <typename, typename, int, int> class ScoreT, typename scalar_t,
          typename index_t>
void launch_forward_rows(AttentionParams<scalar_t, index_t> p, const RowConfig& rc,
                         const at::TensorOptions& options, int64_t onepass_min) {
  constexpr int kVec = vec_width<scalar_t>();
  p.G = rc.G;
  p.S = rc.S;
  p.log2S = rc.log2S;
  p.num_chunks = 1;
  p.onepass_min = onepass_min;
  at::Tensor storage;
  // (the attention kernels never sort their fetches)
  const WorkList wl = make_work_list(p.ptr, p.num_rows, p.num_edges, false, storage, options);
  auto stream = c10::cuda::getCurrentCUDAStream();
  const bool transposed = gat_transposed();
  VPL_SWITCH(rc.vpl, kVPL, [&] {
    auto run = [&](auto kernel) {
      kernel<<<persistent_grid(kernel, p.num_rows, p.G), kThreads, 0, stream>>>(p, wl);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    constexpr bool kOne = kVPL == 1;
    if (transposed && kOne && p.S == 8) {
      run(attention_rows_kernel<ScoreT, scalar_t, index_t, kVec, kVPL, kOne ? 8 : 0>);
    } else if (transposed && kOne && p.S == 4) {
      run(attention_rows_kernel<ScoreT, scalar_t, index_t, kVec, kVPL, kOne ? 4 : 0>);
    } else {
      run(attention_rows_kernel<ScoreT, scalar_t, index_t, kVec, kVPL, 0>);
    }
  });
}

template <typename scalar_t, typename index_t>
void launch_gat_forward_rows(AttentionParams<scalar_t, index_t> p, const RowConfig& rc,
                             const at::TensorOptions& options) {
  launch_forward_rows<GatScore>(p, rc, options, gat_onepass_min());
}

// The policies whose score needs the gathered row (padded heads, the online
// pass for every row).
template <typename scalar_t, typename index_t>
void launch_gatv2_forward_rows(AttentionParams<scalar_t, index_t> p, const RowConfig& rc,
                               const at::TensorOptions& options) {
  launch_forward_rows<Gatv2Score>(p, rc, options, 0);
}

template <typename scalar_t, typename index_t>
void launch_transformer_forward_rows(AttentionParams<scalar_t, index_t> p, const RowConfig& rc,
                                     const at::TensorOptions& options) {
  launch_forward_rows<TransformerScore>(p, rc, options, 0);
}

}  // namespace pyg_multihead_agg
