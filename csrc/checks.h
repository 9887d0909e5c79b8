// Input checks shared by the CPU and CUDA entry points. Messages name the
// argument and what was expected; the Python fake implementations in
// pyg_multihead_agg/ops.py mirror them.
#pragma once

#include <ATen/MemoryOverlap.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <initializer_list>
#include <optional>
#include <tuple>
#include <utility>

namespace pyg_multihead_agg {

inline void check_defined(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.defined(), name, " must be a tensor, got None");
}

inline void check_index(const at::Tensor& t, const char* name) {
  check_defined(t, name);
  TORCH_CHECK(t.dim() == 1, name, " must be a 1-D tensor, got ", t.dim(), " dimensions");
  TORCH_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, name,
              " must be int32 or int64, got ", t.scalar_type());
}

inline void check_value(const at::Tensor& t, const char* name, int64_t dim) {
  check_defined(t, name);
  TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dimensions, got ", t.dim());
  const auto s = t.scalar_type();
  TORCH_CHECK(s == at::kHalf || s == at::kBFloat16 || s == at::kFloat || s == at::kDouble, name,
              " must be float16, bfloat16, float32 or float64, got ", s);
}

inline void check_same_device(const at::Tensor& a, const char* name_a, const at::Tensor& b,
                              const char* name_b) {
  TORCH_CHECK(a.device() == b.device(), name_a, " and ", name_b,
              " must be on the same device, got ", a.device(), " and ", b.device());
}

inline void check_same_dtype(const at::Tensor& a, const char* name_a, const at::Tensor& b,
                             const char* name_b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), name_a, " and ", name_b,
              " must have the same dtype, got ", a.scalar_type(), " and ", b.scalar_type());
}

// A CSR (ptr, idx) pair; returns the number of rows.
inline int64_t check_compressed(const at::Tensor& ptr, const char* ptr_name, const at::Tensor& idx,
                                const char* idx_name) {
  check_index(ptr, ptr_name);
  check_index(idx, idx_name);
  check_same_dtype(ptr, ptr_name, idx, idx_name);
  check_same_device(ptr, ptr_name, idx, idx_name);
  TORCH_CHECK(ptr.numel() >= 1, ptr_name, " must have at least one element (num_rows + 1)");
  return ptr.numel() - 1;
}

inline void check_spmm(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& weight,
                       const at::Tensor& x) {
  check_compressed(rowptr, "rowptr", col, "col");
  check_value(weight, "weight", 2);
  check_value(x, "x", 3);
  check_same_dtype(weight, "weight", x, "x");
  check_same_device(rowptr, "rowptr", weight, "weight");
  check_same_device(weight, "weight", x, "x");
  TORCH_CHECK(weight.size(0) == col.numel(), "weight must have one row per edge: weight.size(0) (",
              weight.size(0), ") != col.numel() (", col.numel(), ")");
  TORCH_CHECK(weight.size(1) == x.size(1), "weight.size(1) (", weight.size(1),
              ") must equal the number of heads x.size(1) (", x.size(1), ")");
}

// The optional inverse of a CSC's perm: perm's index dtype, on `ref`'s
// device, one entry per edge (values are checked by validate=True only).
inline void check_perm_inv(const std::optional<at::Tensor>& perm_inv, const at::Tensor& perm,
                           const at::Tensor& ref, const char* ref_name, int64_t E) {
  if (!perm_inv.has_value() || !perm_inv->defined()) return;
  check_index(*perm_inv, "perm_inv");
  check_same_dtype(*perm_inv, "perm_inv", perm, "perm");
  check_same_device(*perm_inv, "perm_inv", ref, ref_name);
  TORCH_CHECK(perm_inv->numel() == E, "perm_inv must have one entry per edge (", E, "), got ",
              perm_inv->numel());
}

