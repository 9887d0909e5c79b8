// The row sums of the attention backward, grad_s_dst[i, h] = the sum of
// grad_z over the CSR row i, and their launcher (launch_gat_row_sums,
// launchers.cuh), compiled once.
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/TensorOptions.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>

#include "../utils/dispatch.cuh"
#include "../utils/config.cuh"
#include "../utils/index.cuh"
#include "../utils/sum_slices.cuh"
#include "../utils/vec.cuh"
#include "../utils/work_list.cuh"
#include "heuristics.cuh"
#include "launchers.cuh"
#include "params.cuh"

namespace pyg_multihead_agg {
namespace {

// grad_s_dst[i, h] = sum over the CSR row i of grad_z[e, h]: one warp per
// (row, head), lanes over the edges, a butterfly at the end (fixed order).
// For H > 32; otherwise row_sum_sliced_kernel.
template <typename scalar_t, typename index_t, typename acc_t>
__global__ void __launch_bounds__(kThreads)
    row_sum_kernel(const index_t* __restrict__ rowptr, const acc_t* __restrict__ grad_z,
                   const index_t* __restrict__ perm_inv, scalar_t* __restrict__ grad_s_dst,
                   int64_t num_rows, int64_t num_edges, int H) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
  for (int64_t item = blockIdx.x * static_cast<int64_t>(kThreads / 32) + threadIdx.x / 32;
       item < num_rows * H; item += warps) {
    const int64_t i = item / H;
    const int h = static_cast<int>(item - i * H);
    int64_t lo, hi;
    row_range(rowptr, i, num_edges, lo, hi);
    acc_t s = 0;
    if (perm_inv == nullptr) {
#pragma unroll 4
      for (int64_t e = lo + lane; e < hi; e += 32) s += grad_z[e * H + h];
    } else {
      for (int64_t e = lo + lane; e < hi; e += 32) {
        const int64_t k = load_index(perm_inv + e);
        if (in_range(k, num_edges)) s += grad_z[k * H + h];
      }
    }
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) grad_s_dst[item] = static_cast<scalar_t>(s);
  }
}

// grad_s_dst for H up to 32. A row's grad_z[lo:hi, :] is contiguous: the
// first W = (32 / H) * H lanes of a warp stride over it by W, so that lane l
// sums elements l, l + W, ... (all of head l % H), and the lanes of a head are
// added in a fixed order (a butterfly when H divides 32, else lane h adds
// lanes h + H, h + 2H, ... in turn), leaving head h's sum in lane h. One warp
// per short row, or per slice of a long row (a SliceList over the CSR rows,
// as the backward's over the CSC), the slices' partial sums added in slice
// order by sum_slices_kernel: fixed order, and no hub row runs in one warp
// (row_sum_kernel, one warp per row and head, takes 119 us on arxiv-like and
// 0.55 ms on reddit-like, bound by the hub rows). H that do not divide 32 are
// a second instance, kDividesWarp = false: the power-of-two one keeps its
// constant stride and butterfly, which a run-time stride in the same kernel
// made 6-16% slower (the whole backward 1-1.6%).
template <typename scalar_t, typename index_t, typename acc_t, bool kDividesWarp>
__global__ void __launch_bounds__(kThreads)
    row_sum_sliced_kernel(const index_t* __restrict__ rowptr, const acc_t* __restrict__ grad_z,
                          const index_t* __restrict__ perm_inv, scalar_t* __restrict__ grad_s_dst,
                          acc_t* __restrict__ part, int64_t num_edges, int H,
                          const SliceList sl) {
  const int lane = threadIdx.x & 31;
  // z[first], z[first + stride], ... below n, added in that order, 8
  // predicated loads at a time (the added zeros change no sum). Written as
  // an unrolled loop, a short row (56 values on arxiv-like: two per lane)
  // ran the loop's remainder, one load after the other.
  auto strided_sum = [&](const acc_t* z, int64_t n, int first, int stride) {
    constexpr int kBatch = 8;
    acc_t s = 0;
    for (int64_t k = first; k < n; k += static_cast<int64_t>(stride) * kBatch) {
      acc_t v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) v[b] = load_value_if(k + b * stride < n, z + k + b * stride);
#pragma unroll
      for (int b = 0; b < kBatch; ++b) s += v[b];
    }
    return s;
  };
  // The same sum with grad_z in CSC order: element k of the row is head
  // k % H of edge lo + k / H, at grad_z[perm_inv[edge] * H + k % H]. The
  // stride is a multiple of H, so a lane keeps its head and steps over
  // edges; same elements in the same order, so the same sums. 8 edge
  // positions, then 8 values, in flight.
  auto strided_sum_inv = [&](int64_t lo, int64_t n, int first, int stride) {
    constexpr int kBatch = 8;
    const int h = first % H, estride = stride / H;
    const int64_t edges = n / H;
    acc_t s = 0;
    for (int64_t e = first / H; e < edges; e += static_cast<int64_t>(estride) * kBatch) {
      index_t k[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        k[b] = load_index_if(e + b * estride < edges, perm_inv + lo + e + b * estride);
      acc_t v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        v[b] = load_value_if(e + b * estride < edges && in_range(k[b], num_edges),
                             grad_z + static_cast<int64_t>(k[b]) * H + h);
#pragma unroll
      for (int b = 0; b < kBatch; ++b) s += v[b];
    }
    return s;
  };
  auto sum = [&](int64_t lo, int64_t hi) {
    const acc_t* z = grad_z + lo * H;
    const int64_t n = (hi - lo) * H;
    acc_t s = 0;
    if constexpr (kDividesWarp) {  // W = 32
      s = perm_inv != nullptr ? strided_sum_inv(lo, n, lane, 32) : strided_sum(z, n, lane, 32);
      for (int off = 16; off >= H; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      return s;
    } else {
      const int per_head = 32 / H, W = per_head * H;
      if (lane < W) s = perm_inv != nullptr ? strided_sum_inv(lo, n, lane, W)
                                            : strided_sum(z, n, lane, W);
      acc_t t = s;
      for (int j = 1; j < per_head; ++j) t += __shfl_down_sync(0xffffffffu, s, j * H);
      return t;
    }
  };
  auto slice = [&](int64_t slot, int64_t, int64_t lo, int64_t hi) {
    const acc_t s = sum(lo, hi);
    if (lane < H) part[slot * H + lane] = s;
  };
  auto row = [&](int64_t r, int64_t lo, int64_t hi) {
    const acc_t s = sum(lo, hi);
    if (lane < H) grad_s_dst[r * H + lane] = static_cast<scalar_t>(s);
  };
  for_each_slice_or_row(rowptr, num_edges, sl, 32, slice, row);
}

}  // namespace

