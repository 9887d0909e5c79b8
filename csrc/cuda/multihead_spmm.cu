// CUDA kernels of the multihead_spmm family and their CUDA IMPL block.
// Design, expected bandwidth and tuning notes: benchmarks/KERNEL_NOTES.md.
//
// Layout of the work. A row of H*D features is cut into 16-byte vectors
// (8 halves, 4 floats, 2 doubles) when D is a multiple of the vector width
// and the pointers are aligned, else into single elements (the scalar path).
// A group of G lanes (a power of two <= 32, G*VPL vectors covering the row)
// handles one compressed row; lane `l` owns the vectors
//     v = chunk * G * VPL + l + G * k,   k < VPL,
// i.e. features [v*V, v*V + V), all of head v*V / D. In PyTorch terms, for the
// forward and one feature chunk:
//     acc[l, k] = sum_e weight[e, head(v)] * x[col[e]].view(-1, V)[v]
// with the row's edges unrolled by U = 8 / VPL so that 8 gathers per lane are
// in flight. Rows wider than 32 * 4 vectors loop over feature chunks. In the
// gather, rows narrower than a warp (G < 32) may instead take a whole warp,
// its 32 / G groups splitting the row's steps (GatherParams::split). Every
// load of a step is a predicated inline-PTX load (load_vec_if and friends in
// common.cuh), with no branch between them.
//
// Load balance. Rows with more than `long_threshold` edges are listed by a
// first tiny kernel; the main kernel is persistent and takes work items from
// an atomic counter: first the long rows, each split over all the groups of a
// block (contiguous edge slices, partial sums reduced through shared memory
// in a fixed order, so the result is deterministic), then tiles of short rows,
// one row per group. Hubs thus start first and spread over 8 warps instead of
// stalling one warp at the end of the grid. The dot-gather kernel (the
// backward over the CSC) instead cuts long rows into slices that any group
// takes (SliceList in common.cuh), with a second kernel adding each row's
// slice partials in slice order: no block-wide step, so it runs 128-thread
// blocks sized by its registers.
//
// Malformed graphs never fault: every row range is clamped to [0, E] (empty
// when decreasing) and entries whose index (col, row or perm) is out of range
// are skipped. The Python `validate=True` flag is what raises clear errors.
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "../checks.h"
#include "common.cuh"
#include "dispatch.cuh"
#include "tensor_core_backward.cuh"
#include "tensor_core_gather.cuh"

namespace pyg_multihead_agg {
namespace {

// ---------------------------------------------------------------------------
// Gather: out[r] = sum_{e in row r} weight[wperm ? wperm[e] : e] * x[idx[e]]
// (the forward on the CSR; grad_x on the CSC with wperm = perm)
// ---------------------------------------------------------------------------

template <typename scalar_t, typename index_t>
struct GatherParams {
  const index_t* ptr;      // [num_rows + 1]
  const index_t* idx;      // [E] gathered row of x per entry
  const index_t* wperm;    // [E] or nullptr: weight row per entry
  const scalar_t* weight;  // [E, H]
  const scalar_t* x;       // [num_src, H, D]
  scalar_t* out;           // [num_rows, H, D]
  int64_t num_rows, num_src, num_edges;
  int H, D, HD, G, num_chunks;
  // Rows narrower than a warp (G < 32): when true, the 32 / G groups of a
  // warp split the entries of one row (steps of U entries, round robin) and
  // sum their partial rows with shuffles; when false, each group takes a
  // row of its own. Rows of different lengths in one warp leave lanes idle
  // (a bf16 row of 4 x 32 features is 16 lanes: 24.7 active threads per warp
  // on products-like, session 3), one row per warp does not.
  bool split;
};

// The indices of a step's entries e..e+U-1 (those at or past hi are not
// loaded; gather_step skips them). One predicated load each and a select for
// the weight row, with no branch: a uniform branch per entry (`wperm !=
// nullptr ? load : e + u`) cut the step into basic blocks that ptxas does not
// schedule across, and the index loads waited for one another.
template <int U, typename index_t>
struct StepIndex {
  index_t src[U], we[U];
};

template <int U, typename scalar_t, typename index_t>
__device__ __forceinline__ void load_step_indices(StepIndex<U, index_t>& s, int64_t e,
                                                  int64_t hi,
                                                  const GatherParams<scalar_t, index_t>& p) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const bool inside = e + u < hi;
    s.src[u] = load_index_if(inside, p.idx + e + u);
    const index_t wp = load_index_if(inside && p.wperm != nullptr, p.wperm + e + u);
    s.we[u] = p.wperm != nullptr ? wp : static_cast<index_t>(e + u);
  }
}

// Entries e..min(e+U, hi)-1 with their indices in `s`: U*VPL independent
// gathers, then the FMAs. The last, partial step is predicated rather than
// run one entry at a time, so a row of 14 edges costs two round trips of
// latency, not seven.
template <int U, typename scalar_t, typename index_t, int V, int VPL>
__device__ __forceinline__ void gather_step(at::opmath_type<scalar_t> (&acc)[VPL][V],
                                            const StepIndex<U, index_t>& s, int64_t e,
                                            int64_t hi, const GatherParams<scalar_t, index_t>& p,
                                            const LaneMap<VPL>& m) {
  using acc_t = at::opmath_type<scalar_t>;
  Vec<scalar_t, V> xv[U][VPL];
  acc_t w[U][VPL];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const bool ok = e + u < hi && in_range(s.src[u], p.num_src) && in_range(s.we[u], p.num_edges);
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const bool load = ok && m.valid[k];
      xv[u][k] = load_vec_if<scalar_t, V>(
          load, p.x + static_cast<int64_t>(s.src[u]) * p.HD + m.feat[k]);
      w[u][k] = load_value_if(load, p.weight + static_cast<int64_t>(s.we[u]) * p.H + m.head[k]);
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int k = 0; k < VPL; ++k)
      axpy_vec(acc[k], w[u][k], xv[u][k]);
}

// Steps of U entries from lo + first * U, every `stride` steps. With 32-bit
// indices the next step's indices are loaded before this step's gathers, so
// that a step waits for one round trip (its gathers), not two; 64-bit ones
// would take 32 more registers.
template <typename scalar_t, typename index_t, int V, int VPL>
__device__ __forceinline__ void gather_entries(at::opmath_type<scalar_t> (&acc)[VPL][V],
                                               int64_t lo, int64_t hi,
                                               const GatherParams<scalar_t, index_t>& p,
                                               const LaneMap<VPL>& m, int first = 0,
                                               int stride = 1) {
  constexpr int U = kLoadsInFlight / VPL;
  constexpr bool kPrefetch = sizeof(index_t) == 4;
#pragma unroll
  for (int k = 0; k < VPL; ++k)
#pragma unroll
    for (int v = 0; v < V; ++v) acc[k][v] = 0;
  const int64_t step = static_cast<int64_t>(stride) * U;
  StepIndex<U, index_t> cur;
  if constexpr (kPrefetch) load_step_indices(cur, lo + first * U, hi, p);
  for (int64_t e = lo + first * U; e < hi; e += step) {
    if constexpr (kPrefetch) {
      StepIndex<U, index_t> next;
      load_step_indices(next, e + step, hi, p);
      gather_step<U>(acc, cur, e, hi, p, m);
      cur = next;
    } else {
      load_step_indices(cur, e, hi, p);
      gather_step<U>(acc, cur, e, hi, p, m);
    }
  }
}

// The 2-byte transposed gather prefetches the next step's indices too (1;
// 0 for an A/B). Session 8 turned it off: it spilled in the step loop at 80
// registers and measured 18-27% slower. Once `widen` (common.cuh) dropped
// the bf16 unpack's PRMTs it fits without loop spill, and session 9 measured
// it 5 / 7 / 15% faster (arxiv / products / reddit-like) than without.
#ifndef PMA_GATHER_PREFETCH_HALF
#define PMA_GATHER_PREFETCH_HALF 1
#endif

