// Autograd of the operators in C++: the fused attention ops (gat_attention;
// gatv2_attention and transformer_attention through one template),
// multihead_spmm and _gat_scores. The layers call them in every forward,
// and a Python autograd formula (torch.library.register_autograd) costs
// about 0.15-0.3 ms of host time per call and its backward, which bounds the
// step of small graphs and mini-batches. Each backward calls backward ops
// (for the attention ops <name>_backward, the recomputation from lse over the
// CSC), whose own autograd (double backward: an error) stays in
// pyg_multihead_agg/ops.py with the fake implementations.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include <array>

#include "checks.h"

namespace pyg_multihead_agg {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::tuple<Tensor, Tensor> call_forward(const Tensor& rowptr, const Tensor& col,
                                        const Tensor& s_src, const Tensor& s_dst,
                                        const OptTensor& s_edge, const Tensor& x,
                                        double negative_slope, double dropout_p,
                                        const OptTensor& philox, const OptTensor& colptr,
                                        const OptTensor& row, const OptTensor& perm,
                                        const OptTensor& bias, const OptTensor& perm_inv) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pyg_multihead_agg::gat_attention", "")
                       .typed<std::tuple<Tensor, Tensor>(
                           const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const OptTensor&, const Tensor&, double, double, const OptTensor&,
                           const OptTensor&, const OptTensor&, const OptTensor&,
                           const OptTensor&, const OptTensor&)>();
  return op.call(rowptr, col, s_src, s_dst, s_edge, x, negative_slope, dropout_p, philox, colptr,
                 row, perm, bias, perm_inv);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> call_backward(
    const Tensor& rowptr, const Tensor& col, const Tensor& colptr, const Tensor& row,
    const Tensor& perm, const Tensor& s_src, const Tensor& s_dst, const OptTensor& s_edge,
    const Tensor& x, const Tensor& out, const Tensor& lse, const Tensor& grad_out,
    const OptTensor& grad_lse, double negative_slope, double dropout_p, const OptTensor& philox,
    const OptTensor& bias, const OptTensor& perm_inv) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pyg_multihead_agg::gat_attention_backward", "")
                       .typed<std::tuple<Tensor, Tensor, Tensor, Tensor>(
                           const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const Tensor&, const Tensor&, const Tensor&, const OptTensor&,
                           const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const OptTensor&, double, double, const OptTensor&,
                           const OptTensor&, const OptTensor&)>();
  return op.call(rowptr, col, colptr, row, perm, s_src, s_dst, s_edge, x, out, lse, grad_out,
                 grad_lse, negative_slope, dropout_p, philox, bias, perm_inv);
}

// pyg_multihead_agg.csr_to_csc: the same stable sort, so the same CSC. Sizes
// stay symbolic (sym_size), so that torch.compile(dynamic=True) traces this
// without specialising them.
std::tuple<Tensor, Tensor, Tensor> csr_to_csc(const Tensor& rowptr, const Tensor& col,
                                              const c10::SymInt& num_src) {
  const auto rows = at::arange(rowptr.sym_size(0) - 1, col.options());
  const auto row = at::repeat_interleave_symint(rows, at::diff(rowptr), 0, col.sym_size(0));
  const auto [col_sorted, perm] = at::sort(col, /*stable=*/true, 0, false);
  const auto bounds = at::arange(num_src + 1, col.options());
  const auto colptr =
      at::searchsorted(col_sorted, bounds, col.scalar_type() == at::kInt, false);
  return {colptr.to(col.scalar_type()), row.index_select(0, perm), perm.to(col.scalar_type())};
}

// materialize_grads_note: the Functions below leave the gradient of an
// unused output undefined (set_materialize_grads(false)) instead of a zero
// tensor. A layer that returns no attention weights leaves lse unused in
// every step: its backward then gets no grad_lse, where autograd would fill
// an [N_dst, H] zero tensor (a memset launch, and a read of it in the
// backward kernels) each step. Every backward below handles an undefined
// gradient of any output.
Tensor defined_or_empty(const OptTensor& t) { return t.has_value() ? *t : Tensor(); }
OptTensor as_optional(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

// A None where an op requires a tensor reaches its autograd kernel as an
// undefined tensor, on which an autograd Function fails without naming it
// ("tensor does not have a device"): named first, as the kernels' checks name
// it without grad mode.
void check_given(std::initializer_list<std::pair<const Tensor*, const char*>> args) {
  for (const auto& [t, name] : args) check_defined(*t, name);
}

// f() calls a backward op. Below the autograd keys unless a graph of the
// backward is being built (create_graph): the backward ops' own autograd, a
// Python formula that only refuses a double backward, costs about 35 us of
// host time a call even with grad mode off.
template <class F>
auto call_below_autograd(F&& f) {
  if (at::GradMode::is_enabled()) return f();
  at::AutoDispatchBelowADInplaceOrView guard;
  return f();
}

class GatAttention : public torch::autograd::Function<GatAttention> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& rowptr, const Tensor& col,
                               const Tensor& s_src, const Tensor& s_dst,
                               const OptTensor& s_edge, const Tensor& x, double negative_slope,
                               double dropout_p, const OptTensor& philox,
                               const OptTensor& colptr, const OptTensor& row,
                               const OptTensor& perm, const OptTensor& bias,
                               const OptTensor& perm_inv) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->set_materialize_grads(false);  // (see materialize_grads_note)
    auto [out, lse] = call_forward(rowptr, col, s_src, s_dst, s_edge, x, negative_slope,
                                   dropout_p, philox, colptr, row, perm, bias, perm_inv);
    // needs_input_grad counts the tensors given, in argument order.
    const auto given = [](const OptTensor& t) { return int64_t(t.has_value() && t->defined()); };
    const int64_t edge_slot = given(s_edge) ? 4 : -1;
    const int64_t x_slot = 4 + given(s_edge);
    const int64_t bias_slot = given(bias) ? x_slot + 1 + given(philox) + given(colptr) +
                                                given(row) + given(perm)
                                          : -1;
    ctx->saved_data["slots"] = std::vector<int64_t>{2, 3, edge_slot, x_slot, bias_slot};
    ctx->saved_data["negative_slope"] = negative_slope;
    ctx->saved_data["dropout_p"] = dropout_p;
    ctx->saved_data["num_src"] = x.sym_size(0);
    // out is the biased output (the one tensor of its size kept for the
    // backward); the backward takes the attention output as out - bias.
    ctx->save_for_backward({rowptr, col, s_src, s_dst, defined_or_empty(s_edge), x,
                            defined_or_empty(philox), defined_or_empty(colptr),
                            defined_or_empty(row), defined_or_empty(perm), out, lse,
                            defined_or_empty(bias), defined_or_empty(perm_inv)});
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &rowptr = saved[0], &col = saved[1], &s_src = saved[2], &s_dst = saved[3],
               &s_edge = saved[4], &x = saved[5], &philox = saved[6], &out = saved[10],
               &lse = saved[11], &bias = saved[12];
    Tensor colptr = saved[7], row = saved[8], perm = saved[9], perm_inv = saved[13];
    const Tensor &rec0 = saved[14], &rec1 = saved[15];  // the forward's record, if any
    const auto slots = ctx->saved_data["slots"].toIntVector();
    const auto needs = [&](int64_t slot) { return slot >= 0 && ctx->needs_input_grad(slot); };
    const Tensor grad_out = grads[0].defined() ? grads[0] : at::zeros_like(out);
    const Tensor& grad_lse = grads[1];

    variable_list result(14);
    if (needs(slots[4])) {
      // The sum over rows in at least float32 (half types would round every
      // partial sum).
      const auto acc = at::promote_types(grad_out.scalar_type(), at::kFloat);
      result[12] = grad_out.sum(0, false, acc).to(bias.scalar_type());
    }
    if (!(needs(slots[0]) || needs(slots[1]) || needs(slots[2]) || needs(slots[3]))) {
      return result;  // only the bias needs a gradient
    }
    if (!colptr.defined()) {
      std::tie(colptr, row, perm) = csr_to_csc(rowptr, col, ctx->saved_data["num_src"].toSymInt());
      perm_inv = Tensor();  // only with the caller's CSC
    }
    auto [grad_x, grad_src, grad_dst, grad_edge] = call_below_autograd([&] {
      return call_backward(rowptr, col, colptr, row, perm, s_src, s_dst, as_optional(s_edge), x,
                           out, lse, grad_out, as_optional(grad_lse),
                           ctx->saved_data["negative_slope"].toDouble(),
                           ctx->saved_data["dropout_p"].toDouble(), as_optional(philox),
                           as_optional(bias), as_optional(perm_inv));
    });
    result[2] = grad_src;
    result[3] = grad_dst;
    if (s_edge.defined()) result[4] = grad_edge;
    result[5] = grad_x;
    return result;
  }
};

