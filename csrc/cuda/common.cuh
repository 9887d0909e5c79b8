// Device and host building blocks shared by the CUDA kernels
// (multihead_spmm.cu, gat_attention.cu): 16-byte vector loads, the lane map of
// a row's features, and the persistent work loop with its long-row list.
// Design notes: benchmarks/KERNEL_NOTES.md.
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <type_traits>

namespace pyg_multihead_agg {
namespace {

constexpr int kThreads = 256;       // threads per block, every kernel
#ifndef PMA_LOADS_IN_FLIGHT
#define PMA_LOADS_IN_FLIGHT 8
#endif
#ifndef PMA_MIN_BLOCKS
#define PMA_MIN_BLOCKS 2
#endif
constexpr int kLoadsInFlight = PMA_LOADS_IN_FLIGHT;  // 16-byte gathers per lane per unrolled step
// Minimum resident blocks per SM asked of ptxas for the gather kernels:
// caps their registers (2: 128 per thread) so that enough warps keep
// gathers in flight.
constexpr int kMinBlocks = PMA_MIN_BLOCKS;
constexpr int kMaxVPL = 4;          // vectors per lane before chunking the row
// ---------------------------------------------------------------------------
// Device helpers
// ---------------------------------------------------------------------------

template <int kBytes>
struct RawType;
template <>
struct RawType<16> { using type = uint4; };
template <>
struct RawType<8> { using type = uint2; };
template <>
struct RawType<4> { using type = unsigned int; };
template <>
struct RawType<2> { using type = unsigned short; };

template <typename scalar_t, int V>
struct alignas(sizeof(scalar_t) * V) Vec {
  scalar_t val[V];
};

// The V elements of a vector in the accumulation type. bfloat16 pairs are
// widened from their 32-bit word: the low element is the word shifted left by
// 16, the high one the word with its low half cleared (one instruction each,
// exact). Element-wise static_cast<float> of c10::BFloat16 first moves the
// high half down (PRMT) and then shifts it back: 32 more instructions per
// 8-entry step of a bf16 gather (SASS, session 9).
template <typename scalar_t, int V>
__device__ __forceinline__ void widen(const Vec<scalar_t, V>& x,
                                      at::opmath_type<scalar_t> (&out)[V]) {
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16> && V % 2 == 0) {
#pragma unroll
    for (int i = 0; i < V / 2; ++i) {
      uint32_t word;
      memcpy(&word, &x.val[2 * i], sizeof(word));
      out[2 * i] = __uint_as_float(word << 16);
      out[2 * i + 1] = __uint_as_float(word & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) out[v] = static_cast<at::opmath_type<scalar_t>>(x.val[v]);
  }
}

// acc[v] += w * x[v] in the accumulation type, element order.
template <typename scalar_t, int V>
__device__ __forceinline__ void axpy_vec(at::opmath_type<scalar_t> (&acc)[V],
                                         at::opmath_type<scalar_t> w, const Vec<scalar_t, V>& x) {
  at::opmath_type<scalar_t> xw[V];
  widen(x, xw);
#pragma unroll
  for (int v = 0; v < V; ++v) acc[v] += w * xw[v];
}

// d += <a, b - c> over one lane's vector, element by element in the
// accumulation type (the difference too); <a, b> without c. b - 0 = b
// exactly, so with c all zeros this is <a, b> bit for bit.
template <typename scalar_t, int V>
__device__ __forceinline__ void dot_acc(at::opmath_type<scalar_t>& d, const Vec<scalar_t, V>& a,
                                        const Vec<scalar_t, V>& b,
                                        const Vec<scalar_t, V>* c = nullptr) {
  using acc_t = at::opmath_type<scalar_t>;
  acc_t aw[V], bw[V];
  widen(a, aw);
  widen(b, bw);
  if (c != nullptr) {
    acc_t cw[V];
    widen(*c, cw);
#pragma unroll
    for (int v = 0; v < V; ++v) bw[v] -= cw[v];
  }
#pragma unroll
  for (int v = 0; v < V; ++v) d += aw[v] * bw[v];
}

// <a, b - c> (or <a, b>) of one lane's vector, from 0 (dot_acc).
template <typename scalar_t, int V>
__device__ __forceinline__ at::opmath_type<scalar_t> vec_dot(const Vec<scalar_t, V>& a,
                                                             const Vec<scalar_t, V>& b,
                                                             const Vec<scalar_t, V>* c = nullptr) {
  at::opmath_type<scalar_t> d = 0;
  dot_acc(d, a, b, c);
  return d;
}

// One V-element vector through the read-only path (ld.global.nc).
template <typename scalar_t, int V>
__device__ __forceinline__ Vec<scalar_t, V> load_vec(const scalar_t* p) {
  using raw_t = typename RawType<sizeof(scalar_t) * V>::type;
  Vec<scalar_t, V> v;
  *reinterpret_cast<raw_t*>(&v) = __ldg(reinterpret_cast<const raw_t*>(p));
  return v;
}

template <typename scalar_t, int V>
__device__ __forceinline__ Vec<scalar_t, V> zero_vec() {
  using raw_t = typename RawType<sizeof(scalar_t) * V>::type;
  Vec<scalar_t, V> v;
  *reinterpret_cast<raw_t*>(&v) = raw_t{};
  return v;
}

template <typename scalar_t>
__device__ __forceinline__ at::opmath_type<scalar_t> load_value(const scalar_t* p) {
  return static_cast<at::opmath_type<scalar_t>>(load_vec<scalar_t, 1>(p).val[0]);
}

// Predicated loads: `pred ? *p : 0` as one predicated ld.global.nc (inline
// PTX), with no branch. Written as `pred ? load_vec(p) : zero_vec()`, nvcc
// turns each load of an unrolled step into a branch of its own and, for half
// types, moves the bf16/fp16 -> float unpacking of the loaded vector into
// that branch, right behind the load: the step's U gathers then wait for one
// another (SASS of the session-4 bf16 gather: one 16-byte load in flight per
// lane instead of 8, i.e. 1/3 of the float32 kernel's bandwidth). `p` need
// not point to valid memory when `pred` is false.
template <int kBytes>
struct RawLoad;
template <>
struct RawLoad<16> {
  static __device__ __forceinline__ uint4 load(bool pred, const void* p) {
    uint4 v;
    asm volatile(
        "{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n"
        " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
        " @q ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "r"(static_cast<int>(pred)));
    return v;
  }
};
template <>
struct RawLoad<8> {
  static __device__ __forceinline__ uint2 load(bool pred, const void* p) {
    uint2 v;
    asm volatile(
        "{\n .reg .pred q;\n setp.ne.b32 q, %3, 0;\n"
        " mov.b32 %0, 0;\n mov.b32 %1, 0;\n"
        " @q ld.global.nc.v2.u32 {%0, %1}, [%2];\n}\n"
        : "=r"(v.x), "=r"(v.y)
        : "l"(p), "r"(static_cast<int>(pred)));
    return v;
  }
};
template <>
struct RawLoad<4> {
  static __device__ __forceinline__ unsigned int load(bool pred, const void* p) {
    unsigned int v;
    asm volatile(
        "{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n"
        " mov.b32 %0, 0;\n"
        " @q ld.global.nc.u32 %0, [%1];\n}\n"
        : "=r"(v)
        : "l"(p), "r"(static_cast<int>(pred)));
    return v;
  }
};
template <>
struct RawLoad<2> {
  static __device__ __forceinline__ unsigned short load(bool pred, const void* p) {
    unsigned short v;
    asm volatile(
        "{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n"
        " mov.b16 %0, 0;\n"
        " @q ld.global.nc.u16 %0, [%1];\n}\n"
        : "=h"(v)
        : "l"(p), "r"(static_cast<int>(pred)));
    return v;
  }
};

template <typename scalar_t, int V>
__device__ __forceinline__ Vec<scalar_t, V> load_vec_if(bool pred, const scalar_t* p) {
  using raw_t = typename RawType<sizeof(scalar_t) * V>::type;
  Vec<scalar_t, V> v;
  *reinterpret_cast<raw_t*>(&v) = RawLoad<sizeof(scalar_t) * V>::load(pred, p);
  return v;
}

template <typename scalar_t>
__device__ __forceinline__ at::opmath_type<scalar_t> load_value_if(bool pred, const scalar_t* p) {
  return static_cast<at::opmath_type<scalar_t>>(load_vec_if<scalar_t, 1>(pred, p).val[0]);
}

// An index (int32 or int64) when `pred`, else 0, as one predicated load.
// Written as `pred ? __ldg(p) : -1`, the U index loads of a step became
// if-converted loads into one register, each waiting for the previous
// entry's use (SASS of the session-4 one-pass forward): U round trips of
// latency per step instead of one.
template <typename index_t>
__device__ __forceinline__ index_t load_index_if(bool pred, const index_t* p) {
  static_assert(sizeof(index_t) == 4 || sizeof(index_t) == 8, "32- or 64-bit indices");
  const auto raw = RawLoad<sizeof(index_t)>::load(pred, p);
  index_t v;
  memcpy(&v, &raw, sizeof(index_t));
  return v;
}

// The transposing butterfly of the per-entry dot products (gat_attention.cu's
// backward_row_transposed, multihead_spmm.cu's dot_entries_transposed): d[u]
// holds this lane's partial dot of entry u, and a head spans kS lanes (q = the
// lane's index within them). Round OFF (kS / 2, ..., 1), within each block of
// kS slots: the first 2 * OFF slots are live, and the pairs (u, u + OFF) of
// the first OFF are reduced, the lane with bit OFF of q set keeping entry
// u + OFF (and sending u), its partner the reverse; slot u then holds the
// pair's sum. After all rounds slot b * kS holds the whole dot of entry
// b * kS + q: 7 shuffles for 8 entries over 8 lanes instead of 24 for 8
// butterflies, each lane left with its own entries. Each sum adds the same
// pairs as a butterfly xor-ing OFF = kS / 2, ..., 1, so the dots are bitwise
// those of one.
template <int OFF, int kS, int U, typename acc_t>
__device__ __forceinline__ void transpose_round(acc_t (&d)[U], int q, unsigned mask) {
  const bool hi = (q & OFF) != 0;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (u % kS >= OFF) continue;  // compile-time
    const acc_t send = hi ? d[u] : d[u + OFF];
    const acc_t keep = hi ? d[u + OFF] : d[u];
    d[u] = keep + __shfl_xor_sync(mask, send, OFF);
  }
}

// A tuning switch read from the environment (benchmarks and tests of both
// sides of a choice): unset or empty gives `fallback`; otherwise it must be a
// decimal integer >= 0 and, when `allowed` is not empty, one of those values,
// else a RuntimeError naming the variable. Never silently ignored.
inline int64_t env_int(const char* name, int64_t fallback,
                       std::initializer_list<int64_t> allowed = {}) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(env, &end, 10);
  bool ok = end != env && *end == '\0' && errno == 0 && v >= 0;
  if (ok && allowed.size() > 0)
    ok = std::find(allowed.begin(), allowed.end(), static_cast<int64_t>(v)) != allowed.end();
  if (!ok) {
    std::string expected;
    if (allowed.size() == 0) {
      expected = "a non-negative integer";
    } else {
      for (size_t k = 0; k < allowed.size(); ++k) {
        if (k > 0) expected += k + 1 == allowed.size() ? " or " : ", ";
        expected += std::to_string(allowed.begin()[k]);
      }
    }
    TORCH_CHECK(false, name, " must be ", expected, ", got '", env, "'");
  }
  return static_cast<int64_t>(v);
}

// Whether the kernels with heads of 4 or 8 lanes (the backward kernels, the
// SDDMM, the fused forward's second pass) take their transposed variants,
// one entry's scalar work per lane (the default), or do that work in every
// lane of the head: PYG_MULTIHEAD_AGG_TRANSPOSED=0 / 1, for benchmarks and
// tests of both.
inline bool transposed_dots() { return env_int("PYG_MULTIHEAD_AGG_TRANSPOSED", 1, {0, 1}) == 1; }

// A store of an output the kernel writes once and never reads back: through
// L2 evict-first (st.global.cs), leaving more of it to the gathered rows.
// Session 20, call 2 (H200, against plain stores, two runs each): float32
// arxiv-like spmm forward -1.0%, its backward with perm_inv -1.2%,
// reddit-like's -1.1%; every other kernel and shape within -0.9..+0.3%.
// The outputs of every forward and backward kernel, the slices' partial
// rows and the dots by CSC entry go through here.
template <typename T>
__device__ __forceinline__ void store_once(T* p, const T& v) {
  if constexpr (sizeof(T) == 16 && alignof(T) == 16) {
    __stcs(reinterpret_cast<uint4*>(p), *reinterpret_cast<const uint4*>(&v));
  } else if constexpr (sizeof(T) == 8 && alignof(T) == 8) {
    __stcs(reinterpret_cast<uint2*>(p), *reinterpret_cast<const uint2*>(&v));
  } else if constexpr (sizeof(T) == 4 && alignof(T) == 4) {
    __stcs(reinterpret_cast<unsigned int*>(p), *reinterpret_cast<const unsigned int*>(&v));
  } else if constexpr (sizeof(T) == 2 && alignof(T) == 2) {
    __stcs(reinterpret_cast<unsigned short*>(p), *reinterpret_cast<const unsigned short*>(&v));
  } else {
    *p = v;
  }
}

template <typename scalar_t, int V, typename acc_t>
__device__ __forceinline__ void store_vec(scalar_t* p, const acc_t (&a)[V]) {
  Vec<scalar_t, V> v;
#pragma unroll
  for (int i = 0; i < V; ++i) v.val[i] = static_cast<scalar_t>(a[i]);
  store_once(reinterpret_cast<Vec<scalar_t, V>*>(p), v);
}

template <typename index_t>
__device__ __forceinline__ int64_t load_index(const index_t* p) {
  return static_cast<int64_t>(__ldg(p));
}

// [lo, hi) of compressed row r, clamped to [0, num_edges] and empty when the
// pointer decreases: malformed pointers cannot send a kernel out of bounds.
template <typename index_t>
__device__ __forceinline__ void row_range(const index_t* ptr, int64_t r, int64_t num_edges,
                                          int64_t& lo, int64_t& hi) {
  const int64_t a = load_index(ptr + r), b = load_index(ptr + r + 1);
  lo = a < 0 ? 0 : (a > num_edges ? num_edges : a);
  hi = b < lo ? lo : (b > num_edges ? num_edges : b);
}

__device__ __forceinline__ bool in_range(int64_t v, int64_t bound) {
  return static_cast<uint64_t>(v) < static_cast<uint64_t>(bound);
}

// The hot loops' index arithmetic in the index's own width. With int64 math
// on 32-bit indices, a step of the float32 spmm backward (8 entries) spent
// 71 ISETP and 65 IMAD of its 399 instructions on 64-bit compares (two per
// `k < hi` and per range check), sign extensions and 64-bit row products
// (session 8, scripts/sass_loop.py).
//
// IndexBound: `v < bound` as one unsigned compare of the index's width; for
// 32-bit indices the bound is clamped to 2^31 (every non-negative int32 is
// then below it, and a negative one, as unsigned, is not).
template <typename index_t>
struct IndexBound {
  using uint_t = std::conditional_t<sizeof(index_t) == 4, uint32_t, uint64_t>;
  uint_t bound;
  __device__ __forceinline__ explicit IndexBound(int64_t n)
      : bound(sizeof(index_t) == 4 ? static_cast<uint_t>(n < 0 ? 0 : (n > INT32_MAX ? 0x80000000LL : n))
                                   : static_cast<uint_t>(n < 0 ? 0 : n)) {}
  __device__ __forceinline__ bool operator()(index_t v) const {
    return static_cast<uint_t>(v) < bound;
  }
};

// base + i * width for a row index i of the index type. For 32-bit indices
// one IMAD.WIDE (`mad.wide.s32` on the row's byte width): written in C++,
// nvcc lost the sign extension of `width` and emitted a 64-bit product, 7
// instructions per address. Needs width * sizeof(T) < 2^31, which holds for
// the one-chunk rows of the transposed kernels that use it (H * D <= 256).
template <typename T, typename index_t>
__device__ __forceinline__ T* row_at(T* base, index_t i, int width) {
  if constexpr (sizeof(index_t) == 4) {
    uint64_t addr;
    asm("mad.wide.s32 %0, %1, %2, %3;"
        : "=l"(addr)
        : "r"(static_cast<int32_t>(i)), "r"(width * static_cast<int>(sizeof(T))),
          "l"(reinterpret_cast<uint64_t>(base)));
    return reinterpret_cast<T*>(addr);
  } else {
    return base + static_cast<int64_t>(i) * width;
  }
}

// The offset type of a row's entries: hi - lo < 2^31 when indices are 32-bit
// (the pointers are), so the step loop counts in int and its `k < left`
// tests are single 32-bit compares.
template <typename index_t>
using EntryOffset = std::conditional_t<sizeof(index_t) == 4, int, int64_t>;

// One step's indices in the transposed kernels, at entry offset k0 of a row
// of n entries from lo: the gathered rows i[u] of all U entries (every lane
// loads them) and, for this lane's own entries k = s * kS + q (s < kSlots),
// their gathered row iq[s] (kOwnRow) and edge id eq[s] (perm[k], or the
// entry's own position without perm; kPermGiven: perm is never null, which
// saves a select per slot). Entries at or past n load nothing (0). One
// predicated load each, no branch (see load_index_if).
template <int U, int kS, bool kOwnRow, typename index_t>
struct StepIndices {
  static constexpr int kSlots = U / kS;
  index_t i[U], iq[kOwnRow ? kSlots : 1], eq[kSlots];