// gather_entries for one vector per lane and heads of kS = 4 or 8 lanes:
// gather_step's lanes each load the weight of every entry for their head (kS
// lanes the same value) and check its index; here lane q of a head loads the
// weight of entries q (and q + 4 when kS = 4) of the step's 8, and one
// shuffle per entry hands it to the head's lanes. Session 6's ncu: the
// float32 gather issued 53 warp instructions per entry, the bf16 one 37 at
// 64% of the issue slots. Same products in the same order, so out is bitwise
// that of gather_entries. (An entry whose weight index is out of range adds
// 0 x its row instead of nothing: only a malformed perm has one.)
template <int kS, typename scalar_t, typename index_t, int V>
__device__ __forceinline__ void gather_entries_transposed(
    at::opmath_type<scalar_t> (&acc)[1][V], int64_t lo, int64_t hi,
    const GatherParams<scalar_t, index_t>& p, const LaneMap<1>& m, int first, int stride) {
  using acc_t = at::opmath_type<scalar_t>;
  static_assert(kS == 4 || kS == 8, "4 or 8 lanes per head");
  constexpr int U = kLoadsInFlight, kSlots = U / kS;
  const int q = (threadIdx.x & 31) & (kS - 1);
  const int head_base = (threadIdx.x & 31) & ~(kS - 1);  // warp lane of the head's lane 0
  const unsigned mask = group_mask(p.G);
  const bool valid = m.valid[0];
  const int h = m.head[0], HD = p.HD, H = p.H;
  const IndexBound<index_t> src_ok(p.num_src), edge_ok(p.num_edges);
  const scalar_t* x = p.x + m.feat[0];
  const scalar_t* weight = p.weight + h;
#pragma unroll
  for (int v = 0; v < V; ++v) acc[0][v] = 0;
  // The gathered rows of all U entries (every lane) and this lane's own
  // entries' weight rows (StepIndices), one step ahead with 32-bit indices
  // (see PMA_GATHER_PREFETCH_HALF). Offsets from lo in the index's width
  // (EntryOffset).
  using off_t = EntryOffset<index_t>;
  using Step = StepIndices<U, kS, false, index_t>;
  const off_t n = static_cast<off_t>(hi - lo);
  auto load_idx = [&](off_t e, Step& s_) { s_.load(p.idx, p.wperm, lo, e, n, q); };
  constexpr bool kPrefetch =
      sizeof(index_t) == 4 && (sizeof(scalar_t) == 4 || PMA_GATHER_PREFETCH_HALF != 0);
  const off_t step = static_cast<off_t>(stride) * U;
  Step cur;
  if constexpr (kPrefetch) load_idx(static_cast<off_t>(first) * U, cur);
  for (off_t e = static_cast<off_t>(first) * U; e < n; e += step) {
    const off_t left = n - e;  // > 0; the step's entries u < left are the row's
    if constexpr (!kPrefetch) load_idx(e, cur);
    Step next;
    if constexpr (kPrefetch) load_idx(e + step, next);
    Vec<scalar_t, V> xv[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      xv[u] = load_vec_if<scalar_t, V>(valid && u < left && src_ok(cur.i[u]),
                                      row_at(x, cur.i[u], HD));
    acc_t w[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s)
      w[s] = load_value_if(valid && s * kS + q < left && edge_ok(cur.eq[s]),
                           row_at(weight, cur.eq[s], H));
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const acc_t wu = __shfl_sync(mask, w[u / kS], head_base + (u % kS));
      axpy_vec(acc[0], wu, xv[u]);
    }
    if constexpr (kPrefetch) cur = next;
  }
}

// Resident blocks per SM asked of ptxas for gather_kernel. The transposed
// variants fit 80 registers (3 blocks, 24 warps per SM instead of 16): float32
// without spill, bf16 with 32 bytes outside the step loop (session 9 SASS,
// with the index prefetch). Session 6's Nsight Compute:
// the per-lane gather ran at 25% occupancy, register-bound, with under one
// eligible warp per scheduler.
#ifndef PMA_GATHER_TRANSPOSED_MIN_BLOCKS
#define PMA_GATHER_TRANSPOSED_MIN_BLOCKS 3
#endif
template <int kS>
constexpr int gather_min_blocks() {
  return kS != 0 ? PMA_GATHER_TRANSPOSED_MIN_BLOCKS : kMinBlocks;
}

// kS = 4 or 8: gather_entries_transposed (one vector per lane, one chunk);
// kS = 0: gather_entries. kSort: the warps' fetches of rows sorted by degree
// (FetchOrder; launched only for 2-byte types with several rows a warp, as
// the split path measured 2-4% slower with the unused sort compiled in).
template <typename scalar_t, typename index_t, int V, int VPL, int kS, bool kSort = false>
__global__ void __launch_bounds__(kThreads, gather_min_blocks<kS>())
    gather_kernel(const GatherParams<scalar_t, index_t> p, const WorkList wl) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t red[kThreads * VPL * V];
  const int G = p.G, lane = threadIdx.x & (G - 1);
  const int group = threadIdx.x / G, groups = kThreads / G;
  // With p.split, a warp's sub-groups (sub < subs) share one row.
  const int subs = p.split ? 32 / G : 1, sub = p.split ? (threadIdx.x & 31) / G : 0;

  auto short_row = [&](int64_t, int64_t r, int64_t lo, int64_t hi) {
    for (int chunk = 0; chunk < p.num_chunks; ++chunk) {
      const auto m = lane_map<V, VPL>(chunk, lane, G, p.D, p.HD);
      acc_t acc[VPL][V];
      if constexpr (kS != 0) {
        gather_entries_transposed<kS>(acc, lo, hi, p, m, sub, subs);
      } else {
        gather_entries(acc, lo, hi, p, m, sub, subs);
      }
      if (p.split) {  // warp-uniform; a fixed butterfly, so deterministic
        for (int off = G; off < 32; off <<= 1)
#pragma unroll
          for (int k = 0; k < VPL; ++k)
#pragma unroll
            for (int v = 0; v < V; ++v) acc[k][v] += __shfl_xor_sync(0xffffffffu, acc[k][v], off);
      }
      if (sub == 0) {
#pragma unroll
        for (int k = 0; k < VPL; ++k)
          if (m.valid[k]) store_vec<scalar_t, V>(p.out + r * p.HD + m.feat[k], acc[k]);
      }
    }
  };
  auto long_row = [&](int64_t r, int64_t lo, int64_t hi) {
    int64_t slo, shi;
    group_slice(lo, hi, group, groups, slo, shi);
    for (int chunk = 0; chunk < p.num_chunks; ++chunk) {
      const auto m = lane_map<V, VPL>(chunk, lane, G, p.D, p.HD);
      acc_t acc[VPL][V];
      if constexpr (kS != 0) {
        gather_entries_transposed<kS>(acc, slo, shi, p, m, 0, 1);
      } else {
        gather_entries(acc, slo, shi, p, m);
      }
      block_reduce_store<scalar_t, acc_t, V, VPL>(red, acc, G, lane, chunk * G * VPL * V, p.HD,
                                                  p.out + r * p.HD);
    }
  };
  for_each_work_item<kSort>(p.ptr, p.num_edges, wl, p.split ? 32 : G, 1, short_row, long_row);
}

// ---------------------------------------------------------------------------
// Dot-gather: for each entry k of compressed row r, with e = perm ? perm[k] : k
// and the gathered row g = gathered[idx[k]],
//     dot_out[e, h] = <rowval[r, h, :], g[h, :]>                      (all h)
//     acc_out[r]   += weight[e, h] * g[h, :]        (when weight is given)
// The backward over the CSC (rowval = x, gathered = grad_out, perm) computes
// grad_weight and grad_x in one pass, or grad_x alone (no rowval, no
// dot_out); the SDDMM over the CSR (rowval = a, gathered = b, no perm, no
// weight) computes its output. rowval[r] is loaded once per row (per chunk)
// into registers.
// Needs D / V to be a power of two: a head's vectors then fill S = min(D / V, G)
// aligned lanes (for a fixed k), and its dot is a butterfly over S lanes.
// ---------------------------------------------------------------------------

