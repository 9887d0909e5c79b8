// The fused attention's CUDA entry points (gat_attention, gatv2_attention,
// transformer_attention):
// input checks, the choice between the all-heads kernels (fast path) and,
// for GAT, the per-head ones (other shapes; GATv2 pads them instead), and the
// CUDA IMPL block. The kernels and their launchers are in the
// other files of this folder (launchers.cuh lists them); docs/gat_attention.md
// describes the design.
//
// Both kernel families make one pass per destination row with the attention
// recomputed, never stored: the forward keeps only lse, the backward walks the
// CSC with alpha recomputed from lse and the dropout masks redrawn from
// Philox. Malformed graphs never fault (row ranges are clamped, out-of-range
// indices skipped).
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <climits>
#include <initializer_list>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../../checks.h"
#include "../../philox.h"
#include "../utils/config.cuh"
#include "../utils/dispatch.cuh"
#include "../utils/gather_rows.cuh"
#include "heuristics.cuh"
#include "launchers.cuh"
#include "params.cuh"

namespace pyg_multihead_agg {
namespace {

template <typename scalar_t, typename index_t>
void launch_gat_forward(const AttentionParams<scalar_t, index_t>& p, const at::TensorOptions& options) {
  const bool aligned = is_aligned(p.x, 16) && is_aligned(p.out, 16);
  const auto rc = row_config<scalar_t>(p.H, p.D, aligned);
  if (rc.ok) {
    launch_gat_forward_rows(p, rc, options);
  } else {
    launch_gat_forward_heads(p, head_config<scalar_t>(p.D, aligned), options);
  }
}

// The CSC pass (grad_x, grad_s_src, grad_z), then the row sums (grad_s_dst).
template <typename scalar_t, typename index_t>
void launch_gat_backward(const AttentionParams<scalar_t, index_t>& p, const scalar_t* out,
                         scalar_t* grad_dst, const index_t* rowptr,
                         const at::TensorOptions& options) {
  constexpr int kVec = vec_width<scalar_t>();
  const bool aligned = is_aligned(p.x, 16) && is_aligned(p.out, 16) &&
                       is_aligned(p.grad_out, 16) && is_aligned(out, 16);
  const auto rc = row_config<scalar_t>(p.H, p.D, aligned);
  if (rc.ok) {
    launch_gat_backward_rows(p, out, rc, options);
  } else {
    const auto c = head_config<scalar_t>(p.D, aligned);
    TORCH_CHECK(c.num_chunks <= 1, "gat_attention_backward: the CUDA kernel supports heads of "
                "at most ", 32 * kMaxVPL * (c.vectorised ? kVec : 1),
                " channels for this dtype, got ", p.D);
    launch_gat_backward_heads(p, out, c, options);
  }
  launch_gat_row_sums(p, grad_dst, rowptr, options);
}

// The dropout key as the kernels read it: the values of a CPU philox, or the
// address of one on the GPU (check_philox: contiguous, so the address is the
// caller's tensor, alive until the kernels have read it). A CPU key's values
// would be baked into a CUDA graph being captured, every replay drawing the
// first call's masks: refused there.
DropoutRng make_rng(double dropout_p, const std::optional<at::Tensor>& philox) {
  DropoutRng rng;
  rng.threshold = dropout_threshold(dropout_p);
  if (rng.threshold == 0) return rng;
  if (philox->is_cuda()) {
    rng.key = philox->data_ptr<int64_t>();
    return rng;
  }
  TORCH_CHECK(c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None,
              "dropout under CUDA graph capture needs philox on the features' device (a CPU "
              "philox's values would be captured, every replay drawing the same mask)");
  const auto key = philox->contiguous();
  rng.seed = static_cast<uint64_t>(key.data_ptr<int64_t>()[0]);
  rng.offset = static_cast<uint64_t>(key.data_ptr<int64_t>()[1]);
  return rng;
}

template <typename acc_t>
acc_t dropout_scale(double p) {
  return p >= 1.0 ? acc_t(0) : static_cast<acc_t>(1.0 / (1.0 - p));
}

// What every forward sets besides its policy's inputs: the CSR, the output
// and lse, the sizes (D channels a head: the padded width for the
// per-channel ops) and the dropout.
template <typename scalar_t, typename index_t>
AttentionParams<scalar_t, index_t> forward_params(const GatShape& s, int64_t D,
                                                  const at::Tensor& rowptr, const at::Tensor& col,
                                                  at::Tensor& out, at::Tensor& lse,
                                                  double dropout_p,
                                                  const std::optional<at::Tensor>& philox) {
  using acc_t = at::opmath_type<scalar_t>;
  AttentionParams<scalar_t, index_t> p{};
  p.ptr = rowptr.data_ptr<index_t>();
  p.idx = col.data_ptr<index_t>();
  p.out = out.data_ptr<scalar_t>();
  p.lse_out = lse.data_ptr<acc_t>();
  p.num_rows = s.N_dst;
  p.num_gathered = s.N_src;
  p.num_edges = s.E;
  p.H = static_cast<int>(s.H);
  p.D = static_cast<int>(D);
  p.HD = static_cast<int>(s.H * D);
  p.scale = dropout_scale<acc_t>(dropout_p);
  p.rng = make_rng(dropout_p, philox);
  return p;
}

// What every backward sets besides its policy's inputs and gradients: the
// CSC (perm_inv, grad_lse and bias may be undefined), grad_out, lse, the
// sources' gradient rows (grad_src, into p.out), grad_z, the sizes and the
// dropout.
template <typename scalar_t, typename index_t>
AttentionParams<scalar_t, index_t> backward_params(
    const GatShape& s, int64_t D, const at::Tensor& colptr, const at::Tensor& row,
    const at::Tensor& perm, const at::Tensor& perm_inv, const at::Tensor& grad_out,
    const at::Tensor& lse, const at::Tensor& grad_lse, const at::Tensor& bias,
    at::Tensor& grad_src, at::Tensor& grad_z, double dropout_p,
    const std::optional<at::Tensor>& philox) {
  using acc_t = at::opmath_type<scalar_t>;
  AttentionParams<scalar_t, index_t> p{};
  p.ptr = colptr.data_ptr<index_t>();
  p.idx = row.data_ptr<index_t>();
  p.perm = perm.data_ptr<index_t>();
  p.perm_inv = perm_inv.defined() ? perm_inv.data_ptr<index_t>() : nullptr;
  p.grad_out = grad_out.data_ptr<scalar_t>();
  p.lse_in = lse.data_ptr<acc_t>();
  p.grad_lse = grad_lse.defined() ? grad_lse.data_ptr<acc_t>() : nullptr;
  p.bias = bias.defined() ? bias.data_ptr<scalar_t>() : nullptr;
  p.out = grad_src.data_ptr<scalar_t>();
  p.grad_z = grad_z.data_ptr<acc_t>();
  p.num_rows = s.N_src;
  p.num_gathered = s.N_dst;
  p.num_edges = s.E;
  p.H = static_cast<int>(s.H);
  p.D = static_cast<int>(D);
  p.HD = static_cast<int>(s.H * D);
  p.scale = dropout_scale<acc_t>(dropout_p);
  p.rng = make_rng(dropout_p, philox);
  return p;
}

std::tuple<at::Tensor, at::Tensor> gat_attention_cuda(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& s_src,
    const at::Tensor& s_dst, const std::optional<at::Tensor>& s_edge, const at::Tensor& x,
    double negative_slope, double dropout_p, const std::optional<at::Tensor>& philox,
    const std::optional<at::Tensor>& /*colptr*/, const std::optional<at::Tensor>& /*row*/,
    const std::optional<at::Tensor>& /*perm*/, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& /*perm_inv*/) {
  const auto s =
      check_gat_attention(rowptr, col, s_src, s_dst, s_edge, x, dropout_p, philox, bias);
  TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor for the CUDA kernel");
  const c10::cuda::CUDAGuard guard(x.device());
  TORCH_CHECK(s.H * s.D <= INT_MAX, "heads * channels must be below 2^31");
  const auto lse_dtype = at::toOpMathType(x.scalar_type());
  const bool has_bias = bias.has_value() && bias->defined();
  if (s.N_dst == 0 || s.H == 0 || s.E == 0) {
    auto out = at::zeros({s.N_dst, s.H, s.D}, x.options());
    if (has_bias) out.add_(*bias);
    return {out, at::full({s.N_dst, s.H}, -std::numeric_limits<double>::infinity(),
                          x.options().dtype(lse_dtype))};
  }
  // Every row is written by the kernel (rows without edges get zeros, -inf).
  auto out = at::empty({s.N_dst, s.H, s.D}, x.options());
  auto lse = at::empty({s.N_dst, s.H}, x.options().dtype(lse_dtype));
  const auto rowptr_c = rowptr.contiguous(), col_c = col.contiguous();
  const auto src_c = s_src.contiguous(), dst_c = s_dst.contiguous(), x_c = x.contiguous();
  const bool has_edge = s_edge.has_value() && s_edge->defined();
  const auto edge_c = has_edge ? s_edge->contiguous() : at::Tensor();
  FLOAT_SWITCH(x.scalar_type(), "gat_attention", [&] {
    INDEX_SWITCH(rowptr.scalar_type(), "gat_attention", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      auto p = forward_params<scalar_t, index_t>(s, s.D, rowptr_c, col_c, out, lse, dropout_p,
                                                 philox);
      p.s_src = src_c.data_ptr<scalar_t>();
      p.s_dst = dst_c.data_ptr<scalar_t>();
      p.s_edge = has_edge ? edge_c.data_ptr<scalar_t>() : nullptr;
      p.x = x_c.data_ptr<scalar_t>();
      p.negative_slope = static_cast<acc_t>(negative_slope);
      launch_gat_forward(p, rowptr.options());
    });
  });
  // The bias: one in-place elementwise pass over out (the kernels' long rows
  // store through block_reduce_store, shared with multihead_spmm). No second
  // [N_dst, H, D] tensor; NaN rows stay NaN, rows without edges get bias.
  if (has_bias) out.add_(*bias);
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gat_attention_backward_cuda(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& colptr,
    const at::Tensor& row, const at::Tensor& perm, const at::Tensor& s_src,
    const at::Tensor& s_dst, const std::optional<at::Tensor>& s_edge, const at::Tensor& x,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& grad_out,
    const std::optional<at::Tensor>& grad_lse, double negative_slope, double dropout_p,
    const std::optional<at::Tensor>& philox, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& perm_inv) {
  const auto s = check_gat_attention_backward(rowptr, col, colptr, row, perm, s_src, s_dst,
                                              s_edge, x, out, lse, grad_out, grad_lse, dropout_p,
                                              philox, bias, perm_inv);
  TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor for the CUDA kernel");
  const c10::cuda::CUDAGuard guard(x.device());
  const bool has_edge = s_edge.has_value() && s_edge->defined();
  const auto acc_dtype = at::toOpMathType(x.scalar_type());
  if (s.E == 0 || s.H == 0 || s.N_dst == 0 || s.N_src == 0) {
    return {at::zeros({s.N_src, s.H, s.D}, x.options()), at::zeros({s.N_src, s.H}, x.options()),
            at::zeros({s.N_dst, s.H}, x.options()),
            at::zeros({has_edge ? s.E : 0, s.H}, x.options())};
  }
  // The kernels write every source's and every row's gradient, and every
  // entry of grad_z when the CSC is valid, so grad_z is not zero-filled (an
  // [E, H] float32 memset, 0.2-0.3 ms on reddit- and products-like; a
  // malformed CSC leaves it, and so the gradients, meaningless, as the CUDA
  // kernels' other outputs: docs/robustness.md). With perm_inv, grad_z is
  // indexed by CSC entry: written in the order the kernel walks the CSC (runs
  // of consecutive entries) instead of at random edge ids, whose 16-byte
  // pieces of 32-byte sectors cost 2.3-2.9 ms of the backward on products-
  // and reddit-like, and read back through perm_inv by the row sums.
  const bool has_inv = perm_inv.has_value() && perm_inv->defined();
  const auto inv_c = has_inv ? perm_inv->contiguous() : at::Tensor();
  auto grad_x = at::empty({s.N_src, s.H, s.D}, x.options());
  auto grad_src = at::empty({s.N_src, s.H}, x.options());
  auto grad_dst = at::empty({s.N_dst, s.H}, x.options());
  auto grad_z = at::empty({s.E, s.H}, x.options().dtype(acc_dtype));
  const auto go = grad_out.contiguous(), out_c = out.contiguous();
  const auto lse_c = lse.contiguous();
  const bool has_glse = grad_lse.has_value() && grad_lse->defined();
  const auto glse_c = has_glse ? grad_lse->contiguous() : at::Tensor();
  const auto rowptr_c = rowptr.contiguous(), colptr_c = colptr.contiguous();
  const auto row_c = row.contiguous(), perm_c = perm.contiguous();
  const auto src_c = s_src.contiguous(), dst_c = s_dst.contiguous(), x_c = x.contiguous();
  const auto edge_c = has_edge ? s_edge->contiguous() : at::Tensor();
  // The bias, contiguous and 16-byte aligned for the delta kernels' vector
  // loads (a copy of [H, D] elements when it is not).
  at::Tensor bias_c;
  if (bias.has_value() && bias->defined()) {
    bias_c = bias->contiguous();
    if (!is_aligned(bias_c.data_ptr(), 16)) bias_c = bias_c.clone();
  }
  FLOAT_SWITCH(x.scalar_type(), "gat_attention_backward", [&] {
    INDEX_SWITCH(rowptr.scalar_type(), "gat_attention_backward", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      auto p = backward_params<scalar_t, index_t>(s, s.D, colptr_c, row_c, perm_c, inv_c, go,
                                                  lse_c, glse_c, bias_c, grad_x, grad_z,
                                                  dropout_p, philox);
      p.s_src = src_c.data_ptr<scalar_t>();
      p.s_dst = dst_c.data_ptr<scalar_t>();
      p.s_edge = has_edge ? edge_c.data_ptr<scalar_t>() : nullptr;
      p.x = x_c.data_ptr<scalar_t>();
      p.grad_s_src = grad_src.data_ptr<scalar_t>();
      p.negative_slope = static_cast<acc_t>(negative_slope);
      launch_gat_backward(p, out_c.data_ptr<scalar_t>(), grad_dst.data_ptr<scalar_t>(),
                          rowptr_c.data_ptr<index_t>(), colptr.options());
    });
  });
  // grad_s_edge by edge id: grad_z gathered through perm_inv (an
  // out-of-range entry of a malformed perm_inv gives 0, reads nothing).
  if (has_edge && has_inv) {
    auto by_edge = at::empty({s.E, s.H}, grad_z.options());
    INDEX_SWITCH(perm_inv->scalar_type(), "gat_attention_backward", [&] {
      launch_gather_rows<index_t>(grad_z, inv_c, by_edge);
    });
    grad_z = by_edge;
  }
  auto grad_edge = has_edge ? grad_z.to(x.scalar_type()) : at::empty({0, s.H}, x.options());
  return {grad_x, grad_src, grad_dst, grad_edge};
}

// The per-channel ops' result where there is nothing to compute: every
// logit is 0 (no channels) or there is none, so lse = log(degree) (-inf for
// rows without edges) and out = 0 (+ bias).
std::tuple<at::Tensor, at::Tensor> per_channel_without_work(
    const GatShape& s, const at::Tensor& rowptr, const at::TensorOptions& options,
    const std::optional<at::Tensor>& bias) {
  auto out = at::zeros({s.N_dst, s.H, s.D}, options);
  if (bias.has_value() && bias->defined()) out.add_(*bias);
  const auto lse_dtype = at::toOpMathType(c10::typeMetaToScalarType(options.dtype()));
  auto lse = rowptr.diff().to(lse_dtype).log_().unsqueeze(1).expand({s.N_dst, s.H});
  return {out, lse.contiguous()};
}

// GATv2 takes heads of a whole number of 16-byte vectors, 16-byte aligned:
// other inputs go in as copies padded with zero channels (zero in x_l, x_r,
// e_feat and att: the scores are unchanged, the padded outputs are sliced
// off). The channels of the padded heads.
template <typename scalar_t>
int64_t gatv2_padded_channels(int64_t D, std::initializer_list<const at::Tensor*> inputs) {
  constexpr int kVec = vec_width<scalar_t>();
  bool aligned = D % kVec == 0;
  for (const at::Tensor* t : inputs)
    if (t->defined()) aligned = aligned && t->is_contiguous() && is_aligned(t->data_ptr(), 16);
  return aligned ? D : (D + kVec - 1) / kVec * kVec;
}

// t [..., D] -> [..., Dp], contiguous, zeros in the new channels.
at::Tensor pad_channels(const at::Tensor& t, int64_t Dp) {
  if (!t.defined()) return t;
  const int64_t D = t.size(-1);
  if (Dp == D) {
    // (a contiguous tensor at an odd offset into its storage: an aligned copy)
    auto c = t.contiguous();
    return is_aligned(c.data_ptr(), 16) ? c : c.clone();
  }
  auto sizes = t.sizes().vec();
  sizes.back() = Dp;
  auto padded = at::zeros(sizes, t.options());
  padded.narrow(-1, 0, D).copy_(t);
  return padded;
}

at::Tensor crop_channels(const at::Tensor& t, int64_t D) {
  return t.size(-1) == D ? t : t.narrow(-1, 0, D).contiguous();
}

// The kernels' gradient output k of `rows` rows: the caller's buffer into[k]
// (the _<op>_backward_into ops) where the kernels can write it as it is
// (unpadded heads, 16-byte aligned), else a new [rows, H, Dp] tensor, which
// the caller's buffer, if any, gets copied from at the end.
at::Tensor gradient_buffer(const at::Tensor* into, int k, int64_t rows, const GatShape& s,
                           int64_t Dp, const at::TensorOptions& options) {
  const bool direct = into != nullptr && Dp == s.D && is_aligned(into[k].data_ptr(), 16);
  return direct ? into[k] : at::empty({rows, s.H, Dp}, options);
}

template <typename scalar_t>
RowConfig gatv2_checked_config(int64_t H, int64_t Dp, const char* op) {
  const RowConfig rc = gatv2_row_config<scalar_t>(H, Dp);
  constexpr int kVec = vec_width<scalar_t>();
  TORCH_CHECK(rc.ok, op, ": the CUDA kernel supports heads of at most ", 32 * kVec,
              " channels for this dtype, with heads * next_pow2(ceil(channels / ", kVec,
              ")) <= 128; got ", H, " heads of ", Dp, " channels");
  return rc;
}

// The forward of a per-channel op (GATv2, the transformer) once its inputs
// are checked (s): on `ref`'s device, heads padded to the kernels' layout
// (every tensor of `feats`, undefined ones included, padded alike), the
// output and lse, the shared parameters, then set(p, padded) for the
// policy's fields and launch(p, rc) for its kernel; the output cropped and
// the bias added.
template <class Set, class Launch>
std::tuple<at::Tensor, at::Tensor> per_channel_forward(
    const GatShape& s, const char* op, const at::Tensor& ref, const at::Tensor& rowptr,
    const at::Tensor& col, std::initializer_list<const at::Tensor*> feats, double dropout_p,
    const std::optional<at::Tensor>& philox, const std::optional<at::Tensor>& bias, Set&& set,
    Launch&& launch) {
  const c10::cuda::CUDAGuard guard(ref.device());
  TORCH_CHECK(s.H * s.D <= INT_MAX, "heads * channels must be below 2^31");
  if (s.N_dst == 0 || s.H == 0 || s.E == 0 || s.D == 0) {
    return per_channel_without_work(s, rowptr, ref.options(), bias);
  }
  const auto lse_dtype = at::toOpMathType(ref.scalar_type());
  at::Tensor out, lse = at::empty({s.N_dst, s.H}, ref.options().dtype(lse_dtype));
  const auto rowptr_c = rowptr.contiguous(), col_c = col.contiguous();
  FLOAT_SWITCH(ref.scalar_type(), op, [&] {
    const int64_t Dp = gatv2_padded_channels<scalar_t>(s.D, feats);
    const RowConfig rc = gatv2_checked_config<scalar_t>(s.H, Dp, op);
    std::vector<at::Tensor> padded;
    for (const at::Tensor* t : feats) padded.push_back(pad_channels(*t, Dp));
    // Every row is written by the kernel (rows without edges get zeros, -inf).
    auto out_p = at::empty({s.N_dst, s.H, Dp}, ref.options());
    INDEX_SWITCH(rowptr.scalar_type(), op, [&] {
      auto p = forward_params<scalar_t, index_t>(s, Dp, rowptr_c, col_c, out_p, lse, dropout_p,
                                                 philox);
      set(p, padded);
      launch(p, rc);
    });
    out = crop_channels(out_p, s.D);
  });
  if (bias.has_value() && bias->defined()) out.add_(*bias);
  return {out, lse};
}

// GATv2's record of the forward (_gatv2_attention_record): logits [E, H] in
// the accumulation dtype and signs [E, H, ceil(D / 32)] int32, by edge id.
// The kernel writes the bytes of the words that hold channels (0 bits for
// those past D in them); the others, past ceil(D / 8) bytes, are zeroed here.
std::pair<at::Tensor, at::Tensor> gatv2_record_buffers(const GatShape& s, const at::Tensor& x_l) {
  const auto acc_dtype = at::toOpMathType(x_l.scalar_type());
  const int64_t W = (s.D + 31) / 32;
  const auto sign_options = x_l.options().dtype(at::kInt);
  return {at::empty({s.E, s.H}, x_l.options().dtype(acc_dtype)),
          (s.D + 7) / 8 < 4 * W ? at::zeros({s.E, s.H, W}, sign_options)
                                : at::empty({s.E, s.H, W}, sign_options)};
}

// The GATv2 forward (s: checked), with its record written into `record`
// (logits, signs) when given.
std::tuple<at::Tensor, at::Tensor> gatv2_forward(
    const GatShape& s, const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x_l,
    const at::Tensor& x_r, const std::optional<at::Tensor>& e_feat, const at::Tensor& att,
    double negative_slope, double dropout_p, const std::optional<at::Tensor>& philox,
    const std::optional<at::Tensor>& bias, const std::pair<at::Tensor, at::Tensor>* record) {
  TORCH_CHECK(x_l.is_cuda(), "x_l must be a CUDA tensor for the CUDA kernel");
  const bool has_edge = e_feat.has_value() && e_feat->defined();
  const at::Tensor ef = has_edge ? *e_feat : at::Tensor();
  return per_channel_forward(
      s, "gatv2_attention", x_l, rowptr, col, {&x_l, &x_r, &ef, &att}, dropout_p, philox, bias,
      [&](auto& p, const std::vector<at::Tensor>& t) {
        using scalar_t = std::remove_const_t<std::remove_pointer_t<decltype(p.x)>>;
        using acc_t = at::opmath_type<scalar_t>;
        p.x = t[0].data_ptr<scalar_t>();
        p.x_dst = t[1].data_ptr<scalar_t>();
        p.e_feat = has_edge ? t[2].data_ptr<scalar_t>() : nullptr;
        p.att = t[3].data_ptr<scalar_t>();
        p.negative_slope = static_cast<acc_t>(negative_slope);
        if (record != nullptr) {
          p.logits = record->first.data_ptr<acc_t>();
          p.bits = reinterpret_cast<uint32_t*>(record->second.data_ptr<int32_t>());
          p.W = static_cast<int>(record->second.size(2));
        }
      },
      [&](const auto& p, const RowConfig& rc) {
        launch_gatv2_forward_rows(p, rc, rowptr.options());
      });
}

std::tuple<at::Tensor, at::Tensor> gatv2_attention_cuda(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x_l,
    const at::Tensor& x_r, const std::optional<at::Tensor>& e_feat, const at::Tensor& att,
    double negative_slope, double dropout_p, const std::optional<at::Tensor>& philox,
    const std::optional<at::Tensor>& /*colptr*/, const std::optional<at::Tensor>& /*row*/,
    const std::optional<at::Tensor>& /*perm*/, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& /*perm_inv*/) {
  const auto s =
      check_gatv2_attention(rowptr, col, x_l, x_r, e_feat, att, dropout_p, philox, bias);
  return gatv2_forward(s, rowptr, col, x_l, x_r, e_feat, att, negative_slope, dropout_p, philox,
                       bias, nullptr);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gatv2_attention_record_cuda(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x_l,
    const at::Tensor& x_r, const std::optional<at::Tensor>& e_feat, const at::Tensor& att,
    double negative_slope, double dropout_p, const std::optional<at::Tensor>& philox,
    const std::optional<at::Tensor>& bias) {
  const auto s =
      check_gatv2_attention(rowptr, col, x_l, x_r, e_feat, att, dropout_p, philox, bias);
  TORCH_CHECK(x_l.is_cuda(), "x_l must be a CUDA tensor for the CUDA kernel");
  const auto record = gatv2_record_buffers(s, x_l);
  auto [out, lse] = gatv2_forward(s, rowptr, col, x_l, x_r, e_feat, att, negative_slope,
                                  dropout_p, philox, bias, &record);
  return {out, lse, record.first, record.second};
}

// The backward (checked by the entry points in checks.h), into the buffers
// `into` (grad_x_l, grad_x_r) when given. grad_x_l's may be out (the row
// terms read it before the CSC pass writes grad_x_l) and grad_x_r's x_r (the
// destination pass, which writes grad_x_r, reads each row's x_r[i] before
// its gradient). logits, signs: the forward's record (made here, by a
// forward pass without dropout, when not given); consume: the logit
// gradients take the logits' place (the CSC pass reads an entry's logit
// before it writes its gradient there), else a buffer of their own.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gatv2_backward(
    const GatShape& s, const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& colptr,
    const at::Tensor& row, const at::Tensor& perm, const at::Tensor& x_l, const at::Tensor& x_r,
    const std::optional<at::Tensor>& e_feat, const at::Tensor& att, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& grad_out, const std::optional<at::Tensor>& grad_lse,
    double negative_slope, double dropout_p, const std::optional<at::Tensor>& philox,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& perm_inv,
    const at::Tensor* into, const at::Tensor* logits, const at::Tensor* signs, bool consume) {
  TORCH_CHECK(x_l.is_cuda(), "x_l must be a CUDA tensor for the CUDA kernel");
  const c10::cuda::CUDAGuard guard(x_l.device());
  const bool has_edge = e_feat.has_value() && e_feat->defined();
  const bool has_bias = bias.has_value() && bias->defined();
  if (s.E == 0 || s.H == 0 || s.N_dst == 0 || s.N_src == 0 || s.D == 0) {
    auto grad_ef = at::zeros({has_edge ? s.E : 0, s.H, s.D}, x_l.options());
    if (into != nullptr) {
      into[0].zero_();
      into[1].zero_();
      return {into[0], into[1], at::zeros_like(att), grad_ef};
    }
    return {at::zeros_like(x_l), at::zeros_like(x_r), at::zeros_like(att), grad_ef};
  }
  // (perm_inv is only checked: the logit gradients go by edge id, where
  // the record is.)
  std::pair<at::Tensor, at::Tensor> record;
  if (logits != nullptr) {
    record = {*logits, *signs};
  } else {
    record = gatv2_record_buffers(s, x_l);
    gatv2_forward(s, rowptr, col, x_l, x_r, e_feat, att, negative_slope, 0.0, std::nullopt,
                  std::nullopt, &record);
    consume = true;  // (its own)
  }
  const bool has_glse = grad_lse.has_value() && grad_lse->defined();
  const auto glse_c = has_glse ? grad_lse->contiguous() : at::Tensor();
  const auto lse_c = lse.contiguous();
  const auto rowptr_c = rowptr.contiguous(), colptr_c = colptr.contiguous();
  const auto row_c = row.contiguous(), perm_c = perm.contiguous();
  const at::Tensor ef = has_edge ? *e_feat : at::Tensor();
  const at::Tensor bs = has_bias ? *bias : at::Tensor();
  at::Tensor grad_xl, grad_xr, grad_att, grad_ef;
  FLOAT_SWITCH(x_l.scalar_type(), "gatv2_attention_backward", [&] {
    const int64_t Dp = gatv2_padded_channels<scalar_t>(
        s.D, {&x_l, &x_r, &ef, &att, &out, &grad_out, &bs});
    const RowConfig rc = gatv2_checked_config<scalar_t>(s.H, Dp, "gatv2_attention_backward");
    const auto xl_c = pad_channels(x_l, Dp), xr_c = pad_channels(x_r, Dp);
    const auto ef_c = pad_channels(ef, Dp), att_c = pad_channels(att, Dp);
    const auto out_c = pad_channels(out, Dp), go = pad_channels(grad_out, Dp);
    const auto bias_c = pad_channels(bs, Dp);
    // The kernels write every source's and destination's gradient, every
    // edge's logit gradient, signs and (with e_feat) edge gradient when the
    // CSC is valid (a malformed one leaves them meaningless, never out of
    // bounds: docs/robustness.md).
    auto gxl = gradient_buffer(into, 0, s.N_src, s, Dp, x_l.options());
    auto gxr = gradient_buffer(into, 1, s.N_dst, s, Dp, x_l.options());
    auto gef = has_edge ? at::empty({s.E, s.H, Dp}, x_l.options()) : at::Tensor();
    auto grad_z = consume ? record.first : at::empty(record.first.sizes(), record.first.options());
    at::Tensor att_part;
    INDEX_SWITCH(rowptr.scalar_type(), "gatv2_attention_backward", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      auto p = backward_params<scalar_t, index_t>(s, Dp, colptr_c, row_c, perm_c, at::Tensor(),
                                                  go, lse_c, glse_c, bias_c, gxl, grad_z,
                                                  dropout_p, philox);
      p.x = xl_c.data_ptr<scalar_t>();
      p.x_dst = xr_c.data_ptr<scalar_t>();
      p.e_feat = has_edge ? ef_c.data_ptr<scalar_t>() : nullptr;
      p.att = att_c.data_ptr<scalar_t>();
      p.grad_e_feat = has_edge ? gef.data_ptr<scalar_t>() : nullptr;
      p.logits = record.first.data_ptr<acc_t>();
      p.bits = reinterpret_cast<uint32_t*>(record.second.data_ptr<int32_t>());
      p.W = static_cast<int>(record.second.size(2));
      p.negative_slope = static_cast<acc_t>(negative_slope);
      att_part = launch_gatv2_backward_rows(p, out_c.data_ptr<scalar_t>(),
                                            gxr.data_ptr<scalar_t>(),
                                            rowptr_c.data_ptr<index_t>(), rc, colptr.options());
    });
    // grad_att per fixed range of sources and of destinations, summed by
    // one deterministic reduction.
    grad_att = att_part.sum(0).view({s.H, Dp}).to(x_l.scalar_type());
    grad_xl = crop_channels(gxl, s.D);
    grad_xr = crop_channels(gxr, s.D);
    grad_att = crop_channels(grad_att, s.D);
    grad_ef = has_edge ? crop_channels(gef, s.D) : at::empty({0, s.H, s.D}, x_l.options());
  });
  if (into != nullptr) {
    if (!grad_xl.is_same(into[0])) into[0].copy_(grad_xl);
    if (!grad_xr.is_same(into[1])) into[1].copy_(grad_xr);
    return {into[0], into[1], grad_att, grad_ef};
  }
  return {grad_xl, grad_xr, grad_att, grad_ef};
}

