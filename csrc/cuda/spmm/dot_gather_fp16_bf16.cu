// try_launch_dot_gather and its dot_gather_kernel instances for float16 and bfloat16.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "../utils/dispatch.cuh"
#include "dot_gather_launch.cuh"

namespace pyg_multihead_agg {

#define INSTANTIATE(scalar_t, index_t) \
  template bool try_launch_dot_gather<scalar_t, index_t>( \
      DotParams<scalar_t, index_t>, const at::TensorOptions&);
FOR_EACH_HALF_TYPE_AND_INDEX(INSTANTIATE)
#undef INSTANTIATE

}  // namespace pyg_multihead_agg