// multihead_spmm_backward_csc; returns the number of sources.
inline int64_t check_backward_csc(const at::Tensor& colptr, const at::Tensor& row,
                                  const at::Tensor& perm, const std::optional<at::Tensor>& weight,
                                  const std::optional<at::Tensor>& x, const at::Tensor& grad_out,
                                  const std::optional<at::Tensor>& perm_inv = std::nullopt) {
  const int64_t N_src = check_compressed(colptr, "colptr", row, "row");
  check_index(perm, "perm");
  check_same_dtype(perm, "perm", row, "row");
  check_same_device(perm, "perm", row, "row");
  check_value(grad_out, "grad_out", 3);
  check_same_device(colptr, "colptr", grad_out, "grad_out");
  const int64_t E = row.numel(), H = grad_out.size(1), D = grad_out.size(2);
  TORCH_CHECK(perm.numel() == E, "perm must have one entry per edge: perm.numel() (", perm.numel(),
              ") != row.numel() (", E, ")");
  if (weight.has_value()) {
    check_value(*weight, "weight", 2);
    check_same_dtype(*weight, "weight", grad_out, "grad_out");
    check_same_device(*weight, "weight", grad_out, "grad_out");
    TORCH_CHECK(weight->size(0) == E && weight->size(1) == H, "weight must have shape [", E, ", ",
                H, "] (edges, heads), got ", weight->sizes());
  }
  if (x.has_value()) {
    check_value(*x, "x", 3);
    check_same_dtype(*x, "x", grad_out, "grad_out");
    check_same_device(*x, "x", grad_out, "grad_out");
    TORCH_CHECK(x->size(0) == N_src && x->size(1) == H && x->size(2) == D, "x must have shape [",
                N_src, ", ", H, ", ", D, "] (colptr.numel() - 1, heads, channels), got ",
                x->sizes());
  }
  check_perm_inv(perm_inv, perm, grad_out, "grad_out", E);
  return N_src;
}

// multihead_spmm_backward_x_scatter.
inline void check_backward_x_scatter(const at::Tensor& rowptr, const at::Tensor& col,
                                     const at::Tensor& weight, const at::Tensor& grad_out,
                                     int64_t num_src) {
  check_compressed(rowptr, "rowptr", col, "col");
  check_value(weight, "weight", 2);
  check_value(grad_out, "grad_out", 3);
  check_same_dtype(weight, "weight", grad_out, "grad_out");
  check_same_device(rowptr, "rowptr", grad_out, "grad_out");
  check_same_device(weight, "weight", grad_out, "grad_out");
  const int64_t N_dst = rowptr.numel() - 1, E = col.numel(), H = grad_out.size(1);
  TORCH_CHECK(num_src >= 0, "num_src must be non-negative, got ", num_src);
  TORCH_CHECK(grad_out.size(0) == N_dst, "grad_out.size(0) (", grad_out.size(0),
              ") must equal rowptr.numel() - 1 (", N_dst, ")");
  TORCH_CHECK(weight.size(0) == E && weight.size(1) == H, "weight must have shape [", E, ", ", H,
              "] (edges, heads), got ", weight.sizes());
}

// multihead_sddmm.
inline void check_sddmm(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& a,
                        const at::Tensor& b) {
  check_compressed(rowptr, "rowptr", col, "col");
  check_value(a, "a", 3);
  check_value(b, "b", 3);
  check_same_dtype(a, "a", b, "b");
  check_same_device(rowptr, "rowptr", a, "a");
  check_same_device(a, "a", b, "b");
  const int64_t N_dst = rowptr.numel() - 1;
  TORCH_CHECK(a.size(0) == N_dst, "a.size(0) (", a.size(0), ") must equal rowptr.numel() - 1 (",
              N_dst, ")");
  TORCH_CHECK(b.size(1) == a.size(1) && b.size(2) == a.size(2),
              "a and b must agree in heads and channels, got ", a.sizes(), " and ", b.sizes());
}

// gat_attention: returns (N_dst, N_src, E, H, D).
struct GatShape {
  int64_t N_dst, N_src, E, H, D;
};