  template <bool kPermGiven = false>
  __device__ __forceinline__ void load(const index_t* idx, const index_t* perm, int64_t lo,
                                       EntryOffset<index_t> k0, EntryOffset<index_t> n, int q) {
    const EntryOffset<index_t> rest = n - k0;
    const index_t* row_idx = idx + lo + k0;
#pragma unroll
    for (int u = 0; u < U; ++u) i[u] = load_index_if(u < rest, row_idx + u);
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int k = s * kS + q;
      if constexpr (kOwnRow) iq[s] = load_index_if(k < rest, row_idx + k);
      if constexpr (kPermGiven) {
        eq[s] = load_index_if(k < rest, perm + lo + k0 + k);
      } else {
        const index_t pe = load_index_if(k < rest && perm != nullptr, perm + lo + k0 + k);
        eq[s] = perm != nullptr ? pe : static_cast<index_t>(lo + k0 + k);
      }
    }
  }
};

// Mask of the G lanes of this thread's group, for the shuffles of one group
// while other groups of the warp run other rows.
__device__ __forceinline__ unsigned group_mask(int G) {
  if (G == 32) return 0xffffffffu;
  const int lane = threadIdx.x & 31;
  return ((1u << G) - 1u) << (lane & ~(G - 1));
}

// Which vectors of a row this lane owns in one feature chunk (see the top).
template <int VPL>
struct LaneMap {
  int feat[VPL];   // first feature of the vector within the row
  int head[VPL];   // its head (>= H for the padding vectors of the last chunk)
  bool valid[VPL];
};

