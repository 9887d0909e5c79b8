// _gat_scores and _gat_scores_backward (schemas and contract: csrc/ops.cpp):
// the argument checks and dtypes that their CPU (csrc/cpu/gat_scores.cpp)
// and CUDA (csrc/cuda/attention/gat_scores.cu) kernels share. The kernels
// take x [N, H, C] contiguous, each att and each score gradient contiguous in
// the accumulation type of x (a missing gradient: zero), and write the
// scores in that type.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include <array>
#include <optional>

namespace pyg_multihead_agg {

struct ScoresArgs {
  at::Tensor x;              // [N, H, C], contiguous
  at::Tensor att[2];         // att_src, att_dst (undefined for K = 1): H * C, accumulation type
  int64_t K, N, H, C;
  at::ScalarType result;     // the scores' dtype: what x * att promotes to
};

inline void check_scores_att(const at::Tensor& x, const at::Tensor& att, const char* name) {
  TORCH_CHECK_VALUE(att.is_floating_point(), "_gat_scores: ", name,
                    " must be a floating-point tensor, got ", att.scalar_type());
  TORCH_CHECK_VALUE(att.device() == x.device(), "_gat_scores: ", name,
                    " must be on the device of x (", x.device(), "), got ", att.device());
  TORCH_CHECK_VALUE(att.numel() == x.size(1) * x.size(2), "_gat_scores: ", name,
                    " must hold heads * channels = ", x.size(1) * x.size(2),
                    " elements (x is [N, H, C] = ", x.sizes(), "), got ", att.sizes());
}

inline ScoresArgs gat_scores_args(const at::Tensor& x, const at::Tensor& att_src,
                                  const std::optional<at::Tensor>& att_dst) {
  TORCH_CHECK_VALUE(x.dim() == 3, "_gat_scores: x must be [N, H, C], got ", x.dim(),
                    " dimensions");
  TORCH_CHECK_VALUE(x.is_floating_point(),
                    "_gat_scores: x must be a floating-point tensor, got ", x.scalar_type());
  check_scores_att(x, att_src, "att_src");
  const bool two = att_dst.has_value() && att_dst->defined();
  if (two) {
    check_scores_att(x, *att_dst, "att_dst");
    TORCH_CHECK_VALUE(att_dst->scalar_type() == att_src.scalar_type(),
                      "_gat_scores: att_dst must have the dtype of att_src (",
                      att_src.scalar_type(), "), got ", att_dst->scalar_type());
  }
  const auto acc = at::toOpMathType(x.scalar_type());
  ScoresArgs a;
  a.x = x.contiguous();
  a.att[0] = att_src.to(acc).contiguous();
  if (two) a.att[1] = att_dst->to(acc).contiguous();
  a.K = two ? 2 : 1;
  a.N = x.size(0);
  a.H = x.size(1);
  a.C = x.size(2);
  a.result = at::promote_types(x.scalar_type(), att_src.scalar_type());
  return a;
}

// The scores' buffers (s_dst empty for one att), in the accumulation type.
inline std::array<at::Tensor, 2> gat_scores_buffers(const ScoresArgs& a) {
  const auto options = a.x.options().dtype(at::toOpMathType(a.x.scalar_type()));
  return {at::empty({a.N, a.H}, options), at::empty({a.K == 2 ? a.N : 0, a.H}, options)};
}

// The scores in their dtype (converted only where x and the atts are half types).
inline std::tuple<at::Tensor, at::Tensor> gat_scores_result(std::array<at::Tensor, 2> out,
                                                            const ScoresArgs& a) {
  if (out[0].scalar_type() != a.result) {
    for (auto& t : out) t = t.to(a.result);
  }
  return {out[0], out[1]};
}

// The backward's outputs: grad_x (x's dtype, empty unless x_grad) and the
// atts' gradients (accumulation type, empty unless att_grad).
struct ScoresGrads {
  at::Tensor x, att[2];
};

inline ScoresGrads gat_scores_grad_buffers(const ScoresArgs& a, bool x_grad, bool att_grad) {
  const auto acc_options = a.x.options().dtype(at::toOpMathType(a.x.scalar_type()));
  return {at::empty({x_grad ? a.N : 0, a.H, a.C}, a.x.options()),
          {at::empty({att_grad ? a.H : 0, a.C}, acc_options),
           at::empty({att_grad && a.K == 2 ? a.H : 0, a.C}, acc_options)}};
}

// The scores' gradients as the kernels take them (undefined where None).
inline std::array<at::Tensor, 2> gat_scores_grads(const ScoresArgs& a,
                                                  const std::optional<at::Tensor>& grad_src,
                                                  const std::optional<at::Tensor>& grad_dst) {
  const auto acc = at::toOpMathType(a.x.scalar_type());
  std::array<at::Tensor, 2> g;
  const std::optional<at::Tensor>* given[2] = {&grad_src, &grad_dst};
  for (int k = 0; k < 2; ++k) {
    const auto& t = *given[k];
    if (!t.has_value() || !t->defined() || k >= a.K) continue;
    TORCH_CHECK_VALUE(t->dim() == 2 && t->size(0) == a.N && t->size(1) == a.H,
                      "_gat_scores_backward: ", k == 0 ? "grad_src" : "grad_dst",
                      " must be [N, H] = [", a.N, ", ", a.H, "], got ", t->sizes());
    g[k] = t->to(acc).contiguous();
  }
  return g;
}

// Rows per chunk of the deterministic sum over rows (the atts' gradient): at
// least 32, at most 4,096 chunks. A function of N alone.
inline int64_t gat_scores_chunk_rows(int64_t N) {
  return std::max<int64_t>(32, (N + 4095) / 4096);
}

}  // namespace pyg_multihead_agg
