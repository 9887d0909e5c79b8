// CUDA kernels of _gat_scores and _gat_scores_backward (csrc/ops.cpp,
// csrc/gat_scores.h): both scores in one launch, their backward in two (the
// gradient of x with the atts' partial sums per fixed chunk of rows, then
// the chunks summed in a fixed order: deterministic, no atomics).
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "../../gat_scores.h"
#include "../utils/config.cuh"
#include "../utils/dispatch.cuh"

namespace pyg_multihead_agg {
namespace {

constexpr int kScoreThreads = 256;

// s_k[n, h] = sum_c x[n, h, c] * att_k[h, c]: a thread per (n, h).
template <typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(kScoreThreads)
    gat_scores_kernel(const scalar_t* __restrict__ x, const acc_t* __restrict__ att0,
                      const acc_t* __restrict__ att1, acc_t* __restrict__ s0,
                      acc_t* __restrict__ s1, int64_t NH, int H, int C) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < NH;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const scalar_t* row = x + i * C;
    const int64_t h = i % H;
    acc_t v0 = 0, v1 = 0;
    for (int c = 0; c < C; ++c) {
      const acc_t v = static_cast<acc_t>(row[c]);
      v0 += v * att0[h * C + c];
      if (att1 != nullptr) v1 += v * att1[h * C + c];
    }
    s0[i] = v0;
    if (att1 != nullptr) s1[i] = v1;
  }
}

// A block per chunk of `rows` rows, its threads over the H * C columns j:
// grad_x[n, j] = sum_k g_k[n, j / C] * att_k[j] for the chunk's rows, and
// part[chunk, k, j] = sum over them, in row order, of g_k[n, j / C] * x[n, j]
// (g_k null: zero).
template <typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(kScoreThreads)
    gat_scores_backward_kernel(const acc_t* __restrict__ g0, const acc_t* __restrict__ g1,
                               const scalar_t* __restrict__ x, const acc_t* __restrict__ att0,
                               const acc_t* __restrict__ att1, scalar_t* __restrict__ grad_x,
                               acc_t* __restrict__ part, int64_t N, int H, int C, int K,
                               int64_t rows) {
  const int64_t HC = static_cast<int64_t>(H) * C, chunk = blockIdx.x;
  const int64_t first = chunk * rows, last = min(N, first + rows);
  for (int64_t j = threadIdx.x; j < HC; j += blockDim.x) {
    const int64_t h = j / C;
    const acc_t a0 = att0[j], a1 = att1 != nullptr ? att1[j] : acc_t(0);
    acc_t p0 = 0, p1 = 0;
    for (int64_t n = first; n < last; ++n) {
      const acc_t u0 = g0 != nullptr ? g0[n * H + h] : acc_t(0);
      const acc_t u1 = g1 != nullptr ? g1[n * H + h] : acc_t(0);
      if (grad_x != nullptr) grad_x[n * HC + j] = static_cast<scalar_t>(u0 * a0 + u1 * a1);
      if (part != nullptr) {
        const acc_t v = static_cast<acc_t>(x[n * HC + j]);
        p0 += u0 * v;
        p1 += u1 * v;
      }
    }
    if (part != nullptr) {
      part[chunk * K * HC + j] = p0;
      if (K == 2) part[chunk * K * HC + HC + j] = p1;
    }
  }
}

// out_k[j] = sum over the chunks q of part[q, k, j]: a block per (k, j), its
// threads over the chunks in a fixed order, then a fixed tree.
template <typename acc_t>
__global__ void __launch_bounds__(kScoreThreads)
    sum_chunks_kernel(const acc_t* __restrict__ part, acc_t* __restrict__ out0,
                      acc_t* __restrict__ out1, int64_t chunks, int64_t HC, int K) {
  __shared__ acc_t s[kScoreThreads];
  const int64_t i = blockIdx.x;  // k * HC + j
  acc_t v = 0;
  for (int64_t q = threadIdx.x; q < chunks; q += kScoreThreads) v += part[q * K * HC + i];
  s[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kScoreThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) (i < HC ? out0[i] : out1[i - HC]) = s[0];
}

