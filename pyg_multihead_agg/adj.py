"""CSR / CSC helpers: validation and the transposed graph for the backward."""
import weakref
from typing import Optional, Tuple

import torch
from torch import Tensor
from torch_geometric import is_compiling
from torch_geometric.index import index2ptr, ptr2index
from torch_geometric.typing import SparseTensor

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


def check_csc(csc: CSC, rowptr: Tensor, col: Tensor, num_src: int) -> None:
    r"""Raises :class:`ValueError` unless :obj:`csc = (colptr, row, perm)` is
    the CSC of the CSR graph :obj:`(rowptr, col)` over :obj:`num_src`
    sources: :obj:`colptr` has :obj:`num_src + 1` entries, :obj:`perm` is a
    permutation of the edges, and CSC entry :obj:`k` is edge :obj:`perm[k]`,
    from :obj:`row[k]` to the source whose range of :obj:`colptr` holds
    :obj:`k`. (The order within a source is free.) A few passes over the
    edges and one host sync; meant for :obj:`validate=True`.
    """
    colptr, row, perm = csc
    if not isinstance(colptr, Tensor) or colptr.dim() != 1 or colptr.numel() != num_src + 1:
        raise ValueError(f"colptr must have num_src + 1 = {num_src + 1} entries (one more than "
                         f"x.size(0)), got shape {tuple(getattr(colptr, 'shape', ()))}")
    check_csr(colptr, row, rowptr.numel() - 1, ptr_name="colptr", idx_name="row")
    num_edges = col.numel()
    check_csr(colptr, perm, num_edges, ptr_name="colptr", idx_name="perm")
    if num_edges == 0:
        return
    perm64 = perm.long()
    if not bool((torch.bincount(perm64, minlength=num_edges) == 1).all()):
        raise ValueError("perm must be a permutation of the edges (each of 0 .. E-1 once)")
    source = ptr2index(colptr.long(), output_size=num_edges)
    if not bool((col.long()[perm64] == source).all()):
        raise ValueError("perm does not match the CSR: col[perm[k]] must be the source whose "
                         "colptr range holds k")
    row_of_edge = ptr2index(rowptr.long(), output_size=num_edges)
    if not bool((row.long() == row_of_edge[perm64]).all()):
        raise ValueError("row does not match the CSR: row[k] must be the destination of "
                         "edge perm[k]")


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


def invert_perm(perm: Tensor) -> Tensor:
    r"""The inverse of a CSC's :obj:`perm` (:func:`csr_to_csc`): for each edge
    :obj:`e` in CSR order, the CSC entry :obj:`k` with :obj:`perm[k] = e`, in
    the dtype and on the device of :obj:`perm`. Passed as :obj:`perm_inv` to
    :func:`~pyg_multihead_agg.gat_attention` or
    :func:`~pyg_multihead_agg.multihead_spmm` (the layer does, once per
    cached graph), it lets the CUDA backward keep its per-edge gradients in
    CSC order. One scatter over the edges.
    """
    inv = torch.empty_like(perm)
    return inv.scatter_(0, perm.long(), torch.arange(perm.numel(), device=perm.device,
                                                      dtype=perm.dtype))


def check_perm_inv(perm_inv: Tensor, perm: Tensor) -> None:
    r"""Raises :class:`ValueError` unless :obj:`perm_inv` is the inverse of
    :obj:`perm` (:obj:`perm[perm_inv[e]] = e` for every edge; :obj:`perm`
    checked a permutation first, as by :func:`check_csc`). One host sync;
    meant for :obj:`validate=True`.
    """
    if (not isinstance(perm_inv, Tensor) or perm_inv.dim() != 1
            or perm_inv.numel() != perm.numel() or perm_inv.dtype != perm.dtype):
        raise ValueError(f"perm_inv must be a 1-D {perm.dtype} tensor of {perm.numel()} entries "
                         "(one per edge, the dtype of perm), got "
                         f"{getattr(perm_inv, 'dtype', type(perm_inv))} of shape "
                         f"{tuple(getattr(perm_inv, 'shape', ()))}")
    if perm.numel() == 0:
        return
    inv = perm_inv.long()
    if bool(((inv < 0) | (inv >= perm.numel())).any()):
        raise ValueError(f"perm_inv must hold CSC entries in [0, {perm.numel()})")
    if not bool((perm.long()[inv] == torch.arange(perm.numel(), device=perm.device)).all()):
        raise ValueError("perm_inv must be the inverse of perm: perm[perm_inv[e]] == e")


