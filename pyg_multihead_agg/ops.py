"""Python side of the operators: the wrapper, fake implementations and autograd.

The schemas live in csrc/ops.cpp, the kernels in csrc/cpu and csrc/cuda.
"""
from typing import Optional

import torch
from torch import Tensor

from .adj import CSC, check_csc, check_csr, csr_to_csc

_ops = torch.ops.pyg_multihead_agg
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INDICES = (torch.int32, torch.int64)


def multihead_spmm(rowptr: Tensor, col: Tensor, weight: Tensor, x: Tensor,
                   csc: Optional[CSC] = None, validate: bool = False) -> Tensor:
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

    Returns:
        :obj:`[N_dst, H, D]`; rows without edges are zero. Half types
        accumulate in float32.
    """
    if validate:
        check_csr(rowptr, col, x.size(0))
        if csc is not None:
            check_csc(csc, rowptr, col, x.size(0))
    colptr, row, perm = (None, None, None) if csc is None else csc
    return _ops.multihead_spmm(rowptr, col, weight, x, colptr, row, perm)


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
def _(rowptr, col, weight, x, colptr=None, row=None, perm=None):
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


@torch.library.register_fake("pyg_multihead_agg::multihead_spmm_backward_csc")
def _(colptr, row, perm, weight, x, grad_out):
    _check_compressed(colptr, "colptr", row, "row")
    _check_index(perm, "perm")
    _check_value(grad_out, "grad_out", 3)
    num_src, num_edges = colptr.size(0) - 1, row.size(0)
    heads, channels = grad_out.size(1), grad_out.size(2)
    torch._check(perm.size(0) == num_edges, lambda: "perm must have one entry per edge")
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


# Autograd. The backward calls custom ops only, so it traces too.

def _setup_context(ctx, inputs, output):
    rowptr, col, weight, x, colptr, row, perm = inputs
    need_weight, need_x = ctx.needs_input_grad[2], ctx.needs_input_grad[3]
    ctx.num_src = x.size(0)
    # grad_x needs weight, grad_weight needs x: save only those.
    ctx.save_for_backward(rowptr, col, weight if need_x else None, x if need_weight else None,
                          colptr, row, perm)


def _backward(ctx, grad_out):
    rowptr, col, weight, x, colptr, row, perm = ctx.saved_tensors
    grad_weight = grad_x = None
    if colptr is None and grad_out.is_cuda and not torch.are_deterministic_algorithms_enabled():
        if weight is not None:
            grad_x = _ops.multihead_spmm_backward_x_scatter(rowptr, col, weight, grad_out,
                                                            ctx.num_src)
        if x is not None:
            grad_weight = _ops.multihead_sddmm(rowptr, col, grad_out, x)
        return None, None, grad_weight, grad_x, None, None, None
    if colptr is None:
        colptr, row, perm = csr_to_csc(rowptr, col, ctx.num_src)
    gx, gw = _ops.multihead_spmm_backward_csc(colptr, row, perm, weight, x, grad_out)
    if weight is not None:
        grad_x = gx
    if x is not None:
        grad_weight = gw
    return None, None, grad_weight, grad_x, None, None, None


torch.library.register_autograd("pyg_multihead_agg::multihead_spmm", _backward,
                                setup_context=_setup_context)


# The backward ops are not differentiable themselves: say so instead of
# letting autograd silently return zero second derivatives.

def _no_double_backward_context(ctx, inputs, output):
    pass


def _no_double_backward(ctx, *grads):
    raise RuntimeError("pyg_multihead_agg: double backward (gradients of gradients, "
                       "create_graph=True) of multihead_spmm is not supported")


for _name in ("multihead_spmm_backward_csc", "multihead_spmm_backward_x_scatter",
              "multihead_sddmm"):
    torch.library.register_autograd(f"pyg_multihead_agg::{_name}", _no_double_backward,
                                    setup_context=_no_double_backward_context)
