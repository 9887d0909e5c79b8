// launch_transformer_forward_rows and its attention_rows_kernel<TransformerScore>
// instances for float32 and float64.
#include <cstdint>

#include "../utils/dispatch.cuh"
#include "forward_rows_launch.cuh"

namespace pyg_multihead_agg {

#define INSTANTIATE(scalar_t, index_t) \
  template void launch_transformer_forward_rows<scalar_t, index_t>( \
      AttentionParams<scalar_t, index_t>, const RowConfig&, const at::TensorOptions&);
FOR_EACH_FULL_TYPE_AND_INDEX(INSTANTIATE)
#undef INSTANTIATE

}  // namespace pyg_multihead_agg
