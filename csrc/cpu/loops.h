// The CPU kernels' skeleton (docs/multihead_spmm.md, "CPU kernels"): rows
// split across threads by work rather than by count, and the per-row vector
// arithmetic of a head's channels in the accumulation type.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../path_overrides.h"

// The kernels' row loops are lambdas marked CPU_KERNEL_INLINE, and so are the
// helpers below: each loop is compiled into its caller, once for the
// baseline ISA and, on x86-64, once more inside a function built for AVX2 and
// FMA, which parallel_rows calls where the processor has them (the vector
// width and fused multiply-adds: 16-24% faster gathers than SSE2 on the
// benchmark graphs; AVX-512 added nothing more).
#if defined(__GNUC__) || defined(__clang__)
#define CPU_KERNEL_INLINE inline __attribute__((always_inline))
#define CPU_KERNEL_INLINE_LAMBDA __attribute__((always_inline))
#if defined(__x86_64__)
#define CPU_KERNEL_AVX2 1
#endif
#else
#define CPU_KERNEL_INLINE inline
#define CPU_KERNEL_INLINE_LAMBDA
#endif

namespace pyg_multihead_agg {
namespace cpu {

#ifdef CPU_KERNEL_AVX2
inline bool has_avx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return avx2;
}

// fn(begin, end) with fn's (inlined) body compiled for AVX2 and FMA.
template <typename F>
__attribute__((target("avx2,fma"))) void run_avx2(F& fn, int64_t begin, int64_t end) {
  fn(begin, end);
}
#endif

// fn(begin, end) in the best ISA the processor has (or the one a test forces,
// path_overrides.h).
template <typename F>
void run_rows(F& fn, int64_t begin, int64_t end) {
#ifdef CPU_KERNEL_AVX2
  if (has_avx2() && path_override(KernelPath::kCpuAvx2) != 0) {
    run_avx2(fn, begin, end);
    return;
  }
#endif
  fn(begin, end);
}

// The first row i with ptr[i] + i >= cost: a row costs its entries plus one
// (its own loads and stores). Binary search; ptr is non-decreasing in a valid
// graph (the kernels check each row's range as they walk it).
template <typename index_t>
int64_t row_at_cost(const index_t* ptr, int64_t num_rows, int64_t cost) {
  int64_t lo = 0, hi = num_rows;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (static_cast<int64_t>(ptr[mid]) + mid < cost) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Calls fn(begin, end) (see run_rows) on consecutive ranges of rows of about
// equal cost, a few per thread, in parallel. Power-law graphs put most edges in few rows:
// splitting by row count (at::parallel_for's grain) left one thread with most
// of the work. Each range is a whole number of rows, so every output row is
// written by one thread, and the ranges partition [0, num_rows) whatever the
// pointer values, so a malformed pointer array is still checked row by row.
template <typename index_t, typename F>
void parallel_rows(const index_t* ptr, int64_t num_rows, F&& fn) {
  if (num_rows <= 0) return;
  constexpr int64_t kMinCost = 2048;  // entries (or rows) per range at least
  constexpr int64_t kRangesPerThread = 8;
  const int64_t total = std::max<int64_t>(static_cast<int64_t>(ptr[num_rows]), 0) + num_rows;
  const int64_t ranges = std::min<int64_t>(
      {num_rows, at::get_num_threads() * kRangesPerThread, std::max<int64_t>(1, total / kMinCost)});
  if (ranges <= 1 || at::in_parallel_region()) {
    run_rows(fn, 0, num_rows);
    return;
  }
  std::vector<int64_t> bounds(ranges + 1, num_rows);
  bounds[0] = 0;
  for (int64_t r = 1; r < ranges; ++r) {
    bounds[r] = std::clamp(row_at_cost(ptr, num_rows, total * r / ranges), bounds[r - 1],
                           num_rows);
  }
  at::parallel_for(0, ranges, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (bounds[r] < bounds[r + 1]) run_rows(fn, bounds[r], bounds[r + 1]);
    }
  });
}

