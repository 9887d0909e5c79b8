r"""The one graph-preparation step of the layers.

Every adjacency PyG accepts (a plain :obj:`edge_index` in any order, an
:class:`~torch_geometric.EdgeIndex` of any sort order, a
:class:`torch_sparse.SparseTensor`, a :obj:`torch.sparse` CSR or COO tensor)
becomes one :class:`Graph`: the CSR over destinations that the kernels walk,
the CSC for an atomic-free backward, the inverse of its permutation, and the
permutation from the caller's edge order to CSR order (for edge features in,
attention weights out). Self-loops are added as PyG adds them.

:func:`prepare` is called once per forward by each layer. Eagerly it caches
its result per adjacency object (shared by every layer that sees the same
object, dropped with the object, rebuilt when its indices are edited in
place), so a graph used step after step is converted once and a new graph
(a mini-batch) is converted once per step, for all layers together. Under
:func:`torch.compile` the conversion has shapes that do not depend on index
values (no host sync, no recompilation when the graph size changes): a plain
:obj:`edge_index`, an :class:`~torch_geometric.EdgeIndex` and a
:class:`torch_sparse.SparseTensor` with filled caches go through one
operator that converts each edge list once (:func:`_graph_of_edges`), the
other adjacencies' conversions are traced into the graph, and
:func:`prepare_adjacency` computes any of them once outside the compiled
region instead.
"""
import collections
import copy
import weakref
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.multiprocessing.reductions import StorageWeakRef
from torch_geometric import EdgeIndex, is_compiling
from torch_geometric.index import ptr2index
from torch_geometric.typing import SparseTensor
from torch_geometric.utils import coalesce, scatter

CSC = Tuple[Tensor, Tensor, Tensor]
_INT32_MAX = 2**31 - 1


# ---------------------------------------------------------------------------
# Validation of user-supplied CSR / CSC (the ops' ``validate=True``)
# ---------------------------------------------------------------------------

def check_csr(rowptr: Tensor, col: Tensor, num_src: int, *, ptr_name: str = "rowptr",
              idx_name: str = "col") -> None:
    r"""Raises :class:`ValueError` unless :obj:`(rowptr, col)` is a valid CSR
    over :obj:`num_src` columns: :obj:`rowptr` starts at 0, never decreases
    and ends at :obj:`col.numel()`, and every :obj:`col` entry lies in
    :obj:`[0, num_src)`. Costs a few reductions and one host sync.

    Example:
        >>> import torch, pyg_multihead_agg as pma
        >>> pma.check_csr(torch.tensor([0, 1, 2]), torch.tensor([1, 0]), num_src=2)
        >>> pma.check_csr(torch.tensor([0, 1, 2]), torch.tensor([1, 5]), num_src=2)
        Traceback (most recent call last):
        ...
        ValueError: col entries must lie in [0, 2), got values in [1, 5]
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
    :obj:`k` (the order within a source is free). A few passes over the edges
    and one host sync.

    Example:
        >>> import torch, pyg_multihead_agg as pma
        >>> rowptr, col = torch.tensor([0, 1, 3]), torch.tensor([1, 0, 1])
        >>> pma.check_csc(pma.csr_to_csc(rowptr, col, 2), rowptr, col, num_src=2)
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


def check_perm_inv(perm_inv: Tensor, perm: Tensor) -> None:
    r"""Raises :class:`ValueError` unless :obj:`perm_inv` is the inverse of
    :obj:`perm` (:obj:`perm[perm_inv[e]] = e` for every edge). One host sync.
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


# ---------------------------------------------------------------------------
# Building blocks (traceable: sizes come from shapes, never from values)
# ---------------------------------------------------------------------------

def _ptr(sorted_index: Tensor, size: int) -> Tensor:
    # Compressed pointers of a sorted index: searchsorted rather than
    # index2ptr (torch's _convert_indices_from_coo_to_csr), which assumes
    # every value lies below `size`; a traced conversion checks nothing, and
    # a malformed graph must give a wrong CSR, never a write out of bounds.
    bounds = torch.arange(size + 1, dtype=sorted_index.dtype, device=sorted_index.device)
    return torch.searchsorted(sorted_index, bounds, out_int32=sorted_index.dtype == torch.int32)


def csr_to_csc(rowptr: Tensor, col: Tensor, num_src: int) -> CSC:
    r"""The CSC :obj:`(colptr, row, perm)` of a CSR graph, in the index dtype
    of :obj:`col`: :obj:`colptr` points into :obj:`row` per source node,
    :obj:`row[k]` is the destination of CSC entry :obj:`k` and
    :obj:`perm[k]` its position in the CSR. A stable sort, so the result is
    deterministic; traceable by :func:`torch.compile`.

    Example:
        >>> import torch, pyg_multihead_agg as pma
        >>> colptr, row, perm = pma.csr_to_csc(torch.tensor([0, 1, 3]),
        ...                                    torch.tensor([1, 0, 1]), num_src=2)
        >>> colptr.tolist(), row.tolist(), perm.tolist()
        ([0, 1, 3], [1, 0, 1], [1, 0, 2])
    """
    row = ptr2index(rowptr, output_size=col.numel()).to(col.dtype)
    col_sorted, perm = torch.sort(col, stable=True)
    return _ptr(col_sorted, num_src).to(col.dtype), row[perm], perm.to(col.dtype)