// The dropout key: an int64 [seed, offset] on the CPU (read on the host), or
// on the GPU of the features x (read by the kernels, contiguous: the form a
// CUDA graph's replays refill).
inline void check_philox(const std::optional<at::Tensor>& philox, double dropout_p,
                         const at::Tensor& x) {
  TORCH_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0,
              "dropout_p must lie in [0, 1], got ", dropout_p);
  if (dropout_p > 0.0) {
    TORCH_CHECK(philox.has_value() && philox->defined(),
                "philox (an int64 tensor [seed, offset]) is required when dropout_p > 0");
  }
  if (philox.has_value() && philox->defined()) {
    const bool on_gpu = x.is_cuda() && philox->device() == x.device();
    TORCH_CHECK(philox->scalar_type() == at::kLong && philox->numel() == 2 &&
                    (philox->device().is_cpu() || (on_gpu && philox->is_contiguous())),
                "philox must be an int64 tensor of 2 elements [seed, offset] on the CPU",
                x.is_cuda() ? " or, contiguous, on the features' device" : "", ", got ",
                philox->scalar_type(), " with shape ", philox->sizes(), " on ",
                philox->device());
  }
}

// The optional bias [H, D] of gat_attention (and its backward).
inline void check_gat_bias(const std::optional<at::Tensor>& bias, const at::Tensor& x,
                           int64_t H, int64_t D) {
  if (!bias.has_value() || !bias->defined()) return;
  check_value(*bias, "bias", 2);
  check_same_dtype(*bias, "bias", x, "x");
  check_same_device(*bias, "bias", x, "x");
  TORCH_CHECK(bias->size(0) == H && bias->size(1) == D, "bias must have shape [", H, ", ", D,
              "] (heads, channels: x.size(1), x.size(2)), got ", bias->sizes());
}

inline GatShape check_gat_attention(const at::Tensor& rowptr, const at::Tensor& col,
                                    const at::Tensor& s_src, const at::Tensor& s_dst,
                                    const std::optional<at::Tensor>& s_edge, const at::Tensor& x,
                                    double dropout_p, const std::optional<at::Tensor>& philox,
                                    const std::optional<at::Tensor>& bias) {
  GatShape s;
  s.N_dst = check_compressed(rowptr, "rowptr", col, "col");
  check_value(x, "x", 3);
  check_value(s_src, "s_src", 2);
  check_value(s_dst, "s_dst", 2);
  check_same_dtype(s_src, "s_src", x, "x");
  check_same_dtype(s_dst, "s_dst", x, "x");
  check_same_device(rowptr, "rowptr", x, "x");
  check_same_device(s_src, "s_src", x, "x");
  check_same_device(s_dst, "s_dst", x, "x");
  s.N_src = x.size(0);
  s.H = x.size(1);
  s.D = x.size(2);
  s.E = col.numel();
  TORCH_CHECK(s_src.size(0) == s.N_src && s_src.size(1) == s.H, "s_src must have shape [",
              s.N_src, ", ", s.H, "] (x.size(0), heads), got ", s_src.sizes());
  TORCH_CHECK(s_dst.size(0) == s.N_dst && s_dst.size(1) == s.H, "s_dst must have shape [",
              s.N_dst, ", ", s.H, "] (rowptr.numel() - 1, heads), got ", s_dst.sizes());
  if (s_edge.has_value() && s_edge->defined()) {
    check_value(*s_edge, "s_edge", 2);
    check_same_dtype(*s_edge, "s_edge", x, "x");
    check_same_device(*s_edge, "s_edge", x, "x");
    TORCH_CHECK(s_edge->size(0) == s.E && s_edge->size(1) == s.H, "s_edge must have shape [",
                s.E, ", ", s.H, "] (col.numel(), heads), got ", s_edge->sizes());
  }
  check_philox(philox, dropout_p, x);
  check_gat_bias(bias, x, s.H, s.D);
  return s;
}

