// CPU kernels of the fused GATv2 attention (docs/gat_attention.md, GATv2).
//
// Forward: the online-softmax row walk of attention.h (online_softmax_rows),
// all heads of an edge together: each edge's source row x_l[j] is read once,
// for its score
// sum_c att[h, c] * leaky_relu(x_l[j, h, c] + x_r[i, h, c] (+ e_feat[e, h, c]))
// and for the aggregation. float32 accumulation for half types.
//
// Backward, recomputed from lse with the dropout mask regenerated from
// Philox: delta per destination; sources in parallel over the CSC give
// grad_x_l (the aggregation's and the score's parts), grad_e_feat, each
// edge's logit gradient (an E x H buffer) and each source's share of
// grad_att; destinations in parallel over the CSR then give grad_x_r from
// the logit gradients; grad_att is the sum of the sources' shares, column by
// column. Every sum has a fixed order, independent of the thread count, and
// no atomics are needed. Every index is bounds-checked.
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

// The logit of one (edge, head): sum_c att[c] * leaky_relu(z[c]) with
// z = xl + xr (+ ef), z kept in zbuf (acc_t, n entries; none when null) for
// the caller.
template <typename acc_t, typename scalar_t, typename W>
CPU_KERNEL_INLINE acc_t gatv2_logit(const scalar_t* __restrict xl, const acc_t* __restrict xr,
                                    const scalar_t* __restrict ef, const acc_t* __restrict att,
                                    acc_t slope, acc_t* __restrict zbuf, W n) {
  acc_t l = 0;
  for (int64_t c = 0; c < n; ++c) {
    acc_t z = static_cast<acc_t>(xl[c]) + xr[c];
    if (ef != nullptr) z += static_cast<acc_t>(ef[c]);
    if (zbuf != nullptr) zbuf[c] = z;
    l += att[c] * cpu::leaky_relu(z, slope);
  }
  return l;
}

std::tuple<at::Tensor, at::Tensor> gatv2_attention_cpu(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x_l,
    const at::Tensor& x_r, const std::optional<at::Tensor>& e_feat, const at::Tensor& att,
    double negative_slope, double dropout_p, const std::optional<at::Tensor>& philox,
    const std::optional<at::Tensor>& /*colptr*/, const std::optional<at::Tensor>& /*row*/,
    const std::optional<at::Tensor>& /*perm*/, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& /*perm_inv*/) {
  const GatShape s =
      check_gatv2_attention(rowptr, col, x_l, x_r, e_feat, att, dropout_p, philox, bias);
  TORCH_CHECK(x_l.device().is_cpu(), "x_l must be a CPU tensor for the CPU kernel");
  const int64_t N_dst = s.N_dst, N_src = s.N_src, E = s.E, H = s.H, D = s.D, HD = H * D;
  const bool has_edge = e_feat.has_value() && e_feat->defined();
  const bool has_bias = bias.has_value() && bias->defined();
  const auto rowptr_c = rowptr.contiguous(), col_c = col.contiguous();
  const auto xl_c = x_l.contiguous(), xr_c = x_r.contiguous();
  const auto ef_c = has_edge ? e_feat->contiguous() : at::Tensor();
  const cpu::Dropout dropout = cpu::make_dropout(dropout_p, philox);

  auto out = at::empty({N_dst, H, D}, x_l.options());
  auto lse = at::empty({N_dst, H}, x_l.options().dtype(at::toOpMathType(x_l.scalar_type())));

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x_l.scalar_type(), "gatv2_attention_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "gatv2_attention_cpu_index", [&] {
      const index_t* rp = rowptr_c.data_ptr<index_t>();
      const index_t* cp = col_c.data_ptr<index_t>();
      const scalar_t* xlp = xl_c.data_ptr<scalar_t>();
      const scalar_t* xrp = xr_c.data_ptr<scalar_t>();
      const scalar_t* efp = has_edge ? ef_c.data_ptr<scalar_t>() : nullptr;
      const std::vector<acc_t> att_acc = cpu::to_acc<acc_t, scalar_t>(att);
      std::vector<acc_t> bias_acc(HD, acc_t(0));
      if (has_bias) bias_acc = cpu::to_acc<acc_t, scalar_t>(*bias);
      const acc_t* ap = att_acc.data();
      const acc_t* ba = bias_acc.data();
      scalar_t* op = out.data_ptr<scalar_t>();
      acc_t* lp = lse.data_ptr<acc_t>();
      const acc_t slope = static_cast<acc_t>(negative_slope);
      cpu::with_width<scalar_t>(D, [&](auto width) {
        cpu::online_softmax_rows(
            rp, cp, N_dst, N_src, E, H, width, xlp, dropout, dropout_p > 0.0, ba, op, lp,
            [&](int64_t i, std::vector<acc_t>& xr) CPU_KERNEL_INLINE_LAMBDA {
              for (int64_t f = 0; f < HD; ++f) xr[f] = static_cast<acc_t>(xrp[i * HD + f]);
            },
            [&](const std::vector<acc_t>& xr, int64_t e, int64_t j, int64_t f)
                CPU_KERNEL_INLINE_LAMBDA {
              return gatv2_logit(xlp + j * HD + f, xr.data() + f,
                                 efp != nullptr ? efp + e * HD + f : nullptr, ap + f, slope,
                                 static_cast<acc_t*>(nullptr), width);
            },
            [&](acc_t* acc, acc_t w, int64_t, int64_t j, int64_t f) CPU_KERNEL_INLINE_LAMBDA {
              cpu::axpy(acc, w, xlp + j * HD + f, int64_t(width));
            });
      });
    });
  });
  return {out, lse};
}