def invert_perm(perm: Tensor) -> Tensor:
    r"""The inverse of a CSC's :obj:`perm` (:func:`csr_to_csc`): for each edge
    :obj:`e` in CSR order, the CSC entry :obj:`k` with :obj:`perm[k] = e`, in
    the dtype and on the device of :obj:`perm`. Passed as :obj:`perm_inv` to
    :func:`~pyg_multihead_agg.gat_attention` or
    :func:`~pyg_multihead_agg.multihead_spmm`, it lets the CUDA backward keep
    its per-edge gradients in CSC order. One scatter over the edges.

    Example:
        >>> import torch, pyg_multihead_agg as pma
        >>> pma.invert_perm(torch.tensor([1, 0, 2])).tolist()
        [1, 0, 2]
    """
    return _inverse(perm)


def _inverse(perm: Tensor) -> Tensor:
    inv = torch.empty_like(perm)
    return inv.scatter_(0, perm.long(), torch.arange(perm.numel(), device=perm.device,
                                                      dtype=perm.dtype))


def _index_dtype(device: torch.device, *sizes: int) -> torch.dtype:
    # int32 on CUDA where every value fits: the kernels' int32 path loads the
    # next step's indices ahead and moves half the index bytes (docs/performance.md).
    fits = all(size <= _INT32_MAX for size in sizes)
    return torch.int32 if device.type == "cuda" and fits else torch.int64


# ---------------------------------------------------------------------------
# The prepared graph
# ---------------------------------------------------------------------------

class Graph(NamedTuple):
    r"""A graph as the kernels read it (rows are destinations).

    Attributes:
        rowptr (torch.Tensor): :obj:`[num_rows + 1]` CSR pointers.
        col (torch.Tensor): :obj:`[E']` source of each CSR entry.
        csc ((torch.Tensor, torch.Tensor, torch.Tensor), optional): the CSC
            :obj:`(colptr, row, perm)`, built when a backward needs it.
        perm_inv (torch.Tensor, optional): the inverse of :obj:`perm` (CUDA).
        edge_perm (torch.Tensor, optional): for each CSR entry, the position
            of its edge in the caller's edge order, where the self-loop of
            node :obj:`k` is edge :obj:`num_edges + k`; :obj:`None` when the
            CSR order is the caller's order.
        num_dst (int): the destination nodes. Under :func:`torch.compile`
            with self-loops the CSR has one more row, after these, that holds
            the caller's own self-loops (PyG removes them before adding its
            own; their number is known only from the values, so they are set
            aside rather than removed). That row's output is discarded.
    """
    rowptr: Tensor
    col: Tensor
    csc: Optional[CSC]
    perm_inv: Optional[Tensor]
    edge_perm: Optional[Tensor]
    num_dst: int

    @property
    def has_spare_row(self) -> bool:
        return self.rowptr.size(0) - 1 > self.num_dst

    def pad_rows(self, t: Tensor) -> Tensor:
        r"""Per-destination :obj:`t` ([num_dst, ...]) with a zero row for the
        spare row, if the graph has one."""
        if not self.has_spare_row:
            return t
        # A padding, not a concatenation with a zero row (see cat_rows).
        return F.pad(t, (0, 0) * (t.dim() - 1) + (0, 1))

    def crop_rows(self, out: Tensor) -> Tensor:
        r"""The first :obj:`num_dst` rows of a per-row result."""
        return out[:self.num_dst] if self.has_spare_row else out

    def to_csr_order(self, values: Tensor, loop_values: Optional[Tensor] = None) -> Tensor:
        r"""Per-edge :obj:`values` in the caller's order (followed by
        :obj:`loop_values` of the added self-loops) in CSR order."""
        if loop_values is not None:
            values = cat_rows(values, loop_values)
        return values if self.edge_perm is None else values[self.edge_perm]


def cat_rows(first: Tensor, second: Tensor) -> Tensor:
    r""":obj:`torch.cat([first, second])`; under :func:`torch.compile` as
    one element-wise selection between the two padded inputs. Inductor
    lowers a concatenation by having the kernels that compute its inputs
    write straight into slices of one buffer; under its graph partition
    (CUDA graphs, with :func:`_graph_of_edges` between partitions) those
    kernels can land in different partitions, each writing into a buffer of
    its own, and the concatenation came out partly unwritten (GATConv's
    padded destination scores, its self-loops' edge scores)."""
    if not is_compiling():
        return torch.cat([first, second])
    n, pad = first.size(0), (0, 0) * (first.dim() - 1)
    rows = torch.arange(n + second.size(0), device=first.device)
    head = (rows < n).view((-1,) + (1,) * (first.dim() - 1))
    return torch.where(head, F.pad(first, pad + (0, second.size(0))),
                       F.pad(second, pad + (n, 0)))


def edge_coordinates(adj) -> Tuple[Tensor, Tensor]:
    r"""(source, destination) of every edge of any PyG adjacency, in the
    adjacency's own edge order (the order of its edge features); a pair of
    index tensors is its own."""
    if isinstance(adj, tuple):
        return adj
    if isinstance(adj, SparseTensor):
        return adj.storage.col(), adj.storage.row()
    if isinstance(adj, Tensor) and adj.layout == torch.sparse_csr:
        rowptr = adj.crow_indices()
        return adj.col_indices(), ptr2index(rowptr, output_size=adj.col_indices().numel())
    if isinstance(adj, Tensor) and adj.layout == torch.sparse_coo:
        index = adj._indices()
        return index[1], index[0]
    index = adj.as_tensor() if isinstance(adj, EdgeIndex) else adj
    return index[0], index[1]


def _container_csr(adj) -> Optional[Tuple[Tensor, Tensor]]:
    """The CSR over destinations that the container already holds, in its
    edge order (no copy), or None."""
    if isinstance(adj, SparseTensor):
        return adj.storage.rowptr(), adj.storage.col()
    if isinstance(adj, Tensor) and adj.layout == torch.sparse_csr:
        return adj.crow_indices(), adj.col_indices()
    if isinstance(adj, EdgeIndex) and adj.is_sorted_by_col:
        # (eager only: under torch.compile an EdgeIndex goes to _graph_of_edges)
        (rowptr, col), _ = adj.get_csc()
        return rowptr, col
    return None