// Without grad mode (evaluation, inference) there is no graph to record: the
// op runs below the autograd keys at once. An autograd Function costs about 6
// us of host time a call even then (CPU, one thread: gat_attention on a tiny
// graph 12.7 us against 6.7 us below the autograd keys).
template <class F>
auto forward_without_graph(F&& f) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return f();
}

std::tuple<Tensor, Tensor> gat_attention_autograd(
    const Tensor& rowptr, const Tensor& col, const Tensor& s_src, const Tensor& s_dst,
    const OptTensor& s_edge, const Tensor& x, double negative_slope, double dropout_p,
    const OptTensor& philox, const OptTensor& colptr, const OptTensor& row,
    const OptTensor& perm, const OptTensor& bias, const OptTensor& perm_inv) {
  check_given({{&rowptr, "rowptr"}, {&col, "col"}, {&s_src, "s_src"}, {&s_dst, "s_dst"},
               {&x, "x"}});
  if (!at::GradMode::is_enabled()) {
    return forward_without_graph([&] {
      return call_forward(rowptr, col, s_src, s_dst, s_edge, x, negative_slope, dropout_p, philox,
                          colptr, row, perm, bias, perm_inv);
    });
  }
  auto outputs = GatAttention::apply(rowptr, col, s_src, s_dst, s_edge, x, negative_slope,
                                     dropout_p, philox, colptr, row, perm, bias, perm_inv);
  return {outputs[0], outputs[1]};
}

// The per-channel attention ops, gatv2_attention and transformer_attention:
// inputs (rowptr, col, a, b, c, d, factor, dropout_p, philox, colptr, row,
// perm, bias, perm_inv), one of a..d the optional edge features, and the
// backward op <name>_backward(rowptr, col, colptr, row, perm, a, b, c, d,
// out, lse, grad_out, grad_lse, factor, dropout_p, philox, bias, perm_inv),
// whose four gradients Op::kGradOf maps to a..d. Op::forward and
// Op::backward call the typed ops; Op::kSource is the input whose rows are
// the sources (the CSC's columns).
using Quad = std::tuple<Tensor, Tensor, Tensor, Tensor>;

// Gradient donation. A backward that returns new gradients of its [N, H, C]
// inputs holds them beside those inputs, which it no longer needs once its
// kernels have read them. Where nothing but this node reaches an input's
// memory and the graph is freed after this backward, the kernels write the
// gradient in its place (_transformer_attention_backward_into,
// _gatv2_attention_backward_into): a layer step
// then holds no more [N, H, C] tensors during the backward than during the
// forward. Eager only: traced backwards (torch.compile, functorch), other
// dispatch modes, retain_graph and create_graph get new tensors.
bool may_donate(const Tensor& t) {
  constexpr auto traced = c10::DispatchKeySet(
      {c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
       c10::DispatchKey::Functionalize, c10::DispatchKey::FuncTorchBatched,
       c10::DispatchKey::FuncTorchGradWrapper});
  return (t.is_cpu() || t.is_cuda()) && t.layout() == at::kStrided &&
         !t.key_set().has_any(traced);
}

bool donation_allowed(const Tensor& ref) {
  return !at::GradMode::is_enabled() && !c10::impl::TorchDispatchModeTLS::any_modes_set() &&
         !torch::autograd::get_current_graph_task_keep_graph() && may_donate(ref);
}

// Whether this backward alone reaches t's memory: no tensor, view or
// storage handle but the `impls` TensorImpls this node keeps shares it. t
// is a detached alias the node saved of an input (the saved variable and
// `saved` hold that one TensorImpl) or one of the node's outputs (saved as a
// detached copy, unpacked into a second TensorImpl of the same memory).
// Neither TensorImpl ever reaches the caller, so a caller's tensor of that
// memory (its Python object included) shows as one more.
bool sole_owner(const Tensor& t, int64_t impls, at::IntArrayRef shape,
                const at::ScalarType dtype) {
  return t.defined() && may_donate(t) && t.is_contiguous() && t.sizes() == shape &&
         t.scalar_type() == dtype && t.has_storage() && !t.is_view() &&
         t.storage().use_count() == impls;
}

// An input whose memory may take a gradient: `own` (kept by `impls`
// TensorImpls of this node, as sole_owner counts them) for the gradient of
// `like` (its shape, dtype and device).
struct Donation {
  const Tensor* own;
  int64_t impls;
  const Tensor* like;
};