template <typename scalar_t, typename index_t>
struct DotParams {
  const index_t* ptr;          // [num_rows + 1]
  const index_t* idx;          // [E] gathered row per entry
  const index_t* perm;         // [E] or nullptr: edge id per entry
  const scalar_t* rowval;      // [num_rows, H, D]
  const scalar_t* gathered;    // [num_gathered, H, D]
  const scalar_t* weight;      // [E, H] or nullptr
  scalar_t* acc_out;           // [num_rows, H, D] when weight
  scalar_t* dot_out;           // [E, H]: by edge id e, or by entry k when dot_by_entry
  at::opmath_type<scalar_t>* part;  // [slots, H * D] sliced rows' partial acc_out (weight)
  int64_t num_rows, num_gathered, num_edges;
  int H, D, HD, G, S, num_chunks;
  // dot_out by entry: row k holds entry k's dots (the CSC order the kernel
  // walks), for a gather into edge order (gather_rows_kernel) afterwards.
  bool dot_by_entry;
};

template <int U, typename scalar_t, typename index_t, int V, int VPL>
__device__ __forceinline__ void dot_step(at::opmath_type<scalar_t> (&acc)[VPL][V],
                                         const Vec<scalar_t, V> (&rv)[VPL], int64_t e0,
                                         int64_t hi, const DotParams<scalar_t, index_t>& p,
                                         const LaneMap<VPL>& m, const bool (&last)[VPL],
                                         unsigned mask, bool leader) {
  using acc_t = at::opmath_type<scalar_t>;
  const bool with_weight = p.weight != nullptr;
  index_t src[U], e[U];  // the index type: int32 graphs keep half the registers
  bool ok[U], e_ok[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const bool inside = e0 + u < hi;  // the last step of a row is partial
    src[u] = load_index_if(inside, p.idx + e0 + u);
    const index_t pe = load_index_if(inside && p.perm != nullptr, p.perm + e0 + u);  // no branch
    e[u] = p.perm != nullptr ? pe : static_cast<index_t>(e0 + u);
    e_ok[u] = inside && in_range(e[u], p.num_edges);
    ok[u] = e_ok[u] && in_range(src[u], p.num_gathered);
  }
  Vec<scalar_t, V> gv[U][VPL];
  acc_t w[U][VPL];
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const bool load = ok[u] && m.valid[k];
      gv[u][k] = load_vec_if<scalar_t, V>(
          load, p.gathered + static_cast<int64_t>(src[u]) * p.HD + m.feat[k]);
      w[u][k] = load_value_if(load && with_weight,
                              p.weight + static_cast<int64_t>(e[u]) * p.H + m.head[k]);
    }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (e0 + u >= hi) break;  // group-uniform: no shuffles for the padding of a partial step
    acc_t run = 0;
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      acc_t g[V], r[V];
      widen(gv[u][k], g);
      widen(rv[k], r);
#pragma unroll
      for (int v = 0; v < V; ++v) {
        acc[k][v] += w[u][k] * g[v];
        run += g[v] * r[v];
      }
      // `last` is the same for all lanes of the group, so the shuffles are
      // group-uniform. Vectors k that share a head were summed into `run`.
      if (last[k]) {
        for (int off = p.S >> 1; off > 0; off >>= 1) run += __shfl_xor_sync(mask, run, off);
        if (leader && m.valid[k] && e_ok[u] && p.dot_out != nullptr) {
          const int64_t out_row = p.dot_by_entry ? e0 + u : static_cast<int64_t>(e[u]);
          p.dot_out[out_row * p.H + m.head[k]] = static_cast<scalar_t>(run);
        }
        run = 0;
      }
    }
  }
}

template <typename scalar_t, typename index_t, int V, int VPL>
__device__ __forceinline__ void dot_entries(at::opmath_type<scalar_t> (&acc)[VPL][V],
                                            int64_t r, int64_t lo, int64_t hi,
                                            const DotParams<scalar_t, index_t>& p,
                                            const LaneMap<VPL>& m, int lane) {
  constexpr int U = kLoadsInFlight / VPL;
  Vec<scalar_t, V> rv[VPL];  // kept in the input dtype: half the registers for half types
  bool last[VPL];
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    rv[k] = m.valid[k] && p.dot_out != nullptr
                ? load_vec<scalar_t, V>(p.rowval + r * p.HD + m.feat[k])
                : zero_vec<scalar_t, V>();
#pragma unroll
    for (int v = 0; v < V; ++v) acc[k][v] = 0;
    // Heads span G * k-consecutive vectors only when D / V >= G, and then the
    // whole group shares m.head[k]; otherwise every k is a head of its own.
    last[k] = k == VPL - 1 || m.head[k + (k < VPL - 1 ? 1 : 0)] != m.head[k];
  }
  const unsigned mask = group_mask(p.G);
  const bool leader = (lane & (p.S - 1)) == 0;
  for (int64_t e = lo; e < hi; e += U) dot_step<U>(acc, rv, e, hi, p, m, last, mask, leader);
}

