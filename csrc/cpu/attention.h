// What the CPU kernels of the fused attention operators (gat_attention.cpp,
// gatv2_attention.cpp, transformer_attention.cpp) share: the dropout state,
// leaky_relu, the online-softmax forward and the CSC source pass of the
// ops whose score reads the gathered rows, and the per-destination delta of
// the backward.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
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

// A small tensor (att, bias) in acc_t, contiguous.
template <typename acc_t, typename scalar_t>
std::vector<acc_t> to_acc(const at::Tensor& t) {
  const auto c = t.contiguous();
  const scalar_t* p = c.data_ptr<scalar_t>();
  std::vector<acc_t> v(c.numel());
  for (int64_t k = 0; k < c.numel(); ++k) v[k] = static_cast<acc_t>(p[k]);
  return v;
}

template <typename acc_t>
CPU_KERNEL_INLINE acc_t leaky_relu(acc_t z, acc_t negative_slope) {
  return z > acc_t(0) ? z : z * negative_slope;
}

// The forward of the ops whose score reads the gathered rows (GATv2,
// transformer): destination rows in parallel, one pass over each row's edges
// with an online softmax per head, the state rescaled when a head's maximum
// grows, normalised at the end and the bias (acc_t [H * D], zeros without
// one) added before the one rounding to the output. The op supplies
//   load_row(i, row):            its per-row state into row (acc_t [H * D])
//   logit(row, e, j, f):         the logit of edge e (source j) for the head
//                                whose features start at f = h * width
//   add(acc, w, e, j, f):        acc[0, width) += w * the edge's aggregated row
// and `gathered`, the rows whose source row j it prefetches ahead.
template <typename acc_t, typename scalar_t, typename index_t, typename Width, typename LoadRow,
          typename Logit, typename Add>
void online_softmax_rows(const index_t* rp, const index_t* cp, int64_t N_dst, int64_t N_src,
                         int64_t E, int64_t H, Width width, const scalar_t* gathered,
                         const Dropout& dropout, bool has_dropout, const acc_t* bias,
                         scalar_t* out, acc_t* lse, LoadRow&& load_row, Logit&& logit, Add&& add) {
  constexpr acc_t kInf = std::numeric_limits<acc_t>::infinity();
  const int64_t HD = H * width;
  const acc_t keep_scale = static_cast<acc_t>(dropout.keep_scale);
  const DropoutRng rng = dropout.rng;
  check_ends(rp, N_dst, E, "rowptr", "col");
  parallel_rows(rp, N_dst, [&](int64_t begin, int64_t end) CPU_KERNEL_INLINE_LAMBDA {
    std::vector<acc_t> acc(HD), mx(H), sum(H), row(HD);
    for (int64_t i = begin; i < end; ++i) {
      const index_t lo = rp[i], hi = rp[i + 1];
      check_range(lo, hi, E, "rowptr", i);
      scalar_t* o = out + i * HD;
      acc_t* l_out = lse + i * H;
      if (lo == hi) {  // no edges: out = 0 (+ bias), lse = -inf
        for (int64_t f = 0; f < HD; ++f) o[f] = static_cast<scalar_t>(bias[f]);
        std::fill(l_out, l_out + H, -kInf);
        continue;
      }
      load_row(i, row);
      std::fill(mx.begin(), mx.end(), -kInf);
      std::fill(sum.begin(), sum.end(), acc_t(0));
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t e = lo; e < hi; ++e) {
        const index_t j = cp[e];
        check_index_value(j, N_src, "col", e);
        prefetch_source(gathered, cp, e, E, N_src, HD);
        unsigned kept = 0xFu;  // dropout bits of heads h .. h + 3 (one Philox call)
        for (int64_t h = 0; h < H; ++h) {
          const int64_t f = h * width;
          const acc_t l = logit(row, e, static_cast<int64_t>(j), f);
          if (l > mx[h]) {  // rescale the state to the new maximum
            const acc_t c = mx[h] == -kInf ? acc_t(0) : std::exp(mx[h] - l);
            sum[h] *= c;
            for (int64_t d = 0; d < width; ++d) acc[f + d] *= c;
            mx[h] = l;
          }
          // exp(l - mx); 0 for -inf, NaN for a NaN logit (it never becomes
          // the maximum, and reaches sum and the row here).
          const acc_t w = l == -kInf ? acc_t(0) : std::exp(l - mx[h]);
          sum[h] += w;
          if (has_dropout && (h & 3) == 0) kept = rng.keep4(e, h >> 2);
          if ((kept >> (h & 3)) & 1u) add(acc.data() + f, w * keep_scale, e, static_cast<int64_t>(j), f);
        }
      }
      for (int64_t h = 0; h < H; ++h) {
        // sum == 0: every logit -inf; NaN as in the reference (0 / 0).
        l_out[h] = sum[h] == acc_t(0) ? std::numeric_limits<acc_t>::quiet_NaN()
                                      : mx[h] + std::log(sum[h]);
        store_row(o + h * width, acc.data() + h * width, acc_t(1) / sum[h], bias + h * width,
                  int64_t(width));
      }
    }
  });
}

