// The atomic scatter of grad_x over the CSR (the backward without a CSC, when
// deterministic algorithms are off) and its launcher (launch_scatter,
// launchers.cuh).
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
// Atomic scatter: acc[col[e]] += weight[e] * grad_out[r] over the CSR (float32
// accumulation for half types). Not deterministic; the fallback used without
// a CSC when deterministic algorithms are off.
// ---------------------------------------------------------------------------

template <typename scalar_t, typename index_t>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    scatter_kernel(const index_t* __restrict__ rowptr, const index_t* __restrict__ col,
                   const scalar_t* __restrict__ weight, const scalar_t* __restrict__ grad_out,
                   at::opmath_type<scalar_t>* __restrict__ acc, int64_t num_rows,
                   int64_t num_src, int64_t num_edges, int H, int D, int G, WorkList wl) {
  using acc_t = at::opmath_type<scalar_t>;
  const int HD = H * D, lane = threadIdx.x & (G - 1);
  const int group = threadIdx.x / G, groups = kThreads / G;
  auto entries = [&](int64_t r, int64_t lo, int64_t hi) {
    for (int f = lane; f < HD; f += G) {
      const acc_t g = load_value(grad_out + r * HD + f);
      const int h = f / D;
      for (int64_t e = lo; e < hi; ++e) {
        const int64_t j = load_index(col + e);
        if (in_range(j, num_src)) atomicAdd(acc + j * HD + f, load_value(weight + e * H + h) * g);
      }
    }
  };
  auto short_entries = [&](int64_t, int64_t r, int64_t lo, int64_t hi) { entries(r, lo, hi); };
  auto long_row = [&](int64_t r, int64_t lo, int64_t hi) {
    int64_t slo, shi;
    group_slice(lo, hi, group, groups, slo, shi);
    entries(r, slo, shi);
  };
  for_each_work_item(rowptr, num_edges, wl, G, 1, short_entries, long_row);
}

}  // namespace

template <typename scalar_t, typename index_t>
void launch_scatter(const index_t* rowptr, const index_t* col, const scalar_t* weight,
                    const scalar_t* grad_out, at::opmath_type<scalar_t>* acc, int64_t num_rows,
                    int64_t num_src, int64_t num_edges, int H, int D,
                    const at::TensorOptions& options) {
  const int G = next_pow2(static_cast<int64_t>(H) * D);
  at::Tensor storage;
  const WorkList wl =
      make_work_list(rowptr, num_rows, num_edges, spmm_sort_fetch(), storage, options);
  auto kernel = scatter_kernel<scalar_t, index_t>;
  kernel<<<persistent_grid(kernel, num_rows, G), kThreads, 0,
           c10::cuda::getCurrentCUDAStream()>>>(rowptr, col, weight, grad_out, acc, num_rows,
                                                num_src, num_edges, H, D, G, wl);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

#define INSTANTIATE(scalar_t, index_t)                                                    \
  template void launch_scatter<scalar_t, index_t>(                                        \
      const index_t*, const index_t*, const scalar_t*, const scalar_t*,                   \
      at::opmath_type<scalar_t>*, int64_t, int64_t, int64_t, int, int, const at::TensorOptions&);
FOR_EACH_FLOAT_AND_INDEX(INSTANTIATE)
#undef INSTANTIATE

}  // namespace pyg_multihead_agg
