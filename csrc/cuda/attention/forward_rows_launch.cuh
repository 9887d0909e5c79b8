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

template <typename scalar_t, typename index_t>
void launch_gat_forward_rows(AttentionParams<scalar_t, index_t> p, const RowConfig& rc,
                             const at::TensorOptions& options) {
  constexpr int kVec = vec_width<scalar_t>();
  p.G = rc.G;
  p.S = rc.S;
  p.log2S = rc.log2S;
  p.num_chunks = 1;
  p.onepass_min = gat_onepass_min();
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
      run(attention_rows_kernel<GatScore, scalar_t, index_t, kVec, kVPL, kOne ? 8 : 0>);
    } else if (transposed && kOne && p.S == 4) {
      run(attention_rows_kernel<GatScore, scalar_t, index_t, kVec, kVPL, kOne ? 4 : 0>);
    } else {
      run(attention_rows_kernel<GatScore, scalar_t, index_t, kVec, kVPL, 0>);
    }
  });
}

// The policies whose score needs the gathered row (padded heads, the
// online pass for every row).
template <template <typename, typename, int, int> class ScoreT, typename scalar_t,
          typename index_t>
void launch_padded_forward_rows(AttentionParams<scalar_t, index_t> p, const RowConfig& rc,
                                const at::TensorOptions& options) {
  constexpr int kVec = vec_width<scalar_t>();
  p.G = rc.G;
  p.S = rc.S;
  p.log2S = rc.log2S;
  p.num_chunks = 1;
  p.onepass_min = 0;
  at::Tensor storage;
  const WorkList wl = make_work_list(p.ptr, p.num_rows, p.num_edges, false, storage, options);
  auto stream = c10::cuda::getCurrentCUDAStream();
  // heads of 4 or 8 lanes at one vector per lane: each entry's scalar work
  // in one lane (attend_heads_online_transposed)
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
void launch_gatv2_forward_rows(AttentionParams<scalar_t, index_t> p, const RowConfig& rc,
                               const at::TensorOptions& options) {
  launch_padded_forward_rows<Gatv2Score>(p, rc, options);
}

template <typename scalar_t, typename index_t>
void launch_transformer_forward_rows(AttentionParams<scalar_t, index_t> p, const RowConfig& rc,
                                     const at::TensorOptions& options) {
  launch_padded_forward_rows<TransformerScore>(p, rc, options);
}

}  // namespace pyg_multihead_agg
