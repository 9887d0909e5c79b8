// CPU kernels of the fused GAT attention (docs/gat_attention.md).
//
// Forward: destination rows in parallel (split by work, loops.h); per row an exact
// two-pass softmax over the row's edges, all heads of an edge together:
// pass 1 takes the maximum logit per head, pass 2 accumulates
// exp(l - max) (the softmax denominator) and exp(l - max) * m * x[j], and the
// row is normalised at the end, and the optional bias added to it before the
// one rounding to the output dtype. float32 accumulation for half types.
//
// Backward: the attention is recomputed from lse and the dropout mask is
// regenerated from Philox. Sources in parallel over the CSC give grad_x and
// grad_s_src (and each edge's grad_z, written once into an E x H buffer);
// destinations in parallel over the CSR then sum that buffer into grad_s_dst.
// Every reduction has a fixed order, so the result is deterministic, and no
// atomics are needed.
//
// Every index is bounds-checked, so malformed graphs raise instead of reading
// out of bounds.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "../checks.h"
#include "../philox.h"
#include "attention.h"
#include "graph_checks.h"
#include "loops.h"

namespace pyg_multihead_agg {
namespace {

using cpu::Dropout;
using cpu::leaky_relu;
using cpu::make_dropout;

std::tuple<at::Tensor, at::Tensor> gat_attention_cpu(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& s_src,
    const at::Tensor& s_dst, const std::optional<at::Tensor>& s_edge, const at::Tensor& x,
    double negative_slope, double dropout_p, const std::optional<at::Tensor>& philox,
    const std::optional<at::Tensor>& /*colptr*/, const std::optional<at::Tensor>& /*row*/,
    const std::optional<at::Tensor>& /*perm*/, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& /*perm_inv*/) {
  const GatShape s =
      check_gat_attention(rowptr, col, s_src, s_dst, s_edge, x, dropout_p, philox, bias);
  TORCH_CHECK(x.device().is_cpu(), "x must be a CPU tensor for the CPU kernel");
  const int64_t N_dst = s.N_dst, N_src = s.N_src, E = s.E, H = s.H, D = s.D, HD = H * D;
  const bool has_edge = s_edge.has_value() && s_edge->defined();
  const bool has_bias = bias.has_value() && bias->defined();
  const auto bias_c = has_bias ? bias->contiguous() : at::Tensor();
  const auto rowptr_c = rowptr.contiguous(), col_c = col.contiguous();
  const auto s_src_c = s_src.contiguous(), s_dst_c = s_dst.contiguous();
  const auto s_edge_c = has_edge ? s_edge->contiguous() : at::Tensor();
  const auto x_c = x.contiguous();
  const Dropout dropout = make_dropout(dropout_p, philox);

  auto out = at::empty({N_dst, H, D}, x.options());
  auto lse = at::empty({N_dst, H}, x.options().dtype(at::toOpMathType(x.scalar_type())));

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "gat_attention_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "gat_attention_cpu_index", [&] {
      const index_t* rp = rowptr_c.data_ptr<index_t>();
      const index_t* cp = col_c.data_ptr<index_t>();
      const scalar_t* ssp = s_src_c.data_ptr<scalar_t>();
      const scalar_t* sdp = s_dst_c.data_ptr<scalar_t>();
      const scalar_t* sep = has_edge ? s_edge_c.data_ptr<scalar_t>() : nullptr;
      const scalar_t* xp = x_c.data_ptr<scalar_t>();
      // bias[h * D + d] in acc_t (zeros without a bias).
      std::vector<acc_t> bias_acc(HD, acc_t(0));
      if (has_bias) {
        const scalar_t* bp = bias_c.data_ptr<scalar_t>();
        for (int64_t f = 0; f < HD; ++f) bias_acc[f] = static_cast<acc_t>(bp[f]);
      }
      const acc_t* ba = bias_acc.data();
      scalar_t* op = out.data_ptr<scalar_t>();
      acc_t* lp = lse.data_ptr<acc_t>();
      const acc_t slope = static_cast<acc_t>(negative_slope);
      const acc_t keep_scale = static_cast<acc_t>(dropout.keep_scale);
      const DropoutRng rng = dropout.rng;
      const bool has_dropout = dropout_p > 0.0;
      cpu::check_ends(rp, N_dst, E, "rowptr", "col");

      cpu::with_width<scalar_t>(D, [&](auto width) {
        cpu::parallel_rows(rp, N_dst, [&](int64_t begin, int64_t end) CPU_KERNEL_INLINE_LAMBDA {
          std::vector<acc_t> acc(HD), row_max(H), row_sum(H), dst(H), p(H);
          for (int64_t i = begin; i < end; ++i) {
            const index_t lo = rp[i], hi = rp[i + 1];
            cpu::check_range(lo, hi, E, "rowptr", i);
            scalar_t* o = op + i * HD;
            acc_t* l_out = lp + i * H;
            if (lo == hi) {  // no edges: out = 0 (+ bias), lse = -inf
              for (int64_t f = 0; f < HD; ++f) o[f] = static_cast<scalar_t>(ba[f]);
              std::fill(l_out, l_out + H, -std::numeric_limits<acc_t>::infinity());
              continue;
            }
            for (int64_t h = 0; h < H; ++h) dst[h] = static_cast<acc_t>(sdp[i * H + h]);
            // z[e, h] = s_src[j, h] + s_dst[i, h] (+ s_edge[e, h]).
            auto logit = [&](int64_t e, int64_t j, int64_t h) CPU_KERNEL_INLINE_LAMBDA {
              acc_t z = static_cast<acc_t>(ssp[j * H + h]) + dst[h];
              if (has_edge) z += static_cast<acc_t>(sep[e * H + h]);
              return leaky_relu(z, slope);
            };

            // Pass 1: the exact row maximum per head (also validates col).
            std::fill(row_max.begin(), row_max.end(), -std::numeric_limits<acc_t>::infinity());
            for (int64_t e = lo; e < hi; ++e) {
              const index_t j = cp[e];
              cpu::check_index_value(j, N_src, "col", e);
              for (int64_t h = 0; h < H; ++h) row_max[h] = std::max(row_max[h], logit(e, j, h));
            }

            // Pass 2: the denominator and the unnormalised, dropped-out sum.
            std::fill(row_sum.begin(), row_sum.end(), acc_t(0));
            std::fill(acc.begin(), acc.end(), acc_t(0));
            for (int64_t e = lo; e < hi; ++e) {
              const int64_t j = cp[e];
              cpu::prefetch_source(xp, cp, e, E, N_src, HD);
              for (int64_t h = 0; h < H; ++h) p[h] = std::exp(logit(e, j, h) - row_max[h]);
              const scalar_t* xr = xp + j * HD;
              unsigned kept = 0;  // dropout bits of heads h .. h + 3 (one Philox call)
              for (int64_t h = 0; h < H; ++h) {
                row_sum[h] += p[h];
                if (has_dropout) {
                  if ((h & 3) == 0) kept = rng.keep4(e, h >> 2);
                  if (!((kept >> (h & 3)) & 1u)) continue;
                }
                cpu::axpy(acc.data() + h * width, p[h] * keep_scale, xr + h * width,
                          int64_t(width));
              }
            }
            for (int64_t h = 0; h < H; ++h) {
              // row_sum >= 1 (the maximum contributes exp(0)).
              l_out[h] = row_max[h] + std::log(row_sum[h]);
              cpu::store_row(o + h * width, acc.data() + h * width, acc_t(1) / row_sum[h],
                             ba + h * width, int64_t(width));
            }
          }
        });
      });
    });
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gat_attention_backward_cpu(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& colptr,
    const at::Tensor& row, const at::Tensor& perm, const at::Tensor& s_src,
    const at::Tensor& s_dst, const std::optional<at::Tensor>& s_edge, const at::Tensor& x,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& grad_out,
    const std::optional<at::Tensor>& grad_lse, double negative_slope, double dropout_p,
    const std::optional<at::Tensor>& philox, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& perm_inv) {
  // perm_inv is only checked: this kernel keeps grad_z by edge id.
  const GatShape s = check_gat_attention_backward(rowptr, col, colptr, row, perm, s_src, s_dst,
                                                  s_edge, x, out, lse, grad_out, grad_lse,
                                                  dropout_p, philox, bias, perm_inv);
  TORCH_CHECK(x.device().is_cpu(), "x must be a CPU tensor for the CPU kernel");
  const int64_t N_dst = s.N_dst, N_src = s.N_src, E = s.E, H = s.H, D = s.D, HD = H * D;
  const bool has_edge = s_edge.has_value() && s_edge->defined();
  const bool has_grad_lse = grad_lse.has_value() && grad_lse->defined();
  const bool has_bias = bias.has_value() && bias->defined();
  const auto bias_c = has_bias ? bias->contiguous() : at::Tensor();
  const auto rowptr_c = rowptr.contiguous(), col_c = col.contiguous();
  const auto colptr_c = colptr.contiguous(), row_c = row.contiguous(), perm_c = perm.contiguous();
  const auto s_src_c = s_src.contiguous(), s_dst_c = s_dst.contiguous();
  const auto s_edge_c = has_edge ? s_edge->contiguous() : at::Tensor();
  const auto x_c = x.contiguous(), out_c = out.contiguous(), lse_c = lse.contiguous();
  const auto go = grad_out.contiguous();
  const auto glse_c = has_grad_lse ? grad_lse->contiguous() : at::Tensor();
  const Dropout dropout = make_dropout(dropout_p, philox);

  const auto acc_options = x.options().dtype(at::toOpMathType(x.scalar_type()));
  auto grad_x = at::empty({N_src, H, D}, x.options());
  auto grad_s_src = at::empty({N_src, H}, x.options());
  auto grad_s_dst = at::empty({N_dst, H}, x.options());
  // delta[i, h] = <grad_out[i, h], out[i, h] - bias[h]> (out is the biased
  // output), and grad_z per edge. gz is zero-filled: should perm not be a
  // permutation, an edge it misses reads 0 rather than uninitialised memory.
  auto delta = at::empty({N_dst, H}, acc_options);
  auto gz = at::zeros({E, H}, acc_options);

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "gat_attention_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "gat_attention_backward_cpu_index", [&] {
      const index_t* rp = rowptr_c.data_ptr<index_t>();
      const index_t* cp = col_c.data_ptr<index_t>();
      const index_t* ccp = colptr_c.data_ptr<index_t>();
      const index_t* rwp = row_c.data_ptr<index_t>();
      const index_t* pp = perm_c.data_ptr<index_t>();
      const scalar_t* ssp = s_src_c.data_ptr<scalar_t>();
      const scalar_t* sdp = s_dst_c.data_ptr<scalar_t>();
      const scalar_t* sep = has_edge ? s_edge_c.data_ptr<scalar_t>() : nullptr;
      const scalar_t* xp = x_c.data_ptr<scalar_t>();
      const scalar_t* outp = out_c.data_ptr<scalar_t>();
      const scalar_t* bp = has_bias ? bias_c.data_ptr<scalar_t>() : nullptr;
      const scalar_t* gop = go.data_ptr<scalar_t>();
      const acc_t* lp = lse_c.data_ptr<acc_t>();
      const acc_t* glp = has_grad_lse ? glse_c.data_ptr<acc_t>() : nullptr;
      acc_t* dp = delta.data_ptr<acc_t>();
      acc_t* gzp = gz.data_ptr<acc_t>();
      scalar_t* gxp = grad_x.data_ptr<scalar_t>();
      scalar_t* gsp = grad_s_src.data_ptr<scalar_t>();
      scalar_t* gdp = grad_s_dst.data_ptr<scalar_t>();
      const acc_t slope = static_cast<acc_t>(negative_slope);
      const acc_t keep_scale = static_cast<acc_t>(dropout.keep_scale);
      const DropoutRng rng = dropout.rng;
      cpu::check_ends(rp, N_dst, E, "rowptr", "col");
      cpu::check_ends(ccp, N_src, E, "colptr", "row");

      const bool has_dropout = dropout_p > 0.0;

      // 1. delta per destination; validates the CSR (the last pass reads it).
      cpu::row_deltas(rp, cp, N_dst, N_src, E, H, D, gop, outp, bp, dp);

      cpu::with_width<scalar_t>(D, [&](auto width) {
        // 2. Sources over the CSC: grad_x, grad_s_src and gz.
        cpu::parallel_rows(ccp, N_src, [&](int64_t begin, int64_t end) CPU_KERNEL_INLINE_LAMBDA {
          std::vector<acc_t> acc_x(HD), acc_s(H), src(H);
          for (int64_t j = begin; j < end; ++j) {
            std::fill(acc_x.begin(), acc_x.end(), acc_t(0));
            std::fill(acc_s.begin(), acc_s.end(), acc_t(0));
            for (int64_t h = 0; h < H; ++h) src[h] = static_cast<acc_t>(ssp[j * H + h]);
            const index_t lo = ccp[j], hi = ccp[j + 1];
            cpu::check_range(lo, hi, E, "colptr", j);
            const scalar_t* xr = xp + j * HD;
            for (int64_t k = lo; k < hi; ++k) {
              const index_t i = rwp[k], e = pp[k];
              cpu::check_index_value(i, N_dst, "row", k);
              cpu::check_index_value(e, E, "perm", k);
              cpu::prefetch_source(gop, rwp, k, E, N_dst, HD);
              const scalar_t* g = gop + static_cast<int64_t>(i) * HD;
              unsigned kept = 0xFu;  // dropout bits of heads h .. h + 3 (one Philox call)
              for (int64_t h = 0; h < H; ++h) {
                if (has_dropout && (h & 3) == 0) kept = rng.keep4(e, h >> 2);
                acc_t z = src[h] + static_cast<acc_t>(sdp[i * H + h]);
                if (has_edge) z += static_cast<acc_t>(sep[e * H + h]);
                const acc_t alpha = std::exp(leaky_relu(z, slope) - lp[i * H + h]);
                // m * dot; 0 for a dropped element (whose dot is not needed).
                acc_t m_dot = 0;
                if ((kept >> (h & 3)) & 1u) {
                  const scalar_t* gh = g + h * width;
                  cpu::axpy(acc_x.data() + h * width, alpha * keep_scale, gh, int64_t(width));
                  m_dot = keep_scale * cpu::dot<acc_t>(gh, xr + h * width, int64_t(width));
                }
                acc_t grad_l = m_dot - dp[i * H + h];
                if (glp != nullptr) grad_l += glp[i * H + h];
                const acc_t grad_z = alpha * grad_l * (z > acc_t(0) ? acc_t(1) : slope);
                acc_s[h] += grad_z;
                gzp[static_cast<int64_t>(e) * H + h] = grad_z;
              }
            }
            cpu::store_row(gxp + j * HD, acc_x.data(), acc_t(1), static_cast<const acc_t*>(nullptr),
                           HD);
            for (int64_t h = 0; h < H; ++h) gsp[j * H + h] = static_cast<scalar_t>(acc_s[h]);
          }
        });
      });

      // 3. Destinations over the CSR: grad_s_dst[i] = sum of the row's gz.
      cpu::parallel_rows(rp, N_dst, [&](int64_t begin, int64_t end) CPU_KERNEL_INLINE_LAMBDA {
        std::vector<acc_t> acc(H);
        for (int64_t i = begin; i < end; ++i) {
          std::fill(acc.begin(), acc.end(), acc_t(0));
          for (int64_t e = rp[i]; e < rp[i + 1]; ++e)
            for (int64_t h = 0; h < H; ++h) acc[h] += gzp[e * H + h];
          for (int64_t h = 0; h < H; ++h) gdp[i * H + h] = static_cast<scalar_t>(acc[h]);
        }
      });
    });
  });

  auto grad_s_edge = has_edge ? gz.to(x.scalar_type()) : at::empty({0, H}, x.options());
  return {grad_x, grad_s_src, grad_s_dst, grad_s_edge};
}

}  // namespace

TORCH_LIBRARY_IMPL(pyg_multihead_agg, CPU, m) {
  m.impl("gat_attention", &gat_attention_cpu);
  m.impl("gat_attention_backward", &gat_attention_backward_cpu);
}

}  // namespace pyg_multihead_agg
