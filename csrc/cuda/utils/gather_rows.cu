// gather_rows_kernel and its launcher (gather_rows.cuh), compiled once.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "config.cuh"
#include "gather_rows.cuh"
#include "index.cuh"

namespace pyg_multihead_agg {
namespace {

// ---------------------------------------------------------------------------
// Rows through an index: dst[e] = src[index[e]] for rows of `vpr` vectors of
// type vec_t (a whole [H] row in one 16-, 8-, 4- or 2-byte access for
// H * sizeof(scalar_t) = 16, 8, 4, 2 and aligned pointers), zero for an
// out-of-range index[e] (a malformed one cannot read out of bounds). Puts
// the backwards' CSC-ordered per-edge gradients into edge order (index =
// perm_inv): the spmm backward's grad_weight, the fused backward's
// grad_s_edge. The reads of src are random, the rest sequential.
// - The grid covers every access at once (kUnroll = 2 a thread), so those
//   in flight are one contiguous window of edges, as narrow as the device
//   allows: consecutive rows read the same columns' entries, which sit side
//   by side in the CSC (a hub column holds an entry of nearly every row), so
//   a narrow window hits L2 more (our reading, not profiled). Against at
//   most 16 blocks an SM striding over 4 rows a thread this took 3-10% off
//   the spmm backward with perm_inv on products- and reddit-like; more rows
//   a thread, or ld.global.cg reads, changed little (docs/performance.md,
//   "Gathers into edge order").
// - The sequential index and output go through L2 evict-first (ld/st .cs),
//   leaving more of it to the random reads: 0.3-0.7%.
// ---------------------------------------------------------------------------

template <typename vec_t, typename index_t, int kUnroll>
__global__ void __launch_bounds__(kThreads)
    gather_rows_kernel(const vec_t* __restrict__ src, const index_t* __restrict__ index,
                       vec_t* __restrict__ dst, int64_t num_rows, int vpr) {
  const int64_t n = num_rows * vpr;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads * kUnroll;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x;
       base < n; base += stride) {
    int64_t from[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t i = base + j * kThreads;
      const int64_t r = vpr == 1 ? i : i / vpr;
      const int64_t k = i < n ? static_cast<int64_t>(__ldcs(index + r)) : -1;
      from[j] = in_range(k, num_rows) ? k * vpr + (i - r * vpr) : -1;
    }
    vec_t v[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      v[j] = vec_t{};
      if (from[j] >= 0) v[j] = src[from[j]];
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j)
      if (base + j * kThreads < n) __stcs(dst + base + j * kThreads, v[j]);
  }
}

}  // namespace

// dst[e, :] = src[index[e], :] for contiguous [E, H] tensors of one dtype.
template <typename index_t>
void launch_gather_rows(const at::Tensor& src, const at::Tensor& index, at::Tensor& dst) {
  const int64_t E = dst.size(0), row_bytes = dst.size(1) * dst.element_size();
  if (E == 0 || row_bytes == 0) return;
  auto run = [&](auto vec) {
    using vec_t = decltype(vec);
    const int vpr = static_cast<int>(row_bytes / static_cast<int64_t>(sizeof(vec_t)));
    // A thread per kUnroll rows, every block launched at once (see above).
    constexpr int kUnroll = 2;
    const int64_t n = E * vpr, per_block = kThreads * static_cast<int64_t>(kUnroll);
    const int blocks = static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>((n + per_block - 1) / per_block, INT_MAX)));
    gather_rows_kernel<vec_t, index_t, kUnroll>
        <<<blocks, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
            static_cast<const vec_t*>(src.data_ptr()), index.data_ptr<index_t>(),
            static_cast<vec_t*>(dst.data_ptr()), E, vpr);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  // The widest access that divides a row and both pointers' alignment
  // (the backwards pass fresh [E, H] tensors; checked all the same).
  auto fits = [&](int64_t bytes) {
    return row_bytes % bytes == 0 && is_aligned(src.data_ptr(), bytes) &&
           is_aligned(dst.data_ptr(), bytes);
  };
  if (fits(16)) {
    run(uint4{});
  } else if (fits(8)) {
    run(uint2{});
  } else if (fits(4)) {
    run(uint32_t{});
  } else {
    run(uint16_t{});
  }
}

template void launch_gather_rows<int32_t>(const at::Tensor&, const at::Tensor&, at::Tensor&);
template void launch_gather_rows<int64_t>(const at::Tensor&, const at::Tensor&, at::Tensor&);

}  // namespace pyg_multihead_agg
