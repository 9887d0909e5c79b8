// The launchers of the multihead_spmm family's kernels, one per kernel (or
// kernel group), each defined and instantiated next to its kernel:
//   launch_gather            gather_launch.cuh, gather_*.cu
//   try_launch_dot_gather    dot_gather_launch.cuh, dot_gather_*.cu
//   try_launch_tc_gather     tensor_core_gather.cu
//   try_launch_tc_dot_gather tensor_core_backward.cu
//   launch_sddmm_generic     sddmm_generic.cu
//   launch_scatter           scatter.cu
// All of them are built for the four value dtypes (at::Half, at::BFloat16,
// float, double) and both index types (int32_t, int64_t), and launch on the
// current stream; entry.cu calls them.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>

#include "../utils/work_list.cuh"
#include "params.cuh"

namespace pyg_multihead_agg {

// out = the gather of p (GatherParams), on the tensor cores when they apply
// and the heuristics take them, else on gather_kernel.
template <typename scalar_t, typename index_t>
void launch_gather(GatherParams<scalar_t, index_t> p, const at::TensorOptions& options);

// The tensor-core forward when it applies (2-byte types, no weight
// permutation, H * D = 128 with H = 2, 4 or 8, aligned x, out and weight
// rows, a kernel built for sm_80 or newer) and spmm_tensor_cores_forward()
// takes it; returns whether it launched.
template <typename scalar_t, typename index_t>
bool try_launch_tc_gather(const GatherParams<scalar_t, index_t>& p, const WorkList& wl);

// dot_gather_kernel when its fast path applies (16-byte vectors, D / V a
// power of two, heads not cut by feature chunks); returns whether it
// launched. With weight == nullptr only dot_out is written; with dot_out ==
// nullptr (and rowval, not read then) only acc_out.
template <typename scalar_t, typename index_t>
bool try_launch_dot_gather(DotParams<scalar_t, index_t> p, const at::TensorOptions& options);

// The tensor-core backward when it applies (2-byte types, H * D = 128 with
// H = 2, 4 or 8, a perm and a weight, aligned grad_out, grad_x and weight
// rows; with dots also aligned x and dot rows; a kernel built for sm_80 or
// newer) and spmm_tensor_cores_backward() takes it; returns whether it
// launched.
template <typename scalar_t, typename index_t>
bool try_launch_tc_dot_gather(const DotParams<scalar_t, index_t>& p,
                              const at::TensorOptions& options);

// The dots of p (dot_out only) for any D and alignment: the fallback of
// try_launch_dot_gather.
template <typename scalar_t, typename index_t>
void launch_sddmm_generic(DotParams<scalar_t, index_t> p, const at::TensorOptions& options);

// acc[col[e]] += weight[e] * grad_out[r] over the CSR rows r, with atomics
// (not deterministic); acc is [num_src, H, D] in the accumulation type,
// zero-filled by the caller.
template <typename scalar_t, typename index_t>
void launch_scatter(const index_t* rowptr, const index_t* col, const scalar_t* weight,
                    const scalar_t* grad_out, at::opmath_type<scalar_t>* acc, int64_t num_rows,
                    int64_t num_src, int64_t num_edges, int H, int D,
                    const at::TensorOptions& options);

}  // namespace pyg_multihead_agg
