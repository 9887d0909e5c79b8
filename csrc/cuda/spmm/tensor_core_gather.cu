// The tensor-core forward's launcher (try_launch_tc_gather, launchers.cuh)
// and its kernels (tensor_core_gather.cuh), compiled once. Only 2-byte types
// have tensor-core kernels; the float32 and float64 instances return false.
#include <c10/core/TensorOptions.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstddef>
#include <cstdint>

#include "../utils/dispatch.cuh"
#include "../utils/config.cuh"
#include "heuristics.cuh"
#include "launchers.cuh"
#include "tensor_core_gather.cuh"
#include "tensor_core_launch.cuh"

namespace pyg_multihead_agg {

template <typename scalar_t, typename index_t>
bool try_launch_tc_gather(const GatherParams<scalar_t, index_t>& p, const WorkList& wl) {
  if constexpr (sizeof(scalar_t) != 2) {
    return false;
  } else {
    if (p.wperm != nullptr || p.HD != 128 || (p.H != 2 && p.H != 4 && p.H != 8)) return false;
    if (!is_aligned(p.x, 16) || !is_aligned(p.out, 16) || !is_aligned(p.weight, 2 * p.H))
      return false;
    if (!spmm_tensor_cores_forward(p.num_rows, p.num_edges)) return false;
    const TcGatherParams<scalar_t, index_t> t{p.ptr,      p.idx,      p.weight,   p.x,
                                             p.out,      p.num_rows, p.num_src,  p.num_edges};
    const bool staged = spmm_tc_staged(p.H);
    const size_t smem = staged ? static_cast<size_t>(kThreads / 32) * kTcStages * kTcStageBytes : 0;
    auto launch = [&](auto kernel) { return launch_tc(kernel, t, wl, smem); };
    switch (p.H) {
      case 2:
        return staged ? launch(tc_gather_staged_kernel<scalar_t, index_t, 2>)
                      : launch(tc_gather_kernel<scalar_t, index_t, 2>);
      case 4:
        return staged ? launch(tc_gather_staged_kernel<scalar_t, index_t, 4>)
                      : launch(tc_gather_kernel<scalar_t, index_t, 4>);
      default:
        return staged ? launch(tc_gather_staged_kernel<scalar_t, index_t, 8>)
                      : launch(tc_gather_kernel<scalar_t, index_t, 8>);
    }
  }
}

#define INSTANTIATE(scalar_t, index_t)                   \
  template bool try_launch_tc_gather<scalar_t, index_t>( \
      const GatherParams<scalar_t, index_t>&, const WorkList&);
FOR_EACH_FLOAT_AND_INDEX(INSTANTIATE)
#undef INSTANTIATE

}  // namespace pyg_multihead_agg