template <int V, int VPL>
__device__ __forceinline__ LaneMap<VPL> lane_map(int chunk, int lane, int G, int D, int HD) {
  LaneMap<VPL> m;
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    const int v = chunk * G * VPL + lane + G * k;
    m.feat[k] = v * V;
    m.head[k] = v * V / D;
    m.valid[k] = v * V < HD;
  }
  return m;
}

// ---------------------------------------------------------------------------
// Work list: long rows first (block-wide), then tiles of short rows
// ---------------------------------------------------------------------------

struct WorkList {
  const int64_t* long_rows;      // filled by find_long_rows_kernel
  unsigned long long* counters;  // [0]: long rows found, [1]: next long row, [2]: next short item
  int64_t num_rows;
  int64_t long_threshold;        // rows with more edges than this are long
  bool sort_fetch;               // sort a fetch's short rows by degree (FetchOrder)
};

// Short items a warp takes per atomic: fewer atomics on one counter against
// a coarser tail at the end of the grid.
constexpr int kFetchRounds = 8;

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

// Which item of a warp's fetch each group takes, round by round.
//
// When a warp holds several groups (G < 32), its groups run their items side
// by side, and every round lasts as long as the longest of its items: a bf16
// row of 4 x 32 features is 16 lanes, and a warp whose two rows have 1 and 3
// steps runs 3 steps for 4 steps' work. With sort_fetch, the fetch's items
// are sorted by their row's degree across the warp (a bitonic network over
// the lanes, keys degree << 5 | position, so the order depends only on the
// degrees), and round t's groups take the sorted items t * groups .. t *
// groups + groups - 1: neighbours in length. Items of one row (items_per_row
// > 1) have one degree and stay in position order, so they still share a
// round. Each item's own computation is unchanged, so the results are
// bitwise the same; only which group computes an item changes.
// On the CPU-simulated short rows of the benchmark graphs (16 rows a fetch,
// 8 entries a step), the entry slots filled go from 0.64 to 0.74 (arxiv-like
// CSR) and from 0.58 / 0.61 / 0.71 to 0.70 / 0.73 / 0.87 (arxiv-, products-,
// reddit-like CSC). Fetches of more than 32 items are sorted 32 at a time,
// and fetches of more than kMaxSortedFetch (G = 1 or 2) are not sorted; only
// kernels of 2-byte types sort (kSortFetch).
// PYG_MULTIHEAD_AGG_SORT_FETCH=0 keeps the fetch order (A/B, tests).
inline bool sort_fetch_enabled() {
  return env_int("PYG_MULTIHEAD_AGG_SORT_FETCH", 1, {0, 1}) == 1;
}