// dot_entries for one vector per lane and heads of kS = 4 or 8 lanes, with
// the per-entry scalar work done once instead of in all kS lanes of a head:
// a step of U entries reduces its U dot products with one transposing
// butterfly (transpose_round), after which lane q of a head holds the whole
// dot of entry q (and q + 4 when U = 2 kS) and alone loads that entry's edge
// id and weight and stores its dot; the weights go back to the head's lanes
// with one shuffle per entry. Same sums, so dot_out and acc_out are bitwise
// those of dot_entries. (An entry whose edge id is out of range adds
// 0 * gathered row instead of nothing: only a malformed perm has one.)
template <int kS, int kU, typename scalar_t, typename index_t, int V>
__device__ __forceinline__ void dot_entries_transposed(at::opmath_type<scalar_t> (&acc)[1][V],
                                                       int64_t r, int64_t lo, int64_t hi,
                                                       const DotParams<scalar_t, index_t>& p,
                                                       const LaneMap<1>& m, int lane) {
  using acc_t = at::opmath_type<scalar_t>;
  static_assert(kS == 4 || kS == 8, "4 or 8 lanes per head");
  // Entries per step: kU = 8 for float32; 2-byte types: see dot_step().
  constexpr int U = kU, kSlots = U / kS;
  static_assert(U % kS == 0, "whole slots");
  const bool with_weight = p.weight != nullptr;
  const unsigned mask = group_mask(p.G);
  const int q = lane & (kS - 1);
  const int head_base = (threadIdx.x & 31) & ~(kS - 1);  // warp lane of the head's lane 0
  const bool valid = m.valid[0];
  const int h = m.head[0], HD = p.HD, H = p.H;
  const IndexBound<index_t> gathered_ok(p.num_gathered), edge_ok(p.num_edges);
  const scalar_t* gathered = p.gathered + m.feat[0];
  const scalar_t* weight = with_weight ? p.weight + h : p.weight;
  const bool with_dots = p.dot_out != nullptr;
  scalar_t* dot_out = with_dots ? p.dot_out + h : p.dot_out;
  const Vec<scalar_t, V> rv = valid && with_dots
                                  ? load_vec<scalar_t, V>(p.rowval + r * p.HD + m.feat[0])
                                  : zero_vec<scalar_t, V>();
#pragma unroll
  for (int v = 0; v < V; ++v) acc[0][v] = 0;
  // A step's indices (StepIndices), one step ahead with 32-bit ones: the
  // gathered rows of all U entries and this lane's own entries' row and edge id.
  using off_t = EntryOffset<index_t>;
  using Step = StepIndices<U, kS, true, index_t>;
  const off_t n = static_cast<off_t>(hi - lo);
  auto load_idx = [&](off_t k0, Step& s_) { s_.load(p.idx, p.perm, lo, k0, n, q); };
  constexpr bool kPrefetch = sizeof(index_t) == 4;
  Step cur;
  if constexpr (kPrefetch) load_idx(0, cur);
  for (off_t k0 = 0; k0 < n; k0 += U) {
    const off_t left = n - k0;  // > 0; the step's entries u < left are the row's
    if constexpr (!kPrefetch) load_idx(k0, cur);
    Vec<scalar_t, V> gv[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      gv[u] = load_vec_if<scalar_t, V>(valid && u < left && gathered_ok(cur.i[u]),
                                      row_at(gathered, cur.i[u], HD));
    bool ok[kSlots];
    acc_t wq[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      ok[s] = valid && s * kS + q < left && gathered_ok(cur.iq[s]) && edge_ok(cur.eq[s]);
      wq[s] = load_value_if(ok[s] && with_weight, row_at(weight, cur.eq[s], H));
    }
    Step next;
    if constexpr (kPrefetch) load_idx(k0 + U, next);
    // 2-byte types widen each gathered row once and use it at once for its
    // dot and (with a weight) its accumulation, so that no widened row
    // outlives its entry (128 registers at 4 blocks). float32 accumulates
    // after the stores, as before session 9: the other order measured 1.1-
    // 1.2% slower on arxiv-like in three calls. Same sums either way.
    constexpr bool kFuseAcc = sizeof(scalar_t) == 2;
    acc_t wu[U];
    if (kFuseAcc && with_weight) {  // uniform
#pragma unroll
      for (int u = 0; u < U; ++u) wu[u] = __shfl_sync(mask, wq[u / kS], head_base + (u % kS));
    }
    acc_t d[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      d[u] = vec_dot(gv[u], rv);
      if (kFuseAcc && with_weight) axpy_vec(acc[0], wu[u], gv[u]);
    }
    if constexpr (kS == 8) transpose_round<4, kS>(d, q, mask);
    transpose_round<2, kS>(d, q, mask);
    transpose_round<1, kS>(d, q, mask);
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (!ok[s] || !with_dots) continue;
      if (p.dot_by_entry) {  // uniform
        store_once(dot_out + (lo + k0 + s * kS + q) * H, static_cast<scalar_t>(d[s * kS]));
      } else {
        *row_at(dot_out, cur.eq[s], H) = static_cast<scalar_t>(d[s * kS]);
      }
    }
    if (!kFuseAcc && with_weight) {  // uniform
#pragma unroll
      for (int u = 0; u < U; ++u)
        axpy_vec(acc[0], __shfl_sync(mask, wq[u / kS], head_base + (u % kS)), gv[u]);
    }
    if constexpr (kPrefetch) cur = next;
  }
}

// Blocks of 128 threads and no block-wide step: long rows are cut into
// slices (SliceList) that any group takes, each writing its partial acc_out
// row to a scratch slot, summed in slice order by sum_slices_kernel. (The
// session-2 kernel ran long rows block-wide: on a reddit-like CSC one SM ran
// 1.57x the average.) Registers then set the warps per multiprocessor.
constexpr int kDotThreads = 128;

#ifndef PMA_DOT_TRANSPOSED_MIN_BLOCKS
#define PMA_DOT_TRANSPOSED_MIN_BLOCKS 4
#endif
#ifndef PMA_DOT_HALF_STEP
#define PMA_DOT_HALF_STEP 8
#endif
#ifndef PMA_DOT_HALF_MIN_BLOCKS
#define PMA_DOT_HALF_MIN_BLOCKS 4
#endif
// Entries per step of the transposed variants: 8 for float32. 2-byte types
// (kS = 4) took U = kS = 4 until session 8, half the loads in flight of a
// float32 step and twice its per-step overhead per entry; U = 8 fits 128
// registers (4 blocks, see dot_min_blocks). A/B on the H200:
// PYG_MULTIHEAD_AGG_DOT_STEP=4|8 for 2-byte types.
template <typename scalar_t>
int dot_step() {
  if (sizeof(scalar_t) == 4) return 8;
  return static_cast<int>(env_int("PYG_MULTIHEAD_AGG_DOT_STEP", PMA_DOT_HALF_STEP, {4, 8}));
}

template <typename scalar_t, int VPL, int kS, int kU>
constexpr int dot_min_blocks() {
  // The transposed variants: float32 at PMA_DOT_TRANSPOSED_MIN_BLOCKS = 4
  // (128 registers, no spill; session 8 measured 1.5-3% faster than 5 blocks
  // at 96 registers and 88 bytes of spill, once the step loop went 32-bit);
  // 2-byte types at PMA_DOT_HALF_MIN_BLOCKS for 8 entries per step: 128
  // registers without spill at 4 since session 9 widens each gathered row
  // once for its dot and its accumulation (it was 168 at 3, or 124 bytes of
  // spill at 4); measured -4 to -8% against 3 blocks. 4 for 4 (dot_step).
  // (float32 at 5 blocks, 96 registers and 72 bytes of spill outside the
  // loop, measured 1-2% slower again in session 9.)
  if (kS != 0) {
    if (sizeof(scalar_t) == 4) return PMA_DOT_TRANSPOSED_MIN_BLOCKS;
    return kU == 8 ? PMA_DOT_HALF_MIN_BLOCKS : 4;
  }
  // float32, one vector per lane: 96 registers, 5 blocks = 20 warps; half
  // types with two vectors per lane would spill ~140 bytes under 128
  // registers, so they get 3 blocks (12 warps; the 256-thread kernel had 8).
  if (VPL >= 4) return 1;
  if (VPL == 2 && sizeof(scalar_t) == 2) return 3;
  return VPL == 1 && sizeof(scalar_t) == 4 ? 5 : 4;
}

// kS = 4 or 8: dot_entries_transposed (one vector per lane, one chunk);
// kS = 0: dot_entries.
template <typename scalar_t, typename index_t, int V, int VPL, int kS, int kU = 8>
__global__ void __launch_bounds__(kDotThreads, dot_min_blocks<scalar_t, VPL, kS, kU>())
    dot_gather_kernel(const DotParams<scalar_t, index_t> p, const SliceList sl) {
  using acc_t = at::opmath_type<scalar_t>;
  const int G = p.G, lane = threadIdx.x & (G - 1);
  const bool with_weight = p.weight != nullptr;
  // Entries [lo, hi) of row r; acc_out's row (slot < 0) or a slice's partial.
  auto entries = [&](int64_t slot, int64_t r, int64_t lo, int64_t hi) {
    for (int chunk = 0; chunk < p.num_chunks; ++chunk) {
      const auto m = lane_map<V, VPL>(chunk, lane, G, p.D, p.HD);
      acc_t acc[VPL][V];
      if constexpr (kS != 0) {
        static_assert(VPL == 1, "one vector per lane");
        dot_entries_transposed<kS, kU>(acc, r, lo, hi, p, m, lane);
      } else {
        dot_entries(acc, r, lo, hi, p, m, lane);
      }
      if (!with_weight) continue;
#pragma unroll
      for (int k = 0; k < VPL; ++k) {
        if (!m.valid[k]) continue;
        if (slot >= 0) {
          store_vec<acc_t, V>(p.part + slot * p.HD + m.feat[k], acc[k]);
        } else {
          store_vec<scalar_t, V>(p.acc_out + r * p.HD + m.feat[k], acc[k]);
        }
      }
    }
  };
  auto row = [&](int64_t r, int64_t lo, int64_t hi) { entries(-1, r, lo, hi); };
  for_each_slice_or_row<kSortFetch<scalar_t>>(p.ptr, p.num_edges, sl, G, entries, row);
}