def _container_csc(adj) -> Optional[CSC]:
    """The CSC that the container caches (SparseTensor, EdgeIndex), or None."""
    if isinstance(adj, SparseTensor):
        perm = adj.storage.csr2csc()
        return adj.storage.colptr(), adj.storage.row()[perm], perm
    if isinstance(adj, EdgeIndex) and adj.is_sorted_by_col:
        (colptr, row), perm = adj.get_csr()
        return colptr, row, perm
    return None


def _fit_ptr(ptr: Tensor, num_rows: int, name: str) -> Tensor:
    # An EdgeIndex infers a missing sparse size from its largest index, which
    # drops trailing isolated nodes: pad with empty rows.
    missing = num_rows + 1 - ptr.numel()
    if missing < 0:
        raise ValueError(f"{name} describes {ptr.numel() - 1} nodes but the features hold "
                         f"only {num_rows}")
    if missing == 0:
        return ptr
    return torch.cat([ptr, ptr[-1:].expand(missing)])


def _index_error(bound: int, lo: int, hi: int, what: str) -> IndexError:
    # PyG's messages for the same mistake, naming only what is wrong (a
    # negative index first, as PyG checks it first).
    where = (f"Please ensure that all indices in 'edge_index' point to valid indices in the "
             f"interval [0, {bound}) in your node feature matrix and try again.")
    if lo < 0:
        return IndexError(f"Found negative indices in 'edge_index' (got {lo}) in its {what} "
                          f"row. {where}")
    return IndexError(f"Found indices in 'edge_index' that are larger than {bound - 1} (got "
                      f"{hi}) in its {what} row. {where}")


def _checked(src: Tensor, dst: Tensor, num_src: int, num_dst: int, check: bool,
             extra: list) -> list:
    # Raises PyG's IndexError for an index out of range (when `check`) and
    # returns the values of the `extra` scalars, with one host sync.
    stats = [src.min(), src.max(), dst.min(), dst.max()] if check and src.numel() > 0 else []
    if not stats and not extra:
        return []
    values = torch.stack([v.long() for v in stats + extra]).tolist()
    if stats:
        lo_src, hi_src, lo_dst, hi_dst = values[:4]
        if lo_src < 0 or hi_src >= num_src:
            raise _index_error(num_src, lo_src, hi_src, "source")
        if lo_dst < 0 or hi_dst >= num_dst:
            raise _index_error(num_dst, lo_dst, hi_dst, "destination")
    return values[len(stats):]


_INDEX_CHECK = [True]


def set_index_check(enabled: bool) -> None:
    r"""Turns the layers' eager check of edge-list indices on (the default)
    or off.

    With the check, the first eager call for a graph raises PyG's
    :class:`IndexError` for a source or destination index out of range, on
    the CPU and on CUDA alike (never a device-side assert), at the cost of
    one host sync per new graph: one per step of a mini-batch loop. Without
    it no host sync remains (as under :func:`torch.compile`, which never
    checks); a malformed index then gives meaningless output on CUDA (the
    kernels skip indices out of range) and an error from the CPU kernels.
    Turn it off for trusted graphs, such as a sampler's mini-batches.

    Example:
        >>> from pyg_multihead_agg.graph import set_index_check
        >>> set_index_check(False)  # a training loop over sampled batches
        >>> set_index_check(True)
    """
    _INDEX_CHECK[0] = bool(enabled)


def check_index(edge_index: Tensor, num_src: int, num_dst: int) -> None:
    r"""Raises PyG's :class:`IndexError` unless every source of the edge
    list :obj:`edge_index` lies in :obj:`[0, num_src)` and every destination
    in :obj:`[0, num_dst)`. Once per graph in eager mode (one host sync, the
    result cached with the graph); nothing under :func:`torch.compile` or
    after :func:`set_index_check(False) <set_index_check>`."""
    if is_compiling() or not _INDEX_CHECK[0]:
        return
    key = ("checked", num_src, num_dst)
    if _cache_get(edge_index, key) is None:
        src, dst = edge_coordinates(edge_index)
        _checked(src, dst, num_src, num_dst, True, [])
        _cache_put(edge_index, key, True)


def _from_container(adj, num_src: int, num_dst: int) -> Optional[Graph]:
    csr = _container_csr(adj)
    if csr is None:
        return None
    rowptr, col = csr
    rowptr = _fit_ptr(rowptr, num_dst, "the adjacency (destinations)")
    dtype = _index_dtype(col.device, col.numel(), num_src, num_dst)
    return Graph(rowptr.to(dtype), col.to(dtype), None, None, None, num_dst)


