// Rows through an index: dst[e, :] = src[index[e], :], the gather that puts
// the backwards' per-edge gradients, computed in CSC order, into edge order.
#pragma once

#include <ATen/core/Tensor.h>

namespace pyg_multihead_agg {

// dst[e, :] = src[index[e], :] for contiguous [E, H] tensors of one dtype
// (zero for an out-of-range index[e]), on the current stream. index_t: int32_t
// or int64_t, the dtype of index.
template <typename index_t>
void launch_gather_rows(const at::Tensor& src, const at::Tensor& index, at::Tensor& dst);

}  // namespace pyg_multihead_agg
