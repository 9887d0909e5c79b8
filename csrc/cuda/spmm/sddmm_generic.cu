// The generic SDDMM (any D and alignment; the fallback of the dot-gather
// kernel) and its launcher (launch_sddmm_generic, launchers.cuh).
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "../utils/dispatch.cuh"
#include "../utils/config.cuh"
#include "../utils/index.cuh"
#include "../utils/lanes.cuh"
#include "../utils/vec.cuh"
#include "../utils/work_list.cuh"
#include "heuristics.cuh"
#include "launchers.cuh"

namespace pyg_multihead_agg {
namespace {

// ---------------------------------------------------------------------------
// Generic SDDMM, any D and alignment: dot_out[e, h] = <rowval[r, h], gathered[idx[k], h]>
// with e = perm ? perm[k] : k. Lanes stride over d within one head, a butterfly
// over the group per (entry, head). The fallback of the dot-gather kernel.
// ---------------------------------------------------------------------------

template <typename scalar_t, typename index_t>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    sddmm_generic_kernel(const DotParams<scalar_t, index_t> p, const WorkList wl) {
  using acc_t = at::opmath_type<scalar_t>;
  const int G = p.G, lane = threadIdx.x & (G - 1);
  const int group = threadIdx.x / G, groups = kThreads / G;
  const unsigned mask = group_mask(G);

  auto entries = [&](int64_t r, int64_t lo, int64_t hi) {
    const scalar_t* a = p.rowval + r * p.HD;
    for (int64_t k = lo; k < hi; ++k) {
      const int64_t src = load_index(p.idx + k);
      const int64_t e = p.perm != nullptr ? load_index(p.perm + k) : k;
      if (!in_range(e, p.num_edges)) continue;  // group-uniform
      const bool ok = in_range(src, p.num_gathered);
      const scalar_t* b = p.gathered + (ok ? src : 0) * p.HD;
      for (int h = 0; h < p.H; ++h) {
        acc_t dot = 0;
        if (ok)
          for (int d = lane; d < p.D; d += G)
            dot += load_value(a + h * p.D + d) * load_value(b + h * p.D + d);
        for (int off = G >> 1; off > 0; off >>= 1) dot += __shfl_xor_sync(mask, dot, off);
        if (lane == 0) p.dot_out[(p.dot_by_entry ? k : e) * p.H + h] = static_cast<scalar_t>(dot);
      }
    }
  };
  auto short_entries = [&](int64_t, int64_t r, int64_t lo, int64_t hi) { entries(r, lo, hi); };
  auto long_row = [&](int64_t r, int64_t lo, int64_t hi) {
    int64_t slo, shi;
    group_slice(lo, hi, group, groups, slo, shi);
    entries(r, slo, shi);
  };
  for_each_work_item(p.ptr, p.num_edges, wl, G, 1, short_entries, long_row);
}

}  // namespace

template <typename scalar_t, typename index_t>
void launch_sddmm_generic(DotParams<scalar_t, index_t> p, const at::TensorOptions& options) {
  p.G = next_pow2(p.D);
  p.S = p.G;
  p.num_chunks = 1;
  at::Tensor storage;
  const WorkList wl =
      make_work_list(p.ptr, p.num_rows, p.num_edges, spmm_sort_fetch(), storage, options);
  auto kernel = sddmm_generic_kernel<scalar_t, index_t>;
  kernel<<<persistent_grid(kernel, p.num_rows, p.G), kThreads, 0,
           c10::cuda::getCurrentCUDAStream()>>>(p, wl);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

#define INSTANTIATE(scalar_t, index_t)                   \
  template void launch_sddmm_generic<scalar_t, index_t>( \
      DotParams<scalar_t, index_t>, const at::TensorOptions&);
FOR_EACH_FLOAT_AND_INDEX(INSTANTIATE)
#undef INSTANTIATE

}  // namespace pyg_multihead_agg