struct Gatv2Op {  // (x_l, x_r, e_feat?, att), negative_slope
  static constexpr bool kAlias[4] = {false, true, false, false};  // x_r may take grad_x_r
  static constexpr int kSource = 0;
  static constexpr int kGradOf[4] = {0, 1, 3, 2};  // grad_x_l, grad_x_r, grad_att, grad_e_feat
  // The forward of a step that will run the backward keeps its record
  // (_gatv2_attention_record: each entry's logit and signs), which the
  // backward reads instead of rebuilding z, and uses up where it may donate.
  static constexpr bool kRecord = true;
  static Quad forward(const Tensor& rowptr, const Tensor& col, const OptTensor& a,
                      const OptTensor& b, const OptTensor& c, const OptTensor& d, double f,
                      double p, const OptTensor& philox, const OptTensor& colptr,
                      const OptTensor& row, const OptTensor& perm, const OptTensor& bias,
                      const OptTensor& perm_inv, bool record) {
    if (record && a->is_cuda()) {  // (the CPU's backward reads no record)
      static auto op = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("pyg_multihead_agg::_gatv2_attention_record", "")
                           .typed<Quad(const Tensor&, const Tensor&, const Tensor&,
                                       const Tensor&, const OptTensor&, const Tensor&, double,
                                       double, const OptTensor&, const OptTensor&)>();
      return op.call(rowptr, col, *a, *b, c, *d, f, p, philox, bias);
    }
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("pyg_multihead_agg::gatv2_attention", "")
                         .typed<std::tuple<Tensor, Tensor>(
                             const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const OptTensor&, const Tensor&, double, double, const OptTensor&,
                             const OptTensor&, const OptTensor&, const OptTensor&,
                             const OptTensor&, const OptTensor&)>();
    auto [out, lse] =
        op.call(rowptr, col, *a, *b, c, *d, f, p, philox, colptr, row, perm, bias, perm_inv);
    return {out, lse, Tensor(), Tensor()};
  }
  static Quad backward(const Tensor& rowptr, const Tensor& col, const Tensor& colptr,
                       const Tensor& row, const Tensor& perm, const Tensor& a, const Tensor& b,
                       const Tensor& c, const Tensor& d, const Tensor& out, const Tensor& lse,
                       const Tensor& grad_out, const OptTensor& grad_lse, double f, double p,
                       const OptTensor& philox, const OptTensor& bias,
                       const OptTensor& perm_inv, const Tensor& rec0, const Tensor& rec1) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("pyg_multihead_agg::gatv2_attention_backward", "")
                         .typed<Quad(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                     const Tensor&, const Tensor&, const Tensor&,
                                     const OptTensor&, const Tensor&, const Tensor&,
                                     const Tensor&, const Tensor&, const OptTensor&, double,
                                     double, const OptTensor&, const OptTensor&,
                                     const OptTensor&, const OptTensor&, const OptTensor&)>();
    return op.call(rowptr, col, colptr, row, perm, a, b, as_optional(c), d, out, lse, grad_out,
                   grad_lse, f, p, philox, bias, perm_inv, as_optional(rec0), as_optional(rec1));
  }
  // The inputs whose memory may take a gradient (gradient donation), in the
  // order of _gatv2_attention_backward_into's buffers: out takes grad_x_l
  // (when its shape is x_l's), x_r grad_x_r. a, b: x_l, x_r.
  static std::array<Donation, 2> donations(const Tensor& a, const Tensor& b, const Tensor&,
                                           const Tensor& out) {
    return {{{&out, 2, &a}, {&b, 1, &b}}};
  }
  static Quad backward_into(const Tensor& rowptr, const Tensor& col, const Tensor& colptr,
                            const Tensor& row, const Tensor& perm, const Tensor& a,
                            const Tensor& b, const Tensor& c, const Tensor& d, const Tensor& out,
                            const Tensor& lse, const Tensor& grad_out, const OptTensor& grad_lse,
                            double f, double p, const OptTensor& philox, const OptTensor& bias,
                            const OptTensor& perm_inv, std::array<Tensor, 2>& into,
                            const Tensor& rec0, const Tensor& rec1) {
    // (the record's logits take the logit gradients: this node alone keeps
    // them, and donation_allowed has ruled out a retained graph)
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("pyg_multihead_agg::_gatv2_attention_backward_into", "")
                         .typed<std::tuple<Tensor, Tensor>(
                             const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&, const Tensor&, const Tensor&, const OptTensor&,
                             const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const OptTensor&, double, double, const OptTensor&,
                             const OptTensor&, const OptTensor&, Tensor&, Tensor&,
                             const OptTensor&, const OptTensor&)>();
    auto [grad_att, grad_e] = op.call(rowptr, col, colptr, row, perm, a, b, as_optional(c), d,
                                      out, lse, grad_out, grad_lse, f, p, philox, bias, perm_inv,
                                      into[0], into[1], as_optional(rec0), as_optional(rec1));
    return {into[0], into[1], grad_att, grad_e};
  }
};

struct TransformerOp {  // (query, key, value, e_feat?), scale
  static constexpr bool kAlias[4] = {true, false, true, false};  // query, value
  static constexpr int kSource = 1;
  static constexpr int kGradOf[4] = {0, 1, 2, 3};  // grad_query, grad_key, grad_value, grad_e_feat
  static constexpr bool kRecord = false;  // (the backward recomputes the logits)
  static Quad forward(const Tensor& rowptr, const Tensor& col, const OptTensor& a,
                      const OptTensor& b, const OptTensor& c, const OptTensor& d, double f,
                      double p, const OptTensor& philox, const OptTensor& colptr,
                      const OptTensor& row, const OptTensor& perm, const OptTensor& bias,
                      const OptTensor& perm_inv, bool /*record*/) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("pyg_multihead_agg::transformer_attention", "")
                         .typed<std::tuple<Tensor, Tensor>(
                             const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&, const OptTensor&, double, double, const OptTensor&,
                             const OptTensor&, const OptTensor&, const OptTensor&,
                             const OptTensor&, const OptTensor&)>();
    auto [out, lse] =
        op.call(rowptr, col, *a, *b, *c, d, f, p, philox, colptr, row, perm, bias, perm_inv);
    return {out, lse, Tensor(), Tensor()};
  }
  static Quad backward(const Tensor& rowptr, const Tensor& col, const Tensor& colptr,
                       const Tensor& row, const Tensor& perm, const Tensor& a, const Tensor& b,
                       const Tensor& c, const Tensor& d, const Tensor& out, const Tensor& lse,
                       const Tensor& grad_out, const OptTensor& grad_lse, double f, double p,
                       const OptTensor& philox, const OptTensor& bias,
                       const OptTensor& perm_inv, const Tensor&, const Tensor&) {
    static auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("pyg_multihead_agg::transformer_attention_backward", "")
            .typed<Quad(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const OptTensor&, const Tensor&, const Tensor&, const Tensor&,
                        const OptTensor&, double, double, const OptTensor&, const OptTensor&,
                        const OptTensor&)>();
    return op.call(rowptr, col, colptr, row, perm, a, b, c, as_optional(d), out, lse, grad_out,
                   grad_lse, f, p, philox, bias, perm_inv);
  }
  // The inputs whose memory may take a gradient, in the order of
  // _transformer_attention_backward_into's buffers: the query takes
  // grad_query, out grad_key (when its shape is the keys'), the value
  // grad_value. a, b, c: query, key, value.
  static std::array<Donation, 3> donations(const Tensor& a, const Tensor& b, const Tensor& c,
                                           const Tensor& out) {
    return {{{&a, 1, &a}, {&out, 2, &b}, {&c, 1, &c}}};
  }
  static Quad backward_into(const Tensor& rowptr, const Tensor& col, const Tensor& colptr,
                            const Tensor& row, const Tensor& perm, const Tensor& a,
                            const Tensor& b, const Tensor& c, const Tensor& d, const Tensor& out,
                            const Tensor& lse, const Tensor& grad_out, const OptTensor& grad_lse,
                            double f, double p, const OptTensor& philox, const OptTensor& bias,
                            const OptTensor& perm_inv, std::array<Tensor, 3>& into,
                            const Tensor&, const Tensor&) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("pyg_multihead_agg::_transformer_attention_backward_into", "")
                         .typed<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                       const Tensor&, const Tensor&, const Tensor&,
                                       const Tensor&, const OptTensor&, const Tensor&,
                                       const Tensor&, const Tensor&, const OptTensor&, double,
                                       double, const OptTensor&, const OptTensor&,
                                       const OptTensor&, Tensor&, Tensor&, Tensor&)>();
    Tensor grad_e = op.call(rowptr, col, colptr, row, perm, a, b, c, as_optional(d), out, lse,
                            grad_out, grad_lse, f, p, philox, bias, perm_inv, into[0], into[1],
                            into[2]);
    return {into[0], into[1], into[2], grad_e};
  }
};