// The sorted order of the items first .. first + n - 1 (n <= 32): lane i gets
// the key of the i-th in degree order, degree << 5 | the item's position;
// lanes >= n and items >= num_items get the largest keys, so they sort last
// and decode to their own position. Every lane of the warp must call it.
template <typename index_t>
__device__ __forceinline__ unsigned sorted_fetch_key(const index_t* ptr, int64_t num_edges,
                                                     int64_t first, int n, int64_t num_items,
                                                     int items_per_row, int lane32) {
  constexpr unsigned kMaxDegree = (1u << 27) - 2;  // real keys stay below the padding's
  const int64_t item = first + lane32;
  unsigned degree = kMaxDegree + 1;
  if (lane32 < n && item < num_items) {
    int64_t lo, hi;
    row_range(ptr, items_per_row == 1 ? item : item / items_per_row, num_edges, lo, hi);
    const int64_t entries = hi - lo;
    degree = entries < kMaxDegree ? static_cast<unsigned>(entries) : kMaxDegree;
  }
  unsigned key = degree << 5 | static_cast<unsigned>(lane32);
#pragma unroll
  for (int k = 2; k <= 32; k <<= 1)
#pragma unroll
    for (int j = k >> 1; j > 0; j >>= 1) {
      const unsigned other = __shfl_xor_sync(0xffffffffu, key, j);
      // ascending where lane & k is 0 (always in the last merge, k = 32)
      key = (((lane32 & k) == 0) == ((lane32 & j) == 0)) ? min(key, other) : max(key, other);
    }
  return key;
}

constexpr int kMaxSortedFetch = 64;

// Which kernels may sort their fetches: those of 2-byte types (the spmm
// forward's transposed gathers when a warp runs several rows, the backward's
// dot-gathers). Session 12 (H200, bf16): the forward on arxiv-like -5.7%, the
// backward -1.1..-2.7%. The fused attention kernels measured 3-7% slower
// forward and no faster backward with it, so they do not sort; float32 and
// float64 kernels, whose registers are at their caps, spilled around their
// step loops with even an unused sort path compiled in (and a warp of 128
// float32 features is one group).
template <typename scalar_t>
constexpr bool kSortFetch = sizeof(scalar_t) == 2;

// The order in which a warp's groups take the items of a fetch (rounds of one
// item per group: position t * groups + group in round t). kSortable = false
// compiles to the fetch order. Otherwise the positions come from a per-warp
// table in shared memory, the identity until `sort` writes a fetch's sorted
// order (fetches of at most kMaxSortedFetch items: G >= 4).
template <bool kSortable>
struct FetchOrder {
  __device__ __forceinline__ static void init() {}
  template <typename index_t>
  __device__ __forceinline__ static void sort(bool, const index_t*, int64_t, int64_t, int,
                                              int64_t, int) {}
  __device__ __forceinline__ static int position(int pos) { return pos; }
};

template <>
struct FetchOrder<true> {
  // The warp's table (no state in registers: a pointer or flag kept here
  // would be live across the step loops).
  __device__ __forceinline__ static unsigned char* table() {
    __shared__ unsigned char s_table[kThreads / 32][kMaxSortedFetch];
    return s_table[threadIdx.x / 32];
  }