// The CSC source pass of the same ops' backward: sources in parallel, each
// source's CSC entries (i = row[k], e = perm[k]) in order, all heads of an
// entry together, the attention recomputed from lse and the dropout mask
// redrawn. The pass owns the order, the checks, the mask and the logit
// gradient grad_l = alpha * (m * dot - delta + grad_lse), stored by edge id
// into grad_l_out [E, H]; the op supplies, for the head whose features start
// at f = h * width:
//   logit(scratch, j, i, e, f):     the logit (scratch: acc_t [scratch_size],
//                                   this thread's, kept for accumulate)
//   value_dot(j, i, e, f):          <grad_out[i, h], the edge's aggregated row>
//   accumulate(acc, scratch, j, i, e, f, keep, w, grad_l):
//                                   the entry's share of the source's
//                                   accumulators acc (acc_t [num_acc * H *
//                                   width], zeroed per source); w = alpha / (1
//                                   - p) when kept
//   finish(j, acc):                 the source's results from acc.
template <typename acc_t, typename scalar_t, typename index_t, typename Width, typename Logit,
          typename ValueDot, typename Accumulate, typename Finish>
void csc_source_pass(const index_t* ccp, const index_t* rwp, const index_t* pp, int64_t N_src,
                     int64_t N_dst, int64_t E, int64_t H, Width width, const scalar_t* grad_out,
                     const acc_t* lse, const acc_t* delta, const acc_t* grad_lse,
                     const Dropout& dropout, bool has_dropout, acc_t* grad_l_out,
                     int64_t num_acc, int64_t scratch_size, Logit&& logit, ValueDot&& value_dot,
                     Accumulate&& accumulate, Finish&& finish) {
  const int64_t HD = H * width;
  const acc_t keep_scale = static_cast<acc_t>(dropout.keep_scale);
  const DropoutRng rng = dropout.rng;
  parallel_rows(ccp, N_src, [&](int64_t begin, int64_t end) CPU_KERNEL_INLINE_LAMBDA {
    std::vector<acc_t> acc(num_acc * HD), scratch(scratch_size);
    for (int64_t j = begin; j < end; ++j) {
      std::fill(acc.begin(), acc.end(), acc_t(0));
      const index_t lo = ccp[j], hi = ccp[j + 1];
      check_range(lo, hi, E, "colptr", j);
      for (int64_t k = lo; k < hi; ++k) {
        const index_t i = rwp[k], e = pp[k];
        check_index_value(i, N_dst, "row", k);
        check_index_value(e, E, "perm", k);
        prefetch_source(grad_out, rwp, k, E, N_dst, HD);
        unsigned kept = 0xFu;  // dropout bits of heads h .. h + 3 (one Philox call)
        for (int64_t h = 0; h < H; ++h) {
          const int64_t f = h * width, ih = static_cast<int64_t>(i) * H + h;
          const acc_t l = logit(scratch, j, static_cast<int64_t>(i), static_cast<int64_t>(e), f);
          const acc_t alpha = std::exp(l - lse[ih]);
          if (has_dropout && (h & 3) == 0) kept = rng.keep4(e, h >> 2);
          const bool keep = (kept >> (h & 3)) & 1u;
          // m * dot; 0 for a dropped element (whose dot is not needed)
          const acc_t m_dot =
              keep ? keep_scale * value_dot(j, static_cast<int64_t>(i), static_cast<int64_t>(e), f)
                   : acc_t(0);
          acc_t grad_l = m_dot - delta[ih];
          if (grad_lse != nullptr) grad_l += grad_lse[ih];
          grad_l *= alpha;
          grad_l_out[static_cast<int64_t>(e) * H + h] = grad_l;
          accumulate(acc.data(), scratch, j, static_cast<int64_t>(i), static_cast<int64_t>(e), f,
                     keep, alpha * keep_scale, grad_l);
        }
      }
      finish(j, acc.data());
    }
  });
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
