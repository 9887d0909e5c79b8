// CPU kernels of the fused graph-transformer attention (docs/gat_attention.md,
// transformer_attention): TransformerConv's scaled dot-product score.
//
// Forward: the online-softmax row walk of attention.h (online_softmax_rows),
// all heads of an edge together: the logit scale * <query[i], key[j]
// (+ e_feat[e])> and the aggregation of value[j] (+ e_feat[e]). float32
// accumulation for half types.
//
// Backward, recomputed from lse with the dropout mask regenerated from
// Philox: delta per destination; sources in parallel over the CSC give
// grad_key and grad_value (and grad_e_feat and each edge's logit gradient,
// an E x H buffer); destinations in parallel over the CSR then give
// grad_query. Every sum has a fixed order and no atomics are needed. Every
// index is bounds-checked.
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
#include "attention.h"
#include "graph_checks.h"
#include "loops.h"

namespace pyg_multihead_agg {
namespace {

// sum_c q[c] * (k[c] (+ e[c])) in acc_t, q already in acc_t.
template <typename acc_t, typename scalar_t, typename W>
CPU_KERNEL_INLINE acc_t key_dot(const acc_t* __restrict q, const scalar_t* __restrict k,
                                const scalar_t* __restrict e, W n) {
  acc_t s = 0;
  for (int64_t c = 0; c < n; ++c) {
    acc_t kc = static_cast<acc_t>(k[c]);
    if (e != nullptr) kc += static_cast<acc_t>(e[c]);
    s += q[c] * kc;
  }
  return s;
}

std::tuple<at::Tensor, at::Tensor> transformer_attention_cpu(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& query,
    const at::Tensor& key, const at::Tensor& value, const std::optional<at::Tensor>& e_feat,
    double scale, double dropout_p, const std::optional<at::Tensor>& philox,
    const std::optional<at::Tensor>& /*colptr*/, const std::optional<at::Tensor>& /*row*/,
    const std::optional<at::Tensor>& /*perm*/, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& /*perm_inv*/) {
  const GatShape s = check_transformer_attention(rowptr, col, query, key, value, e_feat,
                                                 dropout_p, philox, bias);
  TORCH_CHECK(key.device().is_cpu(), "key must be a CPU tensor for the CPU kernel");
  const int64_t N_dst = s.N_dst, N_src = s.N_src, E = s.E, H = s.H, D = s.D, HD = H * D;
  const bool has_edge = e_feat.has_value() && e_feat->defined();
  const bool has_bias = bias.has_value() && bias->defined();
  const auto rowptr_c = rowptr.contiguous(), col_c = col.contiguous();
  const auto q_c = query.contiguous(), k_c = key.contiguous(), v_c = value.contiguous();
  const auto ef_c = has_edge ? e_feat->contiguous() : at::Tensor();
  const cpu::Dropout dropout = cpu::make_dropout(dropout_p, philox);

  auto out = at::empty({N_dst, H, D}, key.options());
  auto lse = at::empty({N_dst, H}, key.options().dtype(at::toOpMathType(key.scalar_type())));

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, key.scalar_type(), "transformer_attention_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "transformer_attention_cpu_index", [&] {
      const index_t* rp = rowptr_c.data_ptr<index_t>();
      const index_t* cp = col_c.data_ptr<index_t>();
      const scalar_t* qp = q_c.data_ptr<scalar_t>();
      const scalar_t* kp = k_c.data_ptr<scalar_t>();
      const scalar_t* vp = v_c.data_ptr<scalar_t>();
      const scalar_t* efp = has_edge ? ef_c.data_ptr<scalar_t>() : nullptr;
      std::vector<acc_t> bias_acc(HD, acc_t(0));
      if (has_bias) bias_acc = cpu::to_acc<acc_t, scalar_t>(*bias);
      const acc_t* ba = bias_acc.data();
      scalar_t* op = out.data_ptr<scalar_t>();
      acc_t* lp = lse.data_ptr<acc_t>();
      const acc_t sc = static_cast<acc_t>(scale);
      cpu::with_width<scalar_t>(D, [&](auto width) {
        cpu::online_softmax_rows(
            rp, cp, N_dst, N_src, E, H, width, kp, dropout, dropout_p > 0.0, ba, op, lp,
            [&](int64_t i, std::vector<acc_t>& q) CPU_KERNEL_INLINE_LAMBDA {
              for (int64_t f = 0; f < HD; ++f) q[f] = static_cast<acc_t>(qp[i * HD + f]);
            },
            [&](const std::vector<acc_t>& q, int64_t e, int64_t j, int64_t f)
                CPU_KERNEL_INLINE_LAMBDA {
              return sc * key_dot(q.data() + f, kp + j * HD + f,
                                  efp != nullptr ? efp + e * HD + f : nullptr, width);
            },
            [&](acc_t* acc, acc_t w, int64_t e, int64_t j, int64_t f) CPU_KERNEL_INLINE_LAMBDA {
              cpu::axpy(acc, w, vp + j * HD + f, int64_t(width));
              if (efp != nullptr) cpu::axpy(acc, w, efp + e * HD + f, int64_t(width));
            });
      });
    });
  });
  return {out, lse};
}

