"""CSR / CSC helpers: validation and the transposed graph for the backward."""
from typing import Tuple

import torch
from torch import Tensor
from torch_geometric.index import index2ptr, ptr2index

CSC = Tuple[Tensor, Tensor, Tensor]


def check_csr(rowptr: Tensor, col: Tensor, num_src: int, *, ptr_name: str = "rowptr",
              idx_name: str = "col") -> None:
    r"""Raises :class:`ValueError` unless :obj:`(rowptr, col)` is a valid CSR
    over :obj:`num_src` columns: :obj:`rowptr` starts at 0, never decreases
    and ends at :obj:`col.numel()`, and every :obj:`col` entry lies in
    :obj:`[0, num_src)`. Costs a few reductions and one host sync; call it
    once per graph (or pass :obj:`validate=True` to
    :func:`~pyg_multihead_agg.multihead_spmm`).
    """
    for name, t in ((ptr_name, rowptr), (idx_name, col)):
        if not isinstance(t, Tensor) or t.dim() != 1 or t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be a 1-D int32 or int64 tensor, got "
                             f"{getattr(t, 'dtype', type(t))} with shape "
                             f"{tuple(getattr(t, 'shape', ()))}")
    if rowptr.dtype != col.dtype:
        raise ValueError(f"{ptr_name} and {idx_name} must have the same dtype, got "
                         f"{rowptr.dtype} and {col.dtype}")
    if rowptr.numel() < 1:
        raise ValueError(f"{ptr_name} must have at least one element (num_rows + 1)")
    first, last = int(rowptr[0]), int(rowptr[-1])
    if first != 0:
        raise ValueError(f"{ptr_name}[0] must be 0, got {first}")
    if last != col.numel():
        raise ValueError(f"{ptr_name}[-1] must equal {idx_name}.numel() ({col.numel()}), "
                         f"got {last}")
    if rowptr.numel() > 1 and bool((rowptr.diff() < 0).any()):
        bad = int((rowptr.diff() < 0).nonzero()[0])
        raise ValueError(f"{ptr_name} must be non-decreasing, but {ptr_name}[{bad}] = "
                         f"{int(rowptr[bad])} > {ptr_name}[{bad + 1}] = {int(rowptr[bad + 1])}")
    if col.numel() > 0:
        lo, hi = int(col.min()), int(col.max())
        if lo < 0 or hi >= num_src:
            raise ValueError(f"{idx_name} entries must lie in [0, {num_src}), got values in "
                             f"[{lo}, {hi}]")


def csr_to_csc(rowptr: Tensor, col: Tensor, num_src: int) -> CSC:
    r"""The CSC :obj:`(colptr, row, perm)` of a CSR graph, in the index dtype
    of :obj:`col`: :obj:`colptr` points into :obj:`row` per source node,
    :obj:`row[k]` is the destination of CSC entry :obj:`k` and
    :obj:`perm[k]` its position in the CSR. A stable sort, so the result is
    deterministic. Traceable by :func:`torch.compile` (sizes come from
    shapes, not values).
    """
    perm = torch.argsort(col, stable=True)
    row = ptr2index(rowptr, output_size=col.numel())[perm]
    colptr = index2ptr(col[perm], num_src).to(col.dtype)
    return colptr, row, perm.to(col.dtype)