template <typename scalar_t, typename index_t>
void launch_gat_row_sums(const AttentionParams<scalar_t, index_t>& p, scalar_t* grad_dst,
                         const index_t* rowptr, const at::TensorOptions& options) {
  using acc_t = at::opmath_type<scalar_t>;
  auto stream = c10::cuda::getCurrentCUDAStream();
  const auto acc_options = options.dtype(c10::CppTypeToScalarType<acc_t>::value);
  if (p.H <= 32) {
    at::Tensor rs_storage;
    int64_t rs_slots = 0;
    const SliceList rsl =
        make_slice_list(rowptr, p.num_gathered, p.num_edges,
                        gat_row_sum_slice_len(p.num_edges), false, rs_storage, options, rs_slots);
    const at::Tensor rs_part = at::empty({rs_slots * p.H}, acc_options);
    auto launch_rows = [&](auto kernel) {
      kernel<<<persistent_grid(kernel, p.num_gathered, 32), kThreads, 0, stream>>>(
          rowptr, p.grad_z, p.perm_inv, grad_dst, rs_part.data_ptr<acc_t>(), p.num_edges, p.H,
          rsl);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (32 % p.H == 0) {
      launch_rows(row_sum_sliced_kernel<scalar_t, index_t, acc_t, true>);
    } else {
      launch_rows(row_sum_sliced_kernel<scalar_t, index_t, acc_t, false>);
    }
    launch_sum_slices<scalar_t, index_t, acc_t>(rowptr, p.num_edges, rsl,
                                                rs_part.data_ptr<acc_t>(), grad_dst, p.H,
                                                nullptr, nullptr, 0);
    return;
  }
  const int64_t warps = p.num_gathered * p.H;
  const int blocks = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>((warps + kThreads / 32 - 1) / (kThreads / 32), num_sms() * 16LL)));
  row_sum_kernel<scalar_t, index_t, acc_t><<<blocks, kThreads, 0, stream>>>(
      rowptr, p.grad_z, p.perm_inv, grad_dst, p.num_gathered, p.num_edges, p.H);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

#define INSTANTIATE(scalar_t, index_t) \
  template void launch_gat_row_sums<scalar_t, index_t>( \
      const AttentionParams<scalar_t, index_t>&, scalar_t*, const index_t*, const at::TensorOptions&);
FOR_EACH_FLOAT_AND_INDEX(INSTANTIATE)
#undef INSTANTIATE

}  // namespace pyg_multihead_agg