def _build(adj, num_src: int, num_dst: int, loops: Optional[int], exact: bool,
           need_csc: bool = False) -> Graph:
    """CSR of `adj` with self-loops as PyG adds them (`loops`: for that many
    nodes). `exact`: check the index range of an edge list and drop the
    caller's self-loops, with one host sync; otherwise (traced, or checks
    off) nothing is checked and the caller's self-loops go to a spare row.
    An exact build without self-loops also learns from that sync whether
    the edge list is sorted by destination (the CSR is then its own order,
    no sort) or by source (the CSC is, built here when `need_csc`)."""
    torch_sparse_adj = isinstance(adj, Tensor) and (adj.is_sparse or adj.layout == torch.sparse_csr)
    check = exact and not isinstance(adj, SparseTensor) and not torch_sparse_adj
    if loops is None and not check:
        graph = _from_container(adj, num_src, num_dst)
        if graph is not None:
            return graph
    src, dst = edge_coordinates(adj)
    if loops is not None and torch_sparse_adj:
        # PyG's add_self_loops rebuilds a torch.sparse adjacency coalesced:
        # duplicate entries become one edge (Dynamo runs this outside the
        # graph: _untraceable).
        dst, src = coalesce(torch.stack([dst, src]), num_nodes=max(num_src, num_dst, 1))
    num_edges = src.numel()
    own_loops = 0
    dst_sorted = src_sorted = False
    if exact:
        # One host sync for the range check, the count of own self-loops and
        # the sort orders.
        orders = loops is None and check
        extra = [(src == dst).sum()] if loops is not None else []
        if orders:
            extra += [_non_decreasing(dst), _non_decreasing(src)]
        values = _checked(src, dst, num_src, num_dst, check, extra)
        if loops is not None:
            own_loops = values[0]
        else:
            graph = _from_container(adj, num_src, num_dst)
            if graph is not None:
                return graph
            if orders:
                dst_sorted, src_sorted = bool(values[0]), bool(values[1])
    device = src.device
    num_rows, total = num_dst, num_edges
    if loops is not None:
        # PyG removes every self-loop, then adds one per node below `loops`
        # after the other edges. The removed ones go to a spare row, sorted
        # last, which an exact build cuts off.
        num_rows, total = num_dst + 1, num_edges + loops
    dtype = _index_dtype(device, total, num_src, num_rows)
    src, dst = src.to(dtype), dst.to(dtype)
    if loops is not None:
        dst = torch.where(src == dst, torch.full_like(dst, num_dst), dst)
        nodes = torch.arange(loops, dtype=dtype, device=device)
        src, dst = torch.cat([src, nodes]), torch.cat([dst, nodes])
    crop = exact and loops is not None  # the spare row holds only the caller's self-loops
    kept = total - own_loops
    if dst_sorted:
        graph = Graph(_ptr(dst, num_rows), src, None, None, None, num_dst)
    elif need_csc and not src_sorted:
        return _sorted_both(src, dst, num_src, num_dst, num_rows, kept if crop else None)
    else:
        sorted_dst, edge_perm = torch.sort(dst, stable=True)
        col, edge_perm = src[edge_perm], edge_perm.to(dtype)
        rowptr = _ptr(sorted_dst, num_rows)
        if crop:
            rowptr, col, edge_perm = rowptr[:num_dst + 1], col[:kept], edge_perm[:kept]
        graph = Graph(rowptr, col, None, None, edge_perm, num_dst)
    if need_csc and src_sorted:
        # The caller's order is a CSC order: entry k is edge k, which sits
        # at CSR position perm[k] (the inverse of edge_perm).
        edge_perm = graph.edge_perm
        if edge_perm is None:
            perm = torch.arange(num_edges, dtype=dtype, device=device)
            edge_perm = perm
        else:
            perm = invert_perm(edge_perm)
        perm_inv = edge_perm if device.type == "cuda" else None
        graph = graph._replace(csc=(_ptr(src, num_src), dst, perm), perm_inv=perm_inv)
    return graph


def _sorted_both(src: Tensor, dst: Tensor, num_src: int, num_dst: int, num_rows: int,
                 kept: Optional[int]) -> Graph:
    # The CSR and the CSC of an edge list in no known order from one sort
    # call (both rows of [dst; src] at once, stable): a CSC entry's position
    # within its source follows the caller's edge order. `kept`: the spare
    # row num_dst (the caller's own self-loops) is cut from both, leaving
    # `kept` edges; their source key becomes num_src so that they sort last
    # in the CSC too.
    dtype = src.dtype
    src_key = src
    if kept is not None:
        src_key = torch.where(dst == num_dst, torch.full_like(src, num_src), src)
    keys, order = torch.sort(torch.stack([dst, src_key]), dim=1, stable=True)
    # The CSC's pointers from a gathered copy of the sorted sources, not from
    # keys[1]: Inductor's CUDA searchsorted misreads a row at an offset.
    rowptr, colptr = _ptr(keys[0], num_rows), _ptr(src_key[order[1]], num_src)
    edge_perm = order[0].to(dtype)
    # the CSR position of each edge (edge_perm's inverse) at its CSC entry
    col, row, perm = src[order[0]], dst[order[1]], _inverse(edge_perm)[order[1]]
    if kept is not None:
        rowptr, col, edge_perm = rowptr[:num_dst + 1], col[:kept], edge_perm[:kept]
        row, perm = row[:kept], perm[:kept]
    return Graph(rowptr, col, (colptr, row, perm), None, edge_perm, num_dst)


def _non_decreasing(index: Tensor) -> Tensor:
    return (index[1:] >= index[:-1]).all()


def _with_csc(graph: Graph, adj, num_src: int, perm_inv: bool = True) -> Graph:
    csc = None
    if graph.edge_perm is None and graph.rowptr.size(0) - 1 == graph.num_dst:
        csc = _container_csc(adj)  # the container's own cache, if any
        if csc is not None:
            colptr, row, perm = csc
            colptr = _fit_ptr(colptr, num_src, "the adjacency (sources)")
            dtype = graph.col.dtype
            csc = (colptr.to(dtype), row.to(dtype), perm.to(dtype))
    if csc is None:
        csc = csr_to_csc(graph.rowptr, graph.col, num_src)
    inverse = invert_perm(csc[2]) if perm_inv and csc[2].is_cuda else None
    return graph._replace(csc=csc, perm_inv=inverse)


# ---------------------------------------------------------------------------
# Cache: per adjacency object, shared by all layers
# ---------------------------------------------------------------------------

