// The launcher of the per-head backward (launch_gat_backward_heads,
// launchers.cuh): gat_delta_kernel and gat_backward_kernel, compiled once.
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
#include "backward_heads_kernel.cuh"
#include "heuristics.cuh"
#include "launchers.cuh"
#include "params.cuh"

namespace pyg_multihead_agg {

template <typename scalar_t, typename index_t>
void launch_gat_backward_heads(AttentionParams<scalar_t, index_t> p, const scalar_t* out,
                               const HeadConfig& c, const at::TensorOptions& options) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kVec = vec_width<scalar_t>();
  auto stream = c10::cuda::getCurrentCUDAStream();
  const auto acc_options = options.dtype(c10::CppTypeToScalarType<acc_t>::value);
  p.G = c.G;
  p.num_chunks = 1;
  at::Tensor storage;
  const WorkList wl = make_work_list(p.ptr, p.num_rows, p.num_edges, false, storage, options);
  const at::Tensor delta = at::empty({p.num_gathered, p.H}, acc_options);
  const int64_t delta_items = p.num_gathered * p.H;
  const int delta_blocks = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>((delta_items + kThreads / p.G - 1) / (kThreads / p.G),
                           num_sms() * 32LL)));
  auto launch = [&](auto delta_kernel, auto kernel) {
    delta_kernel<<<delta_blocks, kThreads, 0, stream>>>(p, out, delta.data_ptr<acc_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    p.delta = delta.data_ptr<acc_t>();
    kernel<<<persistent_grid(kernel, p.num_rows * p.H, p.G), kThreads, 0, stream>>>(p, wl);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  if (c.vectorised) {
    VPL_SWITCH(c.vpl, kVPL, [&] {
      launch(gat_delta_kernel<scalar_t, index_t, kVec, kVPL>,
             gat_backward_kernel<scalar_t, index_t, kVec, kVPL>);
    });
  } else {
    launch(gat_delta_kernel<scalar_t, index_t, 1, kMaxVPL>,
           gat_backward_kernel<scalar_t, index_t, 1, kMaxVPL>);
  }
}

#define INSTANTIATE(scalar_t, index_t) \
  template void launch_gat_backward_heads<scalar_t, index_t>( \
      AttentionParams<scalar_t, index_t>, const scalar_t*, const HeadConfig&, const at::TensorOptions&);
FOR_EACH_FLOAT_AND_INDEX(INSTANTIATE)
#undef INSTANTIATE

}  // namespace pyg_multihead_agg