  // The identity order. Every lane of the warp must call it.
  __device__ __forceinline__ static void init() {
    __syncwarp();  // an earlier order's positions are read
    for (int p = threadIdx.x & 31; p < kMaxSortedFetch; p += 32)
      table()[p] = static_cast<unsigned char>(p);
    __syncwarp();
  }

  // With `enabled` (warp-uniform), the fetch base .. base + groups_per_warp *
  // kFetchRounds - 1 sorted by degree within windows of 32 items; items past
  // num_items come last in their window, so a group's positions past the end
  // still follow all of its positions below it. Every lane of the warp must
  // call it.
  template <typename index_t>
  __device__ __forceinline__ static void sort(bool enabled, const index_t* ptr, int64_t num_edges,
                                              int64_t base, int groups_per_warp,
                                              int64_t num_items, int items_per_row) {
    const int per_fetch = groups_per_warp * kFetchRounds;
    if (!enabled || groups_per_warp == 1 || per_fetch > kMaxSortedFetch) return;
    const int lane32 = threadIdx.x & 31;
    __syncwarp();  // the previous fetch's positions are read
    for (int w = 0; w < per_fetch; w += 32) {
      const unsigned key = sorted_fetch_key(ptr, num_edges, base + w, min(32, per_fetch - w),
                                            num_items, items_per_row, lane32);
      table()[w + lane32] = static_cast<unsigned char>(w + static_cast<int>(key & 31u));
    }
    __syncwarp();
  }

  __device__ __forceinline__ static int position(int pos) {
    return pos < kMaxSortedFetch ? table()[pos] : pos;
  }
};

// The loop of a persistent kernel. Phase 1: the block takes long rows one at
// a time from an atomic counter and runs `long_fn(r, lo, hi)` with all its
// threads (it may synchronise the block). Phase 2: every warp takes
// kFetchRounds * (32 / G) short work items at a time from a second counter,
// one item per group of G lanes, and runs `short_fn(item, r, lo, hi)` with
// that group (it may shuffle within the group, never synchronise more). An
// item is a (row, sub-item) pair, item = r * items_per_row + sub: the heads
// of one row for the fused attention kernels, 1 for the others. Consecutive
// items go to neighbouring groups of a warp, so they share the row's indices
// in L1. No block-wide barrier in phase 2: a warp whose rows are short goes
// on at once instead of waiting for the longest row of a tile.
template <bool kSortable = false, typename index_t, typename ShortFn, typename LongFn>
__device__ __forceinline__ void for_each_work_item(const index_t* ptr, int64_t num_edges,
                                                   const WorkList& wl, int G, int items_per_row,
                                                   ShortFn&& short_fn, LongFn&& long_fn) {
  __shared__ unsigned long long s_item;
  const int64_t num_long = static_cast<int64_t>(wl.counters[0]);
  for (;;) {
    if (threadIdx.x == 0) s_item = atomicAdd(&wl.counters[1], 1ull);
    __syncthreads();
    const int64_t item = static_cast<int64_t>(s_item);
    __syncthreads();
    if (item >= num_long) break;
    const int64_t r = wl.long_rows[item];
    int64_t lo, hi;
    row_range(ptr, r, num_edges, lo, hi);
    long_fn(r, lo, hi);
  }
  const int lane32 = threadIdx.x & 31, groups_per_warp = 32 / G, group = lane32 / G;
  const int64_t num_items = wl.num_rows * items_per_row;
  const unsigned long long per_fetch = static_cast<unsigned long long>(groups_per_warp) *
                                       kFetchRounds;
  using Order = FetchOrder<kSortable>;
  Order::init();
  for (;;) {
    unsigned long long base = 0;
    if (lane32 == 0) base = atomicAdd(&wl.counters[2], per_fetch);
    base = __shfl_sync(0xffffffffu, base, 0);
    if (base >= static_cast<unsigned long long>(num_items)) break;  // warp-uniform
    Order::sort(wl.sort_fetch, ptr, num_edges, static_cast<int64_t>(base), groups_per_warp,
                num_items, items_per_row);
    for (int t = 0; t < kFetchRounds; ++t) {
      // (without kSortable, the expression of the fetch order as it always was:
      // a regrouped one changed the float32 kernels' register allocation)
      const int64_t item =
          kSortable ? static_cast<int64_t>(base) + Order::position(t * groups_per_warp + group)
                    : static_cast<int64_t>(base) + t * groups_per_warp + group;
      if (item >= num_items) break;  // group-uniform
      const int64_t r = items_per_row == 1 ? item : item / items_per_row;
      int64_t lo, hi;
      row_range(ptr, r, num_edges, lo, hi);
      if (hi - lo <= wl.long_threshold) short_fn(item, r, lo, hi);
    }
  }
}

// ---------------------------------------------------------------------------
// Sliced work list: long rows cut into slices of at most slice_len entries
// ---------------------------------------------------------------------------
//
// A block-wide long row (above) still puts a whole hub on one SM: a CSC column
// of 760K entries is ~390 MB of gathers for one multiprocessor. Here every long
// row is cut into slices of at most `slice_len` entries, each slice one work
// item for one group of lanes, like a short row; a slice writes its partial
// sums to a scratch slot, and a second kernel adds a row's slots in slice
// order (fixed, so deterministic; the slots themselves are reserved in a
// varying order). Which rows are long and how they are cut depends only on the
// pointer array.

struct SliceList {
  const int64_t* long_rows;   // [num_long]: the long rows (varying order)
  const int64_t* long_base;   // [num_long]: first scratch slot of each
  const int64_t* slot_owner;  // [num_slots]: index into long_rows of each slot
  // [0]: long rows found, [1]: slots reserved, [2]: next slice, [3]: next short row
  unsigned long long* counters;
  int64_t num_rows;
  int64_t long_threshold;  // rows with more entries than this are sliced
  int64_t slice_len;       // entries per slice (the last one of a row: fewer)
  // Capacity of the lists: a valid pointer array never fills them; a
  // malformed one (decreasing, so that rows overlap) can claim more long rows
  // and slots than there are, and those past the end are dropped (their
  // output is then meaningless, never out of bounds).
  int64_t max_long, max_slots;
  bool sort_fetch;  // sort a fetch's short rows by degree (FetchOrder)
};

