// The launcher of the all-heads backward (launch_gat_backward_rows,
// launchers.cuh): gat_aux_kernel, gat_backward_rows_kernel and the slices'
// sums, compiled once.
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
#include "../utils/sum_slices.cuh"
#include "../utils/work_list.cuh"
#include "backward_rows_kernel.cuh"
#include "heuristics.cuh"
#include "launchers.cuh"
#include "params.cuh"

namespace pyg_multihead_agg {

template <typename scalar_t, typename index_t>
void launch_gat_backward_rows(GatParams<scalar_t, index_t> p, const scalar_t* out,
                              const RowConfig& rc, const at::TensorOptions& options) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kVec = vec_width<scalar_t>();
  auto stream = c10::cuda::getCurrentCUDAStream();
  const auto acc_options = options.dtype(c10::CppTypeToScalarType<acc_t>::value);
  p.G = rc.G;
  p.S = rc.S;
  p.log2S = rc.log2S;
  p.num_chunks = 1;
  at::Tensor storage;
  int64_t max_slots = 0;
  const SliceList sl = make_slice_list(p.ptr, p.num_rows, p.num_edges,
                                       gat_backward_slice_len<scalar_t>(p.num_edges), false,
                                       storage, options, max_slots);
  const at::Tensor aux = at::empty({p.num_gathered * p.H * 4}, acc_options);
  const at::Tensor part_x = at::empty({max_slots * p.HD}, acc_options);
  const at::Tensor part_src = at::empty({max_slots * p.H}, acc_options);
  p.aux = aux.data_ptr();
  p.part_x = part_x.data_ptr<acc_t>();
  p.part_src = part_src.data_ptr<acc_t>();
  const int aux_blocks = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>((p.num_gathered + kThreads / p.G - 1) / (kThreads / p.G),
                           num_sms() * 32LL)));
  VPL_SWITCH(rc.vpl, kVPL, [&] {
    gat_aux_kernel<scalar_t, index_t, kVec, kVPL><<<aux_blocks, kThreads, 0, stream>>>(
        p, out, static_cast<RowAux<acc_t>*>(aux.data_ptr()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    auto run = [&](auto kernel) {
      kernel<<<persistent_grid(kernel, p.num_rows, p.G, 0, kBackwardThreads), kBackwardThreads,
               0, stream>>>(p, sl);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    const bool transposed = kVPL == 1 && gat_transposed();
    // (kS = 8 only for float32: 2- and 8-byte types spill there.)
    constexpr bool kWide = sizeof(scalar_t) == 4;
    if (transposed && kWide && p.S == 8) {
      run(gat_backward_rows_kernel<scalar_t, index_t, kVec, kVPL, kVPL == 1 && kWide ? 8 : 0>);
    } else if (transposed && p.S == 4) {
      run(gat_backward_rows_kernel<scalar_t, index_t, kVec, kVPL, kVPL == 1 ? 4 : 0>);
    } else {
      run(gat_backward_rows_kernel<scalar_t, index_t, kVec, kVPL, 0>);
    }
  });
  // grad_x[j] and grad_s_src[j] of every sliced column j: its slices' sum
  launch_sum_slices(p.ptr, p.num_edges, sl, p.part_x, p.out, p.HD, p.part_src, p.grad_s_src,
                    p.H);
}

#define INSTANTIATE(scalar_t, index_t) \
  template void launch_gat_backward_rows<scalar_t, index_t>( \
      GatParams<scalar_t, index_t>, const scalar_t*, const RowConfig&, const at::TensorOptions&);
FOR_EACH_FLOAT_AND_INDEX(INSTANTIATE)
#undef INSTANTIATE

}  // namespace pyg_multihead_agg