// TransformerConv: the heads padded as GATv2's (zero channels in query,
// key, value and e_feat leave every logit and output unchanged).
std::tuple<at::Tensor, at::Tensor> transformer_attention_cuda(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& query,
    const at::Tensor& key, const at::Tensor& value, const std::optional<at::Tensor>& e_feat,
    double scale, double dropout_p, const std::optional<at::Tensor>& philox,
    const std::optional<at::Tensor>& /*colptr*/, const std::optional<at::Tensor>& /*row*/,
    const std::optional<at::Tensor>& /*perm*/, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& /*perm_inv*/) {
  const auto s = check_transformer_attention(rowptr, col, query, key, value, e_feat, dropout_p,
                                             philox, bias);
  TORCH_CHECK(key.is_cuda(), "key must be a CUDA tensor for the CUDA kernel");
  const bool has_edge = e_feat.has_value() && e_feat->defined();
  const at::Tensor ef = has_edge ? *e_feat : at::Tensor();
  return per_channel_forward(
      s, "transformer_attention", key, rowptr, col, {&query, &key, &value, &ef}, dropout_p,
      philox, bias,
      [&](auto& p, const std::vector<at::Tensor>& t) {
        using scalar_t = std::remove_const_t<std::remove_pointer_t<decltype(p.x)>>;
        p.x_dst = t[0].data_ptr<scalar_t>();
        p.key = t[1].data_ptr<scalar_t>();
        p.x = t[2].data_ptr<scalar_t>();
        p.e_feat = has_edge ? t[3].data_ptr<scalar_t>() : nullptr;
        p.score_scale = static_cast<decltype(p.score_scale)>(scale);
      },
      [&](const auto& p, const RowConfig& rc) {
        launch_transformer_forward_rows(p, rc, rowptr.options());
      });
}