template <class Op>
class ChannelAttention : public torch::autograd::Function<ChannelAttention<Op>> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& rowptr, const Tensor& col,
                               const OptTensor& a, const OptTensor& b, const OptTensor& c,
                               const OptTensor& d, double factor, double dropout_p,
                               const OptTensor& philox, const OptTensor& colptr,
                               const OptTensor& row, const OptTensor& perm,
                               const OptTensor& bias, const OptTensor& perm_inv) {
    Tensor out, lse, rec0, rec1;
    ctx->set_materialize_grads(false);  // (see materialize_grads_note)
    {
      // A record only for a backward that will read it (not a bias's
      // gradient alone: a sum of grad_out).
      bool record = false;
      for (const OptTensor* t : {&a, &b, &c, &d})
        record = record || (t->has_value() && (*t)->defined() && (*t)->requires_grad());
      at::AutoDispatchBelowADInplaceOrView guard;
      std::tie(out, lse, rec0, rec1) = Op::forward(rowptr, col, a, b, c, d, factor, dropout_p,
                                                   philox, colptr, row, perm, bias, perm_inv,
                                                   Op::kRecord && record);
    }
    // needs_input_grad counts the tensors given, in argument order: a..d's
    // slots (-1: not given), then the bias's.
    const auto given = [](const OptTensor& t) { return int64_t(t.has_value() && t->defined()); };
    std::vector<int64_t> slots;
    int64_t next = 2;  // after rowptr and col
    for (const OptTensor* t : {&a, &b, &c, &d}) slots.push_back(given(*t) ? next++ : -1);
    next += given(philox) + given(colptr) + given(row) + given(perm);
    slots.push_back(given(bias) ? next : -1);
    ctx->saved_data["slots"] = slots;
    ctx->saved_data["factor"] = factor;
    ctx->saved_data["dropout_p"] = dropout_p;
    const OptTensor* source[4] = {&a, &b, &c, &d};
    ctx->saved_data["num_src"] = (*source[Op::kSource])->sym_size(0);
    // out is the biased output, the one [N_dst, H, C] tensor kept. The
    // inputs a backward may write its gradients into are kept as detached
    // aliases (tensor_data: same memory and version counter, no dispatched
    // op), which no caller ever sees: then only another tensor of their
    // memory can hold it (sole_owner).
    const auto keep = [](const OptTensor& t, int k) {
      const Tensor v = defined_or_empty(t);
      return Op::kAlias[k] && v.defined() ? v.tensor_data() : v;
    };
    ctx->save_for_backward({rowptr, col, keep(a, 0), keep(b, 1), keep(c, 2), keep(d, 3),
                            defined_or_empty(philox),
                            defined_or_empty(colptr), defined_or_empty(row),
                            defined_or_empty(perm), out, lse, defined_or_empty(bias),
                            defined_or_empty(perm_inv), rec0, rec1});
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &rowptr = saved[0], &col = saved[1], &philox = saved[6], &out = saved[10],
               &lse = saved[11], &bias = saved[12];
    Tensor colptr = saved[7], row = saved[8], perm = saved[9], perm_inv = saved[13];
    const Tensor &rec0 = saved[14], &rec1 = saved[15];  // the forward's record, if any
    const auto slots = ctx->saved_data["slots"].toIntVector();
    const auto needs = [&](int64_t slot) { return slot >= 0 && ctx->needs_input_grad(slot); };
    const Tensor grad_out = grads[0].defined() ? grads[0].contiguous() : at::zeros_like(out);
    const Tensor& grad_lse = grads[1];

    variable_list result(14);
    if (needs(slots[4])) {
      // The sum over rows in at least float32 (half types would round every
      // partial sum).
      const auto acc = at::promote_types(grad_out.scalar_type(), at::kFloat);
      result[12] = grad_out.sum(0, false, acc).to(bias.scalar_type());
    }
    if (!(needs(slots[0]) || needs(slots[1]) || needs(slots[2]) || needs(slots[3]))) {
      return result;  // only the bias needs a gradient
    }
    if (!colptr.defined()) {
      std::tie(colptr, row, perm) = csr_to_csc(rowptr, col, ctx->saved_data["num_src"].toSymInt());
      perm_inv = Tensor();  // only with the caller's CSC
    }
    const double factor = ctx->saved_data["factor"].toDouble();
    const double dropout_p = ctx->saved_data["dropout_p"].toDouble();
    const Quad gradients = call_below_autograd([&]() -> Quad {
      if (donation_allowed(out)) {
        // The op's buffers: an input's own memory where this node alone
        // reaches it, else new tensors; the backward op where none is.
        const auto donations = Op::donations(saved[2], saved[3], saved[4], out);
        std::array<Tensor, std::tuple_size_v<std::decay_t<decltype(donations)>>> into;
        bool any = false;
        for (size_t k = 0; k < donations.size(); ++k) {
          const Donation& dn = donations[k];
          const bool given = sole_owner(*dn.own, dn.impls, dn.like->sizes(),
                                        dn.like->scalar_type());
          any = any || given;
          into[k] = given ? *dn.own : at::empty(dn.like->sizes(), dn.like->options());
        }
        // (a record, which only this node keeps, is used up there too)
        if (any || (rec0.defined() && rec0.numel() > 0)) {
          return Op::backward_into(rowptr, col, colptr, row, perm, saved[2], saved[3], saved[4],
                                   saved[5], out, lse, grad_out, as_optional(grad_lse), factor,
                                   dropout_p, as_optional(philox), as_optional(bias),
                                   as_optional(perm_inv), into, rec0, rec1);
        }
      }
      return Op::backward(rowptr, col, colptr, row, perm, saved[2], saved[3], saved[4], saved[5],
                          out, lse, grad_out, as_optional(grad_lse), factor, dropout_p,
                          as_optional(philox), as_optional(bias), as_optional(perm_inv), rec0,
                          rec1);
    });
    const Tensor g[4] = {std::get<0>(gradients), std::get<1>(gradients), std::get<2>(gradients),
                         std::get<3>(gradients)};
    for (int k = 0; k < 4; ++k) {
      const int input = Op::kGradOf[k];
      if (slots[input] >= 0) result[2 + input] = g[k];  // (the edge features' only if given)
    }
    return result;
  }
};

