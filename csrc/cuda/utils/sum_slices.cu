// sum_slices_kernel and its launcher (sum_slices.cuh), compiled once for
// every value dtype and both index types.
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>

#include "config.cuh"
#include "dispatch.cuh"
#include "sum_slices.cuh"
#include "vec.cuh"

namespace pyg_multihead_agg {
namespace {

// The second kernel of a sliced pass: for every sliced row r, out_a[r, f] =
// the sum of part_a[slot, f] over r's slots, f < width_a, and the same for b
// (width_b may be 0), in a fixed order, so deterministic. Rows of more than
// kWarpSlices slots (the hubs: ~600 slices on arxiv-like) take a whole block,
// first: its 8 warps each sum a contiguous eighth of the row's slots in slot
// order, and the 8 partials are added in warp order. Every other row takes
// one warp, which sums its slots in slot order, no barrier (most sliced
// columns have at most 8 slots). Slots are loaded in predicated batches
// (lane_sum), 16-byte loads of part_a when width_a is a multiple of 4: a
// plain `s += part[k]` loop keeps one load in flight, one round trip per
// slot. On arxiv-like's spmm backward this kernel takes 16 us, against 35 us
// for a block per row (docs/performance.md, "Sliced rows").
constexpr int kWarpSlices = 16;

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

}  // namespace

// A block per sliced row, for at most as many rows as the slice list can hold.
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

#define INSTANTIATE(scalar_t, index_t)                                                          \
  template void launch_sum_slices<scalar_t, index_t, at::opmath_type<scalar_t>>(                \
      const index_t*, int64_t, const SliceList&, const at::opmath_type<scalar_t>*, scalar_t*, int, \
      const at::opmath_type<scalar_t>*, scalar_t*, int);
FOR_EACH_FLOAT_AND_INDEX(INSTANTIATE)
#undef INSTANTIATE

}  // namespace pyg_multihead_agg
