// Host side of the tensor-core kernels: whether a kernel was built for
// sm_80 or newer, its occupancy (both cached per device), and its launch.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "../utils/config.cuh"

namespace pyg_multihead_agg {

// Whether a tensor-core kernel was compiled for sm_80 or newer (mma of
// 2-byte types): the host never launches it otherwise.
template <typename Kernel>
bool tc_kernel_built(Kernel kernel) {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.binaryVersion >= 80;
}

// Whether a tensor-core kernel can run on the current device, queried once
// per (kernel, device, dynamic shared memory) and cached: it was built for
// sm_80 or newer (tc_kernel_built), and its dynamic shared memory limit is
// raised to `smem` (before its occupancy, blocks_per_sm, is first asked),
// instead of runtime calls at every launch (cudaFuncGetAttributes alone:
// ~5.6 us under torch.profiler).
template <typename Kernel>
bool tc_kernel_ready(Kernel kernel, size_t smem) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, size_t>, bool> cache;
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel),
                                   static_cast<int>(c10::cuda::current_device()), smem);
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  const bool built = tc_kernel_built(kernel);
  if (built && smem > 0)
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  cache.emplace(key, built);
  return built;
}

// Launches a tensor-core kernel (tc_run's loop) over tiles of 8 rows, as many
// blocks as fit the SMs with `smem` bytes of dynamic shared memory; false
// when the kernel was not built for sm_80 or newer. `List`: the kernel's
// WorkList or SliceList.
template <typename Kernel, typename Params, typename List>
bool launch_tc(Kernel kernel, const Params& t, const List& wl, size_t smem) {
  if (!tc_kernel_ready(kernel, smem)) return false;
  const int per_sm = blocks_per_sm(kernel, kThreads, smem);
  const int64_t tiles = (t.num_rows + 7) / 8, warps = kThreads / 32;
  const int64_t blocks = std::max<int64_t>(
      1, std::min<int64_t>(static_cast<int64_t>(std::max(per_sm, 1)) * num_sms(),
                           (tiles + warps - 1) / warps));
  kernel<<<static_cast<int>(blocks), kThreads, smem, c10::cuda::getCurrentCUDAStream()>>>(t, wl);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

}  // namespace pyg_multihead_agg
