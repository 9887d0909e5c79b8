// Static switches in the style of flash-attention's static_switch.h: each turns
// a run-time value into a compile-time constant in one readable place, so the
// kernels are written once and specialised without copy-paste. Usage:
//
//   FLOAT_SWITCH(x.scalar_type(), "multihead_spmm", [&] {
//     INDEX_SWITCH(col.scalar_type(), "multihead_spmm", [&] {
//       VPL_SWITCH(config.vectors_per_lane, kVPL, [&] { launch<scalar_t, index_t, kVPL>(); });
//     });
//   });
//
// Instantiations multiply, so keep the lists short: every kernel instance adds
// to the build, which users run from source. The value dtypes are split over
// the .cu files of a kernel (gather_fp16_bf16.cu, gather_fp32_fp64.cu, ...)
// so that they compile in parallel, each instance once.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <cstdint>

// The explicit instantiations of a launcher: M(scalar_t, index_t) for each
// index type and the 2-byte value types, the 4- and 8-byte ones, or all four
// (M expands to one declaration, its semicolon included).
#define FOR_EACH_INDEX(M, scalar_t) M(scalar_t, int32_t) M(scalar_t, int64_t)
#define FOR_EACH_HALF_TYPE_AND_INDEX(M) FOR_EACH_INDEX(M, at::Half) FOR_EACH_INDEX(M, at::BFloat16)
#define FOR_EACH_FULL_TYPE_AND_INDEX(M) FOR_EACH_INDEX(M, float) FOR_EACH_INDEX(M, double)
#define FOR_EACH_FLOAT_AND_INDEX(M) \
  FOR_EACH_HALF_TYPE_AND_INDEX(M) FOR_EACH_FULL_TYPE_AND_INDEX(M)

// scalar_t: the value dtype (float16, bfloat16, float32, float64).
#define FLOAT_SWITCH(DTYPE, NAME, ...)                                              \
  [&] {                                                                             \
    switch (DTYPE) {                                                                \
      case at::kHalf: {                                                             \
        using scalar_t = at::Half;                                                  \
        return __VA_ARGS__();                                                       \
      }                                                                             \
      case at::kBFloat16: {                                                         \
        using scalar_t = at::BFloat16;                                              \
        return __VA_ARGS__();                                                       \
      }                                                                             \
      case at::kFloat: {                                                            \
        using scalar_t = float;                                                     \
        return __VA_ARGS__();                                                       \
      }                                                                             \
      case at::kDouble: {                                                           \
        using scalar_t = double;                                                    \
        return __VA_ARGS__();                                                       \
      }                                                                             \
      default:                                                                      \
        TORCH_CHECK(false, NAME, ": expected float16, bfloat16, float32 or float64, " \
                    "got ", DTYPE);                                                 \
    }                                                                               \
  }()

// index_t: the graph's index dtype (int32 or int64).
#define INDEX_SWITCH(DTYPE, NAME, ...)                                           \
  [&] {                                                                          \
    switch (DTYPE) {                                                             \
      case at::kInt: {                                                           \
        using index_t = int32_t;                                                 \
        return __VA_ARGS__();                                                    \
      }                                                                          \
      case at::kLong: {                                                          \
        using index_t = int64_t;                                                 \
        return __VA_ARGS__();                                                    \
      }                                                                          \
      default:                                                                   \
        TORCH_CHECK(false, NAME, ": expected int32 or int64 indices, got ", DTYPE); \
    }                                                                            \
  }()

// COND -> constexpr bool CONST_NAME.
#define BOOL_SWITCH(COND, CONST_NAME, ...)     \
  [&] {                                        \
    if (COND) {                                \
      constexpr static bool CONST_NAME = true; \
      return __VA_ARGS__();                    \
    } else {                                   \
      constexpr static bool CONST_NAME = false; \
      return __VA_ARGS__();                    \
    }                                          \
  }()

// Vectors per lane (1, 2 or 4): how many 16-byte vectors of one row each lane
// of a group holds in registers. Rows wider than 32 lanes x 4 vectors are
// processed in several feature chunks, so this list covers every H*D.
#define VPL_SWITCH(VPL, CONST_NAME, ...)     \
  [&] {                                      \
    if ((VPL) == 1) {                        \
      constexpr static int CONST_NAME = 1;   \
      return __VA_ARGS__();                  \
    } else if ((VPL) == 2) {                 \
      constexpr static int CONST_NAME = 2;   \
      return __VA_ARGS__();                  \
    } else {                                 \
      TORCH_CHECK((VPL) == 4, "VPL_SWITCH: unsupported vectors per lane ", (VPL)); \
      constexpr static int CONST_NAME = 4;   \
      return __VA_ARGS__();                  \
    }                                        \
  }()

namespace pyg_multihead_agg {

// Elements per 16-byte vector: 8 halves, 4 floats, 2 doubles.
template <typename scalar_t>
constexpr int vec_width() {
  return static_cast<int>(16 / sizeof(scalar_t));
}

}  // namespace pyg_multihead_agg
