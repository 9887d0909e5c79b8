// Index loads and row arithmetic of the graph walks: predicated index loads,
// clamped row ranges, range checks and row addresses in the index's own width.
#pragma once

#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "vec.cuh"

namespace pyg_multihead_agg {


// An index (int32 or int64) when `pred`, else 0, as one predicated load.
// Written as `pred ? __ldg(p) : -1`, the U index loads of a step became
// if-converted loads into one register, each waiting for the previous
// entry's use (the one-pass attention forward's SASS): U round trips of
// latency per step instead of one.
template <typename index_t>
__device__ __forceinline__ index_t load_index_if(bool pred, const index_t* p) {
  static_assert(sizeof(index_t) == 4 || sizeof(index_t) == 8, "32- or 64-bit indices");
  const auto raw = RawLoad<sizeof(index_t)>::load(pred, p);
  index_t v;
  memcpy(&v, &raw, sizeof(index_t));
  return v;
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
// (tools/sass_loop.py).
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

}  // namespace pyg_multihead_agg