// ---------------------------------------------------------------------------
// Generic SDDMM, any D and alignment: dot_out[e, h] = <rowval[r, h], gathered[idx[k], h]>
// with e = perm ? perm[k] : k. Lanes stride over d within one head, a butterfly
// over the group per (entry, head). The fallback of the dot-gather kernel.
// ---------------------------------------------------------------------------

template <typename scalar_t, typename index_t>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    sddmm_generic_kernel(const DotParams<scalar_t, index_t> p, const WorkList wl) {
  using acc_t = at::opmath_type<scalar_t>;
  const int G = p.G, lane = threadIdx.x & (G - 1);
  const int group = threadIdx.x / G, groups = kThreads / G;
  const unsigned mask = group_mask(G);

  auto entries = [&](int64_t r, int64_t lo, int64_t hi) {
    const scalar_t* a = p.rowval + r * p.HD;
    for (int64_t k = lo; k < hi; ++k) {
      const int64_t src = load_index(p.idx + k);
      const int64_t e = p.perm != nullptr ? load_index(p.perm + k) : k;
      if (!in_range(e, p.num_edges)) continue;  // group-uniform
      const bool ok = in_range(src, p.num_gathered);
      const scalar_t* b = p.gathered + (ok ? src : 0) * p.HD;
      for (int h = 0; h < p.H; ++h) {
        acc_t dot = 0;
        if (ok)
          for (int d = lane; d < p.D; d += G)
            dot += load_value(a + h * p.D + d) * load_value(b + h * p.D + d);
        for (int off = G >> 1; off > 0; off >>= 1) dot += __shfl_xor_sync(mask, dot, off);
        if (lane == 0) p.dot_out[(p.dot_by_entry ? k : e) * p.H + h] = static_cast<scalar_t>(dot);
      }
    }
  };
  auto short_entries = [&](int64_t, int64_t r, int64_t lo, int64_t hi) { entries(r, lo, hi); };
  auto long_row = [&](int64_t r, int64_t lo, int64_t hi) {
    int64_t slo, shi;
    group_slice(lo, hi, group, groups, slo, shi);
    entries(r, slo, shi);
  };
  for_each_work_item(p.ptr, p.num_edges, wl, G, 1, short_entries, long_row);
}

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

// ---------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------

// The forward of 2-byte types on the tensor cores (tensor_core_gather.cuh)
// when it applies: no weight permutation (the forward, not grad_x), H * D =
// 128 with H = 2, 4 or 8, 16-byte aligned x and out, aligned weight rows, and
// a kernel built for sm_80 or newer. PYG_MULTIHEAD_AGG_TENSOR_CORES=1 takes
// it whenever it applies, 0 never; unset, it is taken for rows of at most
// kTcMaxAvgDegree entries on average. Of its two kernels, the staged one
// (rows copied into shared memory) runs heads of 32 and 64 features and the
// register one heads of 16, where the staged kernel's 16-byte weight rows
// spill (PYG_MULTIHEAD_AGG_TC_STAGED=0 / 1 forces one). Session 16, H200,
// bf16, 4 x 32, against the register kernels: arxiv-like (14 entries a row)
// -14%, products-like (25) -6%, reddit-like (200) +14%. Returns whether it
// launched.
constexpr int64_t kTcMaxAvgDegree = 64;

// A tensor-core kernel's launch facts on the current device, queried once
// per (kernel, device, dynamic shared memory) and cached: whether it was
// built for sm_80 or newer (tc_kernel_built), and its resident blocks per SM
// (after raising its dynamic shared memory limit). Session 16 made these
// three runtime calls on every launch (cudaFuncGetAttributes alone: ~5.6 us
// under torch.profiler). No gain was measurable (session 17, calls 7-8): a
// bf16 forward + backward step on arxiv-like (0.32 ms of kernels) waits on
// Python's 0.45-0.65 ms of host work a step whatever the build.
struct TcLaunchInfo {
  bool built = false;
  int per_sm = 0;
};

template <typename Kernel>
TcLaunchInfo tc_launch_info(Kernel kernel, size_t smem) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, size_t>, TcLaunchInfo> cache;
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel),
                                   static_cast<int>(c10::cuda::current_device()), smem);
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  TcLaunchInfo info;
  info.built = tc_kernel_built(kernel);
  if (info.built) {
    if (smem > 0)
      C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
    C10_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&info.per_sm, kernel, kThreads, smem));
  }
  cache.emplace(key, info);
  return info;
}

