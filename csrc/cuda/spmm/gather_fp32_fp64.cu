// launch_gather and its gather_kernel instances for float32 and float64.
#include <cstdint>

#include "gather_launch.cuh"

namespace pyg_multihead_agg {

#define INSTANTIATE(scalar_t, index_t) \
  template void launch_gather<scalar_t, index_t>( \
      GatherParams<scalar_t, index_t>, const at::TensorOptions&);
INSTANTIATE(float, int32_t)
INSTANTIATE(float, int64_t)
INSTANTIATE(double, int32_t)
INSTANTIATE(double, int64_t)
#undef INSTANTIATE

}  // namespace pyg_multihead_agg