// The backward (checked by the entry points in checks.h), into the buffers
// `into` (grad_x_l, grad_x_r) when given: out is read in step 1 only, so it
// may be grad_x_l's buffer; x_r[i] is read by step 2 for every entry and by
// step 3 for its own row i, before that row's gradient is written, so x_r
// may be grad_x_r's. (x_l may not be grad_x_l's: step 3 reads it.)
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gatv2_backward(
    const GatShape& s, const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& colptr,
    const at::Tensor& row, const at::Tensor& perm, const at::Tensor& x_l, const at::Tensor& x_r,
    const std::optional<at::Tensor>& e_feat, const at::Tensor& att, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& grad_out, const std::optional<at::Tensor>& grad_lse,
    double negative_slope, double dropout_p, const std::optional<at::Tensor>& philox,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& /*perm_inv*/,
    const at::Tensor* into, const at::Tensor* /*logits*/, const at::Tensor* /*signs*/,
    bool /*consume*/) {
  // perm_inv is only checked: this kernel keeps the logit gradients by edge
  // id. It rebuilds z from x_l[j] and x_r[i] in its own passes (no record).
  TORCH_CHECK(x_l.device().is_cpu(), "x_l must be a CPU tensor for the CPU kernel");
  const int64_t N_dst = s.N_dst, N_src = s.N_src, E = s.E, H = s.H, D = s.D, HD = H * D;
  const bool has_edge = e_feat.has_value() && e_feat->defined();
  const bool has_grad_lse = grad_lse.has_value() && grad_lse->defined();
  const bool has_bias = bias.has_value() && bias->defined();
  const auto bias_c = has_bias ? bias->contiguous() : at::Tensor();
  const auto rowptr_c = rowptr.contiguous(), col_c = col.contiguous();
  const auto colptr_c = colptr.contiguous(), row_c = row.contiguous(), perm_c = perm.contiguous();
  const auto xl_c = x_l.contiguous(), xr_c = x_r.contiguous();
  const auto ef_c = has_edge ? e_feat->contiguous() : at::Tensor();
  const auto out_c = out.contiguous(), lse_c = lse.contiguous(), go = grad_out.contiguous();
  const auto glse_c = has_grad_lse ? grad_lse->contiguous() : at::Tensor();
  const cpu::Dropout dropout = cpu::make_dropout(dropout_p, philox);

  const auto acc_options = x_l.options().dtype(at::toOpMathType(x_l.scalar_type()));
  auto grad_xl = into != nullptr ? into[0] : at::empty({N_src, H, D}, x_l.options());
  auto grad_xr = into != nullptr ? into[1] : at::empty({N_dst, H, D}, x_l.options());
  // Zero-filled: an edge a malformed perm misses reads (and returns) 0.
  auto grad_ef = has_edge ? at::zeros({E, H, D}, x_l.options()) : at::empty({0, H, D}, x_l.options());
  auto gl = at::zeros({E, H}, acc_options);
  auto delta = at::empty({N_dst, H}, acc_options);
  auto att_part = at::empty({N_src, HD}, acc_options);  // each source's share of grad_att
  auto grad_att = at::empty({H, D}, x_l.options());

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x_l.scalar_type(), "gatv2_attention_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "gatv2_attention_backward_cpu_index", [&] {
      const index_t* rp = rowptr_c.data_ptr<index_t>();
      const index_t* cp = col_c.data_ptr<index_t>();
      const index_t* ccp = colptr_c.data_ptr<index_t>();
      const index_t* rwp = row_c.data_ptr<index_t>();
      const index_t* pp = perm_c.data_ptr<index_t>();
      const scalar_t* xlp = xl_c.data_ptr<scalar_t>();
      const scalar_t* xrp = xr_c.data_ptr<scalar_t>();
      const scalar_t* efp = has_edge ? ef_c.data_ptr<scalar_t>() : nullptr;
      const scalar_t* outp = out_c.data_ptr<scalar_t>();
      const scalar_t* bp = has_bias ? bias_c.data_ptr<scalar_t>() : nullptr;
      const scalar_t* gop = go.data_ptr<scalar_t>();
      const acc_t* lp = lse_c.data_ptr<acc_t>();
      const acc_t* glp = has_grad_lse ? glse_c.data_ptr<acc_t>() : nullptr;
      const std::vector<acc_t> att_acc = cpu::to_acc<acc_t, scalar_t>(att);
      const acc_t* ap = att_acc.data();
      acc_t* dp = delta.data_ptr<acc_t>();
      acc_t* glw = gl.data_ptr<acc_t>();
      acc_t* partp = att_part.data_ptr<acc_t>();
      scalar_t* gxlp = grad_xl.data_ptr<scalar_t>();
      scalar_t* gxrp = grad_xr.data_ptr<scalar_t>();
      scalar_t* gefp = has_edge ? grad_ef.data_ptr<scalar_t>() : nullptr;
      const acc_t slope = static_cast<acc_t>(negative_slope);
      const bool has_dropout = dropout_p > 0.0;
      cpu::check_ends(rp, N_dst, E, "rowptr", "col");
      cpu::check_ends(ccp, N_src, E, "colptr", "row");

      // 1. delta per destination; validates the CSR (the last pass reads it).
      cpu::row_deltas(rp, cp, N_dst, N_src, E, H, D, gop, outp, bp, dp);

      cpu::with_width<scalar_t>(D, [&](auto width) {
        // 2. Sources over the CSC: grad_x_l (acc[0, HD)), grad_e_feat, the
        // logit gradients and the source's share of grad_att (acc[HD, 2 HD)).
        // scratch: x_r[i]'s head, then z.
        cpu::csc_source_pass(
            ccp, rwp, pp, N_src, N_dst, E, H, width, gop, lp, dp, glp, dropout, has_dropout, glw,
            2, 2 * int64_t(width),
            [&](std::vector<acc_t>& scratch, int64_t j, int64_t i, int64_t e, int64_t f)
                CPU_KERNEL_INLINE_LAMBDA {
              acc_t* xr = scratch.data();
              for (int64_t d = 0; d < width; ++d) xr[d] = static_cast<acc_t>(xrp[i * HD + f + d]);
              return gatv2_logit(xlp + j * HD + f, xr, efp != nullptr ? efp + e * HD + f : nullptr,
                                 ap + f, slope, xr + int64_t(width), width);
            },
            [&](int64_t j, int64_t i, int64_t, int64_t f) CPU_KERNEL_INLINE_LAMBDA {
              return cpu::dot<acc_t>(gop + i * HD + f, xlp + j * HD + f, int64_t(width));
            },
            [&](acc_t* acc, const std::vector<acc_t>& scratch, int64_t, int64_t i, int64_t e,
                int64_t f, bool keep, acc_t w, acc_t grad_l) CPU_KERNEL_INLINE_LAMBDA {
              const acc_t* z = scratch.data() + int64_t(width);
              if (keep) cpu::axpy(acc + f, w, gop + i * HD + f, int64_t(width));
              scalar_t* gef = gefp != nullptr ? gefp + e * HD + f : nullptr;
              for (int64_t d = 0; d < width; ++d) {
                const bool pos = z[d] > acc_t(0);
                const acc_t gz = grad_l * ap[f + d] * (pos ? acc_t(1) : slope);
                acc[f + d] += gz;
                acc[HD + f + d] += grad_l * (pos ? z[d] : z[d] * slope);
                if (gef != nullptr) gef[d] = static_cast<scalar_t>(gz);
              }
            },
            [&](int64_t j, const acc_t* acc) CPU_KERNEL_INLINE_LAMBDA {
              cpu::store_row(gxlp + j * HD, acc, acc_t(1), static_cast<const acc_t*>(nullptr), HD);
              std::copy(acc + HD, acc + 2 * HD, partp + j * HD);
            });

        // 3. Destinations over the CSR: grad_x_r[i] = sum over the row of
        // grad_l * att * leaky_relu'(z).
        cpu::parallel_rows(rp, N_dst, [&](int64_t begin, int64_t end) CPU_KERNEL_INLINE_LAMBDA {
          std::vector<acc_t> acc(HD), xr(HD), z(width);
          for (int64_t i = begin; i < end; ++i) {
            std::fill(acc.begin(), acc.end(), acc_t(0));
            for (int64_t f = 0; f < HD; ++f) xr[f] = static_cast<acc_t>(xrp[i * HD + f]);
            for (int64_t e = rp[i]; e < rp[i + 1]; ++e) {
              const scalar_t* xj = xlp + static_cast<int64_t>(cp[e]) * HD;
              for (int64_t h = 0; h < H; ++h) {
                const int64_t f = h * width;
                const acc_t grad_l = glw[e * H + h];
                for (int64_t d = 0; d < width; ++d) {
                  acc_t zd = static_cast<acc_t>(xj[f + d]) + xr[f + d];
                  if (efp != nullptr) zd += static_cast<acc_t>(efp[e * HD + f + d]);
                  acc[f + d] += grad_l * ap[f + d] * (zd > acc_t(0) ? acc_t(1) : slope);
                }
              }
            }
            cpu::store_row(gxrp + i * HD, acc.data(), acc_t(1),
                           static_cast<const acc_t*>(nullptr), HD);
          }
        });
      });

      // 4. grad_att: the sources' shares summed in source order, per column.
      scalar_t* gap = grad_att.data_ptr<scalar_t>();
      at::parallel_for(0, HD, 16, [&](int64_t f0, int64_t f1) {
        for (int64_t f = f0; f < f1; ++f) {
          acc_t sum = 0;
          for (int64_t j = 0; j < N_src; ++j) sum += partp[j * HD + f];
          gap[f] = static_cast<scalar_t>(sum);
        }
      });
    });
  });
  return {grad_xl, grad_xr, grad_att, grad_ef};
}