// Asks for the cache lines of [p, p + bytes) ahead of their use. The kernels
// gather a whole source row per edge at a random address: fetching the rows
// of the next few edges while this one is summed keeps several rows in
// flight instead of waiting for each (docs/multihead_spmm.md, "CPU kernels").
CPU_KERNEL_INLINE void prefetch(const void* p, int64_t bytes) {
#if defined(__GNUC__) || defined(__clang__)
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 3);
#endif
}

// Edges ahead whose source rows are prefetched: 4 to 6 measured best on the
// benchmark graphs (2 too late, 8 and more evict rows still in use).
constexpr int64_t kPrefetchAhead = 4;

// Prefetches the `width` elements of the source row of entry e + kPrefetchAhead
// (of the index array idx, across row boundaries; out-of-range entries are
// skipped, the kernels report them when they reach them).
template <typename scalar_t, typename index_t>
CPU_KERNEL_INLINE void prefetch_source(const scalar_t* x, const index_t* idx, int64_t e,
                                    int64_t num_entries, int64_t num_rows, int64_t width) {
  if (e + kPrefetchAhead >= num_entries) return;
  const index_t j = idx[e + kPrefetchAhead];
  if (0 <= j && j < num_rows) {
    prefetch(x + static_cast<int64_t>(j) * width, width * static_cast<int64_t>(sizeof(scalar_t)));
  }
}

// a[0, n) += w * x[0, n), x in the input dtype, a and w in acc_t. Plain
// loops over restrict pointers, which the compiler vectorises for the
// machine's baseline ISA.
template <typename acc_t, typename scalar_t>
CPU_KERNEL_INLINE void axpy(acc_t* __restrict a, acc_t w, const scalar_t* __restrict x, int64_t n) {
  for (int64_t d = 0; d < n; ++d) a[d] += w * static_cast<acc_t>(x[d]);
}

// The same for the head widths the benchmarks and layers use most, with the
// width known to the compiler (fully unrolled and vectorised), in the dtypes
// whose speed matters on the CPU (float32, bfloat16); float16, float64 and
// other widths take the runtime loop. Each specialisation is compiled per
// index type and ISA: limiting them keeps the build short.
template <typename scalar_t, typename F>
void with_width(int64_t n, F&& fn) {
  if constexpr (std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, c10::BFloat16>) {
    switch (n) {
      case 8: fn(std::integral_constant<int64_t, 8>()); return;
      case 16: fn(std::integral_constant<int64_t, 16>()); return;
      case 32: fn(std::integral_constant<int64_t, 32>()); return;
      case 64: fn(std::integral_constant<int64_t, 64>()); return;
      default: break;
    }
  }
  fn(n);
}

// sum over [0, n) of a[d] * b[d] in acc_t, in a fixed order: kLanes partial
// sums (so that the compiler can vectorise without reassociating), then the
// lanes in order, then the tail. The result depends on n alone.
template <typename acc_t, typename scalar_t>
CPU_KERNEL_INLINE acc_t dot(const scalar_t* __restrict a, const scalar_t* __restrict b, int64_t n) {
  constexpr int kLanes = 8;
  acc_t lanes[kLanes] = {};
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      lanes[l] += static_cast<acc_t>(a[d + l]) * static_cast<acc_t>(b[d + l]);
    }
  }
  acc_t sum = 0;
  for (int l = 0; l < kLanes; ++l) sum += lanes[l];
  for (; d < n; ++d) sum += static_cast<acc_t>(a[d]) * static_cast<acc_t>(b[d]);
  return sum;
}

// out[0, n) = a[0, n) * scale (+ bias[0, n)), rounded once to the output dtype.
template <typename scalar_t, typename acc_t>
CPU_KERNEL_INLINE void store_row(scalar_t* __restrict out, const acc_t* __restrict a, acc_t scale,
                      const acc_t* __restrict bias, int64_t n) {
  if (bias == nullptr) {
    for (int64_t d = 0; d < n; ++d) out[d] = static_cast<scalar_t>(a[d] * scale);
  } else {
    for (int64_t d = 0; d < n; ++d) out[d] = static_cast<scalar_t>(a[d] * scale + bias[d]);
  }
}

}  // namespace cpu
}  // namespace pyg_multihead_agg