// gatv2_attention: x_l [N_src, H, D], x_r [N_dst, H, D], e_feat [E, H, D],
// att [H, D]; returns (N_dst, N_src, E, H, D).
inline GatShape check_gatv2_attention(const at::Tensor& rowptr, const at::Tensor& col,
                                      const at::Tensor& x_l, const at::Tensor& x_r,
                                      const std::optional<at::Tensor>& e_feat,
                                      const at::Tensor& att, double dropout_p,
                                      const std::optional<at::Tensor>& philox,
                                      const std::optional<at::Tensor>& bias) {
  GatShape s;
  s.N_dst = check_compressed(rowptr, "rowptr", col, "col");
  check_value(x_l, "x_l", 3);
  check_value(x_r, "x_r", 3);
  check_value(att, "att", 2);
  check_same_dtype(x_r, "x_r", x_l, "x_l");
  check_same_dtype(att, "att", x_l, "x_l");
  check_same_device(rowptr, "rowptr", x_l, "x_l");
  check_same_device(x_r, "x_r", x_l, "x_l");
  check_same_device(att, "att", x_l, "x_l");
  s.N_src = x_l.size(0);
  s.H = x_l.size(1);
  s.D = x_l.size(2);
  s.E = col.numel();
  TORCH_CHECK(x_r.size(0) == s.N_dst && x_r.size(1) == s.H && x_r.size(2) == s.D,
              "x_r must have shape [", s.N_dst, ", ", s.H, ", ", s.D,
              "] (rowptr.numel() - 1, heads, channels), got ", x_r.sizes());
  TORCH_CHECK(att.size(0) == s.H && att.size(1) == s.D, "att must have shape [", s.H, ", ", s.D,
              "] (heads, channels of x_l), got ", att.sizes());
  if (e_feat.has_value() && e_feat->defined()) {
    check_value(*e_feat, "e_feat", 3);
    check_same_dtype(*e_feat, "e_feat", x_l, "x_l");
    check_same_device(*e_feat, "e_feat", x_l, "x_l");
    TORCH_CHECK(e_feat->size(0) == s.E && e_feat->size(1) == s.H && e_feat->size(2) == s.D,
                "e_feat must have shape [", s.E, ", ", s.H, ", ", s.D,
                "] (col.numel(), heads, channels), got ", e_feat->sizes());
  }
  check_philox(philox, dropout_p, x_l);
  check_gat_bias(bias, x_l, s.H, s.D);
  return s;
}

// The CSC, out, lse, grad_out and grad_lse of an attention backward (shared
// by gat_attention_backward and gatv2_attention_backward); x is the
// aggregated features ([N_src, H, D]).
inline void check_attention_backward_extra(
    const GatShape& s, const at::Tensor& rowptr, const at::Tensor& colptr, const at::Tensor& row,
    const at::Tensor& perm, const at::Tensor& x, const char* x_name, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& grad_out, const std::optional<at::Tensor>& grad_lse,
    const std::optional<at::Tensor>& perm_inv) {
  const int64_t N_src = check_compressed(colptr, "colptr", row, "row");
  TORCH_CHECK(N_src == s.N_src, "colptr must have ", x_name, ".size(0) + 1 = ", s.N_src + 1,
              " entries, got ", colptr.numel());
  check_index(perm, "perm");
  check_same_dtype(perm, "perm", row, "row");
  check_same_dtype(colptr, "colptr", rowptr, "rowptr");
  check_same_device(colptr, "colptr", x, x_name);
  check_same_device(perm, "perm", x, x_name);
  TORCH_CHECK(row.numel() == s.E && perm.numel() == s.E,
              "row and perm must have one entry per edge (", s.E, "), got ", row.numel(),
              " and ", perm.numel());
  check_perm_inv(perm_inv, perm, x, x_name, s.E);
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{out, "out"},
                                {grad_out, "grad_out"}}) {
    check_value(t, name, 3);
    check_same_dtype(t, name, x, x_name);
    check_same_device(t, name, x, x_name);
    TORCH_CHECK(t.size(0) == s.N_dst && t.size(1) == s.H && t.size(2) == s.D, name,
                " must have shape [", s.N_dst, ", ", s.H, ", ", s.D, "], got ", t.sizes());
  }
  const auto lse_dtype = at::toOpMathType(x.scalar_type());
  check_defined(lse, "lse");
  TORCH_CHECK(lse.scalar_type() == lse_dtype && lse.dim() == 2 && lse.size(0) == s.N_dst &&
                  lse.size(1) == s.H,
              "lse must be a ", lse_dtype, " tensor of shape [", s.N_dst, ", ", s.H, "], got ",
              lse.scalar_type(), " ", lse.sizes());
  check_same_device(lse, "lse", x, x_name);
  if (grad_lse.has_value() && grad_lse->defined()) {
    TORCH_CHECK(grad_lse->scalar_type() == lse_dtype && grad_lse->sizes() == lse.sizes(),
                "grad_lse must be a ", lse_dtype, " tensor of shape ", lse.sizes(), ", got ",
                grad_lse->scalar_type(), " ", grad_lse->sizes());
    check_same_device(*grad_lse, "grad_lse", x, x_name);
  }
}