std::tuple<at::Tensor, at::Tensor> gat_scores_cuda(const at::Tensor& x, const at::Tensor& att_src,
                                                   const std::optional<at::Tensor>& att_dst) {
  const auto a = gat_scores_args(x, att_src, att_dst);
  TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor for the CUDA kernel");
  const c10::cuda::CUDAGuard guard(x.device());
  auto out = gat_scores_buffers(a);
  const int64_t NH = a.N * a.H;
  if (NH > 0 && a.C > 0) {
    FLOAT_SWITCH(x.scalar_type(), "_gat_scores", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      const int blocks = static_cast<int>(std::min<int64_t>(
          (NH + kScoreThreads - 1) / kScoreThreads, static_cast<int64_t>(num_sms()) * 32));
      gat_scores_kernel<scalar_t, acc_t>
          <<<blocks, kScoreThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
              a.x.data_ptr<scalar_t>(), a.att[0].data_ptr<acc_t>(),
              a.K == 2 ? a.att[1].data_ptr<acc_t>() : nullptr, out[0].data_ptr<acc_t>(),
              a.K == 2 ? out[1].data_ptr<acc_t>() : nullptr, NH, static_cast<int>(a.H),
              static_cast<int>(a.C));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  } else {
    for (auto& t : out) t.zero_();  // no channels: the sums are zero
  }
  return gat_scores_result(out, a);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gat_scores_backward_cuda(
    const std::optional<at::Tensor>& grad_src, const std::optional<at::Tensor>& grad_dst,
    const at::Tensor& x, const at::Tensor& att_src, const std::optional<at::Tensor>& att_dst,
    bool x_grad, bool att_grad) {
  const auto a = gat_scores_args(x, att_src, att_dst);
  TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor for the CUDA kernel");
  const c10::cuda::CUDAGuard guard(x.device());
  const auto g = gat_scores_grads(a, grad_src, grad_dst);
  const int64_t N = a.N, HC = a.H * a.C;
  auto out = gat_scores_grad_buffers(a, x_grad, att_grad);
  if (N == 0 || HC == 0) {
    for (auto& t : out.att) t.zero_();
    return {out.x, out.att[0], out.att[1]};
  }
  if (!x_grad && !att_grad) return {out.x, out.att[0], out.att[1]};
  const int64_t rows = gat_scores_chunk_rows(N), chunks = (N + rows - 1) / rows;
  const auto part = att_grad ? at::empty({chunks, a.K, HC}, out.att[0].options()) : at::Tensor();
  auto stream = c10::cuda::getCurrentCUDAStream();
  FLOAT_SWITCH(x.scalar_type(), "_gat_scores_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto ptr = [](const at::Tensor& t) { return t.defined() ? t.data_ptr<acc_t>() : nullptr; };
    const int threads = static_cast<int>(std::min<int64_t>(kScoreThreads, (HC + 31) / 32 * 32));
    gat_scores_backward_kernel<scalar_t, acc_t>
        <<<static_cast<unsigned>(chunks), threads, 0, stream>>>(
            ptr(g[0]), ptr(g[1]), a.x.data_ptr<scalar_t>(), a.att[0].data_ptr<acc_t>(),
            a.K == 2 ? a.att[1].data_ptr<acc_t>() : nullptr,
            x_grad ? out.x.data_ptr<scalar_t>() : nullptr, ptr(part), N,
            static_cast<int>(a.H), static_cast<int>(a.C), static_cast<int>(a.K), rows);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (att_grad) {
      sum_chunks_kernel<acc_t><<<static_cast<unsigned>(a.K * HC), kScoreThreads, 0, stream>>>(
          part.data_ptr<acc_t>(), out.att[0].data_ptr<acc_t>(),
          a.K == 2 ? out.att[1].data_ptr<acc_t>() : nullptr, chunks, HC,
          static_cast<int>(a.K));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
  return {out.x, out.att[0], out.att[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(pyg_multihead_agg, CUDA, m) {
  m.impl("_gat_scores", &gat_scores_cuda);
  m.impl("_gat_scores_backward", &gat_scores_backward_cuda);
}

}  // namespace pyg_multihead_agg