// The backward, into the gradient buffers `into` (grad_query, grad_key,
// grad_value; checked by the caller) when given. Each may be the tensor it
// replaces: the row terms read out before the CSC pass writes grad_key;
// source j's group reads value[j] before it writes grad_value[j] (a sliced
// column's sum is a later kernel); the CSC pass reads query before the
// destination pass writes grad_query.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> transformer_backward(
    const GatShape& s, const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& colptr,
    const at::Tensor& row, const at::Tensor& perm, const at::Tensor& query,
    const at::Tensor& key, const at::Tensor& value, const std::optional<at::Tensor>& e_feat,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& grad_out,
    const std::optional<at::Tensor>& grad_lse, double scale, double dropout_p,
    const std::optional<at::Tensor>& philox, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& perm_inv, const at::Tensor* into) {
  TORCH_CHECK(key.is_cuda(), "key must be a CUDA tensor for the CUDA kernel");
  const c10::cuda::CUDAGuard guard(key.device());
  const bool has_edge = e_feat.has_value() && e_feat->defined();
  const bool has_bias = bias.has_value() && bias->defined();
  if (s.E == 0 || s.H == 0 || s.N_dst == 0 || s.N_src == 0 || s.D == 0) {
    auto grad_ef = at::zeros({has_edge ? s.E : 0, s.H, s.D}, key.options());
    if (into != nullptr) {
      for (int k = 0; k < 3; ++k) into[k].zero_();
      return {into[0], into[1], into[2], grad_ef};
    }
    return {at::zeros_like(query), at::zeros_like(key), at::zeros_like(value), grad_ef};
  }
  const auto acc_dtype = at::toOpMathType(key.scalar_type());
  const bool has_inv = perm_inv.has_value() && perm_inv->defined();
  const auto inv_c = has_inv ? perm_inv->contiguous() : at::Tensor();
  const bool has_glse = grad_lse.has_value() && grad_lse->defined();
  const auto glse_c = has_glse ? grad_lse->contiguous() : at::Tensor();
  const auto lse_c = lse.contiguous();
  const auto rowptr_c = rowptr.contiguous(), col_c = col.contiguous();
  const auto colptr_c = colptr.contiguous(), row_c = row.contiguous(), perm_c = perm.contiguous();
  const at::Tensor ef = has_edge ? *e_feat : at::Tensor();
  const at::Tensor bs = has_bias ? *bias : at::Tensor();
  at::Tensor grad_q, grad_k, grad_v, grad_ef;
  FLOAT_SWITCH(key.scalar_type(), "transformer_attention_backward", [&] {
    const int64_t Dp = gatv2_padded_channels<scalar_t>(
        s.D, {&query, &key, &value, &ef, &out, &grad_out, &bs});
    const RowConfig rc =
        gatv2_checked_config<scalar_t>(s.H, Dp, "transformer_attention_backward");
    const auto q_c = pad_channels(query, Dp), k_c = pad_channels(key, Dp);
    const auto v_c = pad_channels(value, Dp), ef_c = pad_channels(ef, Dp);
    const auto out_c = pad_channels(out, Dp), go = pad_channels(grad_out, Dp);
    const auto bias_c = pad_channels(bs, Dp);
    // The kernels write every source's and destination's gradient, every
    // edge's logit gradient and (with e_feat) edge gradient when the CSC is
    // valid (a malformed one leaves them meaningless, never out of bounds:
    // docs/robustness.md).
    auto gq = gradient_buffer(into, 0, s.N_dst, s, Dp, key.options());
    auto gk = gradient_buffer(into, 1, s.N_src, s, Dp, key.options());
    auto gv = gradient_buffer(into, 2, s.N_src, s, Dp, key.options());
    auto gef = has_edge ? at::empty({s.E, s.H, Dp}, key.options()) : at::Tensor();
    auto grad_z = at::empty({s.E, s.H}, key.options().dtype(acc_dtype));
    INDEX_SWITCH(rowptr.scalar_type(), "transformer_attention_backward", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      auto p = backward_params<scalar_t, index_t>(s, Dp, colptr_c, row_c, perm_c, inv_c, go,
                                                  lse_c, glse_c, bias_c, gv, grad_z, dropout_p,
                                                  philox);
      p.x = v_c.data_ptr<scalar_t>();
      p.key = k_c.data_ptr<scalar_t>();
      p.x_dst = q_c.data_ptr<scalar_t>();
      p.e_feat = has_edge ? ef_c.data_ptr<scalar_t>() : nullptr;
      p.grad_key = gk.data_ptr<scalar_t>();
      p.grad_e_feat = has_edge ? gef.data_ptr<scalar_t>() : nullptr;
      p.score_scale = static_cast<acc_t>(scale);
      launch_transformer_backward_rows(p, out_c.data_ptr<scalar_t>(), gq.data_ptr<scalar_t>(),
                                       rowptr_c.data_ptr<index_t>(), col_c.data_ptr<index_t>(),
                                       rc, colptr.options());
    });
    grad_q = crop_channels(gq, s.D);
    grad_k = crop_channels(gk, s.D);
    grad_v = crop_channels(gv, s.D);
    grad_ef = has_edge ? crop_channels(gef, s.D) : at::empty({0, s.H, s.D}, key.options());
  });
  if (into != nullptr) {
    const at::Tensor* grads[3] = {&grad_q, &grad_k, &grad_v};
    for (int k = 0; k < 3; ++k) {
      if (!grads[k]->is_same(into[k])) into[k].copy_(*grads[k]);
    }
    return {into[0], into[1], into[2], grad_ef};
  }
  return {grad_q, grad_k, grad_v, grad_ef};
}

}  // namespace

TORCH_LIBRARY_IMPL(pyg_multihead_agg, CUDA, m) {
  m.impl("gat_attention", &gat_attention_cuda);
  m.impl("gat_attention_backward", &gat_attention_backward_cuda);
  m.impl("gatv2_attention", &gatv2_attention_cuda);
  m.impl("_gatv2_attention_record", &gatv2_attention_record_cuda);
  m.impl("gatv2_attention_backward", &gatv2_backward_entry<&gatv2_backward>);
  m.impl("_gatv2_attention_backward_into", &gatv2_backward_into_entry<&gatv2_backward>);
  m.impl("transformer_attention", &transformer_attention_cuda);
  m.impl("transformer_attention_backward", &transformer_backward_entry<&transformer_backward>);
  m.impl("_transformer_attention_backward_into",
         &transformer_backward_into_entry<&transformer_backward>);
}

}  // namespace pyg_multihead_agg