def _index_versions(adj) -> Optional[Tuple[int, ...]]:
    # In-place changes to an adjacency's indices bump these counters. None:
    # indices made under torch.inference_mode, which keep no counter (and
    # can change in place there unseen): such graphs are not cached.
    if isinstance(adj, SparseTensor):
        storage = adj.storage
        tensors = (storage._rowptr, storage._row, storage._col)
    elif isinstance(adj, Tensor) and adj.layout == torch.sparse_csr:
        tensors = (adj.crow_indices(), adj.col_indices())
    elif isinstance(adj, Tensor) and adj.is_sparse:
        tensors = (adj._indices(),)
    else:
        tensors = (getattr(adj, "_data", adj),)
    tensors = [t for t in tensors if t is not None]
    if any(t.is_inference() for t in tensors):
        return None
    return tuple(t._version for t in tensors)


_CACHE: Dict[int, Dict[Any, Tuple[Tuple[int, ...], Any]]] = {}


def _cache_get(adj, key) -> Any:
    entry = _CACHE.get(id(adj), {}).get(key)
    if entry is None or entry[0] is None or entry[0] != _index_versions(adj):
        return None
    return entry[1]


def _cache_put(adj, key, value) -> None:
    if _index_versions(adj) is None:
        return  # no version counter: converted at every call
    ident = id(adj)
    if ident not in _CACHE:
        _CACHE[ident] = {}
        weakref.finalize(adj, _CACHE.pop, ident, None)
    _CACHE[ident][key] = (_index_versions(adj), value)


def clear_cache() -> None:
    r"""Drops every prepared graph that :func:`prepare` keeps (they are also
    dropped with their adjacency objects)."""
    _CACHE.clear()


class _Attached:
    # What prepare_adjacency attaches to its alias of the adjacency. Not
    # state: deep copies and pickles of the alias drop it (it pickles as an
    # empty set, which torch.load(weights_only=True) accepts).
    def __init__(self, graph: Graph, loops: Optional[int]) -> None:
        self.graph = graph
        self.loops = loops

    def __deepcopy__(self, memo) -> None:
        return None

    def __reduce__(self):
        return (set, ())


def prepare(adj, num_src: int, num_dst: int, *, self_loops: Optional[int] = None,
            need_csc: bool = True) -> Graph:
    r"""The graph of any PyG adjacency as the kernels read it.

    Args:
        adj: a plain :obj:`edge_index` tensor :obj:`[2, E]` (sources in row
            0, destinations in row 1, any order), an
            :class:`~torch_geometric.EdgeIndex` of any sort order, a
            :class:`torch_sparse.SparseTensor` :obj:`adj_t`, or a
            :obj:`torch.sparse` CSR or COO :obj:`adj_t` of shape
            :obj:`[num_dst, num_src]`.
        num_src (int): source nodes (rows of the source features).
        num_dst (int): destination nodes (rows of the output).
        self_loops (int, optional): add self-loops as PyG's layers do:
            remove the caller's, then add one for each node below
            :obj:`self_loops` (after the other edges; the self-loop of node
            :obj:`k` is edge :obj:`E + k` for :attr:`Graph.edge_perm`).
        need_csc (bool): build the CSC (and, on CUDA, its inverse
            permutation) for a backward.

    Returns:
        :class:`Graph`. On CUDA the indices are int32 where they fit.

    Eagerly the first call for a graph checks the index range (one host sync;
    :class:`IndexError` as PyG's; see :func:`set_index_check`) and the result
    is cached per adjacency object. Under :func:`torch.compile` nothing is
    checked: a plain :obj:`edge_index`, an :class:`EdgeIndex` and a
    :class:`SparseTensor` with filled caches go through one operator that
    keeps the graphs of the last few edge lists it saw
    (:func:`_graph_of_edges`), the other adjacencies' conversions are part
    of the compiled graph, and an adjacency from :func:`prepare_adjacency`
    brings its own.

    Example:
        >>> import torch
        >>> from pyg_multihead_agg.graph import prepare
        >>> edge_index = torch.tensor([[0, 2, 1], [1, 0, 0]])
        >>> g = prepare(edge_index, num_src=3, num_dst=2)
        >>> g.rowptr.tolist(), g.col.tolist(), g.edge_perm.tolist()
        ([0, 2, 3], [2, 1, 0], [1, 2, 0])
    """
    attached = getattr(adj, "_pma_graph", None)
    if isinstance(attached, _Attached) and (attached.loops is None) == (self_loops is None):
        return attached.graph
    compiling = is_compiling()
    pair = _edge_pair(adj) if compiling else None
    if pair is not None:
        return _compiled_graph(*pair, num_src, num_dst, self_loops, need_csc)
    run = _outside_graph if _untraceable(adj) else _in_graph
    key = (num_src, num_dst, self_loops)
    graph = None if compiling else _cache_get(adj, key)
    fresh = graph is None
    if fresh:
        exact = (not compiling or run is _outside_graph) and _INDEX_CHECK[0]
        graph = run(_build, adj, num_src, num_dst, self_loops, exact, need_csc)
    elif not need_csc or graph.csc is not None and (
            graph.perm_inv is not None or not graph.col.is_cuda):
        return graph
    # perm_inv (CUDA: the backward's faster write order) costs a scatter over
    # the edges and saves less than that in one backward: it is built at a
    # graph's second backward, so that a graph used once (a mini-batch, a
    # traced call, a first call) never pays for it.
    if need_csc and graph.csc is None:
        graph = run(_with_csc, graph, adj, num_src, False)
    elif need_csc and graph.perm_inv is None and graph.col.is_cuda and not fresh:
        graph = graph._replace(perm_inv=invert_perm(graph.csc[2]))
    if not compiling:
        _cache_put(adj, key, graph)
    return graph


# ---------------------------------------------------------------------------
# Under torch.compile: an edge list's graph, converted once per edge list
# ---------------------------------------------------------------------------

