// The launcher of gather_kernel (launch_gather, declared in launchers.cuh):
// picks the tensor-core forward or one of gather_kernel's variants. Included
// by the gather_*.cu files, each of which instantiates it for its dtypes.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <type_traits>

#include "../utils/config.cuh"
#include "../utils/dispatch.cuh"
#include "../utils/work_list.cuh"
#include "gather_kernel.cuh"
#include "heuristics.cuh"
#include "launchers.cuh"
#include "params.cuh"

namespace pyg_multihead_agg {

template <typename scalar_t, typename index_t>
void launch_gather(GatherParams<scalar_t, index_t> p, const at::TensorOptions& options) {
  constexpr int kVec = vec_width<scalar_t>();
  const bool vectorised = p.D % kVec == 0 && is_aligned(p.x, 16) && is_aligned(p.out, 16);
  const auto c = lane_config(vectorised ? p.HD / kVec : p.HD, vectorised);
  p.G = c.G;
  p.num_chunks = c.num_chunks;
  p.split = spmm_split_rows(c, p.num_rows, p.num_edges);
  at::Tensor storage;
  const WorkList wl =
      make_work_list(p.ptr, p.num_rows, p.num_edges, spmm_sort_fetch(), storage, options);
  if (try_launch_tc_gather(p, wl)) return;
  auto stream = c10::cuda::getCurrentCUDAStream();
  auto launch = [&](auto kernel) {
    kernel<<<persistent_grid(kernel, p.num_rows, p.split ? 32 : p.G), kThreads, 0, stream>>>(
        p, wl);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  if (vectorised) {
    // Heads of 4 or 8 lanes, one vector per lane, one chunk: the transposed
    // weight loads when spmm_transposed() takes them.
    const int head_lanes = p.D / kVec;
    const bool transposed = c.vpl == 1 && c.num_chunks == 1 && head_lanes <= c.G &&
                            (head_lanes == 4 || head_lanes == 8) && spmm_transposed();
    // Fetches sorted by degree (FetchOrder) when a warp runs several rows.
    const bool sort = kSortFetch<scalar_t> && wl.sort_fetch && !p.split && c.G < 32;
    VPL_SWITCH(c.vpl, kVPL, [&] {
      constexpr bool kOne = kVPL == 1, kSortable = kOne && kSortFetch<scalar_t>;
      // kS = 4 or 8 lanes a head; the sorting instance only where it can sort
      auto launch_transposed = [&](auto heads) {
        constexpr int kS = kOne ? decltype(heads)::value : 0;
        if (kSortable && sort) {
          launch(gather_kernel<scalar_t, index_t, kVec, kVPL, kS, kSortable>);
        } else {
          launch(gather_kernel<scalar_t, index_t, kVec, kVPL, kS>);
        }
      };
      if (transposed && head_lanes == 8) {
        launch_transposed(std::integral_constant<int, 8>{});
      } else if (transposed) {
        launch_transposed(std::integral_constant<int, 4>{});
      } else {
        launch(gather_kernel<scalar_t, index_t, kVec, kVPL, 0>);
      }
    });
  } else if (c.vpl == 1) {
    launch(gather_kernel<scalar_t, index_t, 1, 1, 0>);
  } else {
    launch(gather_kernel<scalar_t, index_t, 1, kMaxVPL, 0>);
  }
}

}  // namespace pyg_multihead_agg
