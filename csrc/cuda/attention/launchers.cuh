// The launchers of the fused attention's kernels, one per kernel (or kernel
// group), each defined and instantiated next to its kernel:
//   launch_gat_forward_rows    forward_rows_launch.cuh, forward_rows_*.cu
//   launch_gat_forward_heads   forward_heads.cu
//   launch_gat_backward_rows   backward_rows.cu
//   launch_gat_backward_heads  backward_heads.cu
//   launch_gat_row_sums        row_sum.cu
// All of them are built for the four value dtypes (at::Half, at::BFloat16,
// float, double) and both index types (int32_t, int64_t), and launch on the
// current stream; entry.cu calls them.
#pragma once

#include <c10/core/TensorOptions.h>

#include "heuristics.cuh"
#include "params.cuh"

namespace pyg_multihead_agg {

// The forward with all heads of a row per group (gat_forward_rows_kernel),
// for shapes row_config accepts (rc.ok).
template <typename scalar_t, typename index_t>
void launch_gat_forward_rows(GatParams<scalar_t, index_t> p, const RowConfig& rc,
                             const at::TensorOptions& options);

// The forward with one (row, head) item per group (gat_forward_kernel), for
// every other shape.
template <typename scalar_t, typename index_t>
void launch_gat_forward_heads(GatParams<scalar_t, index_t> p, const HeadConfig& c,
                              const at::TensorOptions& options);

// The backward's pass over the CSC with all heads of a column per group
// (gat_aux_kernel, gat_backward_rows_kernel, the slices' sums): grad_x,
// grad_s_src and grad_z. `out` is the forward's output.
template <typename scalar_t, typename index_t>
void launch_gat_backward_rows(GatParams<scalar_t, index_t> p, const scalar_t* out,
                              const RowConfig& rc, const at::TensorOptions& options);

// The same with one (column, head) item per group (gat_delta_kernel,
// gat_backward_kernel); c.num_chunks must be 1.
template <typename scalar_t, typename index_t>
void launch_gat_backward_heads(GatParams<scalar_t, index_t> p, const scalar_t* out,
                               const HeadConfig& c, const at::TensorOptions& options);

// grad_s_dst[i, h] = the sum of grad_z over the CSR row i (p.grad_z by edge
// id, or by CSC entry through p.perm_inv).
template <typename scalar_t, typename index_t>
void launch_gat_row_sums(const GatParams<scalar_t, index_t>& p, scalar_t* grad_dst,
                         const index_t* rowptr, const at::TensorOptions& options);

}  // namespace pyg_multihead_agg