# The graphs of the last _EDGES_KEPT edge lists _graph_of_edges converted,
# most recent last: key -> (weak references to the source and destination
# index storages, ((rowptr, the other parts), the Graph of their views)).
_Kept = Tuple[Tuple[StorageWeakRef, ...], Tuple[Tuple[Tensor, Tensor], Graph]]
_EDGES: "collections.OrderedDict[tuple, _Kept]" = collections.OrderedDict()
_EDGES_KEPT = 8


def _edge_pair(adj) -> Optional[Tuple[Tensor, Optional[Tensor]]]:
    # The index tensors that _graph_of_edges takes under torch.compile, the
    # adjacency's own (whose storages, views and versions key its cache):
    # (index, None) for a plain edge_index or an EdgeIndex's index tensor
    # (traced, its conversion would run in every call and build no
    # perm_inv), (col, row) for a SparseTensor whose row indices are cached
    # (fill_cache_(); else they are computed in every call and would never
    # match the cache); None where the conversion is traced instead. Whole
    # tensors, not rows of one: Inductor hands a view on to an operator as a
    # tensor of its own, whose version counter an in-place edit of the edges
    # does not move.
    if isinstance(adj, SparseTensor):
        row = adj.storage._row
        return None if row is None else (adj.storage.col(), row)
    if isinstance(adj, Tensor) and adj.layout == torch.strided and adj.dim() == 2:
        return (adj.as_tensor() if isinstance(adj, EdgeIndex) else adj), None
    return None


