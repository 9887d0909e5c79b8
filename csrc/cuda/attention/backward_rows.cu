// The launcher of GAT's all-heads backward (launch_gat_backward_rows,
// launchers.cuh): gat_aux_kernel, attention_backward_rows_kernel<GatScore>
// and the slices' sums, compiled once.
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
#include "backward_rows_launch.cuh"
#include "heuristics.cuh"
#include "launchers.cuh"
#include "params.cuh"

namespace pyg_multihead_agg {

template <typename scalar_t, typename index_t>
void launch_gat_backward_rows(AttentionParams<scalar_t, index_t> p, const scalar_t* out,
                              const RowConfig& rc, const at::TensorOptions& options) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kVec = vec_width<scalar_t>();
  const auto acc_options = options.dtype(c10::CppTypeToScalarType<acc_t>::value);
  const BackwardScratch b =
      prepare_backward_rows(p, out, rc, gat_backward_slice_len<scalar_t>(p.num_edges), options);
  const at::Tensor part_src = at::empty({b.max_slots * p.H}, acc_options);
  p.part_src = part_src.data_ptr<acc_t>();
  VPL_SWITCH(rc.vpl, kVPL, [&] {
    launch_backward_rows_pass<GatScore, scalar_t, index_t, kVec, kVPL>(p, b.sl);
  });
  // grad_x[j] and grad_s_src[j] of every sliced column j: its slices' sum
  launch_sum_slices(p.ptr, p.num_edges, b.sl, p.part_x, p.out, p.HD, p.part_src, p.grad_s_src,
                    p.H);
}

#define INSTANTIATE(scalar_t, index_t) \
  template void launch_gat_backward_rows<scalar_t, index_t>( \
      AttentionParams<scalar_t, index_t>, const scalar_t*, const RowConfig&, const at::TensorOptions&);
FOR_EACH_FLOAT_AND_INDEX(INSTANTIATE)
#undef INSTANTIATE

}  // namespace pyg_multihead_agg