inline GatShape check_gat_attention_backward(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& colptr,
    const at::Tensor& row, const at::Tensor& perm, const at::Tensor& s_src,
    const at::Tensor& s_dst, const std::optional<at::Tensor>& s_edge, const at::Tensor& x,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& grad_out,
    const std::optional<at::Tensor>& grad_lse, double dropout_p,
    const std::optional<at::Tensor>& philox, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& perm_inv) {
  const GatShape s =
      check_gat_attention(rowptr, col, s_src, s_dst, s_edge, x, dropout_p, philox, bias);
  check_attention_backward_extra(s, rowptr, colptr, row, perm, x, "x", out, lse, grad_out,
                                 grad_lse, perm_inv);
  return s;
}

inline GatShape check_gatv2_attention_backward(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& colptr,
    const at::Tensor& row, const at::Tensor& perm, const at::Tensor& x_l, const at::Tensor& x_r,
    const std::optional<at::Tensor>& e_feat, const at::Tensor& att, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& grad_out, const std::optional<at::Tensor>& grad_lse,
    double dropout_p, const std::optional<at::Tensor>& philox,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& perm_inv) {
  const GatShape s =
      check_gatv2_attention(rowptr, col, x_l, x_r, e_feat, att, dropout_p, philox, bias);
  check_attention_backward_extra(s, rowptr, colptr, row, perm, x_l, "x_l", out, lse, grad_out,
                                 grad_lse, perm_inv);
  return s;
}

// transformer_attention: query [N_dst, H, D], key and value [N_src, H, D],
// e_feat [E, H, D]; returns (N_dst, N_src, E, H, D).
inline GatShape check_transformer_attention(const at::Tensor& rowptr, const at::Tensor& col,
                                            const at::Tensor& query, const at::Tensor& key,
                                            const at::Tensor& value,
                                            const std::optional<at::Tensor>& e_feat,
                                            double dropout_p,
                                            const std::optional<at::Tensor>& philox,
                                            const std::optional<at::Tensor>& bias) {
  GatShape s;
  s.N_dst = check_compressed(rowptr, "rowptr", col, "col");
  check_value(query, "query", 3);
  check_value(key, "key", 3);
  check_value(value, "value", 3);
  check_same_dtype(query, "query", key, "key");
  check_same_dtype(value, "value", key, "key");
  check_same_device(rowptr, "rowptr", key, "key");
  check_same_device(query, "query", key, "key");
  check_same_device(value, "value", key, "key");
  s.N_src = key.size(0);
  s.H = key.size(1);
  s.D = key.size(2);
  s.E = col.numel();
  TORCH_CHECK(value.sizes() == key.sizes(), "value must have the shape of key [", s.N_src, ", ",
              s.H, ", ", s.D, "], got ", value.sizes());
  TORCH_CHECK(query.size(0) == s.N_dst && query.size(1) == s.H && query.size(2) == s.D,
              "query must have shape [", s.N_dst, ", ", s.H, ", ", s.D,
              "] (rowptr.numel() - 1, heads, channels of key), got ", query.sizes());
  if (e_feat.has_value() && e_feat->defined()) {
    check_value(*e_feat, "e_feat", 3);
    check_same_dtype(*e_feat, "e_feat", key, "key");
    check_same_device(*e_feat, "e_feat", key, "key");
    TORCH_CHECK(e_feat->size(0) == s.E && e_feat->size(1) == s.H && e_feat->size(2) == s.D,
                "e_feat must have shape [", s.E, ", ", s.H, ", ", s.D,
                "] (col.numel(), heads, channels), got ", e_feat->sizes());
  }
  check_philox(philox, dropout_p, key);
  check_gat_bias(bias, key, s.H, s.D);
  return s;
}

inline GatShape check_transformer_attention_backward(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& colptr,
    const at::Tensor& row, const at::Tensor& perm, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const std::optional<at::Tensor>& e_feat, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& grad_out, const std::optional<at::Tensor>& grad_lse,
    double dropout_p, const std::optional<at::Tensor>& philox,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& perm_inv) {
  const GatShape s = check_transformer_attention(rowptr, col, query, key, value, e_feat,
                                                 dropout_p, philox, bias);
  check_attention_backward_extra(s, rowptr, colptr, row, perm, key, "key", out, lse, grad_out,
                                 grad_lse, perm_inv);
  return s;
}

