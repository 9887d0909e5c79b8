"""Python side of the operators: the wrappers, the fake implementations and
the backward ops' autograd (a double backward's error).

The schemas live in csrc/ops.cpp, the kernels in csrc/cpu and csrc/cuda,
the other ops' autograd in csrc/autograd.cpp.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import graph as _graphs
from .graph import CSC, check_csc, check_csr, check_perm_inv

_ops = torch.ops.pyg_multihead_agg
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INDICES = (torch.int32, torch.int64)


def multihead_spmm(rowptr: Tensor, col: Tensor, weight: Tensor, x: Tensor,
                   csc: Optional[CSC] = None, validate: bool = False,
                   perm_inv: Optional[Tensor] = None) -> Tensor:
    r"""Multi-head sparse aggregation over a CSR graph:

    .. math::
        \mathbf{out}_{i,h} = \sum_{e = \mathrm{rowptr}_i}^{\mathrm{rowptr}_{i+1}-1}
        w_{e,h} \, \mathbf{x}_{\mathrm{col}_e, h}

    Rows are destinations and :obj:`col` holds sources, as in PyG's
    :obj:`adj_t`. Differentiable in :obj:`weight` and :obj:`x`.

    Args:
        rowptr (torch.Tensor): :obj:`[N_dst + 1]`, int32 or int64.
        col (torch.Tensor): :obj:`[E]`, same dtype as :obj:`rowptr`.
        weight (torch.Tensor): :obj:`[E, H]` per-edge, per-head weights,
            float16, bfloat16, float32 or float64.
        x (torch.Tensor): :obj:`[N_src, H, D]` source features, same dtype.
        csc ((torch.Tensor, torch.Tensor, torch.Tensor), optional): the CSC
            :obj:`(colptr, row, perm)` of the same graph (see
            :func:`~pyg_multihead_agg.csr_to_csc`). With it the backward is a
            deterministic, atomic-free gather. Without it the backward builds
            it (CPU, or deterministic mode) or scatters with atomics (CUDA).
        validate (bool): check the CSR (and that the CSC belongs to it)
            first; raises
            :class:`ValueError` on malformed input. Costs a host sync.
        perm_inv (torch.Tensor, optional): with :obj:`csc`, the inverse of its
            :obj:`perm` (:func:`~pyg_multihead_agg.invert_perm`). The
            CUDA backward then writes the weight gradient in CSC order and
            gathers it into edge order in a second pass, instead of writing
            it at random edge ids: same results, less time on large graphs,
            one more :obj:`[E, H]` buffer while the backward runs. Worth it
            when the graph is reused (the layers cache it with the CSC);
            ignored without :obj:`csc`.

    Returns:
        :obj:`[N_dst, H, D]`; rows without edges are zero. Half types
        accumulate in float32.

    Example:
        >>> import torch, pyg_multihead_agg as pma
        >>> rowptr, col = torch.tensor([0, 2, 3]), torch.tensor([0, 1, 1])  # 2 rows, 3 edges
        >>> weight = torch.ones(3, 4)                   # [E, H]
        >>> x = torch.randn(2, 4, 8)                    # [N_src, H, D]
        >>> out = pma.multihead_spmm(rowptr, col, weight, x)
        >>> out.shape, torch.allclose(out[0], x[0] + x[1])
        (torch.Size([2, 4, 8]), True)
    """
    if validate:
        check_csr(rowptr, col, x.size(0))
        if csc is not None:
            check_csc(csc, rowptr, col, x.size(0))
            if perm_inv is not None:
                check_perm_inv(perm_inv, csc[2])
    colptr, row, perm = (None, None, None) if csc is None else csc
    if csc is None:
        perm_inv = None
    return _ops.multihead_spmm(rowptr, col, weight, x, colptr, row, perm, perm_inv)


# Fake implementations: shapes and dtypes only, with the checks of
# csrc/checks.h, so torch.compile traces without running kernels.

def _check_index(t: Tensor, name: str) -> None:
    torch._check(t.dim() == 1, lambda: f"{name} must be a 1-D tensor, got {t.dim()} dimensions")
    torch._check(t.dtype in _INDICES, lambda: f"{name} must be int32 or int64, got {t.dtype}")


def _check_value(t: Tensor, name: str, dim: int) -> None:
    torch._check(t.dim() == dim, lambda: f"{name} must have {dim} dimensions, got {t.dim()}")
    torch._check(t.dtype in _FLOATS,
                 lambda: f"{name} must be float16, bfloat16, float32 or float64, got {t.dtype}")


def _check_same(a: Tensor, name_a: str, b: Tensor, name_b: str, dtype: bool = True) -> None:
    torch._check(a.device == b.device, lambda: f"{name_a} and {name_b} must be on the same "
                 f"device, got {a.device} and {b.device}")
    if dtype:
        torch._check(a.dtype == b.dtype, lambda: f"{name_a} and {name_b} must have the same "
                     f"dtype, got {a.dtype} and {b.dtype}")


def _check_compressed(ptr: Tensor, ptr_name: str, idx: Tensor, idx_name: str) -> None:
    _check_index(ptr, ptr_name)
    _check_index(idx, idx_name)
    _check_same(ptr, ptr_name, idx, idx_name)
    torch._check(ptr.numel() >= 1,
                 lambda: f"{ptr_name} must have at least one element (num_rows + 1)")


@torch.library.register_fake("pyg_multihead_agg::multihead_spmm")
def _(rowptr, col, weight, x, colptr=None, row=None, perm=None, perm_inv=None):
    _check_compressed(rowptr, "rowptr", col, "col")
    _check_value(weight, "weight", 2)
    _check_value(x, "x", 3)
    _check_same(weight, "weight", x, "x")
    _check_same(rowptr, "rowptr", weight, "weight", dtype=False)
    torch._check(weight.size(0) == col.numel(), lambda: "weight must have one row per edge: "
                 f"weight.size(0) ({weight.size(0)}) != col.numel() ({col.numel()})")
    torch._check(weight.size(1) == x.size(1), lambda: f"weight.size(1) ({weight.size(1)}) must "
                 f"equal the number of heads x.size(1) ({x.size(1)})")
    return x.new_empty(rowptr.size(0) - 1, x.size(1), x.size(2))


def _check_perm_inv(perm_inv: Optional[Tensor], perm: Tensor, num_edges) -> None:
    if perm_inv is None:
        return
    _check_index(perm_inv, "perm_inv")
    torch._check(perm_inv.dtype == perm.dtype and perm_inv.size(0) == num_edges,
                 lambda: f"perm_inv must be a {perm.dtype} tensor with one entry per edge "
                 f"({num_edges})")


@torch.library.register_fake("pyg_multihead_agg::multihead_spmm_backward_csc")
def _(colptr, row, perm, weight, x, grad_out, perm_inv=None):
    _check_compressed(colptr, "colptr", row, "row")
    _check_index(perm, "perm")
    _check_value(grad_out, "grad_out", 3)
    num_src, num_edges = colptr.size(0) - 1, row.size(0)
    heads, channels = grad_out.size(1), grad_out.size(2)
    torch._check(perm.size(0) == num_edges, lambda: "perm must have one entry per edge")
    _check_perm_inv(perm_inv, perm, num_edges)
    if weight is not None:
        _check_value(weight, "weight", 2)
        _check_same(weight, "weight", grad_out, "grad_out")
        torch._check(weight.size(0) == num_edges and weight.size(1) == heads,
                     lambda: f"weight must have shape [{num_edges}, {heads}] (edges, heads)")
    if x is not None:
        _check_value(x, "x", 3)
        _check_same(x, "x", grad_out, "grad_out")
        torch._check(x.size(0) == num_src and x.size(1) == heads and x.size(2) == channels,
                     lambda: f"x must have shape [{num_src}, {heads}, {channels}]")
    grad_x = grad_out.new_empty(num_src if weight is not None else 0, heads, channels)
    grad_weight = grad_out.new_empty(num_edges if x is not None else 0, heads)
    return grad_x, grad_weight


@torch.library.register_fake("pyg_multihead_agg::multihead_spmm_backward_x_scatter")
def _(rowptr, col, weight, grad_out, num_src):
    _check_compressed(rowptr, "rowptr", col, "col")
    _check_value(weight, "weight", 2)
    _check_value(grad_out, "grad_out", 3)
    _check_same(weight, "weight", grad_out, "grad_out")
    torch._check(grad_out.size(0) == rowptr.size(0) - 1,
                 lambda: "grad_out.size(0) must equal rowptr.numel() - 1")
    return grad_out.new_empty(num_src, grad_out.size(1), grad_out.size(2))


@torch.library.register_fake("pyg_multihead_agg::multihead_sddmm")
def _(rowptr, col, a, b):
    _check_compressed(rowptr, "rowptr", col, "col")
    _check_value(a, "a", 3)
    _check_value(b, "b", 3)
    _check_same(a, "a", b, "b")
    torch._check(a.size(0) == rowptr.size(0) - 1,
                 lambda: "a.size(0) must equal rowptr.numel() - 1")
    torch._check(a.size(1) == b.size(1) and a.size(2) == b.size(2),
                 lambda: "a and b must agree in heads and channels")
    return a.new_empty(col.size(0), a.size(1))


# The backward ops are not differentiable themselves: say so instead of
# letting autograd silently return zero second derivatives.

def _no_double_backward_context(ctx, inputs, output):
    pass


def _no_double_backward(ctx, *grads):
    raise RuntimeError("pyg_multihead_agg: double backward (gradients of gradients, "
                       "create_graph=True) of the pyg_multihead_agg operators is not supported")


for _name in ("multihead_spmm_backward_csc", "multihead_spmm_backward_x_scatter",
              "multihead_sddmm"):
    torch.library.register_autograd(f"pyg_multihead_agg::{_name}", _no_double_backward,
                                    setup_context=_no_double_backward_context)


# ---------------------------------------------------------------------------
# Fused GAT attention (docs/gat_attention.md)
# ---------------------------------------------------------------------------

def _new_philox(generator: Optional[torch.Generator] = None,
                device: Optional[torch.device] = None) -> Tensor:
    r"""A fresh dropout key for :func:`gat_attention`: an int64 tensor
    :obj:`[seed, 0]` whose seed is drawn from :obj:`generator` (default:
    torch's global generator of :obj:`device`, so :func:`torch.manual_seed`
    makes the masks reproducible), on the CPU (:obj:`device` None: the
    kernels take its values, no launch) or on :obj:`device` (the kernels read
    it there: the key a CUDA graph's replays draw afresh). No device sync;
    traceable by :func:`torch.compile`."""
    seed = torch.randint(0, 2**62, (1,), dtype=torch.int64, generator=generator, device=device)
    return torch.cat([seed, seed.new_zeros(1)])


def _dropout_key(src: Optional[Tensor], generator: Optional[torch.Generator] = None) -> Tensor:
    """The key a wrapper or layer draws for dropout on the features ``src``:
    on their GPU under torch.compile or a CUDA graph capture, where a graph
    (mode="reduce-overhead", torch.cuda.graph) draws it again at each replay
    (a CPU key's values would be captured once); else on the CPU, whose
    values the kernels take without a launch."""
    on_gpu = (generator is None and isinstance(src, Tensor) and src.device.type == "cuda"
              and (torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing()))
    return _new_philox(generator, src.device if on_gpu else None)


def _attention_call_args(rowptr: Tensor, col: Tensor, src: Optional[Tensor], dropout: float,
                         philox: Optional[Tensor], generator: Optional[torch.Generator],
                         csc: Optional[CSC], validate: bool, perm_inv: Optional[Tensor]):
    """What the attention wrappers pass their op besides the features: the
    graph checked (validate) against the source features ``src`` (whose
    absence the op names), a fresh Philox key when dropout needs one, the
    CSC as three optionals, and perm_inv only with the caller's CSC."""
    if validate and isinstance(src, Tensor):
        num_src = src.size(0)
        check_csr(rowptr, col, num_src)
        if csc is not None:
            check_csc(csc, rowptr, col, num_src)
            if perm_inv is not None:
                check_perm_inv(perm_inv, csc[2])
    if dropout > 0 and philox is None:
        philox = _dropout_key(src, generator)
    if csc is None:
        return philox, (None, None, None), None
    return philox, csc, perm_inv


def gat_attention(rowptr: Tensor, col: Tensor, s_src: Tensor, s_dst: Tensor, x: Tensor, *,
                  s_edge: Optional[Tensor] = None, negative_slope: float = 0.2,
                  dropout: float = 0.0, philox: Optional[Tensor] = None,
                  generator: Optional[torch.Generator] = None, csc: Optional[CSC] = None,
                  validate: bool = False, bias: Optional[Tensor] = None,
                  perm_inv: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    r"""Fused GAT attention: edge softmax, attention dropout and aggregation
    in one pass over a CSR graph, without materialising the :obj:`E x H`
    attention matrix:

    .. math::
        \alpha_{e,h} = \mathrm{softmax}_{e \in \mathrm{row}\ i}\big(
        \mathrm{LeakyReLU}(s^{src}_{j,h} + s^{dst}_{i,h} + s^{edge}_{e,h})\big),
        \qquad
        \mathbf{out}_{i,h} = \sum_{e} \alpha_{e,h} \, m_{e,h} \, \mathbf{x}_{j,h}

    with :obj:`j = col[e]` and the dropout mask :math:`m` (kept with
    probability :obj:`1 - dropout`, scaled by :obj:`1 / (1 - dropout)`),
    regenerated in the backward from a Philox key instead of stored; plus
    :obj:`bias[h]` when given.

    Args:
        rowptr, col (torch.Tensor): the CSR over destinations (int32/int64).
        s_src (torch.Tensor): :obj:`[N_src, H]` source scores
            (:obj:`(x_j * att_src).sum(-1)` in a GAT layer).
        s_dst (torch.Tensor): :obj:`[N_dst, H]` destination scores.
        x (torch.Tensor): :obj:`[N_src, H, D]` source features; float16,
            bfloat16, float32 or float64 (scores in the same dtype).
        s_edge (torch.Tensor, optional): :obj:`[E, H]` edge scores in CSR
            order.
        negative_slope (float): of the LeakyReLU.
        dropout (float): attention dropout probability (pass 0 in eval).
        philox (torch.Tensor, optional): int64 :obj:`[seed, offset]` on the
            CPU, or on :obj:`x`'s GPU (read there by the kernels: the form
            CUDA graphs need, a CPU key is refused under capture); drawn
            from :obj:`generator` (a fresh seed, offset 0) when
            :obj:`dropout > 0` and not given, on the GPU under
            :func:`torch.compile` or a CUDA graph capture without a
            generator.
        csc ((torch.Tensor, torch.Tensor, torch.Tensor), optional): the CSC
            :obj:`(colptr, row, perm)` of the graph for the backward; built
            by :func:`~pyg_multihead_agg.csr_to_csc` when needed otherwise.
        validate (bool): check the graph first (:class:`ValueError`).
        bias (torch.Tensor, optional): :obj:`[H, D]`, dtype and device of
            :obj:`x`, added to every row of :obj:`out` (rows without edges
            get :obj:`bias`); differentiable. A layer's bias folded into the
            op: autograd then keeps :obj:`out` itself for the backward
            (which takes :obj:`out - bias`) instead of the attention output
            and a biased copy.
        perm_inv (torch.Tensor, optional): with :obj:`csc`, the inverse of its
            :obj:`perm` (:func:`~pyg_multihead_agg.invert_perm`: the CSC
            entry of each edge). The CUDA backward then keeps its per-edge
            logit gradients in CSC order instead of writing them to random
            edge ids: same results, 12-18% less time for the backward on
            the products- and reddit-like graphs (H200). Worth it when the
            graph is reused (the layer caches it with the CSC); ignored
            without :obj:`csc`.

    Returns:
        :obj:`(out [N_dst, H, D], lse [N_dst, H])`; :obj:`lse` is the
        log-sum-exp of each row's logits in float32 (float64 for float64
        inputs), :obj:`-inf` for rows without edges and NaN (as
        :obj:`out`) for rows with a NaN or :obj:`+inf` logit or only
        :obj:`-inf` logits. Both are differentiable.

    Example:
        >>> import torch, pyg_multihead_agg as pma
        >>> rowptr, col = torch.tensor([0, 2, 3]), torch.tensor([0, 1, 1])
        >>> x = torch.randn(2, 4, 8)                          # [N_src, H, D]
        >>> s_src, s_dst = torch.randn(2, 4), torch.randn(2, 4)
        >>> out, lse = pma.gat_attention(rowptr, col, s_src, s_dst, x)
        >>> out.shape, lse.shape
        (torch.Size([2, 4, 8]), torch.Size([2, 4]))
        >>> torch.allclose(out[1], x[1])  # a row with one edge: its weight is 1
        True
    """
    philox, (colptr, row, perm), perm_inv = _attention_call_args(
        rowptr, col, x, dropout, philox, generator, csc, validate, perm_inv)
    return _ops.gat_attention(rowptr, col, s_src, s_dst, s_edge, x, float(negative_slope),
                              float(dropout), philox, colptr, row, perm, bias, perm_inv)


def _check_gat(rowptr, col, s_src, s_dst, s_edge, x, dropout_p, philox, bias=None):
    _check_compressed(rowptr, "rowptr", col, "col")
    _check_value(x, "x", 3)
    for t, name in ((s_src, "s_src"), (s_dst, "s_dst")):
        _check_value(t, name, 2)
        _check_same(t, name, x, "x")
    _check_same(rowptr, "rowptr", x, "x", dtype=False)
    num_dst, (num_src, heads) = rowptr.size(0) - 1, x.shape[:2]
    torch._check(s_src.size(0) == num_src and s_src.size(1) == heads,
                 lambda: f"s_src must have shape [{num_src}, {heads}] (x.size(0), heads)")
    torch._check(s_dst.size(0) == num_dst and s_dst.size(1) == heads,
                 lambda: f"s_dst must have shape [{num_dst}, {heads}] (rowptr.numel() - 1, heads)")
    if s_edge is not None:
        _check_value(s_edge, "s_edge", 2)
        _check_same(s_edge, "s_edge", x, "x")
        torch._check(s_edge.size(0) == col.size(0) and s_edge.size(1) == heads,
                     lambda: f"s_edge must have shape [{col.size(0)}, {heads}] (col.numel(), "
                     "heads)")
    torch._check(0.0 <= dropout_p <= 1.0, lambda: f"dropout_p must lie in [0, 1], got {dropout_p}")
    if dropout_p > 0:
        torch._check(philox is not None, lambda: "philox (an int64 tensor [seed, offset]) is "
                     "required when dropout_p > 0")
    if bias is not None:
        _check_value(bias, "bias", 2)
        _check_same(bias, "bias", x, "x")
        channels = x.size(2)
        torch._check(bias.size(0) == heads and bias.size(1) == channels,
                     lambda: f"bias must have shape [{heads}, {channels}] (heads, channels: "
                     f"x.size(1), x.size(2)), got {list(bias.shape)}")


def _lse_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _attention_outputs(rowptr: Tensor, x: Tensor) -> Tuple[Tensor, Tensor]:
    """The forward outputs of an attention op: out [N_dst, H, D] like x, lse
    [N_dst, H] in float32 (float64 for float64)."""
    num_dst = rowptr.size(0) - 1
    return (x.new_empty(num_dst, x.size(1), x.size(2)),
            x.new_empty(num_dst, x.size(1), dtype=_lse_dtype(x)))


def _check_backward_graph(col, colptr, row, perm, perm_inv, out, grad_out) -> None:
    """The CSC, perm_inv and grad_out of an attention op's backward."""
    _check_compressed(colptr, "colptr", row, "row")
    _check_index(perm, "perm")
    _check_perm_inv(perm_inv, perm, col.size(0))
    torch._check(grad_out.shape == out.shape, lambda: "grad_out must have the shape of out")


@torch.library.register_fake("pyg_multihead_agg::gat_attention")
def _(rowptr, col, s_src, s_dst, s_edge, x, negative_slope, dropout_p, philox, colptr=None,
      row=None, perm=None, bias=None, perm_inv=None):
    _check_gat(rowptr, col, s_src, s_dst, s_edge, x, dropout_p, philox, bias)
    return _attention_outputs(rowptr, x)


@torch.library.register_fake("pyg_multihead_agg::gat_attention_backward")
def _(rowptr, col, colptr, row, perm, s_src, s_dst, s_edge, x, out, lse, grad_out, grad_lse,
      negative_slope, dropout_p, philox, bias=None, perm_inv=None):
    _check_gat(rowptr, col, s_src, s_dst, s_edge, x, dropout_p, philox, bias)
    _check_backward_graph(col, colptr, row, perm, perm_inv, out, grad_out)
    num_edges = col.size(0) if s_edge is not None else 0
    return (torch.empty_like(x), torch.empty_like(s_src), torch.empty_like(s_dst),
            x.new_empty(num_edges, x.size(1)))


# gat_attention's autograd is C++ (csrc/autograd.cpp): a Python formula's
# host time per call bounds the step of small graphs. Its backward op is not
# differentiable.
torch.library.register_autograd("pyg_multihead_agg::gat_attention_backward", _no_double_backward,
                                setup_context=_no_double_backward_context)


def _register_no_double_backward(name: str) -> None:
    """The per-channel attention ops (gatv2_attention, transformer_attention)
    have their autograd in C++ (csrc/autograd.cpp, ChannelAttention): their
    backward op ``<name>_backward`` refuses a double backward."""
    torch.library.register_autograd(f"pyg_multihead_agg::{name}_backward", _no_double_backward,
                                    setup_context=_no_double_backward_context)


# ---------------------------------------------------------------------------
# Fused GATv2 attention (docs/gat_attention.md, GATv2)
# ---------------------------------------------------------------------------

def gatv2_attention(rowptr: Tensor, col: Tensor, x_l: Tensor, x_r: Tensor, att: Tensor, *,
                    e_feat: Optional[Tensor] = None, negative_slope: float = 0.2,
                    dropout: float = 0.0, philox: Optional[Tensor] = None,
                    generator: Optional[torch.Generator] = None, csc: Optional[CSC] = None,
                    validate: bool = False, bias: Optional[Tensor] = None,
                    perm_inv: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    r"""Fused GATv2 attention: the per-channel scores, edge softmax,
    attention dropout and aggregation in one pass over a CSR graph, without
    materialising any :obj:`E x H x C` tensor or the :obj:`E x H` attention
    matrix:

    .. math::
        \alpha_{e,h} = \mathrm{softmax}_{e \in \mathrm{row}\ i}\Big(
        \sum_c a_{h,c} \, \mathrm{LeakyReLU}\big(x^l_{j,h,c} + x^r_{i,h,c}
        + e_{e,h,c}\big)\Big),
        \qquad
        \mathbf{out}_{i,h} = \sum_{e} \alpha_{e,h} \, m_{e,h} \, \mathbf{x}^l_{j,h}

    with :obj:`j = col[e]` and the dropout mask :math:`m` of
    :func:`gat_attention` (the same Philox scheme); plus :obj:`bias[h]` when
    given. Each source row :obj:`x_l[j]` is read once per edge, for its score
    and its aggregation (an online softmax); the backward recomputes the
    attention from the row log-sum-exp.

    Args:
        rowptr, col (torch.Tensor): the CSR over destinations (int32/int64).
        x_l (torch.Tensor): :obj:`[N_src, H, C]` source features (aggregated
            and scored); float16, bfloat16, float32 or float64.
        x_r (torch.Tensor): :obj:`[N_dst, H, C]` destination features
            (scored only).
        att (torch.Tensor): :obj:`[H, C]` attention vector.
        e_feat (torch.Tensor, optional): :obj:`[E, H, C]` projected edge
            features in CSR order.
        negative_slope, dropout, philox, generator, csc, validate, bias,
            perm_inv: as for :func:`gat_attention`.

    Returns:
        :obj:`(out [N_dst, H, C], lse [N_dst, H])`, with the conventions of
        :func:`gat_attention`. Differentiable in :obj:`x_l`, :obj:`x_r`,
        :obj:`att`, :obj:`e_feat` and :obj:`bias` (and :obj:`lse`). In an
        eager backward that frees the graph, the gradients of :obj:`x_l`
        and :obj:`x_r` are written into the memory of :obj:`out` and
        :obj:`x_r` where no tensor but the autograd graph's holds it; a
        tensor you keep is never written.

    Example:
        >>> import torch, pyg_multihead_agg as pma
        >>> rowptr, col = torch.tensor([0, 2, 3]), torch.tensor([0, 1, 1])
        >>> x_l, x_r = torch.randn(2, 4, 8), torch.randn(2, 4, 8)  # [N, H, C]
        >>> att = torch.randn(4, 8)
        >>> out, lse = pma.gatv2_attention(rowptr, col, x_l, x_r, att)
        >>> out.shape, lse.shape
        (torch.Size([2, 4, 8]), torch.Size([2, 4]))
        >>> torch.allclose(out[1], x_l[1])  # a row with one edge: its weight is 1
        True
    """
    philox, (colptr, row, perm), perm_inv = _attention_call_args(
        rowptr, col, x_l, dropout, philox, generator, csc, validate, perm_inv)
    return _ops.gatv2_attention(rowptr, col, x_l, x_r, e_feat, att, float(negative_slope),
                                float(dropout), philox, colptr, row, perm, bias, perm_inv)


def _check_edge_dropout_bias(col, e_feat, x, x_name, dropout_p, philox, bias):
    """The checks the per-channel attention ops share: e_feat [E, H, C],
    dropout_p and its philox, bias [H, C], against the features x [N, H, C]."""
    heads, channels = x.size(1), x.size(2)
    if e_feat is not None:
        _check_value(e_feat, "e_feat", 3)
        _check_same(e_feat, "e_feat", x, x_name)
        torch._check(e_feat.size(0) == col.size(0) and e_feat.size(1) == heads
                     and e_feat.size(2) == channels,
                     lambda: f"e_feat must have shape [{col.size(0)}, {heads}, {channels}] "
                     "(col.numel(), heads, channels)")
    torch._check(0.0 <= dropout_p <= 1.0, lambda: f"dropout_p must lie in [0, 1], got {dropout_p}")
    if dropout_p > 0:
        torch._check(philox is not None, lambda: "philox (an int64 tensor [seed, offset]) is "
                     "required when dropout_p > 0")
    if bias is not None:
        _check_value(bias, "bias", 2)
        _check_same(bias, "bias", x, x_name)
        torch._check(bias.size(0) == heads and bias.size(1) == channels,
                     lambda: f"bias must have shape [{heads}, {channels}] (heads, channels), got "
                     f"{list(bias.shape)}")


def _check_gatv2(rowptr, col, x_l, x_r, e_feat, att, dropout_p, philox, bias=None):
    _check_compressed(rowptr, "rowptr", col, "col")
    _check_value(x_l, "x_l", 3)
    _check_value(x_r, "x_r", 3)
    _check_value(att, "att", 2)
    _check_same(x_r, "x_r", x_l, "x_l")
    _check_same(att, "att", x_l, "x_l")
    _check_same(rowptr, "rowptr", x_l, "x_l", dtype=False)
    num_dst, (heads, channels) = rowptr.size(0) - 1, x_l.shape[1:]
    torch._check(x_r.size(0) == num_dst and x_r.size(1) == heads and x_r.size(2) == channels,
                 lambda: f"x_r must have shape [{num_dst}, {heads}, {channels}] "
                 "(rowptr.numel() - 1, heads, channels)")
    torch._check(att.size(0) == heads and att.size(1) == channels,
                 lambda: f"att must have shape [{heads}, {channels}] (heads, channels of x_l)")
    _check_edge_dropout_bias(col, e_feat, x_l, "x_l", dropout_p, philox, bias)


@torch.library.register_fake("pyg_multihead_agg::gatv2_attention")
def _(rowptr, col, x_l, x_r, e_feat, att, negative_slope, dropout_p, philox, colptr=None,
      row=None, perm=None, bias=None, perm_inv=None):
    _check_gatv2(rowptr, col, x_l, x_r, e_feat, att, dropout_p, philox, bias)
    return _attention_outputs(rowptr, x_l)


@torch.library.register_fake("pyg_multihead_agg::_gatv2_attention_record")
def _(rowptr, col, x_l, x_r, e_feat, att, negative_slope, dropout_p, philox, bias=None):
    # gatv2_attention's outputs and the record its backward reads on CUDA:
    # logits [E, H] (lse's dtype) and signs [E, H, ceil(C / 32)] int32; empty
    # on the CPU, whose backward needs none.
    _check_gatv2(rowptr, col, x_l, x_r, e_feat, att, dropout_p, philox, bias)
    out, lse = _attention_outputs(rowptr, x_l)
    num_edges = col.size(0) if x_l.device.type == "cuda" else 0
    heads, words = x_l.size(1), (x_l.size(2) + 31) // 32
    return (out, lse, lse.new_empty(num_edges, heads),
            x_l.new_empty(num_edges, heads, words, dtype=torch.int32))


@torch.library.register_fake("pyg_multihead_agg::gatv2_attention_backward")
def _(rowptr, col, colptr, row, perm, x_l, x_r, e_feat, att, out, lse, grad_out, grad_lse,
      negative_slope, dropout_p, philox, bias=None, perm_inv=None, logits=None, signs=None):
    _check_gatv2(rowptr, col, x_l, x_r, e_feat, att, dropout_p, philox, bias)
    _check_backward_graph(col, colptr, row, perm, perm_inv, out, grad_out)
    num_edges = col.size(0) if e_feat is not None else 0
    return (torch.empty_like(x_l), torch.empty_like(x_r), torch.empty_like(att),
            x_l.new_empty(num_edges, x_l.size(1), x_l.size(2)))


@torch.library.register_fake("pyg_multihead_agg::_gatv2_attention_backward_into")
def _(rowptr, col, colptr, row, perm, x_l, x_r, e_feat, att, out, lse, grad_out, grad_lse,
      negative_slope, dropout_p, philox, bias, perm_inv, grad_x_l, grad_x_r, logits=None,
      signs=None):
    # The backward of gatv2_attention written into the two buffers
    # (csrc/autograd.cpp's gradient donation), the logit gradients into the
    # record's logits; returns (grad_att, grad_e_feat).
    _check_gatv2(rowptr, col, x_l, x_r, e_feat, att, dropout_p, philox, bias)
    _check_backward_graph(col, colptr, row, perm, perm_inv, out, grad_out)
    for buf, name, ref in ((grad_x_l, "grad_x_l", x_l), (grad_x_r, "grad_x_r", x_r)):
        torch._check(buf.shape == ref.shape and buf.dtype == ref.dtype,
                     lambda name=name, ref=ref:
                     f"{name} must have the shape and dtype of {ref.shape} {ref.dtype}")
    num_edges = col.size(0) if e_feat is not None else 0
    return torch.empty_like(att), x_l.new_empty(num_edges, x_l.size(1), x_l.size(2))


_register_no_double_backward("gatv2_attention")


# ---------------------------------------------------------------------------
# Fused graph-transformer attention (docs/gat_attention.md, transformer)
# ---------------------------------------------------------------------------

def transformer_attention(rowptr: Tensor, col: Tensor, query: Tensor, key: Tensor,
                          value: Tensor, *, e_feat: Optional[Tensor] = None,
                          scale: Optional[float] = None, dropout: float = 0.0,
                          philox: Optional[Tensor] = None,
                          generator: Optional[torch.Generator] = None,
                          csc: Optional[CSC] = None, validate: bool = False,
                          bias: Optional[Tensor] = None,
                          perm_inv: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    r"""Fused graph-transformer attention (TransformerConv's): the scaled
    dot-product scores, edge softmax, attention dropout and aggregation in
    one pass over a CSR graph, without materialising the :obj:`E x H x C`
    keys, values or messages or the :obj:`E x H` attention matrix:

    .. math::
        \alpha_{e,h} = \mathrm{softmax}_{e \in \mathrm{row}\ i}\big(
        s \, \langle \mathbf{q}_{i,h}, \mathbf{k}_{j,h} + \mathbf{e}_{e,h} \rangle \big),
        \qquad
        \mathbf{out}_{i,h} = \sum_{e} \alpha_{e,h} \, m_{e,h} \,
        (\mathbf{v}_{j,h} + \mathbf{e}_{e,h})

    with :obj:`j = col[e]`, :math:`s` = :obj:`scale` (default
    :math:`1 / \sqrt{C}`) and the dropout mask :math:`m` of
    :func:`gat_attention`; plus :obj:`bias[h]` when given.

    Args:
        rowptr, col (torch.Tensor): the CSR over destinations (int32/int64).
        query (torch.Tensor): :obj:`[N_dst, H, C]`; float16, bfloat16,
            float32 or float64.
        key, value (torch.Tensor): :obj:`[N_src, H, C]` each.
        e_feat (torch.Tensor, optional): :obj:`[E, H, C]` projected edge
            features in CSR order, added to the keys and the values.
        scale (float, optional): the scores' factor (default
            :obj:`1 / sqrt(C)`).
        dropout, philox, generator, csc, validate, bias, perm_inv: as for
            :func:`gat_attention`.

    Returns:
        :obj:`(out [N_dst, H, C], lse [N_dst, H])`, with the conventions of
        :func:`gat_attention`. Differentiable in :obj:`query`, :obj:`key`,
        :obj:`value`, :obj:`e_feat` and :obj:`bias` (and :obj:`lse`). In an
        eager backward that frees the graph, the gradients of :obj:`query`,
        :obj:`key` and :obj:`value` are written into the memory of
        :obj:`query`, :obj:`out` and :obj:`value` where no tensor but the
        autograd graph's holds it; a tensor you keep is never written.

    Example:
        >>> import torch, pyg_multihead_agg as pma
        >>> rowptr, col = torch.tensor([0, 2, 3]), torch.tensor([0, 1, 1])
        >>> q, k, v = torch.randn(2, 4, 8), torch.randn(2, 4, 8), torch.randn(2, 4, 8)
        >>> out, lse = pma.transformer_attention(rowptr, col, q, k, v)
        >>> out.shape, lse.shape
        (torch.Size([2, 4, 8]), torch.Size([2, 4]))
        >>> torch.allclose(out[1], v[1])  # a row with one edge: its weight is 1
        True
    """
    if scale is None:  # (a missing key: the op names it)
        scale = key.size(-1) ** -0.5 if isinstance(key, Tensor) and key.size(-1) > 0 else 1.0
    philox, (colptr, row, perm), perm_inv = _attention_call_args(
        rowptr, col, key, dropout, philox, generator, csc, validate, perm_inv)
    return _ops.transformer_attention(rowptr, col, query, key, value, e_feat, float(scale),
                                      float(dropout), philox, colptr, row, perm, bias, perm_inv)


def _check_transformer(rowptr, col, query, key, value, e_feat, dropout_p, philox, bias=None):
    _check_compressed(rowptr, "rowptr", col, "col")
    for t, name in ((query, "query"), (key, "key"), (value, "value")):
        _check_value(t, name, 3)
    _check_same(query, "query", key, "key")
    _check_same(value, "value", key, "key")
    _check_same(rowptr, "rowptr", key, "key", dtype=False)
    num_dst, (num_src, heads, channels) = rowptr.size(0) - 1, key.shape
    torch._check(value.shape == key.shape,
                 lambda: f"value must have the shape of key [{num_src}, {heads}, {channels}]")
    torch._check(query.size(0) == num_dst and query.size(1) == heads
                 and query.size(2) == channels,
                 lambda: f"query must have shape [{num_dst}, {heads}, {channels}] "
                 "(rowptr.numel() - 1, heads, channels of key)")
    _check_edge_dropout_bias(col, e_feat, key, "key", dropout_p, philox, bias)


@torch.library.register_fake("pyg_multihead_agg::transformer_attention")
def _(rowptr, col, query, key, value, e_feat, scale, dropout_p, philox, colptr=None, row=None,
      perm=None, bias=None, perm_inv=None):
    _check_transformer(rowptr, col, query, key, value, e_feat, dropout_p, philox, bias)
    return _attention_outputs(rowptr, key)


@torch.library.register_fake("pyg_multihead_agg::transformer_attention_backward")
def _(rowptr, col, colptr, row, perm, query, key, value, e_feat, out, lse, grad_out, grad_lse,
      scale, dropout_p, philox, bias=None, perm_inv=None):
    _check_transformer(rowptr, col, query, key, value, e_feat, dropout_p, philox, bias)
    _check_backward_graph(col, colptr, row, perm, perm_inv, out, grad_out)
    num_edges = col.size(0) if e_feat is not None else 0
    return (torch.empty_like(query), torch.empty_like(key), torch.empty_like(value),
            key.new_empty(num_edges, key.size(1), key.size(2)))


@torch.library.register_fake("pyg_multihead_agg::_transformer_attention_backward_into")
def _(rowptr, col, colptr, row, perm, query, key, value, e_feat, out, lse, grad_out, grad_lse,
      scale, dropout_p, philox, bias, perm_inv, grad_query, grad_key, grad_value):
    # The backward of transformer_attention written into the three buffers
    # (csrc/autograd.cpp's gradient donation); returns grad_e_feat.
    _check_transformer(rowptr, col, query, key, value, e_feat, dropout_p, philox, bias)
    _check_backward_graph(col, colptr, row, perm, perm_inv, out, grad_out)
    for buf, name, ref in ((grad_query, "grad_query", query), (grad_key, "grad_key", key),
                           (grad_value, "grad_value", value)):
        torch._check(buf.shape == ref.shape and buf.dtype == ref.dtype,
                     lambda name=name, ref=ref:
                     f"{name} must have the shape and dtype of {ref.shape} {ref.dtype}")
    num_edges = col.size(0) if e_feat is not None else 0
    return key.new_empty(num_edges, key.size(1), key.size(2))


_register_no_double_backward("transformer_attention")


# ---------------------------------------------------------------------------
# GATConv's per-node scores (_gat_scores; csrc/ops.cpp, nn/gat_conv.py)
# ---------------------------------------------------------------------------

@torch.library.register_fake("pyg_multihead_agg::_gat_scores")
def _(x, att_src, att_dst=None):
    if x.dim() != 3:
        raise ValueError(f"_gat_scores: x must be [N, H, C], got {x.dim()} dimensions")
    dtype = torch.promote_types(x.dtype, att_src.dtype)
    s_src = x.new_empty((x.size(0), x.size(1)), dtype=dtype)
    return s_src, x.new_empty((0 if att_dst is None else x.size(0), x.size(1)), dtype=dtype)


@torch.library.register_fake("pyg_multihead_agg::_gat_scores_backward")
def _(grad_src, grad_dst, x, att_src, att_dst, x_grad, att_grad):
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    N, H, C = x.shape
    grad_x = x.new_empty((N if x_grad else 0, H, C))
    grad_att_src = x.new_empty((H if att_grad else 0, C), dtype=acc)
    grad_att_dst = x.new_empty((H if att_grad and att_dst is not None else 0, C), dtype=acc)
    return grad_x, grad_att_src, grad_att_dst


torch.library.register_autograd("pyg_multihead_agg::_gat_scores_backward", _no_double_backward,
                                setup_context=_no_double_backward_context)


# ---------------------------------------------------------------------------
# GATConv's whole call (_gat_conv and its halves; csrc/autograd.cpp,
# nn/gat_conv.py): fake implementations, for torch.compile
# ---------------------------------------------------------------------------

def _gat_conv_shapes(x, att_src, rowptr):
    # (N, H, C, rows), rows being N or N + 1 (a spare row).
    num_nodes, rows = x.size(0), rowptr.size(0) - 1
    torch._check(rows == num_nodes or rows == num_nodes + 1,
                 lambda: f"rowptr must describe {num_nodes} rows (the nodes of x), or one spare "
                 f"row more, got {rows}")
    return num_nodes, att_src.size(-2), att_src.size(-1), rows


@torch.library.register_fake("pyg_multihead_agg::_gat_conv")
def _(x, weight, att_src, att_dst, bias, rowptr, col, colptr, row, perm, perm_inv, concat,
      negative_slope, dropout_p, philox):
    num_nodes, heads, channels, _ = _gat_conv_shapes(x, att_src, rowptr)
    return x.new_empty(num_nodes, heads * channels if concat else channels)


@torch.library.register_fake("pyg_multihead_agg::_gat_conv_forward")
def _(x, weight, att_src, att_dst, bias, rowptr, col, colptr, row, perm, perm_inv, concat,
      negative_slope, dropout_p, philox):
    num_nodes, heads, channels, rows = _gat_conv_shapes(x, att_src, rowptr)
    h = x.new_empty(num_nodes, heads, channels)
    score = torch.promote_types(h.dtype, att_src.dtype)
    out, lse = _attention_outputs(rowptr, h)
    return (out, h, h.new_empty(num_nodes, heads, dtype=score),
            h.new_empty(rows, heads, dtype=score), lse)


def _gat_conv_grads(x, weight, att_src, att_dst, bias, output_mask):
    def grad_of(t, asked):
        return t.new_empty(t.shape if asked else (0,))

    return (grad_of(x, output_mask[0]), grad_of(weight, output_mask[1]),
            grad_of(att_src, output_mask[2]), grad_of(att_dst, output_mask[3]),
            grad_of(x, False) if bias is None else grad_of(bias, output_mask[4]))


@torch.library.register_fake("pyg_multihead_agg::_gat_conv_backward")
def _(grad, x, weight, att_src, att_dst, bias, h, s_src, s_dst, out, lse, rowptr, col, colptr,
      row, perm, perm_inv, concat, negative_slope, dropout_p, philox, output_mask):
    return _gat_conv_grads(x, weight, att_src, att_dst, bias, output_mask)


# The halves are called below autograd by _gat_conv's C++ autograd: neither
# is differentiable on its own.
for _name in ("_gat_conv_forward", "_gat_conv_backward"):
    torch.library.register_autograd(f"pyg_multihead_agg::{_name}", _no_double_backward,
                                    setup_context=_no_double_backward_context)


# ---------------------------------------------------------------------------
# GATConv's whole call on an edge list, under torch.compile
# ---------------------------------------------------------------------------
# A compiled GATConv given an edge list (a plain edge_index, an EdgeIndex, a
# SparseTensor with filled caches) calls these two instead of
# _graph_of_edges and _gat_conv's halves: each looks up the graph that
# _graph_of_edges keeps for the edge list (graph.kept_graph) inside its own
# call and hands it to the half it wraps, so that the graph is neither
# copied nor saved for the backward in every step (_graph_of_edges returns
# copies, which the compiled graph owns; on reddit-like the copy took 0.4 ms
# of a 12.1 ms step). The graph of an edge list the cache no longer holds
# at the backward is converted again.
_LIB = torch.library.Library("pyg_multihead_agg", "FRAGMENT")
_LIB.define(
    "_gat_conv_edges_forward(Tensor x, Tensor weight, Tensor att_src, Tensor att_dst, "
    "Tensor? bias, Tensor src, Tensor? dst, SymInt loops, bool need_csc, bool concat, "
    "float negative_slope, float dropout_p, Tensor? philox) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor)", tags=_graphs._EDGES_TAGS)
_LIB.define(
    "_gat_conv_edges_backward(Tensor grad, Tensor x, Tensor weight, Tensor att_src, "
    "Tensor att_dst, Tensor? bias, Tensor h, Tensor s_src, Tensor s_dst, Tensor out, "
    "Tensor lse, Tensor src, Tensor? dst, SymInt loops, bool concat, float negative_slope, "
    "float dropout_p, Tensor? philox, bool[5] output_mask) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor)", tags=_graphs._EDGES_TAGS)


def _gat_conv_edges_forward(x, weight, att_src, att_dst, bias, src, dst, loops, need_csc, concat,
                            negative_slope, dropout_p, philox):
    g = _graphs.kept_graph(src, dst, x.size(0), x.size(0), loops, need_csc)
    colptr, row, perm = g.csc if g.csc is not None else (None, None, None)
    return _ops._gat_conv_forward.default(x, weight, att_src, att_dst, bias, g.rowptr, g.col,
                                          colptr, row, perm, g.perm_inv, concat, negative_slope,
                                          dropout_p, philox)


def _gat_conv_edges_backward(grad, x, weight, att_src, att_dst, bias, h, s_src, s_dst, out, lse,
                             src, dst, loops, concat, negative_slope, dropout_p, philox,
                             output_mask):
    # (the bias's gradient alone is a sum: the graph the forward kept, no CSC)
    g = _graphs.kept_graph(src, dst, x.size(0), x.size(0), loops, any(output_mask[:4]))
    colptr, row, perm = g.csc if g.csc is not None else (None, None, None)
    return _ops._gat_conv_backward.default(grad, x, weight, att_src, att_dst, bias, h, s_src,
                                           s_dst, out, lse, g.rowptr, g.col, colptr, row, perm,
                                           g.perm_inv, concat, negative_slope, dropout_p, philox,
                                           output_mask)


_LIB.impl("_gat_conv_edges_forward", _gat_conv_edges_forward, "CompositeExplicitAutograd")
_LIB.impl("_gat_conv_edges_backward", _gat_conv_edges_backward, "CompositeExplicitAutograd")


@torch.library.register_fake("pyg_multihead_agg::_gat_conv_edges_forward")
def _(x, weight, att_src, att_dst, bias, src, dst, loops, need_csc, concat, negative_slope,
      dropout_p, philox):
    num_nodes, heads, channels = x.size(0), att_src.size(-2), att_src.size(-1)
    rows = num_nodes if loops < 0 else num_nodes + 1  # (a spare row: graph._graph_layout)
    h = x.new_empty(num_nodes, heads, channels)
    score = torch.promote_types(h.dtype, att_src.dtype)
    out, lse = h.new_empty(rows, heads, channels), h.new_empty(rows, heads, dtype=_lse_dtype(h))
    return (out, h, h.new_empty(num_nodes, heads, dtype=score),
            h.new_empty(rows, heads, dtype=score), lse)


@torch.library.register_fake("pyg_multihead_agg::_gat_conv_edges_backward")
def _(grad, x, weight, att_src, att_dst, bias, h, s_src, s_dst, out, lse, src, dst, loops, concat,
      negative_slope, dropout_p, philox, output_mask):
    return _gat_conv_grads(x, weight, att_src, att_dst, bias, output_mask)


for _name in ("_gat_conv_edges_forward", "_gat_conv_edges_backward"):
    torch.library.register_autograd(f"pyg_multihead_agg::{_name}", _no_double_backward,
                                    setup_context=_no_double_backward_context)


def _merge_heads(out: Tensor, num_nodes: int, concat: bool) -> Tensor:
    # The layer's result from the attention's output [rows, H, C] (as
    # merge_heads in csrc/autograd.cpp): the nodes' rows, heads concatenated
    # or averaged.
    nodes = out[:num_nodes]
    return nodes.reshape(num_nodes, -1) if concat else nodes.mean(1)


class _GatConvEdges(torch.autograd.Function):
    # _gat_conv's autograd (csrc/autograd.cpp) on _gat_conv_edges_forward
    # and _gat_conv_edges_backward: traced once by torch.compile, so its
    # Python costs nothing per step.
    @staticmethod
    def forward(ctx, x, weight, att_src, att_dst, bias, src, dst, loops, need_csc, concat,
                negative_slope, dropout_p, philox):
        out, h, s_src, s_dst, lse = _ops._gat_conv_edges_forward(
            x, weight, att_src, att_dst, bias, src, dst, loops, need_csc, concat, negative_slope,
            dropout_p, philox)
        result = _merge_heads(out, x.size(0), concat)
        # (with concat the result, out's memory, as _gat_conv keeps it)
        ctx.save_for_backward(x, weight, att_src, att_dst, bias, h, s_src, s_dst,
                              result if concat else out, lse, src, dst, philox)
        ctx.args = (loops, concat, negative_slope, dropout_p)
        return result

    @staticmethod
    def backward(ctx, grad):
        x, weight, att_src, att_dst, bias, h, s_src, s_dst, out, lse, src, dst, philox = \
            ctx.saved_tensors
        loops, concat, negative_slope, dropout_p = ctx.args
        need = ctx.needs_input_grad
        mask = [need[0], need[1], need[2], need[3], bias is not None and need[4]]
        grads = _ops._gat_conv_edges_backward(grad, x, weight, att_src, att_dst, bias, h, s_src,
                                              s_dst, out, lse, src, dst, loops, concat,
                                              negative_slope, dropout_p, philox, mask)
        return tuple(grads[i] if mask[i] else None for i in range(5)) + (None,) * 8


def _gat_conv_on_edges(x: Tensor, weight: Tensor, att_src: Tensor, att_dst: Tensor,
                       bias: Optional[Tensor], src: Tensor, dst: Optional[Tensor], loops: int,
                       need_csc: bool, concat: bool, negative_slope: float, dropout_p: float,
                       philox: Optional[Tensor]) -> Tensor:
    """GATConv's whole call on an edge list under torch.compile (above);
    need_csc: a backward follows that needs more than the bias's gradient."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (x, weight, att_src, att_dst, bias)):
        return _GatConvEdges.apply(x, weight, att_src, att_dst, bias, src, dst, loops, need_csc,
                                   concat, negative_slope, dropout_p, philox)
    out = _ops._gat_conv_edges_forward(x, weight, att_src, att_dst, bias, src, dst, loops, False,
                                       concat, negative_slope, dropout_p, philox)[0]
    return _merge_heads(out, x.size(0), concat)
