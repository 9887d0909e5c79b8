// The multihead_spmm family's CUDA entry points: input checks, the choice of
// kernels per op (each launcher then picks its variant, see heuristics.cuh),
// and the CUDA IMPL block. The kernels and their launchers are in the other
// files of this folder (launchers.cuh lists them); docs/multihead_spmm.md
// describes the design.
//
// Malformed graphs never fault: every row range is clamped to [0, E] (empty
// when decreasing) and entries whose index (col, row or perm) is out of range
// are skipped. The Python `validate=True` flag is what raises clear errors.
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <climits>
#include <cstdint>
#include <optional>
#include <tuple>

#include "../../checks.h"
#include "../utils/dispatch.cuh"
#include "../utils/gather_rows.cuh"
#include "launchers.cuh"
#include "params.cuh"

namespace pyg_multihead_agg {
namespace {

// The dots of p (dot_out only): the dot-gather kernel when it applies, else
// the generic SDDMM.
template <typename scalar_t, typename index_t>
void launch_dot(const DotParams<scalar_t, index_t>& p, const at::TensorOptions& options) {
  if (!try_launch_dot_gather(p, options)) launch_sddmm_generic(p, options);
}

void check_int_width(int64_t H, int64_t D) {
  TORCH_CHECK(H * D <= INT_MAX, "heads * channels must be below 2^31, got ", H, " * ", D);
}

// ---------------------------------------------------------------------------
// Ops
// ---------------------------------------------------------------------------

at::Tensor multihead_spmm_cuda(const at::Tensor& rowptr, const at::Tensor& col,
                               const at::Tensor& weight, const at::Tensor& x,
                               const std::optional<at::Tensor>& /*colptr*/,
                               const std::optional<at::Tensor>& /*row*/,
                               const std::optional<at::Tensor>& /*perm*/,
                               const std::optional<at::Tensor>& /*perm_inv*/) {
  check_spmm(rowptr, col, weight, x);
  TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor for the CUDA kernel");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t N_dst = rowptr.numel() - 1, N_src = x.size(0), H = x.size(1), D = x.size(2);
  const int64_t E = col.numel();
  check_int_width(H, D);
  if (N_dst == 0 || H * D == 0) return at::empty({N_dst, H, D}, x.options());
  if (E == 0) return at::zeros({N_dst, H, D}, x.options());
  const auto rowptr_c = rowptr.contiguous(), col_c = col.contiguous();
  const auto weight_c = weight.contiguous(), x_c = x.contiguous();
  auto out = at::empty({N_dst, H, D}, x.options());
  FLOAT_SWITCH(x.scalar_type(), "multihead_spmm", [&] {
    INDEX_SWITCH(rowptr.scalar_type(), "multihead_spmm", [&] {
      GatherParams<scalar_t, index_t> p{};
      p.ptr = rowptr_c.data_ptr<index_t>();
      p.idx = col_c.data_ptr<index_t>();
      p.wperm = nullptr;
      p.weight = weight_c.data_ptr<scalar_t>();
      p.x = x_c.data_ptr<scalar_t>();
      p.out = out.data_ptr<scalar_t>();
      p.num_rows = N_dst;
      p.num_src = N_src;
      p.num_edges = E;
      p.H = static_cast<int>(H);
      p.D = static_cast<int>(D);
      p.HD = static_cast<int>(H * D);
      launch_gather(p, rowptr.options());
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> multihead_spmm_backward_csc_cuda(
    const at::Tensor& colptr, const at::Tensor& row, const at::Tensor& perm,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& x,
    const at::Tensor& grad_out, const std::optional<at::Tensor>& perm_inv) {
  const int64_t N_src = check_backward_csc(colptr, row, perm, weight, x, grad_out, perm_inv);
  const int64_t E = row.numel(), N_dst = grad_out.size(0), H = grad_out.size(1);
  const int64_t D = grad_out.size(2);
  const bool need_grad_x = weight.has_value(), need_grad_weight = x.has_value();
  TORCH_CHECK(grad_out.is_cuda(), "grad_out must be a CUDA tensor for the CUDA kernel");
  check_int_width(H, D);
  const c10::cuda::CUDAGuard guard(grad_out.device());
  auto grad_x = at::empty({need_grad_x ? N_src : 0, H, D}, grad_out.options());
  // The kernels write every edge's row of grad_weight when perm is a
  // permutation (a CSC's), so it is not zero-filled first (an [E, H] memset,
  // 0.3 ms on products-like float32); a malformed CSC leaves it meaningless,
  // as the CUDA kernels' other outputs (docs/robustness.md). The CPU kernel
  // zero-fills it.
  auto grad_weight = at::empty({need_grad_weight ? E : 0, H}, grad_out.options());
  if ((!need_grad_x && !need_grad_weight) || H * D == 0 || N_src == 0 || E == 0) {
    grad_x.zero_();
    grad_weight.zero_();
    return {grad_x, grad_weight};
  }
  // With perm_inv, the dots go to a scratch [E, H] by CSC entry (runs of
  // consecutive entries per column, instead of 16-byte pieces of 32-byte
  // sectors at random edge ids, which the memory reads, merges and writes
  // back) and one gather through perm_inv puts them in edge order.
  const bool by_entry = need_grad_weight && perm_inv.has_value() && perm_inv->defined();
  const auto inv_c = by_entry ? perm_inv->contiguous() : at::Tensor();
  auto dots = by_entry ? at::empty({E, H}, grad_out.options()) : grad_weight;
  const auto colptr_c = colptr.contiguous(), row_c = row.contiguous(), perm_c = perm.contiguous();
  // (The weights stay read through perm: gathering them into CSC order
  // first, the same way, measured 0.3-0.9 ms slower on products- and
  // reddit-like.)
  const auto go = grad_out.contiguous();
  const auto weight_c = need_grad_x ? weight->contiguous() : at::Tensor();
  const auto x_c = need_grad_weight ? x->contiguous() : at::Tensor();
  FLOAT_SWITCH(go.scalar_type(), "multihead_spmm_backward_csc", [&] {
    INDEX_SWITCH(colptr.scalar_type(), "multihead_spmm_backward_csc", [&] {
      DotParams<scalar_t, index_t> d{};
      d.ptr = colptr_c.data_ptr<index_t>();
      d.idx = row_c.data_ptr<index_t>();
      d.perm = perm_c.data_ptr<index_t>();
      d.rowval = need_grad_weight ? x_c.data_ptr<scalar_t>() : nullptr;
      d.gathered = go.data_ptr<scalar_t>();
      d.weight = need_grad_x ? weight_c.data_ptr<scalar_t>() : nullptr;
      d.acc_out = need_grad_x ? grad_x.data_ptr<scalar_t>() : nullptr;
      d.dot_out = need_grad_weight ? dots.data_ptr<scalar_t>() : nullptr;
      d.dot_by_entry = by_entry;
      d.num_rows = N_src;
      d.num_gathered = N_dst;
      d.num_edges = E;
      d.H = static_cast<int>(H);
      d.D = static_cast<int>(D);
      d.HD = static_cast<int>(H * D);
      // Both gradients in one pass when a fast path applies (the tensor
      // cores for 2-byte types, else the dot-gather kernel).
      if (need_grad_x && need_grad_weight &&
          (try_launch_tc_dot_gather(d, colptr.options()) ||
           try_launch_dot_gather(d, colptr.options()))) {
        if (by_entry) launch_gather_rows<index_t>(dots, inv_c, grad_weight);
        return;
      }
      // grad_x alone: the same kernels without the dots (rowval and dot_out
      // null), whose long CSC rows are sliced; the register gather below runs
      // them block-wide, and took longer than both gradients together
      // (float32 0.588 / 11.03 / 10.29 ms on arxiv- / products- /
      // reddit-like).
      if (need_grad_x && !need_grad_weight &&
          (try_launch_tc_dot_gather(d, colptr.options()) ||
           try_launch_dot_gather(d, colptr.options())))
        return;
      if (need_grad_x) {
        GatherParams<scalar_t, index_t> g{};
        g.ptr = d.ptr;
        g.idx = d.idx;
        g.wperm = d.perm;
        g.weight = d.weight;
        g.x = d.gathered;
        g.out = d.acc_out;
        g.num_rows = N_src;
        g.num_src = N_dst;
        g.num_edges = E;
        g.H = d.H;
        g.D = d.D;
        g.HD = d.HD;
        launch_gather(g, colptr.options());
      }
      if (need_grad_weight) {
        d.weight = nullptr;
        d.acc_out = nullptr;
        launch_dot(d, colptr.options());
        if (by_entry) launch_gather_rows<index_t>(dots, inv_c, grad_weight);
      }
    });
  });
  return {grad_x, grad_weight};
}

at::Tensor multihead_spmm_backward_x_scatter_cuda(const at::Tensor& rowptr, const at::Tensor& col,
                                                  const at::Tensor& weight,
                                                  const at::Tensor& grad_out, int64_t num_src) {
  check_backward_x_scatter(rowptr, col, weight, grad_out, num_src);
  const int64_t N_dst = rowptr.numel() - 1, E = col.numel();
  const int64_t H = grad_out.size(1), D = grad_out.size(2);
  TORCH_CHECK(grad_out.is_cuda(), "grad_out must be a CUDA tensor for the CUDA kernel");
  check_int_width(H, D);
  const c10::cuda::CUDAGuard guard(grad_out.device());
  auto acc = at::zeros({num_src, H, D},
                       grad_out.options().dtype(at::toOpMathType(grad_out.scalar_type())));
  if (acc.numel() == 0 || E == 0 || N_dst == 0) return acc.to(grad_out.scalar_type());
  const auto rowptr_c = rowptr.contiguous(), col_c = col.contiguous();
  const auto weight_c = weight.contiguous(), go = grad_out.contiguous();
  FLOAT_SWITCH(go.scalar_type(), "multihead_spmm_backward_x_scatter", [&] {
    INDEX_SWITCH(rowptr.scalar_type(), "multihead_spmm_backward_x_scatter", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      launch_scatter(rowptr_c.data_ptr<index_t>(), col_c.data_ptr<index_t>(),
                     weight_c.data_ptr<scalar_t>(), go.data_ptr<scalar_t>(),
                     acc.data_ptr<acc_t>(), N_dst, num_src, E, static_cast<int>(H),
                     static_cast<int>(D), rowptr.options());
    });
  });
  return acc.to(grad_out.scalar_type());
}

at::Tensor multihead_sddmm_cuda(const at::Tensor& rowptr, const at::Tensor& col,
                                const at::Tensor& a, const at::Tensor& b) {
  check_sddmm(rowptr, col, a, b);
  const int64_t N_dst = rowptr.numel() - 1, E = col.numel();
  const int64_t N_src = b.size(0), H = a.size(1), D = a.size(2);
  TORCH_CHECK(a.is_cuda(), "a must be a CUDA tensor for the CUDA kernel");
  check_int_width(H, D);
  const c10::cuda::CUDAGuard guard(a.device());
  if (E * H == 0) return at::empty({E, H}, a.options());
  // D == 0 gives empty dot products; without rows no edge is covered.
  if (D == 0 || N_dst == 0) return at::zeros({E, H}, a.options());
  auto out = at::empty({E, H}, a.options());
  const auto rowptr_c = rowptr.contiguous(), col_c = col.contiguous();
  const auto a_c = a.contiguous(), b_c = b.contiguous();
  FLOAT_SWITCH(a.scalar_type(), "multihead_sddmm", [&] {
    INDEX_SWITCH(rowptr.scalar_type(), "multihead_sddmm", [&] {
      DotParams<scalar_t, index_t> d{};
      d.ptr = rowptr_c.data_ptr<index_t>();
      d.idx = col_c.data_ptr<index_t>();
      d.perm = nullptr;
      d.rowval = a_c.data_ptr<scalar_t>();
      d.gathered = b_c.data_ptr<scalar_t>();
      d.weight = nullptr;
      d.acc_out = nullptr;
      d.dot_out = out.data_ptr<scalar_t>();
      d.num_rows = N_dst;
      d.num_gathered = N_src;
      d.num_edges = E;
      d.H = static_cast<int>(H);
      d.D = static_cast<int>(D);
      d.HD = static_cast<int>(H * D);
      launch_dot(d, rowptr.options());
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(pyg_multihead_agg, CUDA, m) {
  m.impl("multihead_spmm", &multihead_spmm_cuda);
  m.impl("multihead_spmm_backward_csc", &multihead_spmm_backward_csc_cuda);
  m.impl("multihead_spmm_backward_x_scatter", &multihead_spmm_backward_x_scatter_cuda);
  m.impl("multihead_sddmm", &multihead_sddmm_cuda);
}

}  // namespace pyg_multihead_agg