// The training forward: gatv2_attention's outputs and an empty record (the
// CPU backward needs none).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gatv2_attention_record_cpu(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x_l,
    const at::Tensor& x_r, const std::optional<at::Tensor>& e_feat, const at::Tensor& att,
    double negative_slope, double dropout_p, const std::optional<at::Tensor>& philox,
    const std::optional<at::Tensor>& bias) {
  auto [out, lse] = gatv2_attention_cpu(rowptr, col, x_l, x_r, e_feat, att, negative_slope,
                                        dropout_p, philox, std::nullopt, std::nullopt,
                                        std::nullopt, bias, std::nullopt);
  const int64_t H = x_l.size(1), W = (x_l.size(2) + 31) / 32;
  return {out, lse, at::empty({0, H}, lse.options()),
          at::empty({0, H, W}, x_l.options().dtype(at::kInt))};
}

}  // namespace

TORCH_LIBRARY_IMPL(pyg_multihead_agg, CPU, m) {
  m.impl("gatv2_attention", &gatv2_attention_cpu);
  m.impl("_gatv2_attention_record", &gatv2_attention_record_cpu);
  m.impl("gatv2_attention_backward", &gatv2_backward_entry<&gatv2_backward>);
  m.impl("_gatv2_attention_backward_into", &gatv2_backward_into_entry<&gatv2_backward>);
}

}  // namespace pyg_multihead_agg
