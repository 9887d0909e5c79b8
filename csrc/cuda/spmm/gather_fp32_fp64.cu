// launch_gather and its gather_kernel instances for float32 and float64.
#include <cstdint>

#include "../utils/dispatch.cuh"
#include "gather_launch.cuh"

namespace pyg_multihead_agg {

#define INSTANTIATE(scalar_t, index_t) \
  template void launch_gather<scalar_t, index_t>( \
      GatherParams<scalar_t, index_t>, const at::TensorOptions&);
FOR_EACH_FULL_TYPE_AND_INDEX(INSTANTIATE)
#undef INSTANTIATE

}  // namespace pyg_multihead_agg