// The gradient buffers of the _<op>_backward_into ops: each contiguous, of
// `ref`'s dtype and device, [rows, H, D], apart from each other and from
// every input, except that each may be the very tensor whose memory its
// backward frees for it (`own`, an input), which the kernels read before
// they write a gradient in its place.
using NamedTensor = std::pair<const at::Tensor*, const char*>;
struct GradientBuffer {
  const at::Tensor* buf;
  const char* name;
  int64_t rows;
  const at::Tensor* own;
};
inline void check_gradient_buffers(const GatShape& s, const at::Tensor& ref, const char* ref_name,
                                   std::initializer_list<GradientBuffer> buffers,
                                   std::initializer_list<NamedTensor> inputs) {
  for (const GradientBuffer& b : buffers) {
    check_value(*b.buf, b.name, 3);
    check_same_dtype(*b.buf, b.name, ref, ref_name);
    check_same_device(*b.buf, b.name, ref, ref_name);
    TORCH_CHECK(b.buf->size(0) == b.rows && b.buf->size(1) == s.H && b.buf->size(2) == s.D,
                b.name, " must have shape [", b.rows, ", ", s.H, ", ", s.D, "], got ",
                b.buf->sizes());
    TORCH_CHECK(b.buf->is_contiguous(), b.name, " must be contiguous");
    auto apart = [&](const at::Tensor& other, const char* other_name, bool own) {
      if (!other.defined() || &other == b.buf || !other.has_storage() ||
          !b.buf->storage().is_alias_of(other.storage())) {
        return;
      }
      // (memory the two share: exactly the same elements, or an error)
      const auto status = at::get_overlap_status(*b.buf, other);
      TORCH_CHECK((own && status == at::MemOverlapStatus::Full) ||
                      status == at::MemOverlapStatus::No,
                  b.name, " must not overlap ", other_name, own ? " unless it is that very tensor" : "");
    };
    for (const auto& [t, name] : inputs) apart(*t, name, t == b.own);
    for (const GradientBuffer& other : buffers) apart(*other.buf, other.name, false);
  }
}

inline void check_transformer_gradient_buffers(
    const GatShape& s, const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& colptr,
    const at::Tensor& row, const at::Tensor& perm, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const std::optional<at::Tensor>& e_feat, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& grad_out, const std::optional<at::Tensor>& grad_lse,
    const std::optional<at::Tensor>& philox, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& perm_inv, const at::Tensor& grad_query,
    const at::Tensor& grad_key, const at::Tensor& grad_value) {
  const at::Tensor none;
  auto opt = [&](const std::optional<at::Tensor>& t) -> const at::Tensor& {
    return t.has_value() ? *t : none;
  };
  check_gradient_buffers(
      s, key, "key",
      {{&grad_query, "grad_query", s.N_dst, &query}, {&grad_key, "grad_key", s.N_src, &out},
       {&grad_value, "grad_value", s.N_src, &value}},
      {{&rowptr, "rowptr"}, {&col, "col"}, {&colptr, "colptr"}, {&row, "row"}, {&perm, "perm"},
       {&query, "query"}, {&key, "key"}, {&value, "value"}, {&opt(e_feat), "e_feat"},
       {&out, "out"}, {&lse, "lse"}, {&grad_out, "grad_out"}, {&opt(grad_lse), "grad_lse"},
       {&opt(philox), "philox"}, {&opt(bias), "bias"}, {&opt(perm_inv), "perm_inv"}});
}

// The two entry points of transformer_attention's backward on a device, over
// its Backward(s, <the op's arguments>, into): the checks, then the gradients
// into new tensors (into: nullptr) or into the given buffers (grad_query,
// grad_key, grad_value), of which _transformer_attention_backward_into
// returns grad_e_feat.
using Grads4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using OptionalTensor = std::optional<at::Tensor>;
using TransformerBackward = Grads4 (*)(
    const GatShape&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const OptionalTensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const OptionalTensor&, double, double, const OptionalTensor&, const OptionalTensor&,
    const OptionalTensor&, const at::Tensor*);

