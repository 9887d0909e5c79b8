// Autocast kernels for multihead_spmm and the attention operators. Under
// torch.autocast the layer's x comes from a Linear (low precision) while the
// attention weights come from a float32 softmax; without these kernels the op
// would get mixed dtypes and raise. All floating inputs are cast to the autocast dtype (the
// "lower_precision_fp" policy of matmul-like ops; float64 stays float64, as in
// at::autocast::cached_cast), then the op is redispatched below autocast. The
// backward ops need no autocast kernel: autograd calls them with the dtypes
// the forward saw. Registered for CPU and CUDA in every build (the CUDA key
// exists in CPU-only torch as well, it is simply never reached there).
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <tuple>

namespace pyg_multihead_agg {
namespace {

using opt_tensor = std::optional<at::Tensor>;

at::Tensor multihead_spmm_call(const at::Tensor& rowptr, const at::Tensor& col,
                               const at::Tensor& weight, const at::Tensor& x,
                               const opt_tensor& colptr, const opt_tensor& row,
                               const opt_tensor& perm, const opt_tensor& perm_inv) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pyg_multihead_agg::multihead_spmm", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const opt_tensor&, const opt_tensor&,
                                         const opt_tensor&, const opt_tensor&)>();
  return op.call(rowptr, col, weight, x, colptr, row, perm, perm_inv);
}

template <c10::DispatchKey autocast_key, c10::DeviceType device_type>
at::Tensor multihead_spmm_autocast(const at::Tensor& rowptr, const at::Tensor& col,
                                   const at::Tensor& weight, const at::Tensor& x,
                                   const opt_tensor& colptr, const opt_tensor& row,
                                   const opt_tensor& perm, const opt_tensor& perm_inv) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(autocast_key);
  const auto dtype = at::autocast::get_autocast_dtype(device_type);
  // cached_cast leaves tensors of other devices, non-floating tensors and
  // float64 untouched, so malformed inputs still reach the kernels' checks.
  return multihead_spmm_call(rowptr, col, at::autocast::cached_cast(dtype, weight, device_type),
                             at::autocast::cached_cast(dtype, x, device_type), colptr, row, perm,
                             perm_inv);
}

// gat_attention: scores, edge scores, features and bias all in the autocast
// dtype (the kernels accumulate in float32 and return lse in float32).
std::tuple<at::Tensor, at::Tensor> gat_attention_call(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& s_src,
    const at::Tensor& s_dst, const opt_tensor& s_edge, const at::Tensor& x, double negative_slope,
    double dropout_p, const opt_tensor& philox, const opt_tensor& colptr, const opt_tensor& row,
    const opt_tensor& perm, const opt_tensor& bias, const opt_tensor& perm_inv) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("pyg_multihead_agg::gat_attention", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const opt_tensor&, const at::Tensor&, double, double, const opt_tensor&,
              const opt_tensor&, const opt_tensor&, const opt_tensor&, const opt_tensor&,
              const opt_tensor&)>();
  return op.call(rowptr, col, s_src, s_dst, s_edge, x, negative_slope, dropout_p, philox, colptr,
                 row, perm, bias, perm_inv);
}

template <c10::DispatchKey autocast_key, c10::DeviceType device_type>
std::tuple<at::Tensor, at::Tensor> gat_attention_autocast(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& s_src,
    const at::Tensor& s_dst, const opt_tensor& s_edge, const at::Tensor& x, double negative_slope,
    double dropout_p, const opt_tensor& philox, const opt_tensor& colptr, const opt_tensor& row,
    const opt_tensor& perm, const opt_tensor& bias, const opt_tensor& perm_inv) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(autocast_key);
  const auto dtype = at::autocast::get_autocast_dtype(device_type);
  auto cast = [&](const at::Tensor& t) { return at::autocast::cached_cast(dtype, t, device_type); };
  auto cast_opt = [&](const opt_tensor& t) -> opt_tensor {
    return t.has_value() && t->defined() ? opt_tensor(cast(*t)) : t;
  };
  return gat_attention_call(rowptr, col, cast(s_src), cast(s_dst), cast_opt(s_edge), cast(x),
                            negative_slope, dropout_p, philox, colptr, row, perm, cast_opt(bias),
                            perm_inv);
}

// gatv2_attention: features, edge features, att and bias in the autocast dtype.
std::tuple<at::Tensor, at::Tensor> gatv2_attention_call(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x_l,
    const at::Tensor& x_r, const opt_tensor& e_feat, const at::Tensor& att,
    double negative_slope, double dropout_p, const opt_tensor& philox, const opt_tensor& colptr,
    const opt_tensor& row, const opt_tensor& perm, const opt_tensor& bias,
    const opt_tensor& perm_inv) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("pyg_multihead_agg::gatv2_attention", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const opt_tensor&, const at::Tensor&, double, double, const opt_tensor&,
              const opt_tensor&, const opt_tensor&, const opt_tensor&, const opt_tensor&,
              const opt_tensor&)>();
  return op.call(rowptr, col, x_l, x_r, e_feat, att, negative_slope, dropout_p, philox, colptr,
                 row, perm, bias, perm_inv);
}

