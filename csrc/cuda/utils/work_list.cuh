// Work lists of the persistent kernels: which rows are long, and the loops
// that hand rows, slices and long rows to groups of lanes. Two kinds:
// - WorkList: long rows run block-wide first, then short rows, one per group
//   (for_each_work_item).
// - SliceList: long rows cut into slices that any group takes, their partial
//   sums added afterwards in slice order (for_each_slice_or_row, then
//   launch_sum_slices in sum_slices.cuh).
// The lists are built on the device by make_work_list / make_slice_list
// (work_list.cu) from the pointer array alone.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "config.cuh"
#include "fetch_order.cuh"
#include "index.cuh"
#include "../../path_overrides.h"

namespace pyg_multihead_agg {

// ---------------------------------------------------------------------------
// Work list: long rows first (block-wide), then short rows
// ---------------------------------------------------------------------------

struct WorkList {
  const int64_t* long_rows;      // filled by find_long_rows_kernel
  unsigned long long* counters;  // [0]: long rows found, [1]: next long row, [2]: next short item
  int64_t num_rows;
  int64_t long_threshold;        // rows with more edges than this are long
  bool sort_fetch;               // sort a fetch's short rows by degree (FetchOrder)
  int forced_rounds;             // rounds per fetch forced by the test hook, or 0 (fetch_rounds)
};

// The loop of a persistent kernel. Phase 1: the block takes long rows one at
// a time from an atomic counter and runs `long_fn(r, lo, hi)` with all its
// threads (it may synchronise the block). Phase 2: every warp takes
// fetch_rounds(...) * (32 / G) short work items at a time from a second counter,
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
  const int rounds = fetch_rounds(num_items, G, wl.forced_rounds);
  const unsigned long long per_fetch = static_cast<unsigned long long>(groups_per_warp) * rounds;
  using Order = FetchOrder<kSortable>;
  Order::init();
  for (;;) {
    unsigned long long base = 0;
    if (lane32 == 0) base = atomicAdd(&wl.counters[2], per_fetch);
    base = __shfl_sync(0xffffffffu, base, 0);
    if (base >= static_cast<unsigned long long>(num_items)) break;  // warp-uniform
    Order::sort(wl.sort_fetch, ptr, num_edges, static_cast<int64_t>(base), groups_per_warp,
                rounds, num_items, items_per_row);
    for (int t = 0; t < rounds; ++t) {
      // (without kSortable, exactly this expression of the fetch order: a
      // regrouped one changes the float32 kernels' register allocation)
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
  bool sort_fetch;    // sort a fetch's short rows by degree (FetchOrder)
  int forced_rounds;  // rounds per fetch forced by the test hook, or 0 (fetch_rounds)
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

// The loop of a persistent kernel over a SliceList, per warp without block
// barriers: first the slices (the largest items, so they do not form the
// tail), then the short rows, each fetched fetch_rounds(...) * (32 / G) at a time
// from an atomic counter and run by one group of G lanes:
// `slice_fn(slot, r, lo, hi)` with the slice's entries [lo, hi) of row r, and
// `short_fn(r, lo, hi)`. After each fetch every group of the warp calls
// `fetch_done(range)`: `range` numbers the (fetch, group) pairs, the short
// rows' fetches first, then the slices' (fetch_ranges), and names the same
// fixed items on every run, whichever warp took them. A per-group sum over
// its items in fetch order, stored per range, is thus a deterministic
// reduction of the items into fetch_ranges(...) rows.
struct NoFetchFn {
  __device__ __forceinline__ void operator()(int64_t) const {}
};

// The (fetch, group) ranges of n items fetched by groups of G lanes, rounds
// per fetch.
__host__ __device__ __forceinline__ int64_t fetch_ranges(int64_t n, int G, int rounds) {
  const int64_t groups = 32 / G, per_fetch = groups * rounds;
  return (n + per_fetch - 1) / per_fetch * groups;
}

template <bool kSortable = false, typename index_t, typename SliceFn, typename ShortFn,
          typename FetchFn = NoFetchFn>
__device__ __forceinline__ void for_each_slice_or_row(const index_t* ptr, int64_t num_edges,
                                                      const SliceList& sl, int G,
                                                      SliceFn&& slice_fn, ShortFn&& short_fn,
                                                      FetchFn&& fetch_done = FetchFn{}) {
  const int lane32 = threadIdx.x & 31, groups_per_warp = 32 / G, group = lane32 / G;
  // (both phases: the rows size the grid)
  const int rounds = fetch_rounds(sl.num_rows, G, sl.forced_rounds);
  const unsigned long long per_fetch = static_cast<unsigned long long>(groups_per_warp) * rounds;
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
                  groups_per_warp, rounds, num_items, 1);
      for (int t = 0; t < rounds; ++t) {
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
      // (base is a multiple of per_fetch = groups_per_warp * rounds)
      fetch_done((phase == 0 ? fetch_ranges(sl.num_rows, G, rounds) : int64_t{0}) +
                 static_cast<int64_t>(base) / rounds + group);
    }
  }
}

// ---------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------

// Rows longer than this go to a whole block. A single warp gathers ~5 GB/s,
// the device ~4 TB/s: a row of E / 32768 edges then costs a warp about 2% of
// the whole kernel, so anything longer is spread over a block. div > 1 gives
// a lower threshold (shorter slices in a SliceList).
inline int64_t long_threshold(int64_t num_edges, int64_t div = 1) {
  return std::max<int64_t>(64, num_edges / (32768 * div));
}

// The work list of a persistent kernel over the rows of `ptr`; `storage`
// keeps it alive until the launches that use it are enqueued
// (stream-ordered reuse afterwards). sort_fetch: see FetchOrder.
template <typename index_t>
WorkList make_work_list(const index_t* ptr, int64_t num_rows, int64_t num_edges,
                        bool sort_fetch, at::Tensor& storage, const at::TensorOptions& options);

// At most this many rows of a SliceList are long (more than long_threshold
// entries each, E entries in all): the size of its row lists, and the grid of
// sum_slices_kernel.
inline int64_t max_long_rows(const SliceList& sl, int64_t num_edges) {
  return std::min<int64_t>(sl.num_rows, num_edges / (sl.long_threshold + 1) + 1);
}

// A SliceList of the rows of `ptr` (see above); `storage` keeps it alive as in
// make_work_list. Rows of more than slice_len entries are cut into slices of
// slice_len. A long row of n entries gives fewer than 2 n / slice_len slots,
// and all rows together fewer than 2 E / slice_len: max_slots, the rows of
// the scratch that holds the slices' partial sums.
template <typename index_t>
SliceList make_slice_list(const index_t* ptr, int64_t num_rows, int64_t num_edges,
                          int64_t slice_len, bool sort_fetch, at::Tensor& storage,
                          const at::TensorOptions& options, int64_t& max_slots);

// The rounds per fetch forced by the test hook (path_overrides.h), or 0: the
// heuristic (fetch_rounds). The work lists carry it to their kernels.
inline int forced_fetch_rounds() {
  const int64_t forced = path_override(KernelPath::kFetchRounds);
  return forced > 0 ? static_cast<int>(forced) : 0;
}

// Resident blocks of a persistent kernel, no more than there is work for.
template <typename Kernel>
int persistent_grid(Kernel kernel, int64_t num_items, int G, size_t smem = 0,
                    int threads = kThreads) {
  const int per_sm = blocks_per_sm(kernel, threads, smem);
  const int64_t blocks = static_cast<int64_t>(std::max(per_sm, 1)) * num_sms();
  const int64_t items_per_block =
      static_cast<int64_t>(threads / G) * fetch_rounds(num_items, G, forced_fetch_rounds());
  return static_cast<int>(
      std::max<int64_t>(1, std::min(blocks, (num_items + items_per_block - 1) / items_per_block)));
}

}  // namespace pyg_multihead_agg
