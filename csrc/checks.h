// Input checks shared by the CPU and CUDA entry points. Messages name the
// argument and what was expected; the Python fake implementations in
// pyg_multihead_agg/ops.py mirror them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <optional>

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

// multihead_spmm_backward_csc; returns the number of sources.
inline int64_t check_backward_csc(const at::Tensor& colptr, const at::Tensor& row,
                                  const at::Tensor& perm, const std::optional<at::Tensor>& weight,
                                  const std::optional<at::Tensor>& x, const at::Tensor& grad_out) {
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

}  // namespace pyg_multihead_agg