template <TransformerBackward Backward>
Grads4 transformer_backward_entry(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& colptr,
    const at::Tensor& row, const at::Tensor& perm, const at::Tensor& query,
    const at::Tensor& key, const at::Tensor& value, const OptionalTensor& e_feat,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& grad_out,
    const OptionalTensor& grad_lse, double scale, double dropout_p, const OptionalTensor& philox,
    const OptionalTensor& bias, const OptionalTensor& perm_inv) {
  const GatShape s = check_transformer_attention_backward(
      rowptr, col, colptr, row, perm, query, key, value, e_feat, out, lse, grad_out, grad_lse,
      dropout_p, philox, bias, perm_inv);
  return Backward(s, rowptr, col, colptr, row, perm, query, key, value, e_feat, out, lse,
                  grad_out, grad_lse, scale, dropout_p, philox, bias, perm_inv, nullptr);
}

template <TransformerBackward Backward>
at::Tensor transformer_backward_into_entry(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& colptr,
    const at::Tensor& row, const at::Tensor& perm, const at::Tensor& query,
    const at::Tensor& key, const at::Tensor& value, const OptionalTensor& e_feat,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& grad_out,
    const OptionalTensor& grad_lse, double scale, double dropout_p, const OptionalTensor& philox,
    const OptionalTensor& bias, const OptionalTensor& perm_inv, at::Tensor& grad_query,
    at::Tensor& grad_key, at::Tensor& grad_value) {
  const GatShape s = check_transformer_attention_backward(
      rowptr, col, colptr, row, perm, query, key, value, e_feat, out, lse, grad_out, grad_lse,
      dropout_p, philox, bias, perm_inv);
  check_transformer_gradient_buffers(s, rowptr, col, colptr, row, perm, query, key, value,
                                     e_feat, out, lse, grad_out, grad_lse, philox, bias,
                                     perm_inv, grad_query, grad_key, grad_value);
  const at::Tensor into[3] = {grad_query, grad_key, grad_value};
  return std::get<3>(Backward(s, rowptr, col, colptr, row, perm, query, key, value, e_feat, out,
                              lse, grad_out, grad_lse, scale, dropout_p, philox, bias, perm_inv,
                              into));
}

// GATv2's record (_gatv2_attention_record): logits [E, H] in lse's dtype and
// signs [E, H, ceil(D / 32)] int32, contiguous, on x_l's device; both or
// neither. The CPU's record is empty (its backward needs none), which a
// backward on any device may take as none. Returns whether it is given.
inline bool check_gatv2_record(const GatShape& s, const at::Tensor& x_l, const at::Tensor& lse,
                               const OptionalTensor& logits, const OptionalTensor& signs) {
  const bool has_l = logits.has_value() && logits->defined();
  const bool has_s = signs.has_value() && signs->defined();
  TORCH_CHECK(has_l == has_s, "logits and signs (the forward's record) must be given together");
  if (!has_l || (logits->numel() == 0 && signs->numel() == 0)) return false;
  const int64_t W = (s.D + 31) / 32;
  TORCH_CHECK(logits->dim() == 2 && logits->size(0) == s.E && logits->size(1) == s.H,
              "logits must have shape [", s.E, ", ", s.H, "] (edges, heads), got ",
              logits->sizes());
  TORCH_CHECK(signs->dim() == 3 && signs->size(0) == s.E && signs->size(1) == s.H &&
                  signs->size(2) == W,
              "signs must have shape [", s.E, ", ", s.H, ", ", W,
              "] (edges, heads, ceil(channels / 32)), got ", signs->sizes());
  TORCH_CHECK(logits->scalar_type() == lse.scalar_type(), "logits must have lse's dtype ",
              lse.scalar_type(), ", got ", logits->scalar_type());
  TORCH_CHECK(signs->scalar_type() == at::kInt, "signs must be int32, got ",
              signs->scalar_type());
  check_same_device(*logits, "logits", x_l, "x_l");
  check_same_device(*signs, "signs", x_l, "x_l");
  TORCH_CHECK(logits->is_contiguous() && signs->is_contiguous(),
              "logits and signs must be contiguous");
  return true;
}