std::tuple<Tensor, Tensor> gatv2_attention_autograd(
    const Tensor& rowptr, const Tensor& col, const Tensor& x_l, const Tensor& x_r,
    const OptTensor& e_feat, const Tensor& att, double negative_slope, double dropout_p,
    const OptTensor& philox, const OptTensor& colptr, const OptTensor& row,
    const OptTensor& perm, const OptTensor& bias, const OptTensor& perm_inv) {
  check_given({{&rowptr, "rowptr"}, {&col, "col"}, {&x_l, "x_l"}, {&x_r, "x_r"}, {&att, "att"}});
  if (!at::GradMode::is_enabled()) {
    return forward_without_graph([&] {
      auto [out, lse, r0, r1] = Gatv2Op::forward(rowptr, col, x_l, x_r, e_feat, att, negative_slope, dropout_p,
                              philox, colptr, row, perm, bias, perm_inv, false);
      return std::make_tuple(out, lse);
    });
  }
  auto outputs = ChannelAttention<Gatv2Op>::apply(
      rowptr, col, OptTensor(x_l), OptTensor(x_r), e_feat, OptTensor(att), negative_slope,
      dropout_p, philox, colptr, row, perm, bias, perm_inv);
  return {outputs[0], outputs[1]};
}

std::tuple<Tensor, Tensor> transformer_attention_autograd(
    const Tensor& rowptr, const Tensor& col, const Tensor& query, const Tensor& key,
    const Tensor& value, const OptTensor& e_feat, double scale, double dropout_p,
    const OptTensor& philox, const OptTensor& colptr, const OptTensor& row,
    const OptTensor& perm, const OptTensor& bias, const OptTensor& perm_inv) {
  check_given({{&rowptr, "rowptr"}, {&col, "col"}, {&query, "query"}, {&key, "key"},
               {&value, "value"}});
  if (!at::GradMode::is_enabled()) {
    return forward_without_graph([&] {
      auto [out, lse, r0, r1] = TransformerOp::forward(rowptr, col, query, key, value, e_feat, scale, dropout_p,
                                    philox, colptr, row, perm, bias, perm_inv, false);
      return std::make_tuple(out, lse);
    });
  }
  auto outputs = ChannelAttention<TransformerOp>::apply(
      rowptr, col, OptTensor(query), OptTensor(key), OptTensor(value), e_feat, scale, dropout_p,
      philox, colptr, row, perm, bias, perm_inv);
  return {outputs[0], outputs[1]};
}

// multihead_spmm: its backward is multihead_spmm_backward_csc over the
// caller's CSC (or one built here), or on CUDA without a CSC, outside
// deterministic mode, the atomic scatter (grad_x) and the SDDMM
// (grad_weight) over the CSR.
Tensor call_spmm(const Tensor& rowptr, const Tensor& col, const Tensor& weight, const Tensor& x,
                 const OptTensor& colptr, const OptTensor& row, const OptTensor& perm,
                 const OptTensor& perm_inv) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pyg_multihead_agg::multihead_spmm", "")
                       .typed<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                     const OptTensor&, const OptTensor&, const OptTensor&,
                                     const OptTensor&)>();
  return op.call(rowptr, col, weight, x, colptr, row, perm, perm_inv);
}

std::tuple<Tensor, Tensor> call_spmm_backward_csc(const Tensor& colptr, const Tensor& row,
                                                  const Tensor& perm, const OptTensor& weight,
                                                  const OptTensor& x, const Tensor& grad_out,
                                                  const OptTensor& perm_inv) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pyg_multihead_agg::multihead_spmm_backward_csc", "")
                       .typed<std::tuple<Tensor, Tensor>(
                           const Tensor&, const Tensor&, const Tensor&, const OptTensor&,
                           const OptTensor&, const Tensor&, const OptTensor&)>();
  return op.call(colptr, row, perm, weight, x, grad_out, perm_inv);
}

Tensor call_spmm_backward_x_scatter(const Tensor& rowptr, const Tensor& col,
                                    const Tensor& weight, const Tensor& grad_out,
                                    const c10::SymInt& num_src) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("pyg_multihead_agg::multihead_spmm_backward_x_scatter", "")
          .typed<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        c10::SymInt)>();
  return op.call(rowptr, col, weight, grad_out, num_src);
}

Tensor call_sddmm(const Tensor& rowptr, const Tensor& col, const Tensor& a, const Tensor& b) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pyg_multihead_agg::multihead_sddmm", "")
                       .typed<Tensor(const Tensor&, const Tensor&, const Tensor&,
                                     const Tensor&)>();
  return op.call(rowptr, col, a, b);
}

class MultiheadSpmm : public torch::autograd::Function<MultiheadSpmm> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& rowptr, const Tensor& col,
                        const Tensor& weight, const Tensor& x, const OptTensor& colptr,
                        const OptTensor& row, const OptTensor& perm,
                        const OptTensor& perm_inv) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->set_materialize_grads(false);  // (see materialize_grads_note)
    Tensor out = call_spmm(rowptr, col, weight, x, colptr, row, perm, perm_inv);
    // grad_x needs weight, grad_weight needs x: only those are kept.
    ctx->saved_data["num_src"] = x.sym_size(0);
    ctx->save_for_backward({rowptr, col, x.requires_grad() ? weight : Tensor(),
                            weight.requires_grad() ? x : Tensor(), defined_or_empty(colptr),
                            defined_or_empty(row), defined_or_empty(perm),
                            defined_or_empty(perm_inv)});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &rowptr = saved[0], &col = saved[1];
    Tensor colptr = saved[4], row = saved[5], perm = saved[6], perm_inv = saved[7];
    // weight and x are inputs 2 and 3 (rowptr and col come first).
    const Tensor weight = ctx->needs_input_grad(3) ? saved[2] : Tensor();
    const Tensor x = ctx->needs_input_grad(2) ? saved[3] : Tensor();
    const Tensor& grad_out = grads[0];
    variable_list result(8);
    if (!grad_out.defined() || !(weight.defined() || x.defined())) return result;
    const c10::SymInt num_src = ctx->saved_data["num_src"].toSymInt();
    if (!colptr.defined() && grad_out.is_cuda() &&
        !at::globalContext().deterministicAlgorithms()) {
      if (weight.defined()) {
        result[3] = call_below_autograd([&] {
          return call_spmm_backward_x_scatter(rowptr, col, weight, grad_out, num_src);
        });
      }
      if (x.defined()) {
        result[2] = call_below_autograd([&] { return call_sddmm(rowptr, col, grad_out, x); });
      }
      return result;
    }
    if (!colptr.defined()) {
      std::tie(colptr, row, perm) = csr_to_csc(rowptr, col, num_src);
      perm_inv = Tensor();  // only with the caller's CSC
    }
    auto [grad_x, grad_weight] = call_below_autograd([&] {
      return call_spmm_backward_csc(colptr, row, perm, as_optional(weight), as_optional(x),
                                    grad_out, as_optional(perm_inv));
    });
    if (weight.defined()) result[3] = grad_x;
    if (x.defined()) result[2] = grad_weight;
    return result;
  }
};

