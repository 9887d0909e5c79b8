// What the CPU kernels of the fused attention operators (gat_attention.cpp,
// gatv2_attention.cpp) share: the dropout state, leaky_relu, and the
// per-destination delta of the backward.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "../philox.h"
#include "graph_checks.h"
#include "loops.h"

namespace pyg_multihead_agg {
namespace cpu {

// The dropout generator and the scale of a kept element, 1 / (1 - p) (0 when
// p == 1, where nothing is kept).
struct Dropout {
  DropoutRng rng;
  double keep_scale = 1.0;
};

inline Dropout make_dropout(double dropout_p, const std::optional<at::Tensor>& philox) {
  Dropout d;
  if (philox.has_value() && philox->defined()) {
    const auto p = philox->contiguous();
    const int64_t* v = p.data_ptr<int64_t>();
    d.rng.seed = static_cast<uint64_t>(v[0]);
    d.rng.offset = static_cast<uint64_t>(v[1]);
  }
  d.rng.threshold = dropout_threshold(dropout_p);
  d.keep_scale = dropout_p < 1.0 ? 1.0 / (1.0 - dropout_p) : 0.0;
  return d;
}

template <typename acc_t>
CPU_KERNEL_INLINE acc_t leaky_relu(acc_t z, acc_t negative_slope) {
  return z > acc_t(0) ? z : z * negative_slope;
}

// delta[i, h] = <grad_out[i, h], out[i, h] - bias[h]> for every destination
// (out is the biased output; bias may be null), in acc_t; validates the CSR
// (rowptr rp, col cp), which the backward's last pass reads unchecked.
template <typename acc_t, typename scalar_t, typename index_t>
void row_deltas(const index_t* rp, const index_t* cp, int64_t N_dst, int64_t N_src, int64_t E,
                int64_t H, int64_t D, const scalar_t* gop, const scalar_t* outp,
                const scalar_t* bp, acc_t* dp) {
  const int64_t HD = H * D;
  parallel_rows(rp, N_dst, [&](int64_t begin, int64_t end) CPU_KERNEL_INLINE_LAMBDA {
    for (int64_t i = begin; i < end; ++i) {
      check_range(rp[i], rp[i + 1], E, "rowptr", i);
      for (int64_t e = rp[i]; e < rp[i + 1]; ++e) check_index_value(cp[e], N_src, "col", e);
      for (int64_t h = 0; h < H; ++h) {
        const scalar_t* g = gop + i * HD + h * D;
        const scalar_t* o = outp + i * HD + h * D;
        if (bp == nullptr) {
          dp[i * H + h] = dot<acc_t>(g, o, D);
        } else {  // the attention output: out - bias, in acc_t
          const scalar_t* b = bp + h * D;
          acc_t sum = 0;
          for (int64_t d = 0; d < D; ++d) {
            sum += static_cast<acc_t>(g[d]) * (static_cast<acc_t>(o[d]) - static_cast<acc_t>(b[d]));
          }
          dp[i * H + h] = sum;
        }
      }
    }
  });
}

}  // namespace cpu
}  // namespace pyg_multihead_agg