// The backward, into the gradient buffers `into` (grad_query, grad_key,
// grad_value; checked by the caller) when given: query is read in step 2,
// out in step 1, value[j] only by source j's own step-2 task, before any of
// them is written, so each buffer may be the tensor it replaces.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> transformer_backward(
    const GatShape& s, const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& colptr,
    const at::Tensor& row, const at::Tensor& perm, const at::Tensor& query,
    const at::Tensor& key, const at::Tensor& value, const std::optional<at::Tensor>& e_feat,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& grad_out,
    const std::optional<at::Tensor>& grad_lse, double scale, double dropout_p,
    const std::optional<at::Tensor>& philox, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& /*perm_inv*/, const at::Tensor* into) {
  // perm_inv is only checked: this kernel keeps the logit gradients by edge id.
  TORCH_CHECK(key.device().is_cpu(), "key must be a CPU tensor for the CPU kernel");
  const int64_t N_dst = s.N_dst, N_src = s.N_src, E = s.E, H = s.H, D = s.D, HD = H * D;
  const bool has_edge = e_feat.has_value() && e_feat->defined();
  const bool has_grad_lse = grad_lse.has_value() && grad_lse->defined();
  const bool has_bias = bias.has_value() && bias->defined();
  const auto bias_c = has_bias ? bias->contiguous() : at::Tensor();
  const auto rowptr_c = rowptr.contiguous(), col_c = col.contiguous();
  const auto colptr_c = colptr.contiguous(), row_c = row.contiguous(), perm_c = perm.contiguous();
  const auto q_c = query.contiguous(), k_c = key.contiguous(), v_c = value.contiguous();
  const auto ef_c = has_edge ? e_feat->contiguous() : at::Tensor();
  const auto out_c = out.contiguous(), lse_c = lse.contiguous(), go = grad_out.contiguous();
  const auto glse_c = has_grad_lse ? grad_lse->contiguous() : at::Tensor();
  const cpu::Dropout dropout = cpu::make_dropout(dropout_p, philox);

  const auto acc_options = key.options().dtype(at::toOpMathType(key.scalar_type()));
  auto grad_q = into != nullptr ? into[0] : at::empty({N_dst, H, D}, key.options());
  auto grad_k = into != nullptr ? into[1] : at::empty({N_src, H, D}, key.options());
  auto grad_v = into != nullptr ? into[2] : at::empty({N_src, H, D}, key.options());
  // Zero-filled: an edge a malformed perm misses reads (and returns) 0.
  auto grad_ef = has_edge ? at::zeros({E, H, D}, key.options()) : at::empty({0, H, D}, key.options());
  auto gl = at::zeros({E, H}, acc_options);
  auto delta = at::empty({N_dst, H}, acc_options);

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, key.scalar_type(), "transformer_attention_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "transformer_attention_backward_cpu_index", [&] {
      const index_t* rp = rowptr_c.data_ptr<index_t>();
      const index_t* cp = col_c.data_ptr<index_t>();
      const index_t* ccp = colptr_c.data_ptr<index_t>();
      const index_t* rwp = row_c.data_ptr<index_t>();
      const index_t* pp = perm_c.data_ptr<index_t>();
      const scalar_t* qp = q_c.data_ptr<scalar_t>();
      const scalar_t* kp = k_c.data_ptr<scalar_t>();
      const scalar_t* vp = v_c.data_ptr<scalar_t>();
      const scalar_t* efp = has_edge ? ef_c.data_ptr<scalar_t>() : nullptr;
      const scalar_t* outp = out_c.data_ptr<scalar_t>();
      const scalar_t* bp = has_bias ? bias_c.data_ptr<scalar_t>() : nullptr;
      const scalar_t* gop = go.data_ptr<scalar_t>();
      const acc_t* lp = lse_c.data_ptr<acc_t>();
      const acc_t* glp = has_grad_lse ? glse_c.data_ptr<acc_t>() : nullptr;
      acc_t* dp = delta.data_ptr<acc_t>();
      acc_t* glw = gl.data_ptr<acc_t>();
      scalar_t* gqp = grad_q.data_ptr<scalar_t>();
      scalar_t* gkp = grad_k.data_ptr<scalar_t>();
      scalar_t* gvp = grad_v.data_ptr<scalar_t>();
      scalar_t* gefp = has_edge ? grad_ef.data_ptr<scalar_t>() : nullptr;
      const acc_t sc = static_cast<acc_t>(scale);
      const bool has_dropout = dropout_p > 0.0;
      cpu::check_ends(rp, N_dst, E, "rowptr", "col");
      cpu::check_ends(ccp, N_src, E, "colptr", "row");

      // 1. delta per destination; validates the CSR (the last pass reads it).
      cpu::row_deltas(rp, cp, N_dst, N_src, E, H, D, gop, outp, bp, dp);

      cpu::with_width<scalar_t>(D, [&](auto width) {
        // 2. Sources over the CSC: grad_key (acc[0, HD)), grad_value
        // (acc[HD, 2 HD)), grad_e_feat and the logit gradients. scratch:
        // query[i]'s head.
        cpu::csc_source_pass(
            ccp, rwp, pp, N_src, N_dst, E, H, width, gop, lp, dp, glp, dropout, has_dropout, glw,
            2, int64_t(width),
            [&](std::vector<acc_t>& q, int64_t j, int64_t i, int64_t e, int64_t f)
                CPU_KERNEL_INLINE_LAMBDA {
              for (int64_t d = 0; d < width; ++d) q[d] = static_cast<acc_t>(qp[i * HD + f + d]);
              return sc * key_dot(q.data(), kp + j * HD + f,
                                  efp != nullptr ? efp + e * HD + f : nullptr, width);
            },
            [&](int64_t j, int64_t i, int64_t e, int64_t f) CPU_KERNEL_INLINE_LAMBDA {
              // <grad_out[i], value[j] (+ e_feat[e])>
              const scalar_t* gh = gop + i * HD + f;
              acc_t dot = 0;
              for (int64_t d = 0; d < width; ++d) {
                acc_t ve = static_cast<acc_t>(vp[j * HD + f + d]);
                if (efp != nullptr) ve += static_cast<acc_t>(efp[e * HD + f + d]);
                dot += static_cast<acc_t>(gh[d]) * ve;
              }
              return dot;
            },
            [&](acc_t* acc, const std::vector<acc_t>& q, int64_t, int64_t i, int64_t e, int64_t f,
                bool keep, acc_t w, acc_t grad_l) CPU_KERNEL_INLINE_LAMBDA {
              const scalar_t* gh = gop + i * HD + f;
              const acc_t gs = grad_l * sc, wk = keep ? w : acc_t(0);
              scalar_t* gef = gefp != nullptr ? gefp + e * HD + f : nullptr;
              for (int64_t d = 0; d < width; ++d) {
                const acc_t gk = gs * q[d];
                const acc_t gv = wk * static_cast<acc_t>(gh[d]);
                acc[f + d] += gk;
                acc[HD + f + d] += gv;
                if (gef != nullptr) gef[d] = static_cast<scalar_t>(gk + gv);
              }
            },
            [&](int64_t j, const acc_t* acc) CPU_KERNEL_INLINE_LAMBDA {
              cpu::store_row(gkp + j * HD, acc, acc_t(1), static_cast<const acc_t*>(nullptr), HD);
              cpu::store_row(gvp + j * HD, acc + HD, acc_t(1), static_cast<const acc_t*>(nullptr),
                             HD);
            });

        // 3. Destinations over the CSR: grad_query[i] = scale * sum over the
        // row of grad_l * (key[j] (+ e_feat[e])).
        cpu::parallel_rows(rp, N_dst, [&](int64_t begin, int64_t end) CPU_KERNEL_INLINE_LAMBDA {
          std::vector<acc_t> acc(HD);
          for (int64_t i = begin; i < end; ++i) {
            std::fill(acc.begin(), acc.end(), acc_t(0));
            for (int64_t e = rp[i]; e < rp[i + 1]; ++e) {
              const scalar_t* kj = kp + static_cast<int64_t>(cp[e]) * HD;
              const scalar_t* ee = efp != nullptr ? efp + e * HD : nullptr;
              for (int64_t h = 0; h < H; ++h) {
                const int64_t f = h * width;
                const acc_t gs = glw[e * H + h] * sc;
                cpu::axpy(acc.data() + f, gs, kj + f, int64_t(width));
                if (ee != nullptr) cpu::axpy(acc.data() + f, gs, ee + f, int64_t(width));
              }
            }
            cpu::store_row(gqp + i * HD, acc.data(), acc_t(1), static_cast<const acc_t*>(nullptr),
                           HD);
          }
        });
      });
    });
  });
  return {grad_q, grad_k, grad_v, grad_ef};
}

}  // namespace

TORCH_LIBRARY_IMPL(pyg_multihead_agg, CPU, m) {
  m.impl("transformer_attention", &transformer_attention_cpu);
  m.impl("transformer_attention_backward", &transformer_backward_entry<&transformer_backward>);
  m.impl("_transformer_attention_backward_into",
         &transformer_backward_into_entry<&transformer_backward>);
}

}  // namespace pyg_multihead_agg
