// The tensor-core backward's launcher (try_launch_tc_dot_gather,
// launchers.cuh) and its kernel (tensor_core_backward.cuh), compiled once.
// Only 2-byte types have tensor-core kernels; the float32 and float64
// instances return false.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstddef>
#include <cstdint>

#include "../utils/dispatch.cuh"
#include "../utils/config.cuh"
#include "../utils/sum_slices.cuh"
#include "../utils/work_list.cuh"
#include "heuristics.cuh"
#include "launchers.cuh"
#include "tensor_core_backward.cuh"
#include "tensor_core_launch.cuh"

namespace pyg_multihead_agg {
namespace {

// The tensor-core backward kernel for H = 2, 4 or 8 heads (H * D = 128).
template <typename scalar_t, typename index_t, bool kDots>
auto tc_dot_kernel_for(int H) {
  return H == 2   ? tc_dot_gather_kernel<scalar_t, index_t, 2, kDots>
         : H == 4 ? tc_dot_gather_kernel<scalar_t, index_t, 4, kDots>
                  : tc_dot_gather_kernel<scalar_t, index_t, 8, kDots>;
}

}  // namespace

template <typename scalar_t, typename index_t>
bool try_launch_tc_dot_gather(const DotParams<scalar_t, index_t>& p,
                              const at::TensorOptions& options) {
  if constexpr (sizeof(scalar_t) != 2) {
    return false;
  } else {
    const bool dots = p.dot_out != nullptr;
    if (!spmm_tensor_cores_backward()) return false;
    if (p.HD != 128 || (p.H != 2 && p.H != 4 && p.H != 8)) return false;
    if (p.perm == nullptr || p.weight == nullptr || p.acc_out == nullptr) return false;
    if (!is_aligned(p.gathered, 16) || !is_aligned(p.acc_out, 16) ||
        !is_aligned(p.weight, 2 * p.H))
      return false;
    if (dots && (p.rowval == nullptr || !is_aligned(p.rowval, 16) ||
                 !is_aligned(p.dot_out, 2 * p.H)))
      return false;
    TcDotParams<scalar_t, index_t> t{};
    t.ptr = p.ptr;
    t.idx = p.idx;
    t.weight = p.weight;
    t.x = p.gathered;
    t.out = p.acc_out;
    t.num_rows = p.num_rows;
    t.num_src = p.num_gathered;
    t.num_edges = p.num_edges;
    t.perm = p.perm;
    t.rowval = p.rowval;
    t.dot_out = p.dot_out;
    t.by_entry = p.dot_by_entry;
    auto kernel = dots ? tc_dot_kernel_for<scalar_t, index_t, true>(p.H)
                       : tc_dot_kernel_for<scalar_t, index_t, false>(p.H);
    const size_t smem = static_cast<size_t>(kThreads / 32) * kTcDotStages * kTcDotStageBytes;
    if (!tc_kernel_ready(kernel, smem)) return false;
    // Long rows in slices (SliceList), their partial grad_x rows summed by
    // sum_slices_kernel.
    at::Tensor storage;
    int64_t max_slots = 0;
    const SliceList sl = make_slice_list(p.ptr, p.num_rows, p.num_edges,
                                         spmm_slice_len(p.num_edges), spmm_sort_fetch(),
                                         storage, options, max_slots);
    const at::Tensor part = at::empty({max_slots * 128}, options.dtype(at::kFloat));
    t.part = part.data_ptr<float>();
    launch_tc(kernel, t, sl, smem);
    launch_sum_slices<scalar_t, index_t, float>(p.ptr, p.num_edges, sl, t.part, p.acc_out, 128,
                                                nullptr, nullptr, 0);
    return true;
  }
}

#define INSTANTIATE(scalar_t, index_t)                       \
  template bool try_launch_tc_dot_gather<scalar_t, index_t>( \
      const DotParams<scalar_t, index_t>&, const at::TensorOptions&);
FOR_EACH_FLOAT_AND_INDEX(INSTANTIATE)
#undef INSTANTIATE

}  // namespace pyg_multihead_agg
