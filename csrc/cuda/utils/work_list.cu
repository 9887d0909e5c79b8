// The device-side builders of the work lists (work_list.cuh): one thread per
// row finds the long rows (and cuts them into slices), compiled once for both
// index types.
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>

#include "work_list.cuh"

namespace pyg_multihead_agg {
namespace {

template <typename index_t>
__global__ void __launch_bounds__(kThreads)
    find_long_rows_kernel(const index_t* __restrict__ ptr, int64_t num_rows, int64_t num_edges,
                          WorkList wl, int64_t* __restrict__ long_rows) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < num_rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t lo, hi;
    row_range(ptr, r, num_edges, lo, hi);
    // The list order varies from run to run, the per-row results do not.
    if (hi - lo > wl.long_threshold) long_rows[atomicAdd(&wl.counters[0], 1ull)] = r;
  }
}

template <typename index_t>
__global__ void __launch_bounds__(kThreads)
    find_sliced_rows_kernel(const index_t* __restrict__ ptr, int64_t num_edges, SliceList sl,
                            int64_t* __restrict__ long_rows, int64_t* __restrict__ long_base,
                            int64_t* __restrict__ slot_owner) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < sl.num_rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t lo, hi;
    row_range(ptr, r, num_edges, lo, hi);
    if (hi - lo <= sl.long_threshold) continue;
    const int64_t n = (hi - lo + sl.slice_len - 1) / sl.slice_len;
    const int64_t li = static_cast<int64_t>(atomicAdd(&sl.counters[0], 1ull));
    if (li >= sl.max_long) continue;  // malformed pointers only (see SliceList)
    const int64_t base =
        static_cast<int64_t>(atomicAdd(&sl.counters[1], static_cast<unsigned long long>(n)));
    long_rows[li] = r;
    long_base[li] = base;
    for (int64_t k = 0; k < n && base + k < sl.max_slots; ++k) slot_owner[base + k] = li;
  }
}

}  // namespace

template <typename index_t>
WorkList make_work_list(const index_t* ptr, int64_t num_rows, int64_t num_edges,
                        bool sort_fetch, at::Tensor& storage, const at::TensorOptions& options) {
  auto stream = c10::cuda::getCurrentCUDAStream();
  storage = at::empty({num_rows + 3}, options.dtype(at::kLong));
  WorkList wl;
  wl.counters = reinterpret_cast<unsigned long long*>(storage.data_ptr<int64_t>());
  wl.long_rows = storage.data_ptr<int64_t>() + 3;
  wl.num_rows = num_rows;
  wl.long_threshold = long_threshold(num_edges);
  wl.sort_fetch = sort_fetch;
  wl.forced_rounds = forced_fetch_rounds();
  C10_CUDA_CHECK(cudaMemsetAsync(wl.counters, 0, 3 * sizeof(unsigned long long), stream));
  const int blocks =
      static_cast<int>(std::min<int64_t>((num_rows + kThreads - 1) / kThreads, num_sms() * 8LL));
  if (blocks > 0) {
    find_long_rows_kernel<index_t><<<blocks, kThreads, 0, stream>>>(
        ptr, num_rows, num_edges, wl, storage.data_ptr<int64_t>() + 3);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return wl;
}

template <typename index_t>
SliceList make_slice_list(const index_t* ptr, int64_t num_rows, int64_t num_edges,
                          int64_t slice_len, bool sort_fetch, at::Tensor& storage,
                          const at::TensorOptions& options, int64_t& max_slots) {
  auto stream = c10::cuda::getCurrentCUDAStream();
  SliceList sl;
  sl.num_rows = num_rows;
  sl.long_threshold = slice_len;
  sl.slice_len = slice_len;
  sl.sort_fetch = sort_fetch;
  sl.forced_rounds = forced_fetch_rounds();
  const int64_t max_long = max_long_rows(sl, num_edges);
  max_slots = 2 * num_edges / sl.long_threshold + 1;
  sl.max_long = max_long;
  sl.max_slots = max_slots;
  storage = at::empty({4 + 2 * max_long + max_slots}, options.dtype(at::kLong));
  int64_t* base = storage.data_ptr<int64_t>();
  sl.counters = reinterpret_cast<unsigned long long*>(base);
  sl.long_rows = base + 4;
  sl.long_base = base + 4 + max_long;
  sl.slot_owner = base + 4 + 2 * max_long;
  C10_CUDA_CHECK(cudaMemsetAsync(sl.counters, 0, 4 * sizeof(unsigned long long), stream));
  const int blocks =
      static_cast<int>(std::min<int64_t>((num_rows + kThreads - 1) / kThreads, num_sms() * 8LL));
  if (blocks > 0) {
    find_sliced_rows_kernel<index_t><<<blocks, kThreads, 0, stream>>>(
        ptr, num_edges, sl, base + 4, base + 4 + max_long, base + 4 + 2 * max_long);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return sl;
}

template WorkList make_work_list<int32_t>(const int32_t*, int64_t, int64_t, bool, at::Tensor&,
                                          const at::TensorOptions&);
template WorkList make_work_list<int64_t>(const int64_t*, int64_t, int64_t, bool, at::Tensor&,
                                          const at::TensorOptions&);
template SliceList make_slice_list<int32_t>(const int32_t*, int64_t, int64_t, int64_t, bool,
                                            at::Tensor&, const at::TensorOptions&, int64_t&);
template SliceList make_slice_list<int64_t>(const int64_t*, int64_t, int64_t, int64_t, bool,
                                            at::Tensor&, const at::TensorOptions&, int64_t&);

}  // namespace pyg_multihead_agg