// Long rows and slots of a SliceList that fit its lists.
__device__ __forceinline__ int64_t num_long_rows(const SliceList& sl) {
  return min(static_cast<int64_t>(sl.counters[0]), sl.max_long);
}
__device__ __forceinline__ int64_t num_slots(const SliceList& sl) {
  return min(static_cast<int64_t>(sl.counters[1]), sl.max_slots);
}
// Slots of long row li (its last ones dropped if they did not fit).
template <typename index_t>
__device__ __forceinline__ int64_t row_slots(const SliceList& sl, const index_t* ptr,
                                             int64_t num_edges, int64_t li) {
  int64_t lo, hi;
  row_range(ptr, sl.long_rows[li], num_edges, lo, hi);
  const int64_t fit = max(int64_t{0}, sl.max_slots - sl.long_base[li]);
  return min((hi - lo + sl.slice_len - 1) / sl.slice_len, fit);
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

// The loop of a persistent kernel over a SliceList, per warp without block
// barriers: first the slices (the largest items, so they do not form the
// tail), then the short rows, each fetched kFetchRounds * (32 / G) at a time
// from an atomic counter and run by one group of G lanes:
// `slice_fn(slot, r, lo, hi)` with the slice's entries [lo, hi) of row r, and
// `short_fn(r, lo, hi)`.
template <bool kSortable = false, typename index_t, typename SliceFn, typename ShortFn>
__device__ __forceinline__ void for_each_slice_or_row(const index_t* ptr, int64_t num_edges,
                                                      const SliceList& sl, int G,
                                                      SliceFn&& slice_fn, ShortFn&& short_fn) {
  const int lane32 = threadIdx.x & 31, groups_per_warp = 32 / G, group = lane32 / G;
  const unsigned long long per_fetch = static_cast<unsigned long long>(groups_per_warp) *
                                       kFetchRounds;
  const int64_t slots = num_slots(sl);
  // Slices all have slice_len entries but a row's last: only the short rows'
  // fetches are sorted (FetchOrder; phase 0 keeps the identity order).
  using Order = FetchOrder<kSortable>;
  Order::init();
  for (int phase = 0; phase < 2; ++phase) {
    const int64_t num_items = phase == 0 ? slots : sl.num_rows;
    unsigned long long* counter = &sl.counters[2 + phase];
    for (;;) {
      unsigned long long base = 0;
      if (lane32 == 0) base = atomicAdd(counter, per_fetch);
      base = __shfl_sync(0xffffffffu, base, 0);
      if (base >= static_cast<unsigned long long>(num_items)) break;  // warp-uniform
      Order::sort(phase == 1 && sl.sort_fetch, ptr, num_edges, static_cast<int64_t>(base),
                  groups_per_warp, num_items, 1);
      for (int t = 0; t < kFetchRounds; ++t) {
        const int64_t item =
            kSortable ? static_cast<int64_t>(base) + Order::position(t * groups_per_warp + group)
                      : static_cast<int64_t>(base) + t * groups_per_warp + group;
        if (item >= num_items) break;  // group-uniform
        if (phase == 0) {
          const int64_t li = sl.slot_owner[item];
          const int64_t r = sl.long_rows[li];
          int64_t lo, hi;
          row_range(ptr, r, num_edges, lo, hi);
          const int64_t slo = lo + (item - sl.long_base[li]) * sl.slice_len;
          slice_fn(item, r, slo, min(hi, slo + sl.slice_len));
        } else {
          int64_t lo, hi;
          row_range(ptr, item, num_edges, lo, hi);
          if (hi - lo <= sl.long_threshold) short_fn(item, lo, hi);
        }
      }
    }
  }
}

// The second kernel of a sliced pass: for every sliced row r, out_a[r, f] =
// the sum of part_a[slot, f] over r's slots, f < width_a, and the same for b
// (width_b may be 0), in a fixed order, so deterministic. Rows of more than
// kWarpSlices slots (the hubs: ~600 slices on arxiv-like) take a whole block,
// first: its 8 warps each sum a contiguous eighth of the row's slots in slot
// order, and the 8 partials are added in warp order. Every other row takes
// one warp, which sums its slots in slot order, no barrier. Slots are loaded
// in predicated batches (lane_sum), 16-byte loads of part_a when width_a is
// a multiple of 4. History (arxiv-like spmm backward): one thread summed all
// of a feature's slots until session 8 (120-150 us whatever the graph); then
// a block per row, 35 us; session 10 found that the slot loop had one load
// in flight (ptxas used each load right after issuing it, so the hub's 75
// slots per warp were 75 round trips) and moved the short rows (2691 of
// 2812 columns have at most 8 slots) to warps: 16 us; a block per row with
// the batched loads measured 19 us.
#ifndef PMA_SUM_SLICES_WARP
#define PMA_SUM_SLICES_WARP 1
#endif
// 0: every sliced row takes a block (the session-9 layout, for an A/B).
constexpr int kWarpSlices = PMA_SUM_SLICES_WARP != 0 ? 16 : 0;

template <typename scalar_t, typename index_t, typename acc_t>
__global__ void __launch_bounds__(kThreads)
    sum_slices_kernel(const index_t* __restrict__ ptr, int64_t num_edges, const SliceList sl,
                      const acc_t* __restrict__ part_a, scalar_t* __restrict__ out_a, int width_a,
                      const acc_t* __restrict__ part_b, scalar_t* __restrict__ out_b,
                      int width_b, bool vec_a) {
  constexpr int kWarps = kThreads / 32;
  __shared__ acc_t red[kWarps][32 * 4];
  __shared__ unsigned s_big[kWarps];  // phase 1: which candidates are long, per warp
  const int64_t num_long = num_long_rows(sl);
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  auto num_slices = [&](int64_t li) { return row_slots(sl, ptr, num_edges, li); };
  // This lane's sum over slots [k0, k1) of features [c0 + lane * 4, + 4)
  // (vec) or c0 + lane, in slot order, kBatch predicated loads at a time
  // (the SASS issues 5 of the 8 before the first add: ptxas reuses the first
  // loads' registers for the last three).
  auto lane_sum = [&](const acc_t* part, int width, bool vec, int64_t base, int64_t k0,
                      int64_t k1, int c0, acc_t (&s)[4]) {
    constexpr int kBatch = 8;
    s[0] = s[1] = s[2] = s[3] = 0;
    if (vec) {
      const int c = c0 + lane * 4;
      if (c >= width) return;
      for (int64_t k = k0; k < k1; k += kBatch) {
        Vec<acc_t, 4> v[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const acc_t* q = part + (base + k + b) * width + c;
          if constexpr (sizeof(acc_t) == 4) {
            v[b] = load_vec_if<acc_t, 4>(k + b < k1, q);
          } else {  // double: two 16-byte loads
            const auto lo2 = load_vec_if<acc_t, 2>(k + b < k1, q);
            const auto hi2 = load_vec_if<acc_t, 2>(k + b < k1, q + 2);
            v[b].val[0] = lo2.val[0], v[b].val[1] = lo2.val[1];
            v[b].val[2] = hi2.val[0], v[b].val[3] = hi2.val[1];
          }
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b)
#pragma unroll
          for (int i = 0; i < 4; ++i) s[i] += v[b].val[i];
      }
    } else {
      const int c = c0 + lane;
      if (c >= width) return;
      for (int64_t k = k0; k < k1; k += kBatch) {
        acc_t v[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b)
          v[b] = load_value_if(k + b < k1, part + (base + k + b) * width + c);
#pragma unroll
        for (int b = 0; b < kBatch; ++b) s[0] += v[b];
      }
    }
  };
  // A long row with the whole block.
  auto block_part = [&](const acc_t* part, scalar_t* out, int width, bool vec, int64_t r,
                        int64_t base, int64_t k0, int64_t k1) {
    const int chunk = vec ? 32 * 4 : 32;
    for (int c0 = 0; c0 < width; c0 += chunk) {  // block-uniform
      acc_t s[4];
      lane_sum(part, width, vec, base, k0, k1, c0, s);
      if (vec) {
#pragma unroll
        for (int i = 0; i < 4; ++i) red[warp][lane * 4 + i] = s[i];
      } else {
        red[warp][lane] = s[0];
      }
      __syncthreads();
      const int t = threadIdx.x;
      if (t < chunk && c0 + t < width) {
        acc_t tot = 0;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) tot += red[w][t];
        out[r * width + c0 + t] = static_cast<scalar_t>(tot);
      }
      __syncthreads();
    }
  };
  // A short one with this warp alone.
  auto warp_part = [&](const acc_t* part, scalar_t* out, int width, bool vec, int64_t r,
                       int64_t base, int64_t n) {
    const int chunk = vec ? 32 * 4 : 32;
    for (int c0 = 0; c0 < width; c0 += chunk) {
      acc_t s[4];
      lane_sum(part, width, vec, base, 0, n, c0, s);
      if (vec) {
        const int c = c0 + lane * 4;
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (c + i < width) out[r * width + c + i] = static_cast<scalar_t>(s[i]);
      } else if (c0 + lane < width) {
        out[r * width + c0 + lane] = static_cast<scalar_t>(s[0]);
      }
    }
  };
  // Phase 1: block b takes the rows b, b + grid, ... of more than kWarpSlices
  // slots, in that order (one thread per candidate finds them).
  for (int64_t j0 = 0;; j0 += kThreads) {  // block-uniform
    if (blockIdx.x + j0 * gridDim.x >= num_long) break;
    const int64_t li = blockIdx.x + (j0 + threadIdx.x) * gridDim.x;
    const bool big = li < num_long && num_slices(li) > kWarpSlices;
    const unsigned ballot = __ballot_sync(0xffffffffu, big);
    if (lane == 0) s_big[warp] = ballot;
    if (!__syncthreads_or(big)) continue;  // (also the barrier after the s_big writes)
    for (int w = 0; w < kWarps; ++w) {
      for (unsigned m = s_big[w]; m != 0; m &= m - 1) {  // block-uniform
        const int64_t lj = blockIdx.x + (j0 + w * 32 + __ffs(m) - 1) * gridDim.x;
        const int64_t r = sl.long_rows[lj], base = sl.long_base[lj], n = num_slices(lj);
        const int64_t per = (n + kWarps - 1) / kWarps;
        const int64_t k0 = min(n, warp * per), k1 = min(n, k0 + per);
        block_part(part_a, out_a, width_a, vec_a, r, base, k0, k1);
        if (width_b > 0) block_part(part_b, out_b, width_b, false, r, base, k0, k1);
      }
    }
    __syncthreads();  // s_big is read before the next round writes it
  }
  // Phase 2: warp w of the grid takes the rows w, w + warps, ... of at most
  // kWarpSlices slots.
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t li = blockIdx.x * static_cast<int64_t>(kWarps) + warp; li < num_long;
       li += warps) {  // warp-uniform
    const int64_t n = num_slices(li);
    if (n > kWarpSlices) continue;
    const int64_t r = sl.long_rows[li], base = sl.long_base[li];
    warp_part(part_a, out_a, width_a, vec_a, r, base, n);
    if (width_b > 0) warp_part(part_b, out_b, width_b, false, r, base, n);
  }
}