Tensor multihead_spmm_autograd(const Tensor& rowptr, const Tensor& col, const Tensor& weight,
                               const Tensor& x, const OptTensor& colptr, const OptTensor& row,
                               const OptTensor& perm, const OptTensor& perm_inv) {
  check_given({{&rowptr, "rowptr"}, {&col, "col"}, {&weight, "weight"}, {&x, "x"}});
  if (!at::GradMode::is_enabled()) {
    return forward_without_graph(
        [&] { return call_spmm(rowptr, col, weight, x, colptr, row, perm, perm_inv); });
  }
  return MultiheadSpmm::apply(rowptr, col, weight, x, colptr, row, perm, perm_inv);
}

// _gat_scores: one node for both atts; its backward is the op
// _gat_scores_backward.
std::tuple<Tensor, Tensor> call_gat_scores(const Tensor& x, const Tensor& att_src,
                                           const OptTensor& att_dst) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pyg_multihead_agg::_gat_scores", "")
                       .typed<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&,
                                                         const OptTensor&)>();
  return op.call(x, att_src, att_dst);
}

std::tuple<Tensor, Tensor, Tensor> call_gat_scores_backward(
    const OptTensor& grad_src, const OptTensor& grad_dst, const Tensor& x, const Tensor& att_src,
    const OptTensor& att_dst, bool x_grad, bool att_grad) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pyg_multihead_agg::_gat_scores_backward", "")
                       .typed<std::tuple<Tensor, Tensor, Tensor>(
                           const OptTensor&, const OptTensor&, const Tensor&, const Tensor&,
                           const OptTensor&, bool, bool)>();
  return op.call(grad_src, grad_dst, x, att_src, att_dst, x_grad, att_grad);
}

class GatScores : public torch::autograd::Function<GatScores> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& att_src,
                               const OptTensor& att_dst) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->set_materialize_grads(false);  // (see materialize_grads_note)
    ctx->save_for_backward({x, att_src, defined_or_empty(att_dst)});
    auto [s_src, s_dst] = call_gat_scores(x, att_src, att_dst);
    return {s_src, s_dst};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &att_src = saved[1], &att_dst = saved[2];
    variable_list result(3);
    const bool two = att_dst.defined();  // (needs_input_grad counts the tensors given)
    const bool x_grad = ctx->needs_input_grad(0);
    const bool att_grad = ctx->needs_input_grad(1) || (two && ctx->needs_input_grad(2));
    if (!grads[0].defined() && !(two && grads[1].defined())) return result;
    auto [grad_x, grad_att_src, grad_att_dst] = call_below_autograd([&] {
      return call_gat_scores_backward(as_optional(grads[0]),
                                      two ? as_optional(grads[1]) : std::nullopt, x, att_src,
                                      as_optional(att_dst), x_grad, att_grad);
    });
    if (x_grad) result[0] = grad_x;
    if (att_grad) {
      result[1] = grad_att_src.view(att_src.sizes()).to(att_src.scalar_type());
      if (two) result[2] = grad_att_dst.view(att_dst.sizes()).to(att_dst.scalar_type());
    }
    return result;
  }
};

std::tuple<Tensor, Tensor> gat_scores_autograd(const Tensor& x, const Tensor& att_src,
                                               const OptTensor& att_dst) {
  check_given({{&x, "x"}, {&att_src, "att_src"}});
  if (!at::GradMode::is_enabled()) {
    return forward_without_graph([&] { return call_gat_scores(x, att_src, att_dst); });
  }
  auto outputs = GatScores::apply(x, att_src, att_dst);
  return {outputs[0], outputs[1]};
}

// _gat_conv: a whole GATConv call (projection, scores, attention, heads
// merged) as one op and one autograd node, whose two halves are ops of their
// own, _gat_conv_forward and _gat_conv_backward: under torch.compile the
// traced graph then holds one call for the layer's forward and one for its
// backward, not the pieces (a small graph's compiled step is bound by the
// host's cost per call of the compiled graph's wrapper, as an eager one by
// the cost per operation). The forward's pieces, which the backward reuses:
// the projection h [N, H, C], the scores, the attention's biased output
// [rows, H, C] and lse.
struct GatConvParts {
  Tensor h, s_src, s_dst, out, lse;
};

// The bias as the attention op adds it to every head: [H, C] (concat), or
// the whole [C] bias per head (the mean over the heads of out_h + bias is
// mean(out_h) + bias).
OptTensor heads_bias(const OptTensor& bias, const Tensor& h, bool concat) {
  if (!bias.has_value() || !bias->defined()) return std::nullopt;
  const Tensor b = bias->scalar_type() == h.scalar_type() ? *bias : bias->to(h.scalar_type());
  return concat ? b.view_symint({h.sym_size(1), h.sym_size(2)})
                : b.expand_symint({h.sym_size(1), h.sym_size(2)});
}

GatConvParts gat_conv_parts(const Tensor& x, const Tensor& weight, const Tensor& att_src,
                            const Tensor& att_dst, const OptTensor& bias, const Tensor& rowptr,
                            const Tensor& col, const OptTensor& colptr, const OptTensor& row,
                            const OptTensor& perm, const OptTensor& perm_inv, bool concat,
                            double negative_slope, double dropout_p, const OptTensor& philox) {
  TORCH_CHECK(att_src.dim() >= 2, "att_src must be [1, heads, channels], got ", att_src.sizes());
  const int64_t H = att_src.size(-2), C = att_src.size(-1);
  TORCH_CHECK(x.dim() == 2, "x must be [N, in_channels], got ", x.sizes());
  // A spare row after the nodes' (the caller's own self-loops, where the
  // graph was built without the index check) has no features: its score is
  // 0, and the result drops its output.
  const int64_t rows = rowptr.size(0) - 1;
  TORCH_CHECK(rows == x.size(0) || rows == x.size(0) + 1, "rowptr must describe ", x.size(0),
              " rows (the nodes of x), or one spare row more, got ", rows);
  GatConvParts p;
  p.h = at::linear(x, weight);  // (a width that does not fit fails here, as in PyG's layer)
  TORCH_CHECK(p.h.size(1) == H * C, "weight must have heads * channels = ", H * C,
              " rows, got ", weight.sizes());
  p.h = p.h.view({x.size(0), H, C});
  std::tie(p.s_src, p.s_dst) = call_gat_scores(p.h, att_src, att_dst);
  if (rows > x.size(0)) p.s_dst = at::constant_pad_nd(p.s_dst, {0, 0, 0, 1});
  std::tie(p.out, p.lse) =
      call_forward(rowptr, col, p.s_src, p.s_dst, std::nullopt, p.h, negative_slope, dropout_p,
                   philox, colptr, row, perm, heads_bias(bias, p.h, concat), perm_inv);
  return p;
}

