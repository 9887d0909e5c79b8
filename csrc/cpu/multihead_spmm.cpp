// CPU kernels of the multihead_spmm family: rows in parallel, split by work
// (loops.h), all heads of an edge in one contiguous pass over its source row,
// vectorised over the channels, float32 accumulation for half types. Every
// index is bounds-checked, so malformed graphs raise instead of reading out of
// bounds.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../checks.h"
#include "graph_checks.h"
#include "loops.h"

namespace pyg_multihead_agg {
namespace {

using cpu::check_ends;
using cpu::check_index_value;
using cpu::check_range;

at::Tensor multihead_spmm_cpu(const at::Tensor& rowptr, const at::Tensor& col,
                              const at::Tensor& weight, const at::Tensor& x,
                              const std::optional<at::Tensor>& /*colptr*/,
                              const std::optional<at::Tensor>& /*row*/,
                              const std::optional<at::Tensor>& /*perm*/,
                              const std::optional<at::Tensor>& /*perm_inv*/) {
  check_spmm(rowptr, col, weight, x);
  TORCH_CHECK(x.device().is_cpu(), "x must be a CPU tensor for the CPU kernel");
  const auto rowptr_c = rowptr.contiguous();
  const auto col_c = col.contiguous();
  const auto weight_c = weight.contiguous();
  const auto x_c = x.contiguous();
  const int64_t N_dst = rowptr.numel() - 1, N_src = x.size(0), H = x.size(1), D = x.size(2);
  const int64_t E = col.numel(), HD = H * D;
  auto out = at::empty({N_dst, H, D}, x.options());
  if (out.numel() == 0) return out;

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "multihead_spmm_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "multihead_spmm_cpu_index", [&] {
      const index_t* rp = rowptr_c.data_ptr<index_t>();
      const index_t* cp = col_c.data_ptr<index_t>();
      const scalar_t* wp = weight_c.data_ptr<scalar_t>();
      const scalar_t* xp = x_c.data_ptr<scalar_t>();
      scalar_t* op = out.data_ptr<scalar_t>();
      check_ends(rp, N_dst, E, "rowptr", "col");
      cpu::with_width<scalar_t>(D, [&](auto width) {
        cpu::parallel_rows(rp, N_dst, [&](int64_t begin, int64_t end) CPU_KERNEL_INLINE_LAMBDA {
          std::vector<acc_t> acc(HD);
          for (int64_t i = begin; i < end; ++i) {
            std::fill(acc.begin(), acc.end(), acc_t(0));
            const index_t lo = rp[i], hi = rp[i + 1];
            check_range(lo, hi, E, "rowptr", i);
            for (int64_t e = lo; e < hi; ++e) {
              const index_t j = cp[e];
              check_index_value(j, N_src, "col", e);
              cpu::prefetch_source(xp, cp, e, E, N_src, HD);
              const scalar_t* xr = xp + j * HD;
              for (int64_t h = 0; h < H; ++h) {
                cpu::axpy(acc.data() + h * width, static_cast<acc_t>(wp[e * H + h]),
                          xr + h * width, int64_t(width));
              }
            }
            cpu::store_row(op + i * HD, acc.data(), acc_t(1), static_cast<const acc_t*>(nullptr),
                           HD);
          }
        });
      });
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> multihead_spmm_backward_csc_cpu(
    const at::Tensor& colptr, const at::Tensor& row, const at::Tensor& perm,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& x,
    const at::Tensor& grad_out, const std::optional<at::Tensor>& perm_inv) {
  // perm_inv is only checked: this kernel writes grad_weight by edge id.
  const int64_t N_src = check_backward_csc(colptr, row, perm, weight, x, grad_out, perm_inv);
  const int64_t E = row.numel(), N_dst = grad_out.size(0), H = grad_out.size(1), D = grad_out.size(2);
  const int64_t HD = H * D;
  const bool need_grad_x = weight.has_value(), need_grad_weight = x.has_value();
  const auto weight_c = need_grad_x ? weight->contiguous() : at::Tensor();
  const auto x_c = need_grad_weight ? x->contiguous() : at::Tensor();
  const auto colptr_c = colptr.contiguous(), row_c = row.contiguous(), perm_c = perm.contiguous();
  const auto go = grad_out.contiguous();
  auto grad_x = at::empty({need_grad_x ? N_src : 0, H, D}, grad_out.options());
  // Zero-filled: if perm is not a permutation, unvisited edges read 0, not garbage.
  auto grad_weight = at::zeros({need_grad_weight ? E : 0, H}, grad_out.options());
  if ((!need_grad_x && !need_grad_weight) || HD == 0) return {grad_x, grad_weight};

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, go.scalar_type(), "multihead_spmm_backward_csc_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(colptr.scalar_type(), "multihead_spmm_backward_csc_cpu_index", [&] {
      const index_t* cp = colptr_c.data_ptr<index_t>();
      const index_t* rp = row_c.data_ptr<index_t>();
      const index_t* pp = perm_c.data_ptr<index_t>();
      const scalar_t* gp = go.data_ptr<scalar_t>();
      const scalar_t* wp = need_grad_x ? weight_c.data_ptr<scalar_t>() : nullptr;
      const scalar_t* xp = need_grad_weight ? x_c.data_ptr<scalar_t>() : nullptr;
      scalar_t* gxp = need_grad_x ? grad_x.data_ptr<scalar_t>() : nullptr;
      scalar_t* gwp = need_grad_weight ? grad_weight.data_ptr<scalar_t>() : nullptr;
      check_ends(cp, N_src, E, "colptr", "row");
      cpu::with_width<scalar_t>(D, [&](auto width) {
        cpu::parallel_rows(cp, N_src, [&](int64_t begin, int64_t end) CPU_KERNEL_INLINE_LAMBDA {
          std::vector<acc_t> acc(HD);
          for (int64_t j = begin; j < end; ++j) {
            std::fill(acc.begin(), acc.end(), acc_t(0));
            const index_t lo = cp[j], hi = cp[j + 1];
            check_range(lo, hi, E, "colptr", j);
            const scalar_t* xr = need_grad_weight ? xp + j * HD : nullptr;
            for (int64_t k = lo; k < hi; ++k) {
              const index_t i = rp[k], e = pp[k];
              check_index_value(i, N_dst, "row", k);
              check_index_value(e, E, "perm", k);
              cpu::prefetch_source(gp, rp, k, E, N_dst, HD);
              const scalar_t* g = gp + i * HD;
              for (int64_t h = 0; h < H; ++h) {
                const scalar_t* gh = g + h * width;
                if (need_grad_x) {
                  cpu::axpy(acc.data() + h * width, static_cast<acc_t>(wp[e * H + h]), gh,
                            int64_t(width));
                }
                if (need_grad_weight) {
                  gwp[e * H + h] =
                      static_cast<scalar_t>(cpu::dot<acc_t>(gh, xr + h * width, int64_t(width)));
                }
              }
            }
            if (need_grad_x) {
              cpu::store_row(gxp + j * HD, acc.data(), acc_t(1),
                             static_cast<const acc_t*>(nullptr), HD);
            }
          }
        });
      });
    });
  });
  return {grad_x, grad_weight};
}