def _index_versions(adj) -> Tuple[int, ...]:
    # In-place changes to an adjacency's indices bump these counters.
    if isinstance(adj, SparseTensor):
        storage = adj.storage
        tensors = (storage._rowptr, storage._row, storage._col)
    elif isinstance(adj, Tensor) and adj.layout == torch.sparse_csr:
        tensors = (adj.crow_indices(), adj.col_indices())
    elif isinstance(adj, Tensor) and adj.is_sparse:
        tensors = (adj._indices(),)
    else:
        tensors = (getattr(adj, "_data", adj),)
    return tuple(t._version for t in tensors if t is not None)


class GraphCache:
    r"""Holds one value derived from one adjacency object (its graph with
    self-loops, its CSC), so that a graph used step after step is processed
    once. Keyed by the object's identity (held weakly), the version counters
    of its index tensors (in-place edits invalidate it) and an extra key.
    Dropped on copy and pickle: a cache, not state.
    """

    def __init__(self) -> None:
        self._ref = None
        self._key = None
        self._value = None

    def get(self, adj, extra):
        if self._ref is not None and self._ref() is adj and self._key == (
                _index_versions(adj), extra):
            return self._value
        return None

    def put(self, adj, extra, value) -> None:
        self._ref = weakref.ref(adj)
        self._key = (_index_versions(adj), extra)
        self._value = value

    def __deepcopy__(self, memo) -> "GraphCache":
        return GraphCache()

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()


# CSR + CSC extraction from the adjacency types PyG passes to ``propagate``.
# Each returns (rowptr, col, (colptr, row, perm)) with rows = destinations,
# as multihead_spmm expects, reusing whatever the container caches.

def _same_index_dtype(rowptr: Tensor, col: Tensor,
                      csc: Optional[CSC]) -> Tuple[Tensor, Tensor, Optional[CSC]]:
    dtype = col.dtype
    if csc is None:
        return rowptr.to(dtype), col, None
    colptr, row, perm = csc
    return (rowptr.to(dtype), col, (colptr.to(dtype), row.to(dtype), perm.to(dtype)))


_INT32_MAX = 2**31 - 1


def compact_indices(rowptr: Tensor, col: Tensor, csc, num_src: int):
    r"""The CSR :obj:`(rowptr, col)` and CSC :obj:`csc` (or :obj:`None`) in
    int32 when they are int64 on a CUDA device and every value fits: at most
    :math:`2^{31} - 1` edges, source and destination nodes. The CUDA kernels'
    int32 path loads the next step's indices ahead and moves half the index
    bytes (H200, reddit-like, float32: the fused backward takes 8.2 ms with
    int32 indices against 10.9 ms with int64). Anything else is returned
    unchanged. The layer caches the result per adjacency.
    """
    if (col.dtype != torch.int64 or col.device.type != "cuda" or col.numel() > _INT32_MAX
            or rowptr.numel() - 1 > _INT32_MAX or num_src > _INT32_MAX):
        return rowptr, col, csc
    if csc is not None:
        csc = tuple(t.to(torch.int32) for t in csc)
    return rowptr.to(torch.int32), col.to(torch.int32), csc