template <c10::DispatchKey autocast_key, c10::DeviceType device_type>
std::tuple<at::Tensor, at::Tensor> gatv2_attention_autocast(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x_l,
    const at::Tensor& x_r, const opt_tensor& e_feat, const at::Tensor& att,
    double negative_slope, double dropout_p, const opt_tensor& philox, const opt_tensor& colptr,
    const opt_tensor& row, const opt_tensor& perm, const opt_tensor& bias,
    const opt_tensor& perm_inv) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(autocast_key);
  const auto dtype = at::autocast::get_autocast_dtype(device_type);
  auto cast = [&](const at::Tensor& t) { return at::autocast::cached_cast(dtype, t, device_type); };
  auto cast_opt = [&](const opt_tensor& t) -> opt_tensor {
    return t.has_value() && t->defined() ? opt_tensor(cast(*t)) : t;
  };
  return gatv2_attention_call(rowptr, col, cast(x_l), cast(x_r), cast_opt(e_feat), cast(att),
                              negative_slope, dropout_p, philox, colptr, row, perm,
                              cast_opt(bias), perm_inv);
}

// transformer_attention: query, key, value, edge features and bias in the
// autocast dtype.
std::tuple<at::Tensor, at::Tensor> transformer_attention_call(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& query,
    const at::Tensor& key, const at::Tensor& value, const opt_tensor& e_feat, double scale,
    double dropout_p, const opt_tensor& philox, const opt_tensor& colptr, const opt_tensor& row,
    const opt_tensor& perm, const opt_tensor& bias, const opt_tensor& perm_inv) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("pyg_multihead_agg::transformer_attention", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const at::Tensor&, const opt_tensor&, double, double, const opt_tensor&,
              const opt_tensor&, const opt_tensor&, const opt_tensor&, const opt_tensor&,
              const opt_tensor&)>();
  return op.call(rowptr, col, query, key, value, e_feat, scale, dropout_p, philox, colptr, row,
                 perm, bias, perm_inv);
}

template <c10::DispatchKey autocast_key, c10::DeviceType device_type>
std::tuple<at::Tensor, at::Tensor> transformer_attention_autocast(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& query,
    const at::Tensor& key, const at::Tensor& value, const opt_tensor& e_feat, double scale,
    double dropout_p, const opt_tensor& philox, const opt_tensor& colptr, const opt_tensor& row,
    const opt_tensor& perm, const opt_tensor& bias, const opt_tensor& perm_inv) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(autocast_key);
  const auto dtype = at::autocast::get_autocast_dtype(device_type);
  auto cast = [&](const at::Tensor& t) { return at::autocast::cached_cast(dtype, t, device_type); };
  auto cast_opt = [&](const opt_tensor& t) -> opt_tensor {
    return t.has_value() && t->defined() ? opt_tensor(cast(*t)) : t;
  };
  return transformer_attention_call(rowptr, col, cast(query), cast(key), cast(value),
                                    cast_opt(e_feat), scale, dropout_p, philox, colptr, row, perm,
                                    cast_opt(bias), perm_inv);
}

}  // namespace

TORCH_LIBRARY_IMPL(pyg_multihead_agg, AutocastCPU, m) {
  m.impl("multihead_spmm",
         &multihead_spmm_autocast<c10::DispatchKey::AutocastCPU, c10::DeviceType::CPU>);
  m.impl("gat_attention",
         &gat_attention_autocast<c10::DispatchKey::AutocastCPU, c10::DeviceType::CPU>);
  m.impl("gatv2_attention",
         &gatv2_attention_autocast<c10::DispatchKey::AutocastCPU, c10::DeviceType::CPU>);
  m.impl("transformer_attention",
         &transformer_attention_autocast<c10::DispatchKey::AutocastCPU, c10::DeviceType::CPU>);
}

TORCH_LIBRARY_IMPL(pyg_multihead_agg, AutocastCUDA, m) {
  m.impl("multihead_spmm",
         &multihead_spmm_autocast<c10::DispatchKey::AutocastCUDA, c10::DeviceType::CUDA>);
  m.impl("gat_attention",
         &gat_attention_autocast<c10::DispatchKey::AutocastCUDA, c10::DeviceType::CUDA>);
  m.impl("gatv2_attention",
         &gatv2_attention_autocast<c10::DispatchKey::AutocastCUDA, c10::DeviceType::CUDA>);
  m.impl("transformer_attention",
         &transformer_attention_autocast<c10::DispatchKey::AutocastCUDA, c10::DeviceType::CUDA>);
}

}  // namespace pyg_multihead_agg