at::Tensor multihead_spmm_backward_x_scatter_cpu(const at::Tensor& rowptr, const at::Tensor& col,
                                                 const at::Tensor& weight,
                                                 const at::Tensor& grad_out, int64_t num_src) {
  check_backward_x_scatter(rowptr, col, weight, grad_out, num_src);
  const int64_t N_dst = rowptr.numel() - 1, E = col.numel();
  const int64_t H = grad_out.size(1), D = grad_out.size(2), HD = H * D;
  const auto rowptr_c = rowptr.contiguous(), col_c = col.contiguous();
  const auto weight_c = weight.contiguous(), go = grad_out.contiguous();
  auto acc_dtype = at::toOpMathType(grad_out.scalar_type());
  auto acc = at::zeros({num_src, H, D}, grad_out.options().dtype(acc_dtype));
  if (acc.numel() == 0 || E == 0) return acc.to(grad_out.scalar_type());

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, go.scalar_type(), "multihead_spmm_backward_x_scatter_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "multihead_spmm_backward_x_scatter_cpu_index", [&] {
      const index_t* rp = rowptr_c.data_ptr<index_t>();
      const index_t* cp = col_c.data_ptr<index_t>();
      const scalar_t* wp = weight_c.data_ptr<scalar_t>();
      const scalar_t* gp = go.data_ptr<scalar_t>();
      acc_t* ap = acc.data_ptr<acc_t>();
      check_ends(rp, N_dst, E, "rowptr", "col");
      // Heads are independent: threads split them, so no two threads write
      // the same element and the sum order is fixed (deterministic).
      at::parallel_for(0, H, 1, [&](int64_t h_begin, int64_t h_end) {
        for (int64_t i = 0; i < N_dst; ++i) {
          const index_t lo = rp[i], hi = rp[i + 1];
          check_range(lo, hi, E, "rowptr", i);
          for (int64_t e = lo; e < hi; ++e) {
            const index_t j = cp[e];
            check_index_value(j, num_src, "col", e);
            for (int64_t h = h_begin; h < h_end; ++h) {
              const acc_t w = static_cast<acc_t>(wp[e * H + h]);
              const scalar_t* g = gp + i * HD + h * D;
              acc_t* a = ap + j * HD + h * D;
              for (int64_t d = 0; d < D; ++d) a[d] += w * static_cast<acc_t>(g[d]);
            }
          }
        }
      });
    });
  });
  return acc.to(grad_out.scalar_type());
}

