// Block size, loads in flight and lane layouts shared by every kernel, and the
// host helpers that size their launches.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

namespace pyg_multihead_agg {

constexpr int kThreads = 256;  // threads per block, unless a kernel says otherwise
// 16-byte gathers per lane per unrolled step: enough bytes in flight to cover
// the memory latency at the occupancy the gather kernels reach
// (docs/performance.md, "Loads in flight").
constexpr int kLoadsInFlight = 8;
// Minimum resident blocks per SM asked of ptxas for the gather kernels:
// caps their registers (2: 128 per thread) so that enough warps keep
// gathers in flight.
constexpr int kMinBlocks = 2;
constexpr int kMaxVPL = 4;  // vectors per lane before chunking the row

inline int next_pow2(int64_t n) {
  int p = 1;
  while (p < n && p < 32) p <<= 1;
  return p;
}

inline bool is_aligned(const void* ptr, size_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

// Lanes per row and vectors per lane for rows of `num_vec` vectors.
struct LaneConfig {
  int G, vpl, num_chunks;
};

inline LaneConfig lane_config(int64_t num_vec, bool allow_vpl2) {
  LaneConfig c;
  if (num_vec <= 32) {
    c.G = next_pow2(num_vec);
    c.vpl = 1;
  } else {
    c.G = 32;
    c.vpl = (allow_vpl2 && num_vec <= 64) ? 2 : kMaxVPL;
  }
  c.num_chunks = static_cast<int>((num_vec + c.G * c.vpl - 1) / (c.G * c.vpl));
  return c;
}

inline int num_sms() {
  int count = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount,
                                        c10::cuda::current_device()));
  return count;
}

// A kernel's resident blocks per SM on the current device with `threads`
// threads and `smem` bytes of dynamic shared memory, queried once per
// (kernel, device, threads, smem) and cached. The runtime's occupancy query
// reads the kernel's attributes, microseconds of host time, and every
// persistent launch sizes its grid with it: on the small graphs, whose steps
// the host bounds, each launch would pay it again. (A kernel's dynamic
// shared memory limit is raised, where it is, before its first query.)
template <typename Kernel>
int blocks_per_sm(Kernel kernel, int threads, size_t smem) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int, size_t>, int> cache;
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel),
                                   static_cast<int>(c10::cuda::current_device()), threads, smem);
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  int per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  cache.emplace(key, per_sm);
  return per_sm;
}

}  // namespace pyg_multihead_agg
