// launch_gather and its gather_kernel instances for float16 and bfloat16.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "gather_launch.cuh"

namespace pyg_multihead_agg {

#define INSTANTIATE(scalar_t, index_t) \
  template void launch_gather<scalar_t, index_t>( \
      GatherParams<scalar_t, index_t>, const at::TensorOptions&);
INSTANTIATE(at::Half, int32_t)
INSTANTIATE(at::Half, int64_t)
INSTANTIATE(at::BFloat16, int32_t)
INSTANTIATE(at::BFloat16, int64_t)
#undef INSTANTIATE

}  // namespace pyg_multihead_agg
