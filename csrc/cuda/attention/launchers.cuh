// The launchers of the fused attention's kernels, one per kernel (or kernel
// group), each defined and instantiated next to its kernel:
//   launch_gat_forward_rows    forward_rows_launch.cuh, forward_rows_*.cu
//   launch_gat_forward_heads   forward_heads.cu
//   launch_gat_backward_rows   backward_rows.cu
//   launch_gat_backward_heads  backward_heads.cu
//   launch_gat_row_sums        row_sum.cu
//   launch_gatv2_forward_rows  forward_rows_launch.cuh, gatv2_forward_*.cu
//   launch_gatv2_backward_rows gatv2_backward.cu
//   launch_transformer_forward_rows  forward_rows_launch.cuh, transformer_forward_*.cu
//   launch_transformer_backward_rows transformer_backward.cu
// All of them are built for the four value dtypes (at::Half, at::BFloat16,
// float, double) and both index types (int32_t, int64_t), and launch on the
// current stream; entry.cu calls them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include "heuristics.cuh"
#include "params.cuh"

namespace pyg_multihead_agg {

// The forward with all heads of a row per group (attention_rows_kernel<GatScore>),
// for shapes row_config accepts (rc.ok).
template <typename scalar_t, typename index_t>
void launch_gat_forward_rows(AttentionParams<scalar_t, index_t> p, const RowConfig& rc,
                             const at::TensorOptions& options);

// The forward with one (row, head) item per group (gat_forward_kernel), for
// every other shape.
template <typename scalar_t, typename index_t>
void launch_gat_forward_heads(AttentionParams<scalar_t, index_t> p, const HeadConfig& c,
                              const at::TensorOptions& options);

// The backward's pass over the CSC with all heads of a column per group
// (gat_aux_kernel, attention_backward_rows_kernel<GatScore>, the slices' sums): grad_x,
// grad_s_src and grad_z. `out` is the forward's output.
template <typename scalar_t, typename index_t>
void launch_gat_backward_rows(AttentionParams<scalar_t, index_t> p, const scalar_t* out,
                              const RowConfig& rc, const at::TensorOptions& options);

// The same with one (column, head) item per group (gat_delta_kernel,
// gat_backward_kernel); c.num_chunks must be 1.
template <typename scalar_t, typename index_t>
void launch_gat_backward_heads(AttentionParams<scalar_t, index_t> p, const scalar_t* out,
                               const HeadConfig& c, const at::TensorOptions& options);

// grad_s_dst[i, h] = the sum of grad_z over the CSR row i (p.grad_z by edge
// id, or by CSC entry through p.perm_inv).
template <typename scalar_t, typename index_t>
void launch_gat_row_sums(const AttentionParams<scalar_t, index_t>& p, scalar_t* grad_dst,
                         const index_t* rowptr, const at::TensorOptions& options);

// The GATv2 forward (attention_rows_kernel<Gatv2Score>), for shapes
// gatv2_row_config accepts (rc.ok).
template <typename scalar_t, typename index_t>
void launch_gatv2_forward_rows(AttentionParams<scalar_t, index_t> p, const RowConfig& rc,
                               const at::TensorOptions& options);

// The GATv2 backward: the CSC pass into p.out (grad_x_l), p.grad_e_feat,
// p.grad_z and p.bits, then grad_x_dst from the destination pass over the
// CSR (rowptr). Returns grad_att summed per fetch range of the CSC pass,
// [ranges, H * D] (acc_t), whose sum over rows is grad_att. `out` is the
// forward's output.
template <typename scalar_t, typename index_t>
at::Tensor launch_gatv2_backward_rows(AttentionParams<scalar_t, index_t> p, const scalar_t* out,
                                      scalar_t* grad_x_dst, const index_t* rowptr,
                                      const RowConfig& rc, const at::TensorOptions& options);

// The TransformerConv forward (attention_rows_kernel<TransformerScore>), for
// shapes gatv2_row_config accepts (the same padded heads).
template <typename scalar_t, typename index_t>
void launch_transformer_forward_rows(AttentionParams<scalar_t, index_t> p, const RowConfig& rc,
                                     const at::TensorOptions& options);

// The TransformerConv backward: the CSC pass into p.out (grad_value),
// p.grad_key, p.grad_e_feat and p.grad_z, then grad_query from the
// destination pass over the CSR (rowptr, col). `out` is the forward's output.
template <typename scalar_t, typename index_t>
void launch_transformer_backward_rows(AttentionParams<scalar_t, index_t> p, const scalar_t* out,
                                      scalar_t* grad_query, const index_t* rowptr,
                                      const index_t* col, const RowConfig& rc,
                                      const at::TensorOptions& options);

}  // namespace pyg_multihead_agg