// The contiguous slice of [lo, hi) that group `group` of `groups` (a power of
// two: a shift, not a 64-bit division, which would be a subroutine call) takes
// in a long row.
__device__ __forceinline__ void group_slice(int64_t lo, int64_t hi, int group, int groups,
                                            int64_t& slo, int64_t& shi) {
  const int64_t len = (hi - lo + groups - 1) >> (__ffs(groups) - 1);
  slo = min(hi, lo + group * len);
  shi = min(hi, slo + len);
}

// Sums the groups' partial rows of one feature chunk in group order (fixed, so
// deterministic) and writes them. red holds kThreads * VPL * V values: group g's
// value of feature chunk_feat + q at red[g * G * VPL * V + q].
template <typename scalar_t, typename acc_t, int V, int VPL>
__device__ __forceinline__ void block_reduce_store(acc_t* red, const acc_t (&acc)[VPL][V], int G,
                                                   int lane, int chunk_feat, int HD,
                                                   scalar_t* __restrict__ out_row) {
  const int cwe = G * VPL * V, groups = kThreads / G, group = threadIdx.x / G;
#pragma unroll
  for (int k = 0; k < VPL; ++k)
#pragma unroll
    for (int v = 0; v < V; ++v) red[group * cwe + (k * G + lane) * V + v] = acc[k][v];
  __syncthreads();
  for (int q = threadIdx.x; q < cwe; q += kThreads) {
    if (chunk_feat + q < HD) {
      acc_t s = 0;
      for (int g = 0; g < groups; ++g) s += red[g * cwe + q];
      out_row[chunk_feat + q] = static_cast<scalar_t>(s);
    }
  }
  __syncthreads();
}

