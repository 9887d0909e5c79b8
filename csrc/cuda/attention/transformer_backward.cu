// The launcher of TransformerConv's backward (launch_transformer_backward_rows,
// launchers.cuh): gat_aux_kernel (the row terms), the CSC source pass
// attention_backward_rows_kernel<TransformerScore> (grad_value, grad_key,
// grad_e_feat, and per edge the logit gradient), the destination pass
// transformer_dst_rows_kernel (grad_query), and the slices' sums. Heads of 4
// or 8 lanes take the transposed CSC pass (backward_row_transposed_dot).
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/TensorOptions.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>

#include "../utils/config.cuh"
#include "../utils/dispatch.cuh"
#include "../utils/index.cuh"
#include "../utils/lanes.cuh"
#include "../utils/sum_slices.cuh"
#include "../utils/work_list.cuh"
#include "backward_rows_kernel.cuh"
#include "backward_rows_launch.cuh"
#include "head_lanes.cuh"
#include "heuristics.cuh"
#include "launchers.cuh"
#include "params.cuh"
#include "scores.cuh"

namespace pyg_multihead_agg {
namespace {

// grad_query[i, h] = scale * sum over the CSR row i of grad_z[e, h] *
// (key[col[e], h] (+ e_feat[e, h])), from the logit gradients the CSC pass
// stored (by edge id, or by CSC entry through perm_inv): one weighted gather
// of the keys per row, in the forward's lane layout (padded heads); long
// rows in slices, their partial rows in `part`.
template <typename scalar_t, typename index_t, int V, int VPL>
__global__ void __launch_bounds__(kBackwardThreads)
    transformer_dst_rows_kernel(const AttentionParams<scalar_t, index_t> p,
                                const index_t* __restrict__ rowptr,
                                const index_t* __restrict__ col,
                                scalar_t* __restrict__ grad_query,
                                at::opmath_type<scalar_t>* __restrict__ part,
                                const SliceList sl) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int U = kLoadsInFlight / 2 / VPL > 0 ? kLoadsInFlight / 2 / VPL : 1;
  const int G = p.G, lane = threadIdx.x & (G - 1);
  const RowLanes<V, VPL> m(lane, G, p.log2S, p.H, p.D);
  auto pass = [&](acc_t(&acc)[VPL][V], int64_t lo, int64_t hi) {
#pragma unroll
    for (int k = 0; k < VPL; ++k)
#pragma unroll
      for (int v = 0; v < V; ++v) acc[k][v] = 0;
    for (int64_t e0 = lo; e0 < hi; e0 += U) {
      int64_t zi[U];
      index_t j[U];
      bool ok[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const bool inside = e0 + u < hi;
        zi[u] = p.perm_inv != nullptr
                    ? static_cast<int64_t>(load_index_if(inside, p.perm_inv + e0 + u))
                    : e0 + u;
        j[u] = load_index_if(inside, col + e0 + u);
        ok[u] = inside && in_range(zi[u], p.num_edges) && in_range(j[u], p.num_rows);
      }
      acc_t gl[U][VPL];
      Vec<scalar_t, V> kv[U][VPL], ef[U][VPL];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int k = 0; k < VPL; ++k) {
          const bool use = ok[u] && m.valid[k];
          gl[u][k] = load_value_if(use, p.grad_z + zi[u] * p.H + m.head[k]);
          kv[u][k] = load_vec_if<scalar_t, V>(
              use, p.key + static_cast<int64_t>(j[u]) * p.HD + m.feat[k]);
          ef[u][k] = load_vec_if<scalar_t, V>(use && p.e_feat != nullptr,
                                              p.e_feat + (e0 + u) * p.HD + m.feat[k]);
        }
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int k = 0; k < VPL; ++k) {
          const acc_t gs = gl[u][k] * p.score_scale;  // 0 for unused entries
          axpy_vec(acc[k], gs, kv[u][k]);
          if (p.e_feat != nullptr) axpy_vec(acc[k], gs, ef[u][k]);
        }
    }
  };
  for_each_dst_row<scalar_t>(rowptr, p.num_edges, sl, G, m, p.HD, part, grad_query, pass);
}

}  // namespace

template <typename scalar_t, typename index_t>
void launch_transformer_backward_rows(AttentionParams<scalar_t, index_t> p, const scalar_t* out,
                                      scalar_t* grad_query, const index_t* rowptr,
                                      const index_t* col, const RowConfig& rc,
                                      const at::TensorOptions& options) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kVec = vec_width<scalar_t>();
  const auto acc_options = options.dtype(c10::CppTypeToScalarType<acc_t>::value);
  const BackwardScratch b =
      prepare_backward_rows(p, out, rc, gat_backward_slice_len<scalar_t>(p.num_edges), options);
  const at::Tensor part_key = at::empty({b.max_slots * p.HD}, acc_options);
  p.part_key = part_key.data_ptr<acc_t>();
  const DstScratch dst = prepare_dst_rows(p, rowptr, options);
  auto stream = c10::cuda::getCurrentCUDAStream();
  VPL_SWITCH(rc.vpl, kVPL, [&] {
    launch_backward_rows_pass<TransformerScore, scalar_t, index_t, kVec, kVPL>(p, b.sl);
    // grad_value[j] and grad_key[j] of every sliced column j: its slices' sums
    launch_sum_slices(p.ptr, p.num_edges, b.sl, p.part_x, p.out, p.HD,
                      static_cast<const acc_t*>(p.part_key), p.grad_key, p.HD);
    // (the CSR's rows are the destinations, p.num_gathered; its column
    // indices address the sources, p.num_rows)
    auto kernel = transformer_dst_rows_kernel<scalar_t, index_t, kVec, kVPL>;
    kernel<<<persistent_grid(kernel, p.num_gathered, p.G, 0, kBackwardThreads), kBackwardThreads,
             0, stream>>>(p, rowptr, col, grad_query, dst.part.data_ptr<acc_t>(), dst.sl);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  launch_sum_slices(rowptr, p.num_edges, dst.sl, dst.part.data_ptr<acc_t>(), grad_query, p.HD,
                    static_cast<const acc_t*>(nullptr), static_cast<scalar_t*>(nullptr), 0);
}

#define INSTANTIATE(scalar_t, index_t)                                                      \
  template void launch_transformer_backward_rows<scalar_t, index_t>(                        \
      AttentionParams<scalar_t, index_t>, const scalar_t*, scalar_t*, const index_t*,       \
      const index_t*, const RowConfig&, const at::TensorOptions&);
FOR_EACH_FLOAT_AND_INDEX(INSTANTIATE)
#undef INSTANTIATE

}  // namespace pyg_multihead_agg
