// The launcher of gat_forward_kernel (launch_gat_forward_heads,
// launchers.cuh), compiled once.
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
#include "forward_heads_kernel.cuh"
#include "heuristics.cuh"
#include "launchers.cuh"
#include "params.cuh"

namespace pyg_multihead_agg {

template <typename scalar_t, typename index_t>
void launch_gat_forward_heads(AttentionParams<scalar_t, index_t> p, const HeadConfig& c,
                              const at::TensorOptions& options) {
  constexpr int kVec = vec_width<scalar_t>();
  p.G = c.G;
  p.num_chunks = c.num_chunks;
  at::Tensor storage;
  const WorkList wl = make_work_list(p.ptr, p.num_rows, p.num_edges, false, storage, options);
  auto stream = c10::cuda::getCurrentCUDAStream();
  auto launch = [&](auto kernel) {
    kernel<<<persistent_grid(kernel, p.num_rows * p.H, p.G), kThreads, 0, stream>>>(p, wl);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  if (c.vectorised) {
    VPL_SWITCH(c.vpl, kVPL, [&] { launch(gat_forward_kernel<scalar_t, index_t, kVec, kVPL>); });
  } else {
    launch(gat_forward_kernel<scalar_t, index_t, 1, kMaxVPL>);
  }
}

#define INSTANTIATE(scalar_t, index_t) \
  template void launch_gat_forward_heads<scalar_t, index_t>( \
      AttentionParams<scalar_t, index_t>, const HeadConfig&, const at::TensorOptions&);
FOR_EACH_FLOAT_AND_INDEX(INSTANTIATE)
#undef INSTANTIATE

}  // namespace pyg_multihead_agg
