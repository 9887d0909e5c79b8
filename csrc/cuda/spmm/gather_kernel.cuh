// gather_kernel: out[r] = sum_{e in row r} weight[e or wperm[e], h] * x[idx[e], h, :],
// the spmm forward over the CSR and grad_x over the CSC (wperm = perm), on
// the CUDA cores.
//
// Layout of the work. A row of H*D features is cut into 16-byte vectors
// (8 halves, 4 floats, 2 doubles) when D is a multiple of the vector width
// and the pointers are aligned, else into single elements (the scalar path).
// A group of G lanes (a power of two <= 32, G*VPL vectors covering the row)
// handles one compressed row; lane `l` owns the vectors
//     v = chunk * G * VPL + l + G * k,   k < VPL,
// i.e. features [v*V, v*V + V), all of head v*V / D. In PyTorch terms, for
// one feature chunk:
//     acc[l, k] = sum_e weight[e, head(v)] * x[col[e]].view(-1, V)[v]
// with the row's edges unrolled by U = 8 / VPL so that 8 gathers per lane are
// in flight. Rows wider than 32 * 4 vectors loop over feature chunks. Rows
// narrower than a warp (G < 32) may instead take a whole warp, its 32 / G
// groups splitting the row's steps (GatherParams::split). Every load of a
// step is a predicated inline-PTX load (load_vec_if and friends in
// utils/vec.cuh), with no branch between them.
//
// Load balance. Rows with more than `long_threshold` edges are listed by a
// first tiny kernel (make_work_list); the kernel is persistent and takes work
// items from an atomic counter: first the long rows, each split over all the
// groups of a block (contiguous edge slices, partial sums reduced through
// shared memory in a fixed order, so the result is deterministic), then short
// rows, one per group. Hubs thus start first and spread over 8 warps instead
// of stalling one warp at the end of the grid.
#pragma once

#include <ATen/OpMathType.h>

#include <cstdint>

#include "../utils/config.cuh"
#include "../utils/index.cuh"
#include "../utils/lanes.cuh"
#include "../utils/vec.cuh"
#include "../utils/work_list.cuh"
#include "params.cuh"

namespace pyg_multihead_agg {

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

// gather_entries for one vector per lane and heads of kS = 4 or 8 lanes:
// gather_step's lanes each load the weight of every entry for their head (kS
// lanes the same value) and check its index; here lane q of a head loads the
// weight of entries q (and q + 4 when kS = 4) of the step's 8, and one
// shuffle per entry hands it to the head's lanes (per entry, the per-lane
// float32 gather issued 53 warp instructions and the bf16 one 37, at 64% of
// the issue slots). Same products in the same order, so out is bitwise
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
  // entries' weight rows (StepIndices), one step ahead with 32-bit indices,
  // 2-byte types included: 5-15% faster than without, and without spill in
  // the step loop since `widen` (utils/vec.cuh) unpacks bf16 without PRMTs.
  // Offsets from lo in the index's width (EntryOffset).
  using off_t = EntryOffset<index_t>;
  using Step = StepIndices<U, kS, false, index_t>;
  const off_t n = static_cast<off_t>(hi - lo);
  auto load_idx = [&](off_t e, Step& s_) { s_.load(p.idx, p.wperm, lo, e, n, q); };
  constexpr bool kPrefetch = sizeof(index_t) == 4;
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

namespace {  // internal linkage: each instance is launched by one .cu
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
}  // namespace

}  // namespace pyg_multihead_agg
