// CPU kernels of _gat_scores and _gat_scores_backward (csrc/ops.cpp,
// csrc/gat_scores.h): rows in parallel; the atts' gradients summed per fixed
// chunk of rows, then over the chunks in order (the same bits on any number
// of threads).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../gat_scores.h"

namespace pyg_multihead_agg {
namespace {

std::tuple<at::Tensor, at::Tensor> gat_scores_cpu(const at::Tensor& x, const at::Tensor& att_src,
                                                  const std::optional<at::Tensor>& att_dst) {
  const auto a = gat_scores_args(x, att_src, att_dst);
  TORCH_CHECK(x.device().is_cpu(), "x must be a CPU tensor for the CPU kernel");
  auto out = gat_scores_buffers(a);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "_gat_scores", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = a.x.data_ptr<scalar_t>();
    const int64_t H = a.H, C = a.C;
    for (int64_t k = 0; k < a.K; ++k) {
      const acc_t* att = a.att[k].data_ptr<acc_t>();
      acc_t* op = out[k].data_ptr<acc_t>();
      at::parallel_for(0, a.N * H, 1024, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const scalar_t* row = xp + i * C;
          const acc_t* w = att + (i % H) * C;
          acc_t sum = 0;
          for (int64_t c = 0; c < C; ++c) sum += static_cast<acc_t>(row[c]) * w[c];
          op[i] = sum;
        }
      });
    }
  });
  return gat_scores_result(out, a);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gat_scores_backward_cpu(
    const std::optional<at::Tensor>& grad_src, const std::optional<at::Tensor>& grad_dst,
    const at::Tensor& x, const at::Tensor& att_src, const std::optional<at::Tensor>& att_dst,
    bool x_grad, bool att_grad) {
  const auto a = gat_scores_args(x, att_src, att_dst);
  TORCH_CHECK(x.device().is_cpu(), "x must be a CPU tensor for the CPU kernel");
  const auto g = gat_scores_grads(a, grad_src, grad_dst);
  const int64_t K = a.K, N = a.N, H = a.H, C = a.C, HC = H * C;
  auto out = gat_scores_grad_buffers(a, x_grad, att_grad);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, x.scalar_type(), "_gat_scores_backward", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        const scalar_t* xp = a.x.data_ptr<scalar_t>();
        const acc_t* gp[2] = {g[0].defined() ? g[0].data_ptr<acc_t>() : nullptr,
                              g[1].defined() ? g[1].data_ptr<acc_t>() : nullptr};
        const acc_t* att[2] = {a.att[0].data_ptr<acc_t>(),
                               K == 2 ? a.att[1].data_ptr<acc_t>() : nullptr};
        // Per row and head, a contiguous loop over the channels (which the
        // compiler vectorises): no index division per element.
        if (x_grad) {  // grad_x[n, h, c] = sum_k grad_k[n, h] * att_k[h, c]
          scalar_t* gx = out.x.data_ptr<scalar_t>();
          at::parallel_for(0, N, 256, [&](int64_t begin, int64_t end) {
            std::vector<acc_t> v(static_cast<size_t>(C));
            for (int64_t n = begin; n < end; ++n) {
              for (int64_t h = 0; h < H; ++h) {
                std::fill(v.begin(), v.end(), acc_t(0));
                for (int64_t k = 0; k < K; ++k) {
                  if (gp[k] == nullptr) continue;
                  const acc_t gk = gp[k][n * H + h];
                  const acc_t* ak = att[k] + h * C;
                  for (int64_t c = 0; c < C; ++c) v[c] += gk * ak[c];
                }
                scalar_t* row = gx + n * HC + h * C;
                for (int64_t c = 0; c < C; ++c) row[c] = static_cast<scalar_t>(v[c]);
              }
            }
          });
        }
        if (!att_grad) return;
        // att_k[h, c]'s gradient: sum_n grad_k[n, h] * x[n, h, c], per chunk of rows
        const int64_t rows = gat_scores_chunk_rows(N), chunks = (N + rows - 1) / rows;
        std::vector<acc_t> part(static_cast<size_t>(chunks * K * HC), 0);
        at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
          for (int64_t q = begin; q < end; ++q) {
            for (int64_t k = 0; k < K; ++k) {
              if (gp[k] == nullptr) continue;
              acc_t* p = part.data() + (q * K + k) * HC;
              for (int64_t n = q * rows; n < std::min(N, (q + 1) * rows); ++n) {
                for (int64_t h = 0; h < H; ++h) {
                  const acc_t gk = gp[k][n * H + h];
                  const scalar_t* xr = xp + n * HC + h * C;
                  acc_t* ph = p + h * C;
                  for (int64_t c = 0; c < C; ++c) ph[c] += gk * static_cast<acc_t>(xr[c]);
                }
              }
            }
          }
        });
        for (int64_t k = 0; k < K; ++k) {
          acc_t* ga = out.att[k].data_ptr<acc_t>();
          for (int64_t j = 0; j < HC; ++j) {
            acc_t v = 0;
            for (int64_t q = 0; q < chunks; ++q) v += part[(q * K + k) * HC + j];
            ga[j] = v;
          }
        }
      });
  return {out.x, out.att[0], out.att[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(pyg_multihead_agg, CPU, m) {
  m.impl("_gat_scores", &gat_scores_cpu);
  m.impl("_gat_scores_backward", &gat_scores_backward_cpu);
}

}  // namespace pyg_multihead_agg
