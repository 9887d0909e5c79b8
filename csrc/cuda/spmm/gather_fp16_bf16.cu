// launch_gather and its gather_kernel instances for float16 and bfloat16.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "../utils/dispatch.cuh"
#include "gather_launch.cuh"

namespace pyg_multihead_agg {

#define INSTANTIATE(scalar_t, index_t) \
  template void launch_gather<scalar_t, index_t>( \
      GatherParams<scalar_t, index_t>, const at::TensorOptions&);
FOR_EACH_HALF_TYPE_AND_INDEX(INSTANTIATE)
#undef INSTANTIATE

}  // namespace pyg_multihead_agg
