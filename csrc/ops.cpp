// Every schema of the library, and nothing else. Kernels register themselves
// next to their code (csrc/cpu/*.cpp, csrc/cuda/*/entry.cu); the fake (meta)
// implementations and the backward ops' autograd (a double backward's error)
// live in pyg_multihead_agg/ops.py, the other ops' autograd in
// csrc/autograd.cpp.
#include <Python.h>
#include <torch/library.h>

extern "C" {
// Lets `from pyg_multihead_agg import _C` load the library, which runs the
// static registrations below. No pybind11, so Py_LIMITED_API stays possible.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr,
  };
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY(pyg_multihead_agg, m) {
  // out[i, h, :] = sum_{e in rowptr[i]..rowptr[i+1]} weight[e, h] * x[col[e], h, :]
  // colptr/row/perm (the CSC of the same graph) and perm_inv (the inverse of
  // perm) are not read by the forward; they are inputs so that the autograd
  // formula can use them.
  m.def(
      "multihead_spmm(Tensor rowptr, Tensor col, Tensor weight, Tensor x, "
      "Tensor? colptr=None, Tensor? row=None, Tensor? perm=None, Tensor? perm_inv=None) -> "
      "Tensor");
  // One pass over the CSC: grad_x[j] = sum_k weight[perm[k]] * grad_out[row[k]]
  // and grad_weight[perm[k], h] = <grad_out[row[k], h], x[j, h]>.
  // grad_x is computed when `weight` is given, grad_weight when `x` is given;
  // the other output is empty. perm_inv, when given, is the inverse of perm
  // (perm[perm_inv[e]] = e); the CUDA kernel then writes grad_weight by CSC
  // entry, in the order it walks the CSC, and gathers it into edge order
  // through perm_inv, instead of writing it at random edge ids. Same
  // results; the CPU kernel only checks it.
  m.def(
      "multihead_spmm_backward_csc(Tensor colptr, Tensor row, Tensor perm, "
      "Tensor? weight, Tensor? x, Tensor grad_out, Tensor? perm_inv=None) -> (Tensor, Tensor)");
  // grad_x without a CSC: a scatter over the CSR (atomic on CUDA, so not
  // deterministic there).
  m.def(
      "multihead_spmm_backward_x_scatter(Tensor rowptr, Tensor col, "
      "Tensor weight, Tensor grad_out, SymInt num_src) -> Tensor");
  // SDDMM over the CSR: out[e, h] = <a[row(e), h, :], b[col[e], h, :]>.
  m.def("multihead_sddmm(Tensor rowptr, Tensor col, Tensor a, Tensor b) -> Tensor");

  // Fused GAT attention (docs/gat_attention.md). For destination i, head h
  // and the edges e of row i (j = col[e]):
  //   z[e, h]     = s_src[j, h] + s_dst[i, h] (+ s_edge[e, h])
  //   alpha[e, h] = exp(leaky_relu(z[e, h], negative_slope) - lse[i, h])
  //   out[i, h]   = sum_e alpha[e, h] * keep(e, h) / (1 - dropout_p) * x[j, h]
  //                 (+ bias[h])
  // lse[i, h] = logsumexp_e leaky_relu(z[e, h]) (-inf for rows without edges),
  // in float32 (float64 for float64 inputs). keep(e, h) comes from Philox with
  // philox = int64 tensor [seed, offset] (required when dropout_p > 0).
  // colptr/row/perm (the CSC) are not read by the forward; they are inputs so
  // that the autograd formula can use them, as for multihead_spmm.
  // bias [H, D] (dtype and device of x), when given, is added to every row
  // (rows without edges get bias, NaN rows stay NaN; lse is unchanged): a
  // layer's bias folded into the op, so that autograd keeps one [N_dst, H, D]
  // tensor (this output) instead of two.
  m.def(
      "gat_attention(Tensor rowptr, Tensor col, Tensor s_src, Tensor s_dst, Tensor? s_edge, "
      "Tensor x, float negative_slope, float dropout_p, Tensor? philox, Tensor? colptr=None, "
      "Tensor? row=None, Tensor? perm=None, Tensor? bias=None, Tensor? perm_inv=None) -> "
      "(Tensor, Tensor)");
  // Its backward from the CSC (colptr, row, perm) of the same graph, with the
  // attention recomputed from lse. Returns (grad_x, grad_s_src, grad_s_dst,
  // grad_s_edge); grad_s_edge is empty [0, H] without s_edge. grad_lse, when
  // given, adds alpha * grad_lse to the gradient of the logits. out is the
  // forward's output, bias included: delta[i, h] = <grad_out[i, h], out[i, h] - bias[h]>
  // (in the accumulation type). The gradient of bias (grad_out summed over
  // rows) is not computed here. perm_inv, when given, is the inverse of perm
  // (perm[perm_inv[e]] = e: the CSC position of each edge); the CUDA kernel
  // then keeps the per-edge logit gradients in CSC order (written as the CSC
  // is walked) and sums them per destination row through perm_inv, instead
  // of writing them to random edge ids. Same results; the CPU kernel only
  // checks it. The forward takes it (unread) for the autograd formula.
  m.def(
      "gat_attention_backward(Tensor rowptr, Tensor col, Tensor colptr, Tensor row, Tensor perm, "
      "Tensor s_src, Tensor s_dst, Tensor? s_edge, Tensor x, Tensor out, Tensor lse, "
      "Tensor grad_out, Tensor? grad_lse, float negative_slope, float dropout_p, "
      "Tensor? philox, Tensor? bias=None, Tensor? perm_inv=None) -> "
      "(Tensor, Tensor, Tensor, Tensor)");

  // Fused GATv2 attention (docs/gat_attention.md, GATv2). For destination i,
  // head h and the edges e of row i (j = col[e]):
  //   z[e, h, c]  = x_l[j, h, c] + x_r[i, h, c] (+ e_feat[e, h, c])
  //   l[e, h]     = sum_c att[h, c] * leaky_relu(z[e, h, c], negative_slope)
  //   alpha[e, h] = exp(l[e, h] - lse[i, h])
  //   out[i, h]   = sum_e alpha[e, h] * keep(e, h) / (1 - dropout_p) * x_l[j, h]
  //                 (+ bias[h])
  // with lse, keep, the CSC inputs, bias and perm_inv as for gat_attention.
  // e_feat is in CSR edge order.
  m.def(
      "gatv2_attention(Tensor rowptr, Tensor col, Tensor x_l, Tensor x_r, Tensor? e_feat, "
      "Tensor att, float negative_slope, float dropout_p, Tensor? philox, Tensor? colptr=None, "
      "Tensor? row=None, Tensor? perm=None, Tensor? bias=None, Tensor? perm_inv=None) -> "
      "(Tensor, Tensor)");
  // The forward of a training step: (out, lse) as gatv2_attention's, and
  // its record for the backward, by edge id (CSR order): logits [E, H] in
  // lse's dtype and the signs of z, signs [E, H, ceil(C / 32)] int32 (bit
  // c % 32 of word c / 32: z[e, h, c] > 0). On CUDA; the CPU's backward
  // needs none (empty [0, H] and [0, H, ceil(C / 32)]).
  m.def(
      "_gatv2_attention_record(Tensor rowptr, Tensor col, Tensor x_l, Tensor x_r, "
      "Tensor? e_feat, Tensor att, float negative_slope, float dropout_p, Tensor? philox, "
      "Tensor? bias=None) -> (Tensor, Tensor, Tensor, Tensor)");
  // Its backward from the CSC, with the attention recomputed from lse.
  // Returns (grad_x_l, grad_x_r, grad_att, grad_e_feat); grad_e_feat is
  // empty [0, H, C] without e_feat; grad_att is [H, C] in the dtype of x_l.
  // out, grad_lse, bias and perm_inv as in gat_attention_backward. logits,
  // signs: the forward's record (_gatv2_attention_record); on CUDA, without
  // it the backward makes it first (one more forward pass).
  m.def(
      "gatv2_attention_backward(Tensor rowptr, Tensor col, Tensor colptr, Tensor row, "
      "Tensor perm, Tensor x_l, Tensor x_r, Tensor? e_feat, Tensor att, Tensor out, Tensor lse, "
      "Tensor grad_out, Tensor? grad_lse, float negative_slope, float dropout_p, "
      "Tensor? philox, Tensor? bias=None, Tensor? perm_inv=None, Tensor? logits=None, "
      "Tensor? signs=None) -> (Tensor, Tensor, Tensor, Tensor)");
  // The same backward into given buffers, grad_x_l [N_src, H, C] and
  // grad_x_r [N_dst, H, C], contiguous; returns (grad_att, grad_e_feat).
  // grad_x_l may be the very tensor out (when N_src = N_dst) and grad_x_r
  // x_r: the kernels read every row of those before they write a gradient
  // in its place (as _transformer_attention_backward_into). The record's
  // logits, when given, take the logit gradients (the record is used up).
  m.def(
      "_gatv2_attention_backward_into(Tensor rowptr, Tensor col, Tensor colptr, Tensor row, "
      "Tensor perm, Tensor x_l, Tensor x_r, Tensor? e_feat, Tensor att, Tensor out, Tensor lse, "
      "Tensor grad_out, Tensor? grad_lse, float negative_slope, float dropout_p, "
      "Tensor? philox, Tensor? bias, Tensor? perm_inv, Tensor(a!) grad_x_l, "
      "Tensor(b!) grad_x_r, Tensor(c!)? logits=None, Tensor? signs=None) -> (Tensor, Tensor)");

  // Fused graph-transformer attention (docs/gat_attention.md, transformer).
  // For destination i, head h and the edges e of row i (j = col[e]):
  //   l[e, h]     = scale * <query[i, h], key[j, h] (+ e_feat[e, h])>
  //   alpha[e, h] = exp(l[e, h] - lse[i, h])
  //   out[i, h]   = sum_e alpha[e, h] * keep(e, h) / (1 - dropout_p) *
  //                 (value[j, h] (+ e_feat[e, h]))  (+ bias[h])
  // with lse, keep, the CSC inputs, bias and perm_inv as for gat_attention.
  // query [N_dst, H, C], key and value [N_src, H, C], e_feat [E, H, C] in
  // CSR edge order.
  m.def(
      "transformer_attention(Tensor rowptr, Tensor col, Tensor query, Tensor key, Tensor value, "
      "Tensor? e_feat, float scale, float dropout_p, Tensor? philox, Tensor? colptr=None, "
      "Tensor? row=None, Tensor? perm=None, Tensor? bias=None, Tensor? perm_inv=None) -> "
      "(Tensor, Tensor)");
  // Its backward from the CSC, with the attention recomputed from lse.
  // Returns (grad_query, grad_key, grad_value, grad_e_feat); grad_e_feat is
  // empty [0, H, C] without e_feat. out, grad_lse, bias and perm_inv as in
  // gat_attention_backward.
  m.def(
      "transformer_attention_backward(Tensor rowptr, Tensor col, Tensor colptr, Tensor row, "
      "Tensor perm, Tensor query, Tensor key, Tensor value, Tensor? e_feat, Tensor out, "
      "Tensor lse, Tensor grad_out, Tensor? grad_lse, float scale, float dropout_p, "
      "Tensor? philox, Tensor? bias=None, Tensor? perm_inv=None) -> "
      "(Tensor, Tensor, Tensor, Tensor)");
  // The same backward into given buffers: grad_query [N_dst, H, C], grad_key
  // and grad_value [N_src, H, C], contiguous; returns grad_e_feat. Each
  // buffer may be the very tensor query, out or value (in that order): the
  // kernels read every row of those before they write a gradient in its
  // place. The autograd formula passes them where nothing else holds them
  // and the graph is not retained, so that the backward allocates none of
  // the three (csrc/autograd.cpp); any other overlap is an error.
  m.def(
      "_transformer_attention_backward_into(Tensor rowptr, Tensor col, Tensor colptr, "
      "Tensor row, Tensor perm, Tensor query, Tensor key, Tensor value, Tensor? e_feat, "
      "Tensor out, Tensor lse, Tensor grad_out, Tensor? grad_lse, float scale, float dropout_p, "
      "Tensor? philox, Tensor? bias, Tensor? perm_inv, Tensor(a!) grad_query, "
      "Tensor(b!) grad_key, Tensor(c!) grad_value) -> Tensor");

  // GATConv's per-node attention scores, PyG's (x * att).sum(-1) for att_src
  // and, when given, att_dst, in one op: s_k[n, h] = sum_c x[n, h, c] *
  // att_k[h, c]. x [N, H, C], each att of H * C elements (PyG's [1, H, C]);
  // returns (s_src, s_dst), [N, H] each (s_dst empty [0] without att_dst), in
  // the dtype that x * att promotes to (float32 for autocast's half-precision
  // x and float32 atts, as PyG's), summed in at least float32. One kernel and
  // one autograd node (csrc/autograd.cpp) per layer call instead of a product
  // and a sum per att and their backward: a small graph's step is bound by
  // the host's cost per operation.
  m.def("_gat_scores(Tensor x, Tensor att_src, Tensor? att_dst=None) -> (Tensor, Tensor)");
  // Its backward for the scores' gradients (either may be None: zero):
  // grad_x [N, H, C] in the dtype of x (empty unless x_grad) and the atts'
  // gradients [H, C] in x's accumulation type (empty unless att_grad; the
  // second empty without att_dst), summed over rows in fixed chunks
  // (deterministic).
  m.def(
      "_gat_scores_backward(Tensor? grad_src, Tensor? grad_dst, Tensor x, Tensor att_src, "
      "Tensor? att_dst, bool x_grad, bool att_grad) -> (Tensor, Tensor, Tensor)");

  // A whole GATConv call on one graph, as one operator and one autograd node
  // (csrc/autograd.cpp): the projection linear(x, weight) [N, H * C] viewed
  // [N, H, C], _gat_scores with att_src and att_dst, gat_attention with the
  // bias ([H * C] with concat, [C] without) and dropout, then the heads
  // concatenated ([N, H * C]) or averaged ([N, C]). Rows are N = x.size(0),
  // sources and destinations alike; rowptr may have one spare row more (the
  // caller's own self-loops of a graph built without the index check), scored
  // 0 and dropped from the result. The layer takes it where nothing
  // observes the pieces (nn/gat_conv.py, GATConv._fused_layer): a small
  // graph's step is bound by the host's cost per operation and autograd
  // node, and this is one of each instead of seven.
  m.def(
      "_gat_conv(Tensor x, Tensor weight, Tensor att_src, Tensor att_dst, Tensor? bias, "
      "Tensor rowptr, Tensor col, Tensor? colptr, Tensor? row, Tensor? perm, Tensor? perm_inv, "
      "bool concat, float negative_slope, float dropout_p, Tensor? philox) -> Tensor");
  // Its autograd node's two halves (csrc/autograd.cpp), so that a traced
  // graph holds one call for each: the forward returns the attention's
  // biased output out [rows, H, C], the projection h [N, H, C], s_src
  // [N, H], s_dst [rows, H] (0 in a spare row) and lse [rows, H]; the
  // backward takes the layer's gradient, those (out, or with concat the
  // layer's result, out's first N rows) and the forward's arguments, and
  // returns the gradients of x, weight, att_src, att_dst and bias (each
  // [0] where output_mask is false, or without a bias).
  m.def(
      "_gat_conv_forward(Tensor x, Tensor weight, Tensor att_src, Tensor att_dst, Tensor? bias, "
      "Tensor rowptr, Tensor col, Tensor? colptr, Tensor? row, Tensor? perm, Tensor? perm_inv, "
      "bool concat, float negative_slope, float dropout_p, Tensor? philox) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "_gat_conv_backward(Tensor grad, Tensor x, Tensor weight, Tensor att_src, Tensor att_dst, "
      "Tensor? bias, Tensor h, Tensor s_src, Tensor s_dst, Tensor out, Tensor lse, "
      "Tensor rowptr, Tensor col, Tensor? colptr, Tensor? row, Tensor? perm, Tensor? perm_inv, "
      "bool concat, float negative_slope, float dropout_p, Tensor? philox, "
      "bool[5] output_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");

  // Private test hook: forces the CUDA kernel path `name` (value -1: back to
  // the launch heuristic) and returns the value it replaces; see
  // csrc/path_overrides.h and pyg_multihead_agg/_testing.py.
  m.def("_set_kernel_path(str name, int value) -> int");
}