// The layer's result from the attention's output: the nodes' rows (without a
// spare row), heads concatenated or averaged. Symbolic sizes: the autograd
// Function below runs this under torch.compile(dynamic=True).
Tensor merge_heads(const Tensor& out, const c10::SymInt& num_nodes, bool concat) {
  const Tensor nodes = out.narrow_symint(0, 0, num_nodes);
  return concat ? nodes.view_symint({num_nodes, out.sym_size(1) * out.sym_size(2)})
                : nodes.mean(1);
}

Tensor gat_conv_composite(const Tensor& x, const Tensor& weight, const Tensor& att_src,
                          const Tensor& att_dst, const OptTensor& bias, const Tensor& rowptr,
                          const Tensor& col, const OptTensor& colptr, const OptTensor& row,
                          const OptTensor& perm, const OptTensor& perm_inv, bool concat,
                          double negative_slope, double dropout_p, const OptTensor& philox) {
  return merge_heads(gat_conv_parts(x, weight, att_src, att_dst, bias, rowptr, col, colptr, row,
                                    perm, perm_inv, concat, negative_slope, dropout_p, philox)
                         .out,
                     x.sym_size(0), concat);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> gat_conv_forward_composite(
    const Tensor& x, const Tensor& weight, const Tensor& att_src, const Tensor& att_dst,
    const OptTensor& bias, const Tensor& rowptr, const Tensor& col, const OptTensor& colptr,
    const OptTensor& row, const OptTensor& perm, const OptTensor& perm_inv, bool concat,
    double negative_slope, double dropout_p, const OptTensor& philox) {
  GatConvParts p = gat_conv_parts(x, weight, att_src, att_dst, bias, rowptr, col, colptr, row,
                                  perm, perm_inv, concat, negative_slope, dropout_p, philox);
  return {p.out, p.h, p.s_src, p.s_dst, p.lse};
}

using GatConvGrads = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;

// The attention's output [rows, H, C] from what the forward kept: out itself,
// or with concat the layer's result [N, H * C], out's first N rows. A spare
// row's output, past the result, is read from out's memory where the result
// still lies in it; else a zero row stands for it (the spare row's output
// gradient is 0, so its output enters the backward only as 0 * out).
Tensor attention_output(const Tensor& kept, int64_t rows, int64_t H, int64_t C) {
  if (kept.dim() == 3) return kept;
  const int64_t N = kept.size(0);
  if (rows == N) return kept.view({N, H, C});
  const bool in_memory = kept.is_contiguous() &&
                         (kept.storage_offset() + rows * H * C) * kept.element_size() <=
                             static_cast<int64_t>(kept.storage().nbytes());
  return in_memory ? kept.as_strided({rows, H, C}, {H * C, C, 1})
                   : at::constant_pad_nd(kept.view({N, H, C}), {0, 0, 0, 0, 0, rows - N});
}

GatConvGrads gat_conv_backward_composite(
    const Tensor& grad, const Tensor& x, const Tensor& weight, const Tensor& att_src,
    const Tensor& att_dst, const OptTensor& bias, const Tensor& h, const Tensor& s_src,
    const Tensor& s_dst, const Tensor& out, const Tensor& lse, const Tensor& rowptr,
    const Tensor& col, const OptTensor& colptr, const OptTensor& row, const OptTensor& perm,
    const OptTensor& perm_inv, bool concat, double negative_slope, double dropout_p,
    const OptTensor& philox, std::array<bool, 5> output_mask) {
  TORCH_CHECK(h.dim() == 3, "h must be [N, heads, channels], got ", h.sizes());
  const int64_t N = h.size(0), H = h.size(1), C = h.size(2), rows = rowptr.size(0) - 1;
  const auto none = [&](const Tensor& like) { return like.new_empty({0}); };
  Tensor grad_x = none(x), grad_weight = none(weight), grad_att_src = none(att_src),
         grad_att_dst = none(att_dst);
  const bool has_bias = bias.has_value() && bias->defined();
  Tensor grad_bias = has_bias ? none(*bias) : none(x);
  if (has_bias && output_mask[4]) {
    // The sum over rows in at least float32 (half types would round every
    // partial sum).
    const auto acc = at::promote_types(grad.scalar_type(), at::kFloat);
    grad_bias = grad.sum(0, false, acc).to(bias->scalar_type());
  }
  const bool need_x = output_mask[0], need_w = output_mask[1];
  const bool need_att = output_mask[2] || output_mask[3];
  if (!(need_x || need_w || need_att)) return {grad_x, grad_weight, grad_att_src, grad_att_dst,
                                                grad_bias};
  // The gradient of the attention's output: the heads' slices (concat) or
  // each head's share of the mean, and none for a spare row.
  Tensor grad_out = concat ? grad.reshape({N, H, C})
                           : (grad / static_cast<double>(H)).unsqueeze(1).expand({N, H, C});
  if (rows > N) grad_out = at::constant_pad_nd(grad_out, {0, 0, 0, 0, 0, rows - N});
  Tensor csc_ptr = defined_or_empty(colptr), csc_row = defined_or_empty(row),
         csc_perm = defined_or_empty(perm), inv = defined_or_empty(perm_inv);
  if (!csc_ptr.defined()) {
    std::tie(csc_ptr, csc_row, csc_perm) = csr_to_csc(rowptr, col, N);
    inv = Tensor();  // only with the caller's CSC
  }
  auto [grad_h, grad_src, grad_dst, grad_edge] = call_backward(
      rowptr, col, csc_ptr, csc_row, csc_perm, s_src, s_dst, std::nullopt, h,
      attention_output(out, rows, H, C), lse, grad_out, std::nullopt, negative_slope, dropout_p,
      philox, heads_bias(bias, h, concat), as_optional(inv));
  grad_out = Tensor();
  const Tensor grad_dst_nodes = grad_dst.narrow(0, 0, N);
  if (need_att) {
    auto [unused, gas, gad] = call_gat_scores_backward(grad_src, grad_dst_nodes, h, att_src,
                                                       att_dst, false, true);
    grad_att_src = gas.view(att_src.sizes()).to(att_src.scalar_type());
    grad_att_dst = gad.view(att_dst.sizes()).to(att_dst.scalar_type());
  }
  if (need_x || need_w) {
    // The scores' share of h's gradient, added in place: the layer's
    // gradient is still held by the caller, and no third [N, H, C] tensor
    // is made at the backward's peak.
    const auto dtype = grad_h.scalar_type();
    grad_h.addcmul_(grad_src.unsqueeze(-1), att_src.view({1, H, C}).to(dtype))
        .addcmul_(grad_dst_nodes.unsqueeze(-1), att_dst.view({1, H, C}).to(dtype));
    // linear's backward: h = x @ weight^T.
    const Tensor grad_proj = grad_h.view({N, H * C});
    if (need_w) grad_weight = grad_proj.t().mm(x);
    if (need_x) grad_x = grad_proj.mm(weight);
  }
  return {grad_x, grad_weight, grad_att_src, grad_att_dst, grad_bias};
}

// The dispatcher's calls of _gat_conv and its halves, typed by their kernels'
// signatures (the schema's).
template <class... Args>
auto call_gat_conv_forward(Args&&... args) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pyg_multihead_agg::_gat_conv_forward", "")
                       .typed<decltype(gat_conv_forward_composite)>();
  return op.call(std::forward<Args>(args)...);
}