def _fit_ptr(ptr: Tensor, num_rows: int, name: str) -> Tensor:
    # EdgeIndex infers a missing sparse size from the largest index, which
    # drops trailing isolated nodes: pad with empty rows.
    missing = num_rows + 1 - ptr.numel()
    if missing < 0:
        raise ValueError(f"{name} describes {ptr.numel() - 1} nodes but the features hold "
                         f"only {num_rows}")
    if missing == 0:
        return ptr
    return torch.cat([ptr, ptr[-1:].expand(missing)])


def csr_csc_from_sparse_tensor(adj_t) -> Tuple[Tensor, Tensor, CSC]:
    r"""CSR and CSC of a :class:`torch_sparse.SparseTensor` :obj:`adj_t`
    (rows are destinations). :obj:`rowptr`, :obj:`colptr` and the
    CSR-to-CSC permutation :obj:`csr2csc` are cached on the storage by
    torch_sparse, so repeated calls on the same :obj:`adj_t` build them once;
    only :obj:`row` in CSC order is gathered per call.
    """
    storage = adj_t.storage
    perm = storage.csr2csc()
    csc = (storage.colptr(), storage.row()[perm], perm)
    return _same_index_dtype(storage.rowptr(), storage.col(), csc)


def csr_csc_from_torch_csr(adj_t: Tensor) -> Tuple[Tensor, Tensor, CSC]:
    r"""CSR and CSC of a :obj:`torch.sparse_csr` :obj:`adj_t` of shape
    :obj:`[num_dst, num_src]`. The CSC is built (one stable sort) on every
    call: a sparse tensor has no cache to keep it in.
    """
    if adj_t.layout != torch.sparse_csr:
        raise ValueError(f"adj_t must have layout torch.sparse_csr, got {adj_t.layout}")
    rowptr, col = adj_t.crow_indices(), adj_t.col_indices()
    return rowptr, col, csr_to_csc(rowptr, col, adj_t.size(1))


def csr_csc_from_edge_index(edge_index, num_src: int, num_dst: int,
                            need_csc: bool = True) -> Tuple[Tensor, Tensor, Optional[CSC]]:
    r"""CSR (over destinations) and CSC (over sources) of a PyG
    :class:`~torch_geometric.EdgeIndex` sorted by column, taken from its
    caches: :meth:`get_csc` gives :obj:`(rowptr, col)` and :meth:`get_csr`
    the transpose. Call :meth:`EdgeIndex.fill_cache_` once (or let the first
    eager call fill it) so that later calls reuse them.

    Under :func:`torch.compile`, :meth:`EdgeIndex.get_csr` cannot run (its
    :obj:`_T_index` cache is not part of the traced subclass state, and
    cache writes on graph inputs fail), so the flattened caches
    :obj:`_indptr`, :obj:`_T_indptr` and :obj:`_T_perm` are read directly and
    anything missing is computed without being cached. With
    :obj:`need_csc=False` the CSC is :obj:`None` (a forward without
    gradients: in a compiled graph, nothing of it is computed).
    """
    if not edge_index.is_sorted_by_col:
        raise ValueError("edge_index must be an EdgeIndex sorted by column (destination); "
                         "use edge_index.sort_by('col')")
    if is_compiling():
        src, dst = edge_index.as_tensor()[0], edge_index.as_tensor()[1]
        rowptr, col = edge_index._indptr, src
        if rowptr is None:
            rowptr = index2ptr(dst, num_dst).to(dst.dtype)
    else:
        (rowptr, col), _ = edge_index.get_csc()
    rowptr = _fit_ptr(rowptr, num_dst, "edge_index (destinations)")
    if not need_csc:
        return _same_index_dtype(rowptr, col, None)
    if is_compiling():
        perm = edge_index._T_perm
        colptr = edge_index._T_indptr
        if perm is None or colptr is None:
            colptr, row, perm = csr_to_csc(rowptr, col, num_src)
        else:
            row = dst[perm]
    else:
        (colptr, row), perm = edge_index.get_csr()
    colptr = _fit_ptr(colptr, num_src, "edge_index (sources)")
    return _same_index_dtype(rowptr, col, (colptr, row, perm))