// Launches a tensor-core kernel (tc_run's loop) over tiles of 8 rows, as many
// blocks as fit the SMs with `smem` bytes of dynamic shared memory; false
// when the kernel was not built for sm_80 or newer. `List`: the kernel's
// WorkList or SliceList.
template <typename Kernel, typename Params, typename List>
bool launch_tc(Kernel kernel, const Params& t, const List& wl, size_t smem) {
  const TcLaunchInfo info = tc_launch_info(kernel, smem);
  if (!info.built) return false;
  const int per_sm = info.per_sm;
  const int64_t tiles = (t.num_rows + 7) / 8, warps = kThreads / 32;
  const int64_t blocks = std::max<int64_t>(
      1, std::min<int64_t>(static_cast<int64_t>(std::max(per_sm, 1)) * num_sms(),
                           (tiles + warps - 1) / warps));
  kernel<<<static_cast<int>(blocks), kThreads, smem, c10::cuda::getCurrentCUDAStream()>>>(t, wl);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

template <typename scalar_t, typename index_t>
bool try_launch_tc_gather(const GatherParams<scalar_t, index_t>& p, const WorkList& wl) {
  if constexpr (sizeof(scalar_t) != 2) {
    return false;
  } else {
    const int64_t mode = env_int("PYG_MULTIHEAD_AGG_TENSOR_CORES", -1, {0, 1});
    const int64_t staged_mode = env_int("PYG_MULTIHEAD_AGG_TC_STAGED", -1, {0, 1});
    if (mode == 0 || (mode == -1 && p.num_edges > kTcMaxAvgDegree * p.num_rows)) return false;
    if (p.wperm != nullptr || p.HD != 128 || (p.H != 2 && p.H != 4 && p.H != 8)) return false;
    if (!is_aligned(p.x, 16) || !is_aligned(p.out, 16) || !is_aligned(p.weight, 2 * p.H))
      return false;
    const TcGatherParams<scalar_t, index_t> t{p.ptr,      p.idx,      p.weight,   p.x,
                                             p.out,      p.num_rows, p.num_src,  p.num_edges};
    const bool staged = staged_mode == -1 ? p.H <= 4 : staged_mode == 1;
    const size_t smem = staged ? static_cast<size_t>(kThreads / 32) * kTcStages * kTcStageBytes : 0;
    auto launch = [&](auto kernel) { return launch_tc(kernel, t, wl, smem); };
    switch (p.H) {
      case 2:
        return staged ? launch(tc_gather_staged_kernel<scalar_t, index_t, 2>)
                      : launch(tc_gather_kernel<scalar_t, index_t, 2>);
      case 4:
        return staged ? launch(tc_gather_staged_kernel<scalar_t, index_t, 4>)
                      : launch(tc_gather_kernel<scalar_t, index_t, 4>);
      default:
        return staged ? launch(tc_gather_staged_kernel<scalar_t, index_t, 8>)
                      : launch(tc_gather_kernel<scalar_t, index_t, 8>);
    }
  }
}

template <typename scalar_t, typename index_t>
void launch_gather(GatherParams<scalar_t, index_t> p, const at::TensorOptions& options) {
  constexpr int kVec = vec_width<scalar_t>();
  const bool vectorised = p.D % kVec == 0 && is_aligned(p.x, 16) && is_aligned(p.out, 16);
  const auto c = lane_config(vectorised ? p.HD / kVec : p.HD, vectorised);
  p.G = c.G;
  p.num_chunks = c.num_chunks;
  // Split a row's entries over a warp's 32 / G groups when the average row
  // has a step (U = 8 / VPL entries) for each group: bf16 4 x 32 measured
  // 20% faster split on reddit-like (200 entries a row), 2.5% on
  // products-like (25) and 9% slower on arxiv-like (14), where a step per row
  // and group is all there is and the split only adds the shuffles.
  // PYG_MULTIHEAD_AGG_SPLIT_ROWS=0 / 1 forces the choice (A/B, tests). (The
  // same split in dot_gather_kernel spilled 64-92 bytes under its register
  // cap, float32 included, so the backward keeps a column per group.)
  const int64_t subs = 32 / c.G, step = kLoadsInFlight / c.vpl;
  p.split = c.G < 32 && p.num_rows > 0 && p.num_edges >= p.num_rows * subs * step;
  if (const int64_t split = env_int("PYG_MULTIHEAD_AGG_SPLIT_ROWS", -1, {0, 1}); split >= 0)
    p.split = c.G < 32 && split == 1;
  at::Tensor storage;
  const WorkList wl = make_work_list(p.ptr, p.num_rows, p.num_edges, storage, options);
  if (try_launch_tc_gather(p, wl)) return;
  auto stream = c10::cuda::getCurrentCUDAStream();
  auto launch = [&](auto kernel) {
    kernel<<<persistent_grid(kernel, p.num_rows, p.split ? 32 : p.G), kThreads, 0, stream>>>(
        p, wl);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  if (vectorised) {
    // Heads of 4 or 8 lanes, one vector per lane, one chunk: the transposed
    // weight loads (PYG_MULTIHEAD_AGG_TRANSPOSED=0 keeps the per-lane ones).
    const int head_lanes = p.D / kVec;
    const bool transposed = c.vpl == 1 && c.num_chunks == 1 && head_lanes <= c.G &&
                            (head_lanes == 4 || head_lanes == 8) && transposed_dots();
    // Fetches sorted by degree (FetchOrder) when a warp runs several rows.
    const bool sort = kSortFetch<scalar_t> && wl.sort_fetch && !p.split && c.G < 32;
    VPL_SWITCH(c.vpl, kVPL, [&] {
      constexpr bool kOne = kVPL == 1, kSortable = kOne && kSortFetch<scalar_t>;
      // kS = 4 or 8 lanes a head; the sorting instance only where it can sort
      auto launch_transposed = [&](auto heads) {
        constexpr int kS = kOne ? decltype(heads)::value : 0;
        if (kSortable && sort) {
          launch(gather_kernel<scalar_t, index_t, kVec, kVPL, kS, kSortable>);
        } else {
          launch(gather_kernel<scalar_t, index_t, kVec, kVPL, kS>);
        }
      };
      if (transposed && head_lanes == 8) {
        launch_transposed(std::integral_constant<int, 8>{});
      } else if (transposed) {
        launch_transposed(std::integral_constant<int, 4>{});
      } else {
        launch(gather_kernel<scalar_t, index_t, kVec, kVPL, 0>);
      }
    });
  } else if (c.vpl == 1) {
    launch(gather_kernel<scalar_t, index_t, 1, 1, 0>);
  } else {
    launch(gather_kernel<scalar_t, index_t, 1, kMaxVPL, 0>);
  }
}

// Launches the dot-gather kernel when its fast path applies (16-byte vectors,
// D / V a power of two, heads not cut by feature chunks); returns false
// otherwise. With weight == nullptr only dot_out is written; with dot_out ==
// nullptr (and rowval, not read then) only acc_out.
template <typename scalar_t, typename index_t>
bool try_launch_dot_gather(DotParams<scalar_t, index_t> p, const at::TensorOptions& options) {
  constexpr int kVec = vec_width<scalar_t>();
  if (p.D % kVec != 0 || !is_aligned(p.rowval, 16) || !is_aligned(p.gathered, 16) ||
      (p.acc_out != nullptr && !is_aligned(p.acc_out, 16)))
    return false;
  const int vec_per_head = p.D / kVec;
  if ((vec_per_head & (vec_per_head - 1)) != 0) return false;
  const auto c = lane_config(p.HD / kVec, true);
  if (c.num_chunks > 1 && vec_per_head > c.G * c.vpl) return false;
  using acc_t = at::opmath_type<scalar_t>;
  p.G = c.G;
  p.S = std::min(vec_per_head, c.G);
  p.num_chunks = c.num_chunks;
  at::Tensor storage, part;
  int64_t max_slots = 0;
  const SliceList sl = make_slice_list(p.ptr, p.num_rows, p.num_edges, storage, options,
                                       max_slots);
  const bool with_weight = p.weight != nullptr;
  if (with_weight) {
    part = at::empty({max_slots * p.HD}, options.dtype(c10::CppTypeToScalarType<acc_t>::value));
    p.part = part.data_ptr<acc_t>();
  }
  auto stream = c10::cuda::getCurrentCUDAStream();
  const bool transposed = c.num_chunks == 1 && transposed_dots();
  VPL_SWITCH(c.vpl, kVPL, [&] {
    auto run = [&](auto kernel) {
      kernel<<<persistent_grid(kernel, p.num_rows, p.G, 0, kDotThreads), kDotThreads, 0,
               stream>>>(p, sl);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    // kS = 8 only for float32 (as in the fused backward).
    constexpr bool kOne = kVPL == 1, kWide = kOne && sizeof(scalar_t) == 4;
    if (transposed && kWide && p.S == 8) {
      run(dot_gather_kernel<scalar_t, index_t, kVec, kVPL, kWide ? 8 : 0>);
    } else if (transposed && kOne && p.S == 4 && dot_step<scalar_t>() == 4) {
      run(dot_gather_kernel<scalar_t, index_t, kVec, kVPL, kOne ? 4 : 0, kOne && !kWide ? 4 : 8>);
    } else if (transposed && kOne && p.S == 4) {
      run(dot_gather_kernel<scalar_t, index_t, kVec, kVPL, kOne ? 4 : 0>);
    } else {
      run(dot_gather_kernel<scalar_t, index_t, kVec, kVPL, 0>);
    }
  });
  if (with_weight)
    launch_sum_slices<scalar_t, index_t, acc_t>(p.ptr, p.num_edges, sl, p.part, p.acc_out, p.HD,
                                                nullptr, nullptr, 0);
  return true;
}

// The tensor-core backward kernel for H = 2, 4 or 8 heads (H * D = 128).
template <typename scalar_t, typename index_t, bool kDots>
auto tc_dot_kernel_for(int H) {
  return H == 2   ? tc_dot_gather_kernel<scalar_t, index_t, 2, kDots>
         : H == 4 ? tc_dot_gather_kernel<scalar_t, index_t, 4, kDots>
                  : tc_dot_gather_kernel<scalar_t, index_t, 8, kDots>;
}

// The spmm backward of 2-byte types on the tensor cores
// (tensor_core_backward.cuh) when it applies: H * D = 128 with H = 2, 4 or 8,
// a weight (grad_x), 16-byte aligned grad_out and grad_x, weight rows aligned
// to their 2 * H bytes, and a kernel built for sm_80 or newer; with x (both
// gradients) also x 16-byte aligned and dot rows aligned to 2 * H bytes.
// PYG_MULTIHEAD_AGG_TENSOR_CORES=0 never takes it; otherwise it is taken
// whenever it applies. Both gradients: session 17 (H200, bf16, 4 x 32, with
// perm_inv, against the dot-gather kernel in the same run) measured
// arxiv-like 0.285 -> 0.217 ms, products-like 7.18 -> 6.46, reddit-like
// (200 entries a row, where the forward keeps the register kernels) 4.25 ->
// 3.43. grad_x alone (the staged SpMM over the CSC without the dots), against
// the register gather over the CSC, whose hubs run block-wide (session 18,
// call 1): 0.337 -> 0.164, 6.00 -> 4.91, 5.91 -> 2.46 ms. Returns whether
// it launched.
template <typename scalar_t, typename index_t>
bool try_launch_tc_dot_gather(const DotParams<scalar_t, index_t>& p,
                              const at::TensorOptions& options) {
  if constexpr (sizeof(scalar_t) != 2) {
    return false;
  } else {
    const int64_t mode = env_int("PYG_MULTIHEAD_AGG_TENSOR_CORES", -1, {0, 1});
    const bool dots = p.dot_out != nullptr;
    if (mode == 0) return false;
    if (p.HD != 128 || (p.H != 2 && p.H != 4 && p.H != 8)) return false;
    if (p.perm == nullptr || p.weight == nullptr || p.acc_out == nullptr) return false;
    if (!is_aligned(p.gathered, 16) || !is_aligned(p.acc_out, 16) ||
        !is_aligned(p.weight, 2 * p.H))
      return false;
    if (dots && (p.rowval == nullptr || !is_aligned(p.rowval, 16) ||
                 !is_aligned(p.dot_out, 2 * p.H)))
      return false;
    TcDotParams<scalar_t, index_t> t{};
    t.ptr = p.ptr;
    t.idx = p.idx;
    t.weight = p.weight;
    t.x = p.gathered;
    t.out = p.acc_out;
    t.num_rows = p.num_rows;
    t.num_src = p.num_gathered;
    t.num_edges = p.num_edges;
    t.perm = p.perm;
    t.rowval = p.rowval;
    t.dot_out = p.dot_out;
    t.by_entry = p.dot_by_entry;
    auto kernel = dots ? tc_dot_kernel_for<scalar_t, index_t, true>(p.H)
                       : tc_dot_kernel_for<scalar_t, index_t, false>(p.H);
    const size_t smem = static_cast<size_t>(kThreads / 32) * kTcDotStages * kTcDotStageBytes;
    if (!tc_launch_info(kernel, smem).built) return false;
    // Long rows in slices (SliceList), their partial grad_x rows summed by
    // sum_slices_kernel.
    at::Tensor storage;
    int64_t max_slots = 0;
    const SliceList sl = make_slice_list(p.ptr, p.num_rows, p.num_edges, storage, options,
                                         max_slots);
    const at::Tensor part = at::empty({max_slots * 128}, options.dtype(at::kFloat));
    t.part = part.data_ptr<float>();
    launch_tc(kernel, t, sl, smem);
    launch_sum_slices<scalar_t, index_t, float>(p.ptr, p.num_edges, sl, t.part, p.acc_out, 128,
                                                nullptr, nullptr, 0);
    return true;
  }
}

template <typename scalar_t, typename index_t>
void launch_sddmm_generic(DotParams<scalar_t, index_t> p, const at::TensorOptions& options) {
  p.G = next_pow2(p.D);
  p.S = p.G;
  p.num_chunks = 1;
  at::Tensor storage;
  const WorkList wl = make_work_list(p.ptr, p.num_rows, p.num_edges, storage, options);
  auto kernel = sddmm_generic_kernel<scalar_t, index_t>;
  kernel<<<persistent_grid(kernel, p.num_rows, p.G), kThreads, 0,
           c10::cuda::getCurrentCUDAStream()>>>(p, wl);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename scalar_t, typename index_t>
void launch_dot(const DotParams<scalar_t, index_t>& p, const at::TensorOptions& options) {
  if (!try_launch_dot_gather(p, options)) launch_sddmm_generic(p, options);
}

void check_int_width(int64_t H, int64_t D) {
  TORCH_CHECK(H * D <= INT_MAX, "heads * channels must be below 2^31, got ", H, " * ", D);
}

// ---------------------------------------------------------------------------
// Ops
// ---------------------------------------------------------------------------

at::Tensor multihead_spmm_cuda(const at::Tensor& rowptr, const at::Tensor& col,
                               const at::Tensor& weight, const at::Tensor& x,
                               const std::optional<at::Tensor>& /*colptr*/,
                               const std::optional<at::Tensor>& /*row*/,
                               const std::optional<at::Tensor>& /*perm*/,
                               const std::optional<at::Tensor>& /*perm_inv*/) {
  check_spmm(rowptr, col, weight, x);
  TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor for the CUDA kernel");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t N_dst = rowptr.numel() - 1, N_src = x.size(0), H = x.size(1), D = x.size(2);
  const int64_t E = col.numel();
  check_int_width(H, D);
  if (N_dst == 0 || H * D == 0) return at::empty({N_dst, H, D}, x.options());
  if (E == 0) return at::zeros({N_dst, H, D}, x.options());
  const auto rowptr_c = rowptr.contiguous(), col_c = col.contiguous();
  const auto weight_c = weight.contiguous(), x_c = x.contiguous();
  auto out = at::empty({N_dst, H, D}, x.options());
  FLOAT_SWITCH(x.scalar_type(), "multihead_spmm", [&] {
    INDEX_SWITCH(rowptr.scalar_type(), "multihead_spmm", [&] {
      GatherParams<scalar_t, index_t> p{};
      p.ptr = rowptr_c.data_ptr<index_t>();
      p.idx = col_c.data_ptr<index_t>();
      p.wperm = nullptr;
      p.weight = weight_c.data_ptr<scalar_t>();
      p.x = x_c.data_ptr<scalar_t>();
      p.out = out.data_ptr<scalar_t>();
      p.num_rows = N_dst;
      p.num_src = N_src;
      p.num_edges = E;
      p.H = static_cast<int>(H);
      p.D = static_cast<int>(D);
      p.HD = static_cast<int>(H * D);
      launch_gather(p, rowptr.options());
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> multihead_spmm_backward_csc_cuda(
    const at::Tensor& colptr, const at::Tensor& row, const at::Tensor& perm,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& x,
    const at::Tensor& grad_out, const std::optional<at::Tensor>& perm_inv) {
  const int64_t N_src = check_backward_csc(colptr, row, perm, weight, x, grad_out, perm_inv);
  const int64_t E = row.numel(), N_dst = grad_out.size(0), H = grad_out.size(1);
  const int64_t D = grad_out.size(2);
  const bool need_grad_x = weight.has_value(), need_grad_weight = x.has_value();
  TORCH_CHECK(grad_out.is_cuda(), "grad_out must be a CUDA tensor for the CUDA kernel");
  check_int_width(H, D);
  const c10::cuda::CUDAGuard guard(grad_out.device());
  auto grad_x = at::empty({need_grad_x ? N_src : 0, H, D}, grad_out.options());
  // The kernels write every edge's row of grad_weight when perm is a
  // permutation (a CSC's), so it is not zero-filled first (an [E, H] memset,
  // 0.3 ms on products-like float32); a malformed CSC leaves it meaningless,
  // as the CUDA kernels' other outputs (docs/robustness.md). The CPU kernel
  // zero-fills it.
  auto grad_weight = at::empty({need_grad_weight ? E : 0, H}, grad_out.options());
  if ((!need_grad_x && !need_grad_weight) || H * D == 0 || N_src == 0 || E == 0) {
    grad_x.zero_();
    grad_weight.zero_();
    return {grad_x, grad_weight};
  }
  // With perm_inv, the dots go to a scratch [E, H] by CSC entry (runs of
  // consecutive entries per column, instead of 16-byte pieces of 32-byte
  // sectors at random edge ids, which the memory reads, merges and writes
  // back) and one gather through perm_inv puts them in edge order.
  const bool by_entry = need_grad_weight && perm_inv.has_value() && perm_inv->defined();
  const auto inv_c = by_entry ? perm_inv->contiguous() : at::Tensor();
  auto dots = by_entry ? at::empty({E, H}, grad_out.options()) : grad_weight;
  const auto colptr_c = colptr.contiguous(), row_c = row.contiguous(), perm_c = perm.contiguous();
  // (The weights stay read through perm: gathering them into CSC order
  // first, the same way, measured 0.3-0.9 ms slower on products- and
  // reddit-like; session 14, KERNEL_NOTES.)
  const auto go = grad_out.contiguous();
  const auto weight_c = need_grad_x ? weight->contiguous() : at::Tensor();
  const auto x_c = need_grad_weight ? x->contiguous() : at::Tensor();
  FLOAT_SWITCH(go.scalar_type(), "multihead_spmm_backward_csc", [&] {
    INDEX_SWITCH(colptr.scalar_type(), "multihead_spmm_backward_csc", [&] {
      DotParams<scalar_t, index_t> d{};
      d.ptr = colptr_c.data_ptr<index_t>();
      d.idx = row_c.data_ptr<index_t>();
      d.perm = perm_c.data_ptr<index_t>();
      d.rowval = need_grad_weight ? x_c.data_ptr<scalar_t>() : nullptr;
      d.gathered = go.data_ptr<scalar_t>();
      d.weight = need_grad_x ? weight_c.data_ptr<scalar_t>() : nullptr;
      d.acc_out = need_grad_x ? grad_x.data_ptr<scalar_t>() : nullptr;
      d.dot_out = need_grad_weight ? dots.data_ptr<scalar_t>() : nullptr;
      d.dot_by_entry = by_entry;
      d.num_rows = N_src;
      d.num_gathered = N_dst;
      d.num_edges = E;
      d.H = static_cast<int>(H);
      d.D = static_cast<int>(D);
      d.HD = static_cast<int>(H * D);
      // Both gradients in one pass when a fast path applies (the tensor
      // cores for 2-byte types, else the dot-gather kernel).
      if (need_grad_x && need_grad_weight &&
          (try_launch_tc_dot_gather(d, colptr.options()) ||
           try_launch_dot_gather(d, colptr.options()))) {
        if (by_entry) launch_gather_rows<index_t>(dots, inv_c, grad_weight);
        return;
      }
      // grad_x alone: the same kernels without the dots (rowval and dot_out
      // null), whose long CSC rows are sliced; the register gather below runs
      // them block-wide (session 18, call 1: float32 0.588 / 11.03 / 10.29
      // ms on arxiv- / products- / reddit-like, more than both gradients).
      if (need_grad_x && !need_grad_weight &&
          (try_launch_tc_dot_gather(d, colptr.options()) ||
           try_launch_dot_gather(d, colptr.options())))
        return;
      if (need_grad_x) {
        GatherParams<scalar_t, index_t> g{};
        g.ptr = d.ptr;
        g.idx = d.idx;
        g.wperm = d.perm;
        g.weight = d.weight;
        g.x = d.gathered;
        g.out = d.acc_out;
        g.num_rows = N_src;
        g.num_src = N_dst;
        g.num_edges = E;
        g.H = d.H;
        g.D = d.D;
        g.HD = d.HD;
        launch_gather(g, colptr.options());
      }
      if (need_grad_weight) {
        d.weight = nullptr;
        d.acc_out = nullptr;
        launch_dot(d, colptr.options());
        if (by_entry) launch_gather_rows<index_t>(dots, inv_c, grad_weight);
      }
    });
  });
  return {grad_x, grad_weight};
}

at::Tensor multihead_spmm_backward_x_scatter_cuda(const at::Tensor& rowptr, const at::Tensor& col,
                                                  const at::Tensor& weight,
                                                  const at::Tensor& grad_out, int64_t num_src) {
  check_backward_x_scatter(rowptr, col, weight, grad_out, num_src);
  const int64_t N_dst = rowptr.numel() - 1, E = col.numel();
  const int64_t H = grad_out.size(1), D = grad_out.size(2);
  TORCH_CHECK(grad_out.is_cuda(), "grad_out must be a CUDA tensor for the CUDA kernel");
  check_int_width(H, D);
  const c10::cuda::CUDAGuard guard(grad_out.device());
  auto acc = at::zeros({num_src, H, D},
                       grad_out.options().dtype(at::toOpMathType(grad_out.scalar_type())));
  if (acc.numel() == 0 || E == 0 || N_dst == 0) return acc.to(grad_out.scalar_type());
  const auto rowptr_c = rowptr.contiguous(), col_c = col.contiguous();
  const auto weight_c = weight.contiguous(), go = grad_out.contiguous();
  FLOAT_SWITCH(go.scalar_type(), "multihead_spmm_backward_x_scatter", [&] {
    INDEX_SWITCH(rowptr.scalar_type(), "multihead_spmm_backward_x_scatter", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      const int G = next_pow2(H * D);
      at::Tensor storage;
      const auto* rp = rowptr_c.data_ptr<index_t>();
      const WorkList wl = make_work_list(rp, N_dst, E, storage, rowptr.options());
      auto kernel = scatter_kernel<scalar_t, index_t>;
      kernel<<<persistent_grid(kernel, N_dst, G), kThreads, 0,
               c10::cuda::getCurrentCUDAStream()>>>(
          rp, col_c.data_ptr<index_t>(), weight_c.data_ptr<scalar_t>(), go.data_ptr<scalar_t>(),
          acc.data_ptr<acc_t>(), N_dst, num_src, E, static_cast<int>(H), static_cast<int>(D), G,
          wl);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return acc.to(grad_out.scalar_type());
}

at::Tensor multihead_sddmm_cuda(const at::Tensor& rowptr, const at::Tensor& col,
                                const at::Tensor& a, const at::Tensor& b) {
  check_sddmm(rowptr, col, a, b);
  const int64_t N_dst = rowptr.numel() - 1, E = col.numel();
  const int64_t N_src = b.size(0), H = a.size(1), D = a.size(2);
  TORCH_CHECK(a.is_cuda(), "a must be a CUDA tensor for the CUDA kernel");
  check_int_width(H, D);
  const c10::cuda::CUDAGuard guard(a.device());
  if (E * H == 0) return at::empty({E, H}, a.options());
  // D == 0 gives empty dot products; without rows no edge is covered.
  if (D == 0 || N_dst == 0) return at::zeros({E, H}, a.options());
  auto out = at::empty({E, H}, a.options());
  const auto rowptr_c = rowptr.contiguous(), col_c = col.contiguous();
  const auto a_c = a.contiguous(), b_c = b.contiguous();
  FLOAT_SWITCH(a.scalar_type(), "multihead_sddmm", [&] {
    INDEX_SWITCH(rowptr.scalar_type(), "multihead_sddmm", [&] {
      DotParams<scalar_t, index_t> d{};
      d.ptr = rowptr_c.data_ptr<index_t>();
      d.idx = col_c.data_ptr<index_t>();
      d.perm = nullptr;
      d.rowval = a_c.data_ptr<scalar_t>();
      d.gathered = b_c.data_ptr<scalar_t>();
      d.weight = nullptr;
      d.acc_out = nullptr;
      d.dot_out = out.data_ptr<scalar_t>();
      d.num_rows = N_dst;
      d.num_gathered = N_src;
      d.num_edges = E;
      d.H = static_cast<int>(H);
      d.D = static_cast<int>(D);
      d.HD = static_cast<int>(H * D);
      launch_dot(d, rowptr.options());
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(pyg_multihead_agg, CUDA, m) {
  m.impl("multihead_spmm", &multihead_spmm_cuda);
  m.impl("multihead_spmm_backward_csc", &multihead_spmm_backward_csc_cuda);
  m.impl("multihead_spmm_backward_x_scatter", &multihead_spmm_backward_x_scatter_cuda);
  m.impl("multihead_sddmm", &multihead_sddmm_cuda);
}

}  // namespace pyg_multihead_agg