at::Tensor multihead_sddmm_cpu(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& a,
                               const at::Tensor& b) {
  check_sddmm(rowptr, col, a, b);
  const int64_t N_dst = rowptr.numel() - 1, E = col.numel();
  const int64_t N_src = b.size(0), H = a.size(1), D = a.size(2), HD = H * D;
  const auto rowptr_c = rowptr.contiguous(), col_c = col.contiguous();
  const auto a_c = a.contiguous(), b_c = b.contiguous();
  auto out = at::empty({E, H}, a.options());
  if (out.numel() == 0) return out;

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "multihead_sddmm_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    AT_DISPATCH_INDEX_TYPES(rowptr.scalar_type(), "multihead_sddmm_cpu_index", [&] {
      const index_t* rp = rowptr_c.data_ptr<index_t>();
      const index_t* cp = col_c.data_ptr<index_t>();
      const scalar_t* ap = a_c.data_ptr<scalar_t>();
      const scalar_t* bp = b_c.data_ptr<scalar_t>();
      scalar_t* op = out.data_ptr<scalar_t>();
      check_ends(rp, N_dst, E, "rowptr", "col");
      cpu::with_width<scalar_t>(D, [&](auto width) {
        cpu::parallel_rows(rp, N_dst, [&](int64_t begin, int64_t end) CPU_KERNEL_INLINE_LAMBDA {
          for (int64_t i = begin; i < end; ++i) {
            const index_t lo = rp[i], hi = rp[i + 1];
            check_range(lo, hi, E, "rowptr", i);
            const scalar_t* ar = ap + i * HD;
            for (int64_t e = lo; e < hi; ++e) {
              const index_t j = cp[e];
              check_index_value(j, N_src, "col", e);
              cpu::prefetch_source(bp, cp, e, E, N_src, HD);
              const scalar_t* br = bp + j * HD;
              for (int64_t h = 0; h < H; ++h) {
                op[e * H + h] = static_cast<scalar_t>(
                    cpu::dot<acc_t>(ar + h * width, br + h * width, int64_t(width)));
              }
            }
          }
        });
      });
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(pyg_multihead_agg, CPU, m) {
  m.impl("multihead_spmm", &multihead_spmm_cpu);
  m.impl("multihead_spmm_backward_csc", &multihead_spmm_backward_csc_cpu);
  m.impl("multihead_spmm_backward_x_scatter", &multihead_spmm_backward_x_scatter_cpu);
  m.impl("multihead_sddmm", &multihead_sddmm_cpu);
}

}  // namespace pyg_multihead_agg