template <class... Args>
auto call_gat_conv_backward(Args&&... args) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pyg_multihead_agg::_gat_conv_backward", "")
                       .typed<decltype(gat_conv_backward_composite)>();
  return op.call(std::forward<Args>(args)...);
}

template <class... Args>
Tensor call_gat_conv(Args&&... args) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pyg_multihead_agg::_gat_conv", "")
                       .typed<decltype(gat_conv_composite)>();
  return op.call(std::forward<Args>(args)...);
}

class GatConv : public torch::autograd::Function<GatConv> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& weight,
                        const Tensor& att_src, const Tensor& att_dst, const OptTensor& bias,
                        const Tensor& rowptr, const Tensor& col, const OptTensor& colptr,
                        const OptTensor& row, const OptTensor& perm, const OptTensor& perm_inv,
                        bool concat, double negative_slope, double dropout_p,
                        const OptTensor& philox) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->set_materialize_grads(false);  // (see materialize_grads_note)
    auto [out, h, s_src, s_dst, lse] =
        call_gat_conv_forward(x, weight, att_src, att_dst, bias, rowptr, col, colptr, row, perm,
                              perm_inv, concat, negative_slope, dropout_p, philox);
    ctx->saved_data["concat"] = concat;
    ctx->saved_data["negative_slope"] = negative_slope;
    ctx->saved_data["dropout_p"] = dropout_p;
    // With concat the result is out's memory: kept as the output (so that
    // an in-place change of it fails the backward, as for any output), not
    // as out, whose version an in-place change of the result would not move.
    Tensor result = merge_heads(out, x.sym_size(0), concat);
    ctx->save_for_backward({x, weight, att_src, att_dst, defined_or_empty(bias), h, s_src, s_dst,
                            concat ? result : out, lse, rowptr, col, defined_or_empty(colptr),
                            defined_or_empty(row), defined_or_empty(perm),
                            defined_or_empty(perm_inv), defined_or_empty(philox)});
    return result;
  }

  // grads by reference: the autograd node's own list (CppNode passes it as
  // an lvalue), whose reference to the layer's gradient moves here, so that
  // the op's call holds the only one the node has.
  static variable_list backward(AutogradContext* ctx, variable_list& grads) {
    const auto saved = ctx->get_saved_variables();
    variable_list result(15);  // one per argument
    const Tensor grad = std::move(grads[0]);
    if (!grad.defined()) return result;
    const Tensor& bias = saved[4];
    // needs_input_grad counts the tensors given: x, weight, att_src, att_dst,
    // then the bias where given.
    const std::array<bool, 5> mask = {ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                      ctx->needs_input_grad(2), ctx->needs_input_grad(3),
                                      bias.defined() && ctx->needs_input_grad(4)};
    auto grads5 = call_below_autograd([&] {
      return call_gat_conv_backward(
          grad, saved[0], saved[1], saved[2], saved[3], as_optional(bias), saved[5], saved[6],
          saved[7], saved[8], saved[9], saved[10], saved[11], as_optional(saved[12]),
          as_optional(saved[13]), as_optional(saved[14]), as_optional(saved[15]),
          ctx->saved_data["concat"].toBool(), ctx->saved_data["negative_slope"].toDouble(),
          ctx->saved_data["dropout_p"].toDouble(), as_optional(saved[16]), mask);
    });
    if (mask[0]) result[0] = std::get<0>(grads5);
    if (mask[1]) result[1] = std::get<1>(grads5);
    if (mask[2]) result[2] = std::get<2>(grads5);
    if (mask[3]) result[3] = std::get<3>(grads5);
    if (mask[4]) result[4] = std::get<4>(grads5);
    return result;
  }
};

Tensor gat_conv_autograd(const Tensor& x, const Tensor& weight, const Tensor& att_src,
                         const Tensor& att_dst, const OptTensor& bias, const Tensor& rowptr,
                         const Tensor& col, const OptTensor& colptr, const OptTensor& row,
                         const OptTensor& perm, const OptTensor& perm_inv, bool concat,
                         double negative_slope, double dropout_p, const OptTensor& philox) {
  check_given({{&x, "x"}, {&weight, "weight"}, {&att_src, "att_src"}, {&att_dst, "att_dst"},
               {&rowptr, "rowptr"}, {&col, "col"}});
  if (!at::GradMode::is_enabled()) {
    // The op itself below autograd: one call in a graph traced without grad
    // mode.
    return forward_without_graph([&] {
      return call_gat_conv(x, weight, att_src, att_dst, bias, rowptr, col, colptr, row, perm,
                           perm_inv, concat, negative_slope, dropout_p, philox);
    });
  }
  return GatConv::apply(x, weight, att_src, att_dst, bias, rowptr, col, colptr, row, perm,
                        perm_inv, concat, negative_slope, dropout_p, philox);
}

}  // namespace

TORCH_LIBRARY_IMPL(pyg_multihead_agg, Autograd, m) {
  m.impl("multihead_spmm", &multihead_spmm_autograd);
  m.impl("_gat_conv", &gat_conv_autograd);
  m.impl("_gat_scores", &gat_scores_autograd);
  m.impl("gat_attention", &gat_attention_autograd);
  m.impl("gatv2_attention", &gatv2_attention_autograd);
  m.impl("transformer_attention", &transformer_attention_autograd);
}

// _gat_conv and its two halves are compositions of the other ops, for every
// device (their fake implementations, for torch.compile, are in
// pyg_multihead_agg/ops.py).
TORCH_LIBRARY_IMPL(pyg_multihead_agg, CompositeExplicitAutograd, m) {
  m.impl("_gat_conv", &gat_conv_composite);
  m.impl("_gat_conv_forward", &gat_conv_forward_composite);
  m.impl("_gat_conv_backward", &gat_conv_backward_composite);
}

}  // namespace pyg_multihead_agg
