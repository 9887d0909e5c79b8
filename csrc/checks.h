// Input checks shared by the CPU and CUDA entry points. Messages name the
// argument and what was expected; the Python fake implementations in
// pyg_multihead_agg/ops.py mirror them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace pyg_multihead_agg {

inline void check_index(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 1, name, " must be a 1-D tensor, got ", t.dim(), " dimensions");
  TORCH_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, name,
              " must be int32 or int64, got ", t.scalar_type());
}

inline void check_value(const at::Tensor& t, const char* name, int64_t dim) {
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

}  // namespace pyg_multihead_agg
