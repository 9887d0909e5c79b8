// The launcher of dot_gather_kernel (try_launch_dot_gather, declared in
// launchers.cuh). Included by the dot_gather_*.cu files, each of which
// instantiates it for its dtypes.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/TensorOptions.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>

#include "../utils/config.cuh"
#include "../utils/dispatch.cuh"
#include "../utils/sum_slices.cuh"
#include "../utils/work_list.cuh"
#include "dot_gather_kernel.cuh"
#include "heuristics.cuh"
#include "launchers.cuh"
#include "params.cuh"

namespace pyg_multihead_agg {

template <typename scalar_t, typename index_t>
bool try_launch_dot_gather(DotParams<scalar_t, index_t> p, const at::TensorOptions& options) {
  constexpr int kVec = vec_width<scalar_t>();
  if (p.D % kVec != 0 || !is_aligned(p.rowval, 16) || !is_aligned(p.gathered, 16) ||
      (p.acc_out != nullptr && !is_aligned(p.acc_out, 16)))
    return false;
  const int vec_per_head = p.D / kVec;
  if ((vec_per_head & (vec_per_head - 1)) != 0) return false;
  const auto c = lane_config(p.HD / kVec, true);
  if (c.num_chunks > 1 && vec_per_head > c.G * c.vpl) return false;
  using acc_t = at::opmath_type<scalar_t>;
  p.G = c.G;
  p.S = std::min(vec_per_head, c.G);
  p.num_chunks = c.num_chunks;
  at::Tensor storage, part;
  int64_t max_slots = 0;
  const SliceList sl = make_slice_list(p.ptr, p.num_rows, p.num_edges,
                                       spmm_slice_len(p.num_edges), spmm_sort_fetch(), storage,
                                       options, max_slots);
  const bool with_weight = p.weight != nullptr;
  if (with_weight) {
    part = at::empty({max_slots * p.HD}, options.dtype(c10::CppTypeToScalarType<acc_t>::value));
    p.part = part.data_ptr<acc_t>();
  }
  auto stream = c10::cuda::getCurrentCUDAStream();
  const bool transposed = c.num_chunks == 1 && spmm_transposed();
  VPL_SWITCH(c.vpl, kVPL, [&] {
    auto run = [&](auto kernel) {
      kernel<<<persistent_grid(kernel, p.num_rows, p.G, 0, kDotThreads), kDotThreads, 0,
               stream>>>(p, sl);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    // kS = 8 only for float32 (as in the attention backward): 2- and 8-byte
    // types spill there.
    constexpr bool kOne = kVPL == 1, kWide = kOne && sizeof(scalar_t) == 4;
    if (transposed && kWide && p.S == 8) {
      run(dot_gather_kernel<scalar_t, index_t, kVec, kVPL, kWide ? 8 : 0>);
    } else if (transposed && kOne && p.S == 4) {
      run(dot_gather_kernel<scalar_t, index_t, kVec, kVPL, kOne ? 4 : 0>);
    } else {
      run(dot_gather_kernel<scalar_t, index_t, kVec, kVPL, 0>);
    }
  });
  if (with_weight)
    launch_sum_slices<scalar_t, index_t, acc_t>(p.ptr, p.num_edges, sl, p.part, p.acc_out, p.HD,
                                                nullptr, nullptr, 0);
  return true;
}

}  // namespace pyg_multihead_agg