// The same two entry points of gatv2_attention's backward; its buffers are
// grad_x_l (which may be the attention output `out`, when N_src = N_dst) and
// grad_x_r (which may be x_r), and _gatv2_attention_backward_into returns
// (grad_att, grad_e_feat). The implementation gets the record (logits,
// signs) when one is given (check_gatv2_record), and whether the logit
// gradients may take the logits' place (consume).
using Gatv2Backward = Grads4 (*)(
    const GatShape&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptionalTensor&,
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const OptionalTensor&, double, double, const OptionalTensor&, const OptionalTensor&,
    const OptionalTensor&, const at::Tensor*, const at::Tensor*, const at::Tensor*, bool);

template <Gatv2Backward Backward>
Grads4 gatv2_backward_entry(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& colptr,
    const at::Tensor& row, const at::Tensor& perm, const at::Tensor& x_l, const at::Tensor& x_r,
    const OptionalTensor& e_feat, const at::Tensor& att, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& grad_out, const OptionalTensor& grad_lse,
    double negative_slope, double dropout_p, const OptionalTensor& philox,
    const OptionalTensor& bias, const OptionalTensor& perm_inv, const OptionalTensor& logits,
    const OptionalTensor& signs) {
  const GatShape s = check_gatv2_attention_backward(rowptr, col, colptr, row, perm, x_l, x_r,
                                                    e_feat, att, out, lse, grad_out, grad_lse,
                                                    dropout_p, philox, bias, perm_inv);
  const bool record = check_gatv2_record(s, x_l, lse, logits, signs);
  return Backward(s, rowptr, col, colptr, row, perm, x_l, x_r, e_feat, att, out, lse, grad_out,
                  grad_lse, negative_slope, dropout_p, philox, bias, perm_inv, nullptr,
                  record ? &*logits : nullptr, record ? &*signs : nullptr, false);
}

template <Gatv2Backward Backward>
std::tuple<at::Tensor, at::Tensor> gatv2_backward_into_entry(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& colptr,
    const at::Tensor& row, const at::Tensor& perm, const at::Tensor& x_l, const at::Tensor& x_r,
    const OptionalTensor& e_feat, const at::Tensor& att, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& grad_out, const OptionalTensor& grad_lse,
    double negative_slope, double dropout_p, const OptionalTensor& philox,
    const OptionalTensor& bias, const OptionalTensor& perm_inv, at::Tensor& grad_x_l,
    at::Tensor& grad_x_r, const OptionalTensor& logits, const OptionalTensor& signs) {
  const GatShape s = check_gatv2_attention_backward(rowptr, col, colptr, row, perm, x_l, x_r,
                                                    e_feat, att, out, lse, grad_out, grad_lse,
                                                    dropout_p, philox, bias, perm_inv);
  const bool record = check_gatv2_record(s, x_l, lse, logits, signs);
  const at::Tensor none;
  auto opt = [&](const OptionalTensor& t) -> const at::Tensor& {
    return t.has_value() ? *t : none;
  };
  check_gradient_buffers(
      s, x_l, "x_l",
      {{&grad_x_l, "grad_x_l", s.N_src, &out}, {&grad_x_r, "grad_x_r", s.N_dst, &x_r}},
      {{&rowptr, "rowptr"}, {&col, "col"}, {&colptr, "colptr"}, {&row, "row"}, {&perm, "perm"},
       {&x_l, "x_l"}, {&x_r, "x_r"}, {&opt(e_feat), "e_feat"}, {&att, "att"}, {&out, "out"},
       {&lse, "lse"}, {&grad_out, "grad_out"}, {&opt(grad_lse), "grad_lse"},
       {&opt(philox), "philox"}, {&opt(bias), "bias"}, {&opt(perm_inv), "perm_inv"}});
  const at::Tensor into[2] = {grad_x_l, grad_x_r};
  auto grads = Backward(s, rowptr, col, colptr, row, perm, x_l, x_r, e_feat, att, out, lse,
                        grad_out, grad_lse, negative_slope, dropout_p, philox, bias, perm_inv,
                        into, record ? &*logits : nullptr, record ? &*signs : nullptr, true);
  return {std::get<2>(grads), std::get<3>(grads)};
}

}  // namespace pyg_multihead_agg