// ---------------------------------------------------------------------------
// Host helpers
// ---------------------------------------------------------------------------

int next_pow2(int64_t n) {
  int p = 1;
  while (p < n && p < 32) p <<= 1;
  return p;
}

bool is_aligned(const void* ptr, size_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

// Lanes per row and vectors per lane for rows of `num_vec` vectors.
struct LaneConfig {
  int G, vpl, num_chunks;
};

LaneConfig lane_config(int64_t num_vec, bool allow_vpl2) {
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

int num_sms() {
  int count = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount,
                                        c10::cuda::current_device()));
  return count;
}

// Rows longer than this go to a whole block. A single warp gathers ~5 GB/s,
// the device ~4 TB/s: a row of E / 32768 edges then costs a warp about 2% of
// the whole kernel, so anything longer is spread over a block.
int64_t long_threshold(int64_t num_edges, int64_t div = 1) {
  return std::max<int64_t>(64, num_edges / (32768 * div));
}

// Builds the work list of a persistent kernel; `storage` keeps it alive until
// the launches that use it are enqueued (stream-ordered reuse afterwards).
template <typename index_t>
WorkList make_work_list(const index_t* ptr, int64_t num_rows, int64_t num_edges,
                        at::Tensor& storage, const at::TensorOptions& options) {
  auto stream = c10::cuda::getCurrentCUDAStream();
  storage = at::empty({num_rows + 3}, options.dtype(at::kLong));
  WorkList wl;
  wl.counters = reinterpret_cast<unsigned long long*>(storage.data_ptr<int64_t>());
  wl.long_rows = storage.data_ptr<int64_t>() + 3;
  wl.num_rows = num_rows;
  wl.long_threshold = long_threshold(num_edges);
  wl.sort_fetch = sort_fetch_enabled();
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

// At most this many rows of a SliceList are long (more than long_threshold
// entries each, E entries in all): the size of its row lists, and the grid of
// sum_slices_kernel.
inline int64_t max_long_rows(const SliceList& sl, int64_t num_edges) {
  return std::min<int64_t>(sl.num_rows, num_edges / (sl.long_threshold + 1) + 1);
}

// Builds a SliceList (see above); `storage` keeps it alive as in
// make_work_list. Rows of more than long_threshold(E, div) entries are cut
// into slices of that many (`div` > 1: shorter slices, see the fused
// backward). Slices hold at most long_threshold entries, so a long row of n
// entries gives fewer than 2 n / long_threshold slots, and all rows together
// fewer than 2 E / long_threshold (at most 65536 * div for E >= 2^21 * div):
// the scratch of the partial sums is bounded by that times the row width.
template <typename index_t>
SliceList make_slice_list(const index_t* ptr, int64_t num_rows, int64_t num_edges,
                          at::Tensor& storage, const at::TensorOptions& options,
                          int64_t& max_slots, int64_t div = 1) {
  auto stream = c10::cuda::getCurrentCUDAStream();
  SliceList sl;
  sl.num_rows = num_rows;
  // PYG_MULTIHEAD_AGG_SLICE_SCALE and PYG_MULTIHEAD_AGG_SLICE_DIV (1, 2, 4,
  // 8 or 16; default 1) multiply and divide that threshold, down to 16
  // entries (A/B knobs: fewer, longer slices write fewer partial rows;
  // shorter ones leave a shorter tail).
  sl.long_threshold = std::max<int64_t>(
      16, long_threshold(num_edges, div) *
              env_int("PYG_MULTIHEAD_AGG_SLICE_SCALE", 1, {1, 2, 4, 8, 16}) /
              env_int("PYG_MULTIHEAD_AGG_SLICE_DIV", 1, {1, 2, 4, 8, 16}));
  sl.slice_len = sl.long_threshold;
  sl.sort_fetch = sort_fetch_enabled();
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

// Launches sum_slices_kernel (see there) on the current stream: a block per
// sliced row, for at most as many rows as the slice list can hold.
template <typename scalar_t, typename index_t, typename acc_t>
void launch_sum_slices(const index_t* ptr, int64_t num_edges, const SliceList& sl,
                       const acc_t* part_a, scalar_t* out_a, int width_a, const acc_t* part_b,
                       scalar_t* out_b, int width_b) {
  const int64_t max_long = max_long_rows(sl, num_edges);
  const int blocks =
      static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(max_long, num_sms() * 8LL)));
  const bool vec_a = width_a % 4 == 0 && is_aligned(part_a, 4 * sizeof(acc_t));
  sum_slices_kernel<scalar_t, index_t, acc_t>
      <<<blocks, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
          ptr, num_edges, sl, part_a, out_a, width_a, part_b, out_b, width_b, vec_a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

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
//   allows. Our reading (not profiled): consecutive rows read the same
//   columns' entries, which sit side by side in the CSC (a hub column holds
//   an entry of nearly every row), so a narrow window hits L2 more. Session
//   19 (call 4, the spmm backward with perm_inv, same run): from at most
//   16 blocks an SM striding over 4 rows a thread, products-like 11.20 ->
//   10.88 ms float32 and 6.74 -> 6.48 bf16, reddit-like 6.40 -> 5.87 and
//   3.57 -> 3.21, arxiv-like within 1%; 8 rows a thread striding changed
//   little (loads in flight do not bound it), nor did ld.global.cg reads.
// - The sequential index and output go through L2 evict-first (ld/st .cs),
//   leaving more of it to the random reads: 0.3-0.7% (call 1).
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

// Resident blocks of a persistent kernel, no more than there is work for.
template <typename Kernel>
int persistent_grid(Kernel kernel, int64_t num_items, int G, size_t smem = 0,
                    int threads = kThreads) {
  int per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  const int64_t blocks = static_cast<int64_t>(std::max(per_sm, 1)) * num_sms();
  const int64_t items_per_block = static_cast<int64_t>(threads / G) * kFetchRounds;
  return static_cast<int>(
      std::max<int64_t>(1, std::min(blocks, (num_items + items_per_block - 1) / items_per_block)));
}

}  // namespace
}  // namespace pyg_multihead_agg