def _edge_rows(src: Tensor, dst: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    # The (sources, destinations) of _graph_of_edges's index tensors.
    return (src[0], src[1]) if dst is None else (src, dst)


def _graph_layout(num_src: int, num_dst: int, num_edges: int, loops: int, need_csc: bool,
                  cuda: bool) -> Tuple[int, List[int]]:
    # The sizes of _graph_of_edges's two tensors: rowptr's, and those of
    # the parts of the other, [col, edge_perm] (+ [colptr, row, perm] with
    # the CSC, + [perm_inv] on CUDA), one after another.
    rows, total = (num_dst, num_edges) if loops < 0 else (num_dst + 1, num_edges + loops)
    parts = [total, total]
    if need_csc:
        parts += [num_src + 1, total, total] + ([total] if cuda else [])
    return rows + 1, parts


def _graph_of_parts(rowptr: Tensor, rest: Tensor, src: Tensor, num_src: int, num_dst: int,
                    loops: int, need_csc: bool) -> Graph:
    # The Graph of _graph_of_edges's two tensors (views of them).
    _, sizes = _graph_layout(num_src, num_dst, src.size(-1), loops, need_csc, src.is_cuda)
    parts = torch.split(rest, sizes)
    csc = tuple(parts[2:5]) if need_csc else None
    perm_inv = parts[5] if len(parts) > 5 else None
    return Graph(rowptr, parts[0], csc, perm_inv, parts[1], num_dst)


def _compiled_graph(src: Tensor, dst: Optional[Tensor], num_src: int, num_dst: int,
                    loops: Optional[int], need_csc: bool) -> Graph:
    loops = -1 if loops is None else loops
    rowptr, rest = torch.ops.pyg_multihead_agg._graph_of_edges(src, dst, num_src, num_dst, loops,
                                                               need_csc)
    return _graph_of_parts(rowptr, rest, src, num_src, num_dst, loops, need_csc)


def compiled_edges(adj) -> Optional[Tuple[Tensor, Optional[Tensor]]]:
    r"""Under :func:`torch.compile`, the index tensors of an edge list whose
    graph :func:`prepare` would convert through :func:`_graph_of_edges`
    (see :func:`_edge_pair`); None eagerly, for an adjacency that carries a
    prepared graph, and for the other adjacencies."""
    if not is_compiling() or isinstance(getattr(adj, "_pma_graph", None), _Attached):
        return None
    return _edge_pair(adj)


def kept_graph(src: Tensor, dst: Optional[Tensor], num_src: int, num_dst: int, loops: int,
               need_csc: bool) -> Graph:
    r"""The graph of an edge list as :func:`_graph_of_edges` keeps it
    (converted once per edge list; :obj:`loops` -1 for none), not copied:
    for an operator's implementation, which reads it and returns none of
    its tensors (a compiled graph may reuse an operator's outputs as
    scratch, never what an operator reads inside its own call)."""
    return _kept_edges(src, dst, num_src, num_dst, loops, need_csc)[1]


def _index_key(index: Tensor) -> tuple:
    # The storage (by its data address; the weak reference kept beside the
    # entry tells whether that storage still lives, since a new one may take
    # a freed address), the view and the version (an in-place change bumps it).
    return (index.untyped_storage().data_ptr(), index.device, index.dtype,
            index.storage_offset(), tuple(index.shape), index.stride(), index._version)


def _kept_edges(src: Tensor, dst: Optional[Tensor], num_src: int, num_dst: int, loops: int,
                need_csc: bool) -> Tuple[Tuple[Tensor, Tensor], Graph]:
    # The graph of an edge list as _graph_of_edges keeps it: its two tensors
    # (rowptr, the other parts one after another) and the Graph of views of
    # them, made once.
    # (indices made under torch.inference_mode keep no version counter: not kept)
    index = (src,) if dst is None else (src, dst)
    keep = not any(t.is_inference() for t in index)
    key = (tuple(_index_key(t) for t in index), num_src, num_dst, loops, need_csc) if keep else None
    hit = _EDGES.get(key) if keep else None
    if hit is not None and not any(ref.expired() for ref in hit[0]):
        _EDGES.move_to_end(key)
        return hit[1]
    pair = _edge_rows(src, dst)  # (an edge list as _build reads it, no stacked copy)
    graph = _build(pair, num_src, num_dst, None if loops < 0 else loops, False, need_csc)
    if need_csc and graph.csc is None:
        graph = _with_csc(graph, pair, num_src, False)
    if need_csc and graph.perm_inv is None and src.is_cuda:
        # converted once per edge list: the CUDA backward's faster write
        # order pays from the first step on
        graph = graph._replace(perm_inv=invert_perm(graph.csc[2]))
    rest = [graph.col, graph.edge_perm] + (
        list(graph.csc) + ([graph.perm_inv] if src.is_cuda else []) if need_csc else [])
    parts = (graph.rowptr, torch.cat(rest))  # (_graph_layout)
    kept = (parts, _graph_of_parts(*parts, src, num_src, num_dst, loops, need_csc))
    if keep:
        for stale in [k for k, (refs, _) in _EDGES.items() if any(r.expired() for r in refs)]:
            del _EDGES[stale]
        refs = tuple(StorageWeakRef(t.untyped_storage()) for t in index)
        _EDGES[key] = (refs, kept)
        while len(_EDGES) > _EDGES_KEPT:
            _EDGES.popitem(last=False)
    return kept


# CUDA graphs would replay the copies below from the first graph's tensors.
_EDGES_TAGS = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()


# Defined through a Library fragment with one kernel for every device
# (CompositeExplicitAutograd), not torch.library.custom_op, whose Python
# autograd and dispatch wrappers cost about 3x the host time of the call
# (CPU: 13 against 4.7 us with a trivial body), paid by every layer call of a
# compiled model.
_LIB = torch.library.Library("pyg_multihead_agg", "FRAGMENT")
_LIB.define("_graph_of_edges(Tensor src, Tensor? dst, SymInt num_src, SymInt num_dst, "
            "SymInt loops, bool need_csc) -> (Tensor, Tensor)", tags=_EDGES_TAGS)


def _graph_of_edges(src: Tensor, dst: Optional[Tensor], num_src: int, num_dst: int, loops: int,
                    need_csc: bool) -> Tuple[Tensor, Tensor]:
    r"""The graph of an edge list (sources :obj:`src` and destinations
    :obj:`dst`, a :class:`SparseTensor`'s cached column and row indices; or,
    with :obj:`dst` None, both as the two rows of :obj:`src`, a plain
    :obj:`edge_index` or an :class:`EdgeIndex`'s index tensor) under
    :func:`torch.compile`, as two tensors: :obj:`rowptr`, and
    :obj:`[col, edge_perm]` (and :obj:`[colptr, row, perm]` with
    :obj:`need_csc`, plus :obj:`perm_inv` on CUDA) one after another
    (:func:`_graph_layout`), converted as :func:`prepare` traces it (no
    index check; the caller's self-loops to a spare row when
    :obj:`loops >= 0`), once per edge list: the graphs of the last few edge
    lists (by storage, view and version of the index tensors) are kept, so
    that a compiled model on a fixed graph converts it once, as an eager one
    does, and the layers of one step share a mini-batch's. Returned as
    copies, which the compiled graph owns (it may reuse an operator's
    outputs as scratch): two, not one per part, since each copy is a kernel
    launch in every layer call."""
    rowptr, rest = _kept_edges(src, dst, num_src, num_dst, loops, need_csc)[0]
    return rowptr.clone(), rest.clone()


_LIB.impl("_graph_of_edges", _graph_of_edges, "CompositeExplicitAutograd")


@torch.library.register_fake("pyg_multihead_agg::_graph_of_edges")
def _(src, dst, num_src, num_dst, loops, need_csc):
    ptr, sizes = _graph_layout(num_src, num_dst, src.size(-1), loops, need_csc,
                               src.device.type == "cuda")
    rows, total = ptr - 1, sizes[0]
    dtype = _index_dtype(src.device, total, num_src, rows)
    return src.new_empty(ptr, dtype=dtype), src.new_empty(sum(sizes), dtype=dtype)


def _untraceable(adj) -> bool:
    # Under torch.compile, Dynamo cannot wrap torch.sparse tensors
    # (SparseTensor traces through its cached index tensors).
    return is_compiling() and isinstance(adj, Tensor) and (
        adj.is_sparse or adj.layout == torch.sparse_csr)


def _in_graph(fn, *args):
    return fn(*args)


@torch.compiler.disable
def _outside_graph(fn, *args):
    # fn(*args) eagerly, outside the compiled graph (one graph break).
    return fn(*args)


# Graphs up to this many edges keep their routing adjacency in the cache.
ROUTING_CACHE_EDGES = 1 << 20


def routing_adjacency(adj, graph: Graph, num_src: int) -> EdgeIndex:
    r"""The prepared :obj:`graph` of :obj:`adj` as a sparse adjacency that
    PyG's :meth:`~torch_geometric.nn.conv.MessagePassing.propagate` routes to
    :meth:`message_and_aggregate`: an :class:`~torch_geometric.EdgeIndex`
    (sources, destinations) in CSR order, sorted by destination, whose
    pointer is the CSR's :obj:`rowptr`, of size :obj:`(num_src, rows)`
    (one row more than the destinations in a graph with a spare row, see
    :class:`Graph`). Eager only (under :func:`torch.compile` PyG's propagate
    runs no hook, and the layers call the op directly). Cached with the
    graph up to :data:`ROUTING_CACHE_EDGES` edges, where building it (about
    50 us of host time) would weigh on a layer call; a larger graph's is
    built per call (one pass over its edges, next to the op's many) rather
    than held (8 bytes an edge)."""
    if graph.col.numel() > ROUTING_CACHE_EDGES:
        return _edge_index_of(graph, num_src)
    # Cached beside the graph, for the graph it was built from (prepare's
    # cache has checked the adjacency's versions).
    key = ("routing", num_src, graph.num_dst)
    hit = _CACHE.get(id(adj), {}).get(key)
    if hit is not None and hit[1][0] is graph.col and hit[1][1] is graph.rowptr:
        return hit[1][2]
    routing = _edge_index_of(graph, num_src)
    _cache_put(adj, key, (graph.col, graph.rowptr, routing))
    return routing


def _edge_index_of(graph: Graph, num_src: int) -> EdgeIndex:
    row = ptr2index(graph.rowptr, output_size=graph.col.numel())
    routing = EdgeIndex(torch.stack([graph.col, row]),
                        sparse_size=(num_src, graph.rowptr.size(0) - 1), sort_order="col")
    routing._indptr = graph.rowptr
    return routing


def loop_attr(adj, edge_attr: Tensor, num_nodes: int,
              fill_value: Union[float, Tensor, str, None]) -> Tensor:
    r"""The edge features of the self-loops PyG's :func:`add_self_loops`
    adds to :obj:`adj` after removing its own self-loops, for
    :obj:`num_nodes` nodes: :obj:`fill_value` as a constant, or a reduction
    (:obj:`"mean"`, :obj:`"add"`, :obj:`"max"`, ...) of each node's incoming
    edge features other than self-loops. Shapes do not depend on values."""
    if fill_value is None:
        return edge_attr.new_ones((num_nodes,) + edge_attr.shape[1:])
    if isinstance(fill_value, (int, float)):
        return edge_attr.new_full((num_nodes,) + edge_attr.shape[1:], fill_value)
    if isinstance(fill_value, Tensor):
        value = fill_value.to(edge_attr.device, edge_attr.dtype)
        if value.dim() != edge_attr.dim():
            value = value.unsqueeze(0)
        return value.expand((num_nodes,) + edge_attr.shape[1:]).contiguous()
    src, dst = edge_coordinates(adj)
    # Self-loops and destinations past num_nodes reduce into a spare row.
    spare = torch.full_like(dst, num_nodes)
    index = torch.where((src == dst) | (dst >= num_nodes), spare, dst)
    return scatter(edge_attr, index, 0, num_nodes + 1, fill_value)[:num_nodes]


def num_edges(adj) -> int:
    """The number of edges of any PyG adjacency."""
    if isinstance(adj, SparseTensor):
        return adj.nnz()
    if isinstance(adj, Tensor) and (adj.is_sparse or adj.layout == torch.sparse_csr):
        return adj._nnz()
    return adj.size(1)


def prepare_adjacency(adj, num_nodes: Optional[int] = None, *,
                      size: Optional[Tuple[int, int]] = None,
                      add_self_loops: bool = True):
    r"""Prepares :obj:`adj` once, outside :func:`torch.compile`, for the
    layers of this package: returns an alias of :obj:`adj` (the same type and
    the same index storage) that carries the prepared graph (CSR, CSC and,
    on CUDA, int32 indices and the inverse permutation), which eager calls
    and compiled models then read instead of converting the adjacency. Eager
    calls cache per graph by themselves, and so do compiled models on a
    plain :obj:`edge_index` (with one copy of the graph per step); the
    prepared adjacency spares a compiled full-batch model that copy, and a
    container (:class:`~torch_geometric.EdgeIndex`, :class:`SparseTensor`)
    its conversion in every step. Mini-batches need no preparation.

    Args:
        adj: any adjacency the layers accept (see :func:`prepare`).
        num_nodes (int, optional): the number of nodes (default: the
            adjacency's size, or the largest index + 1).
        size ((int, int), optional): :obj:`(num_src, num_dst)` of a
            bipartite graph, instead of :obj:`num_nodes`.
        add_self_loops (bool): prepare the graph with self-loops, for layers
            built with :obj:`add_self_loops=True` (their default); layers
            with the other setting convert the adjacency as usual.

    The alias is meant for running models: it is not state (copies and
    pickles drop what it carries), and it describes the indices as they
    are now (edit them and prepare again).

    Example:
        >>> import torch, pyg_multihead_agg as pma
        >>> edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
        >>> conv = pma.nn.GATConv(8, 4, heads=2)
        >>> adj = pma.prepare_adjacency(edge_index, num_nodes=3)
        >>> model = torch.compile(conv, dynamic=True, fullgraph=True)
        >>> model(torch.randn(3, 8), adj).shape
        torch.Size([3, 8])
    """
    if is_compiling():
        raise RuntimeError("prepare_adjacency runs once, outside torch.compile: call it on the "
                           "adjacency before passing it to the compiled model")
    if size is not None:
        num_src, num_dst = size
    else:
        if num_nodes is None:
            num_nodes = _num_nodes(adj)
        num_src = num_dst = num_nodes
    loops = min(num_src, num_dst) if add_self_loops else None
    graph = _build(adj, num_src, num_dst, loops, exact=True, need_csc=True)
    if graph.csc is None:
        graph = _with_csc(graph, adj, num_src)
    elif graph.perm_inv is None and graph.col.is_cuda:
        graph = graph._replace(perm_inv=invert_perm(graph.csc[2]))
    alias = copy.copy(adj)
    alias._pma_graph = _Attached(graph, loops)
    return alias


def _num_nodes(adj) -> int:
    if isinstance(adj, SparseTensor):
        return max(adj.sparse_sizes())
    if isinstance(adj, Tensor) and (adj.is_sparse or adj.layout == torch.sparse_csr):
        return max(adj.size(0), adj.size(1))
    if isinstance(adj, EdgeIndex) and adj.num_rows is not None and adj.num_cols is not None:
        return max(adj.num_rows, adj.num_cols)
    return int(adj.max()) + 1 if adj.numel() > 0 else 0
