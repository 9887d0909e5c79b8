// The order in which the groups of a warp take the short rows of one fetch
// from a work list: as fetched, or sorted by degree (FetchOrder<true>).
#pragma once

#include <cstdint>

#include "config.cuh"
#include "index.cuh"

namespace pyg_multihead_agg {

// Short items a warp takes per atomic, at most (kFetchRounds rounds of one
// item per group): fewer atomics on one counter against a coarser tail at the
// end of the grid.
constexpr int kFetchRounds = 8;
// The warp fetches a grid needs before a fetch takes more than one round:
// about the warps an H200 holds at once (132 SMs x 64 / 2).
constexpr int64_t kFetchesToFill = 4096;

// Rounds per fetch for num_items items taken by groups of G lanes. A group
// runs its rounds one after another, and a small graph has too few fetches of
// kFetchRounds rounds to fill the device: Cora's 2,708 rows would make 22
// blocks of the all-heads forward (16 lanes a row) and 3 of the per-head one
// (2 lanes), each group walking 8 rows in turn. So a fetch takes as many rounds as the
// items fill kFetchesToFill fetches with, from 1 to kFetchRounds (every
// benchmark graph from arxiv-like upwards: kFetchRounds). A function of the
// sizes alone, so that the fetch ranges of a deterministic reduction
// (fetch_ranges, work_list.cuh) are the same on every device. forced > 0
// (the test hook, carried by the work list): that many rounds instead.
__host__ __device__ __forceinline__ int fetch_rounds(int64_t num_items, int G, int forced) {
  if (forced > 0) return forced < kFetchRounds ? forced : kFetchRounds;
  const int64_t rounds = num_items / (static_cast<int64_t>(32 / G) * kFetchesToFill);
  return static_cast<int>(rounds < 1 ? 1 : (rounds > kFetchRounds ? kFetchRounds : rounds));
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
// the spmm kernels of 2-byte types sort (kSortFetch in spmm/params.cuh), and
// only when the list's sort_fetch is set (spmm/heuristics.cuh).

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

// The order in which a warp's groups take the items of a fetch (rounds of one
// item per group: position t * groups + group in round t). kSortable = false
// compiles to the fetch order. Otherwise the positions come from a per-warp
// table in shared memory, the identity until `sort` writes a fetch's sorted
// order (fetches of at most kMaxSortedFetch items: G >= 4).
template <bool kSortable>
struct FetchOrder {
  __device__ __forceinline__ static void init() {}
  template <typename index_t>
  __device__ __forceinline__ static void sort(bool, const index_t*, int64_t, int64_t, int, int,
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
  // rounds - 1 sorted by degree within windows of 32 items; items past
  // num_items come last in their window, so a group's positions past the end
  // still follow all of its positions below it. Every lane of the warp must
  // call it.
  template <typename index_t>
  __device__ __forceinline__ static void sort(bool enabled, const index_t* ptr, int64_t num_edges,
                                              int64_t base, int groups_per_warp, int rounds,
                                              int64_t num_items, int items_per_row) {
    const int per_fetch = groups_per_warp * rounds;
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

}  // namespace pyg_multihead_agg
