"""pyg_multihead_agg.graph: every adjacency type to the kernels' CSR/CSC.

Each prepared graph is checked against its definition: the multiset of
(destination, source, caller's edge id) triples of the CSR equals that of
the caller's edges with PyG's self-loop rule applied (remove every
self-loop, add one per node below the loop count, after the other edges).
"""
from collections import Counter

import pytest
import torch
from conftest import DEVICES
from torch_geometric import EdgeIndex
from torch_geometric.index import index2ptr, ptr2index
from torch_geometric.typing import WITH_TORCH_SPARSE, SparseTensor
from torch_geometric.utils import add_self_loops, coalesce, remove_self_loops

import pyg_multihead_agg as pma
from pyg_multihead_agg import graph as graphs

KINDS = ["edge_index", "edge_index_by_dst", "edge_index_by_src", "edge_index_sorted",
         "edge_index_unsorted",
         pytest.param("sparse_tensor", marks=pytest.mark.skipif(
             not WITH_TORCH_SPARSE, reason="needs torch_sparse")),
         "torch_csr", "torch_coo"]


def random_edges(num_src, num_dst, num_edges, seed, loops=4):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_src, (num_edges,), generator=gen)
    dst = torch.randint(0, num_dst, (num_edges,), generator=gen)
    nodes = torch.randint(0, min(num_src, num_dst), (loops,), generator=gen)
    src[:loops] = dst[:loops] = nodes  # own self-loops (and duplicates by chance)
    return src, dst


def adjacency(kind, src, dst, num_src, num_dst):
    """The adjacency and the caller's edge order as (src, dst)."""
    if kind == "edge_index":
        return torch.stack([src, dst]), (src, dst)
    if kind == "edge_index_by_src":  # a plain edge list sorted by source (as coalesce sorts)
        order = torch.sort(src, stable=True).indices
        return torch.stack([src[order], dst[order]]), (src[order], dst[order])
    if kind == "edge_index_unsorted":
        return EdgeIndex(torch.stack([src, dst]), sparse_size=(num_src, num_dst)), (src, dst)
    order = torch.sort(dst, stable=True).indices
    src, dst = src[order], dst[order]
    if kind == "edge_index_by_dst":
        return torch.stack([src, dst]), (src, dst)
    if kind == "edge_index_sorted":
        return EdgeIndex(torch.stack([src, dst]), sparse_size=(num_src, num_dst),
                         sort_order="col"), (src, dst)
    if kind == "sparse_tensor":
        return SparseTensor(row=dst, col=src, sparse_sizes=(num_dst, num_src),
                            is_sorted=True), (src, dst)
    value = torch.ones(src.numel())
    if kind == "torch_csr":
        return torch.sparse_csr_tensor(index2ptr(dst, num_dst), src, value,
                                       size=(num_dst, num_src)), (src, dst)
    return torch.sparse_coo_tensor(torch.stack([dst, src]), value, size=(num_dst, num_src),
                                   is_coalesced=False), (src, dst)


def triples(graph: graphs.Graph):
    """Counter of (dst, src, caller's edge id) over the real rows."""
    rowptr, col = graph.rowptr.long().cpu(), graph.col.long().cpu()
    rows = ptr2index(rowptr, output_size=col.numel())
    ids = torch.arange(col.numel()) if graph.edge_perm is None else graph.edge_perm.long().cpu()
    keep = rows < graph.num_dst
    return Counter(zip(rows[keep].tolist(), col[keep].tolist(), ids[keep].tolist(), strict=True))


def expected_triples(src, dst, loops):
    num_edges = src.numel()
    ids = torch.arange(num_edges)
    if loops is not None:
        keep, nodes = src != dst, torch.arange(loops)
        # The self-loop of node k is edge num_edges + k.
        src, dst = torch.cat([src[keep], nodes]), torch.cat([dst[keep], nodes])
        ids = torch.cat([ids[keep], num_edges + nodes])
    return Counter(zip(dst.tolist(), src.tolist(), ids.tolist(), strict=True))


def check_csc(graph: graphs.Graph, num_src: int):
    colptr, row, perm = (t.long().cpu() for t in graph.csc)
    rowptr, col = graph.rowptr.long().cpu(), graph.col.long().cpu()
    pma.check_csc((colptr, row, perm), rowptr, col, num_src)
    if graph.perm_inv is not None:
        assert torch.equal(perm[graph.perm_inv.long().cpu()], torch.arange(perm.numel()))


@pytest.mark.sweep
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("exact", [True, False], ids=["eager", "traced"])
@pytest.mark.parametrize("loops", [None, "min"], ids=["no_loops", "loops"])
@pytest.mark.parametrize("sizes", [(30, 30), (40, 12), (9, 25)], ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_prepared_graph_is_the_looped_graph(kind, sizes, loops, exact, device):
    num_src, num_dst = sizes
    src, dst = random_edges(num_src, num_dst, 150, seed=sum(sizes))
    adj, (src, dst) = adjacency(kind, src, dst, num_src, num_dst)
    adj = adj.to(device)
    num_loops = None if loops is None else min(num_src, num_dst)
    graph = graphs._build(adj, num_src, num_dst, num_loops, exact=exact, need_csc=True)
    # An exact build without self-loops takes a sorted edge list's order as
    # its CSR (by destination) or CSC (by source), without sorting.
    in_order = exact and num_loops is None
    if in_order and kind == "edge_index_by_dst":
        assert graph.edge_perm is None
    if in_order and kind == "edge_index_by_src":
        assert graph.csc is not None and torch.equal(graph.csc[1].long().cpu(), dst)
    if graph.csc is None:
        graph = graphs._with_csc(graph, adj, num_src)
    if num_loops is not None and kind in ("torch_csr", "torch_coo"):
        # PyG's add_self_loops coalesces a torch.sparse adjacency: each
        # (destination, source) pair once, the edges in that order.
        dst, src = coalesce(torch.stack([dst, src]), num_nodes=max(sizes))
    assert triples(graph) == expected_triples(src, dst, num_loops)
    # The spare row (traced builds with self-loops) holds the caller's own
    # self-loops; the exact build has none.
    assert graph.has_spare_row == (num_loops is not None and not exact)
    if graph.has_spare_row:
        rowptr = graph.rowptr.cpu()
        assert int(rowptr[-1] - rowptr[-2]) == int((src == dst).sum())
    check_csc(graph, num_src)
    index_dtype = torch.int32 if device == "cuda" else src.dtype
    assert graph.col.dtype == graph.rowptr.dtype == graph.csc[0].dtype == index_dtype
    # perm_inv: CUDA only, where the CSC came from _with_csc or from an
    # order by source (the one-sort build leaves it to the graph's second
    # backward, as prepare does)
    if graph.perm_inv is not None:
        assert device == "cuda"
        graphs.check_perm_inv(graph.perm_inv, graph.csc[2])


def test_edge_values_reach_their_csr_entries():
    src, dst = random_edges(20, 20, 80, seed=3)
    graph = graphs.prepare(torch.stack([src, dst]), 20, 20, self_loops=20)
    values = torch.arange(80.0)
    loop_values = 1000.0 + torch.arange(20.0)
    csr_values = graph.to_csr_order(values, loop_values)
    rows = ptr2index(graph.rowptr.long(), output_size=graph.col.numel())
    looped = rows == graph.col.long()
    # Every self-loop entry carries its node's loop value, every other entry
    # the value of an edge with its endpoints.
    assert torch.equal(csr_values[looped], 1000.0 + rows[looped].float())
    ids = csr_values[~looped].long()
    assert torch.equal(src[ids], graph.col[~looped].long())
    assert torch.equal(dst[ids], rows[~looped])


@pytest.mark.parametrize("fill_value", ["mean", "add", "max", "min", "mul", 0.5, None,
                                        "tensor"])
def test_loop_attr_is_pygs(fill_value):
    src, dst = random_edges(25, 25, 90, seed=4)
    edge_attr = torch.randn(90, 3, generator=torch.Generator().manual_seed(4))
    fill = torch.tensor([1.0, -2.0, 3.0]) if fill_value == "tensor" else fill_value
    edge_index = torch.stack([src, dst])
    no_loops, attr = remove_self_loops(edge_index, edge_attr)
    _, looped_attr = add_self_loops(no_loops, attr, fill_value=fill, num_nodes=25)
    got = graphs.loop_attr(edge_index, edge_attr, 25, fill)
    torch.testing.assert_close(got, looped_attr[-25:], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [(0, -1), (0, 30), (1, -5), (1, 30)], ids=str)
def test_index_range_is_checked_once_per_graph(bad, device):
    src, dst = random_edges(30, 30, 60, seed=5)
    edge_index = torch.stack([src, dst]).to(device)
    graphs.prepare(edge_index, 30, 30)
    edge_index = edge_index.clone()
    edge_index[bad] = bad[1]
    which = "source" if bad[0] == 0 else "destination"
    with pytest.raises(IndexError, match=rf"in its {which} row"):
        graphs.prepare(edge_index, 30, 30)
    with pytest.raises(IndexError, match=rf"in its {which} row"):
        graphs.check_index(edge_index, 30, 30)


def test_index_check_can_be_turned_off():
    src, dst = random_edges(30, 30, 60, seed=6)
    edge_index = torch.stack([src, dst])
    edge_index[0, 3] = 99
    graphs.set_index_check(False)
    try:
        graph = graphs.prepare(edge_index, 30, 30, self_loops=30)
        graphs.check_index(edge_index, 30, 30)
    finally:
        graphs.set_index_check(True)
    assert graph.has_spare_row  # nothing read back from the device: no cut
    with pytest.raises(IndexError):
        graphs.prepare(edge_index.clone(), 30, 30)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_no_host_sync_without_index_check_cuda():
    """A training step of the layer on a new plain edge_index with
    self-loops syncs with the host once, for the index check; without the
    check, not at all."""
    conv = pma.nn.GATConv(16, 8, heads=4).cuda()
    x = torch.randn(200, 16, device="cuda", requires_grad=True)

    def step():
        edge_index = torch.randint(0, 200, (2, 900), device="cuda")
        conv(x, edge_index).square().sum().backward()

    step()  # warm-up (allocations, lazy initialisation)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            step()
        graphs.set_index_check(False)
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
        graphs.set_index_check(True)


class _CountSorts(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.sorts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.sorts += func.overloadpacket in (torch.ops.aten.sort, torch.ops.aten.argsort)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index_check", [True, False])
@pytest.mark.parametrize("order", ["shuffled", "by_dst"])
def test_a_mini_batch_step_sorts_once(order, index_check, device):
    """A training step of two layers on a new edge list, in no order or
    grouped by destination (a sampler's order), with self-loops: one sort
    for the whole step (the CSR's and the CSC's orders from one call), the
    graph shared by both layers; its output is the graph's."""
    torch.manual_seed(3)
    convs = [pma.nn.GATConv(8, 4, heads=2).to(device), pma.nn.GATConv(8, 4, heads=2).to(device)]
    x = torch.randn(50, 8, device=device)
    src, dst = random_edges(50, 50, 400, seed=9)
    if order == "by_dst":
        dst = dst.sort().values
    edge_index = torch.stack([src, dst]).to(device)
    reference = convs[1](convs[0](x, edge_index.clone()), edge_index.clone())
    graphs.clear_cache()
    graphs.set_index_check(index_check)
    try:
        with _CountSorts() as counter:
            out = convs[1](convs[0](x, edge_index), edge_index)
            out.square().sum().backward()
    finally:
        graphs.set_index_check(True)
    assert counter.sorts == 1
    torch.testing.assert_close(out, reference)


def test_cache_is_shared_and_dropped():
    src, dst = random_edges(30, 30, 60, seed=7)
    edge_index = torch.stack([src, dst])
    first = graphs.prepare(edge_index, 30, 30, self_loops=30, need_csc=False)
    assert first.csc is None
    second = graphs.prepare(edge_index, 30, 30, self_loops=30)
    assert second.csc is not None and second.rowptr is first.rowptr
    assert graphs.prepare(edge_index, 30, 30, self_loops=30) is second
    assert graphs.prepare(edge_index, 30, 30) is not second  # another policy
    ident = id(edge_index)
    del edge_index
    assert ident not in graphs._CACHE
    graphs.clear_cache()
    assert not graphs._CACHE


def test_prepare_adjacency_keeps_type_and_storage():
    src, dst = random_edges(30, 30, 60, seed=8)
    for adj in (torch.stack([src, dst]),
                EdgeIndex(torch.stack([src, dst]), sparse_size=(30, 30))):
        prepared = pma.prepare_adjacency(adj)
        assert type(prepared) is type(adj) and prepared.data_ptr() == adj.data_ptr()
        graph = graphs.prepare(prepared, 30, 30, self_loops=30)
        assert triples(graph) == expected_triples(src, dst, 30)
        assert graph.csc is not None and not graph.has_spare_row
        plain = pma.prepare_adjacency(adj, add_self_loops=False)
        assert triples(graphs.prepare(plain, 30, 30)) == expected_triples(src, dst, None)
    with pytest.raises(RuntimeError, match="outside torch.compile"):
        torch.compile(lambda a: pma.prepare_adjacency(a), fullgraph=True)(src.view(1, -1))


def test_routing_adjacency_is_the_csr_and_cached_for_small_graphs(monkeypatch):
    src, dst = random_edges(20, 15, 90, seed=5)
    adj = torch.stack([src, dst])
    graph = graphs.prepare(adj, 20, 15, self_loops=15)
    routing = graphs.routing_adjacency(adj, graph, 20)
    assert routing.is_sorted_by_col and routing.sparse_size() == (20, 15)
    (colptr, row), _ = routing.get_csc()
    assert torch.equal(colptr, graph.rowptr) and torch.equal(row, graph.col)
    assert torch.equal(routing.as_tensor()[1], ptr2index(graph.rowptr, graph.col.numel()))
    assert graphs.routing_adjacency(adj, graph, 20) is routing  # cached with the graph
    monkeypatch.setattr(graphs, "ROUTING_CACHE_EDGES", 10)  # larger graphs: built per call
    again = graphs.routing_adjacency(adj, graph, 20)
    assert again is not graphs.routing_adjacency(adj, graph, 20)
    assert torch.equal(again.as_tensor(), routing.as_tensor())


# Under torch.compile an edge list (plain, EdgeIndex, a SparseTensor's cached indices) goes
# through one operator that keeps the graphs of the last few edge lists
# (graph._graph_of_edges).

def _counting_build(monkeypatch):
    calls = []
    build = graphs._build

    def counted(*args, **kwargs):
        calls.append(None)  # (holding the adjacency would keep it alive)
        return build(*args, **kwargs)
    monkeypatch.setattr(graphs, "_build", counted)
    return calls


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("loops", [None, 6])
@pytest.mark.parametrize("need_csc", [False, True])
def test_graph_of_edges_is_the_traced_conversion(loops, need_csc, device):
    """The operator's graph is prepare's traced one (no index check, a spare
    row for the caller's self-loops; on CUDA with the CSC, perm_inv too, the
    backward's faster write order), as rowptr and the other parts one after
    another (_graph_layout), and opcheck passes (schema, fake shapes and
    dtypes, no aliasing of the kept tensors)."""
    gen = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, 6, (2, 20), generator=gen).to(device)
    graphs._EDGES.clear()
    loops_arg = -1 if loops is None else loops
    rowptr, rest = torch.ops.pyg_multihead_agg._graph_of_edges(
        edge_index[0], edge_index[1], 6, 6, loops_arg, need_csc)
    want = graphs._build(edge_index, 6, 6, loops, False, need_csc)
    if need_csc and want.csc is None:
        want = graphs._with_csc(want, edge_index, 6, False)
    expected = [want.col, want.edge_perm] + (list(want.csc) if need_csc else [])
    if need_csc and device == "cuda":
        expected.append(pma.invert_perm(want.csc[2]))
    ptr_size, sizes = graphs._graph_layout(6, 6, 20, loops_arg, need_csc, device == "cuda")
    assert sizes == [t.numel() for t in expected] and ptr_size == want.rowptr.numel()
    assert torch.equal(rowptr, want.rowptr)
    assert torch.equal(rest, torch.cat(expected))
    # _compiled_graph: the same parts, as views of the two tensors
    graph = graphs._compiled_graph(edge_index[0], edge_index[1], 6, 6, loops, need_csc)
    got = [graph.col, graph.edge_perm] + (list(graph.csc) if need_csc else [])
    if graph.perm_inv is not None:
        got.append(graph.perm_inv)
    assert len(got) == len(expected) and graph.num_dst == 6
    for part, ref in zip(got, expected, strict=True):
        assert torch.equal(part, ref)
    # Copies: the caller may write into them without touching the kept graph.
    rest.fill_(-1)
    rowptr.fill_(-1)
    again = torch.ops.pyg_multihead_agg._graph_of_edges(
        edge_index[0], edge_index[1], 6, 6, loops_arg, need_csc)
    assert torch.equal(again[0], want.rowptr) and torch.equal(again[1], torch.cat(expected))
    torch.library.opcheck(torch.ops.pyg_multihead_agg._graph_of_edges.default,
                          (edge_index[0], edge_index[1], 6, 6, loops_arg, need_csc))
    # the whole edge tensor (dst None: its two rows) gives the same graph
    whole = torch.ops.pyg_multihead_agg._graph_of_edges(edge_index, None, 6, 6, loops_arg,
                                                        need_csc)
    assert torch.equal(whole[0], want.rowptr) and torch.equal(whole[1], torch.cat(expected))
    torch.library.opcheck(torch.ops.pyg_multihead_agg._graph_of_edges.default,
                          (edge_index, None, 6, 6, loops_arg, need_csc))


def test_graph_of_edges_converts_each_edge_tensor_once(monkeypatch):
    """Per edge list, one conversion: again for the same index tensors (and
    for views of the same storage with the same shape) it is kept; an
    in-place change, other tensors (either of the two), or other sizes
    convert anew; dead tensors' graphs are dropped and at most _EDGES_KEPT
    are kept."""
    calls = _counting_build(monkeypatch)
    graphs._EDGES.clear()

    def op(edge_index, *args):
        return torch.ops.pyg_multihead_agg._graph_of_edges(edge_index[0], edge_index[1], *args)
    edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    first = op(edge_index, 4, 4, 4, True)
    op(edge_index, 4, 4, 4, True)
    assert len(calls) == 1
    op(edge_index, 4, 4, -1, True)  # other arguments
    assert len(calls) == 2
    edge_index[0, 0] = 2  # in place: the version changes
    changed = op(edge_index, 4, 4, 4, True)
    assert len(calls) == 3 and not torch.equal(changed[1], first[1])
    op(edge_index.clone(), 4, 4, 4, True)  # another tensor, same values
    assert len(calls) == 4
    torch.ops.pyg_multihead_agg._graph_of_edges(  # one of the two another tensor
        edge_index[0], edge_index[1].clone(), 4, 4, 4, True)
    assert len(calls) == 5
    for _ in range(graphs._EDGES_KEPT + 3):
        op(torch.tensor([[0, 1], [1, 0]]), 2, 2, -1, False)  # each dies after the call
    assert len(graphs._EDGES) <= graphs._EDGES_KEPT
    own = edge_index.untyped_storage().data_ptr()
    others = [refs for key, (refs, _) in graphs._EDGES.items() if key[0][0][0] != own]
    # kept only while their tensors live
    assert others and all(any(ref.expired() for ref in refs) for refs in others)
    op(torch.tensor([[0, 1], [1, 0]]), 2, 2, -1, True)  # a conversion drops the dead ones
    assert all(key[0][0][0] == own for key in list(graphs._EDGES)[:-1])


@pytest.mark.parametrize("adj_type", [
    "edge_index", "EdgeIndex", "EdgeIndex by col",
    pytest.param("SparseTensor", marks=pytest.mark.skipif(not WITH_TORCH_SPARSE,
                                                          reason="needs torch_sparse"))])
@pytest.mark.parametrize("add_self_loops", [False, True])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_layer_converts_an_edge_list_once(backend, add_self_loops, adj_type,
                                                   monkeypatch):
    """A compiled GATConv on a plain edge_index, an EdgeIndex or a
    SparseTensor with filled caches converts the graph at its first call
    only, as the eager layer does (through their index tensors, not traced
    into every call), matches eager (output and gradients), and converts
    again after an in-place change of the edges (also under Inductor, which
    hands an operator a view of an input as a tensor of its own: the
    operator takes the whole edge tensor, whose version the edit moves)."""
    torch.manual_seed(0)
    n = 12
    edge_index = torch.randint(0, n, (2, 40))
    adj = edge_index
    if adj_type.startswith("EdgeIndex"):
        adj = EdgeIndex(edge_index, sparse_size=(n, n))
        if adj_type == "EdgeIndex by col":
            adj = adj.sort_by("col")[0].fill_cache_()
    elif adj_type == "SparseTensor":
        adj = SparseTensor(row=edge_index[1], col=edge_index[0],
                           sparse_sizes=(n, n)).fill_cache_()
    x = torch.randn(n, 8)
    layer = pma.nn.GATConv(8, 4, heads=2, add_self_loops=add_self_loops)
    params = list(layer.parameters())

    def step(model):
        out = model(x, adj)
        return out, torch.autograd.grad(out.square().sum(), params)
    torch._dynamo.reset()
    graphs._EDGES.clear()
    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    calls = _counting_build(monkeypatch)
    for _ in range(3):
        out, grads = step(compiled)
    assert len(calls) == 1
    src = graphs._edge_pair(adj)[0]
    assert [key[0][0][0] for key in graphs._EDGES] == [src.untyped_storage().data_ptr()]
    graphs.clear_cache()
    want, want_grads = step(layer)
    assert torch.allclose(out, want, atol=1e-6)
    for g, w in zip(grads, want_grads, strict=True):
        assert torch.allclose(g, w, atol=1e-5)
    if adj_type in ("EdgeIndex by col", "SparseTensor"):
        return  # (an in-place edit would break their sort order)
    edge_index[1, :5] = (edge_index[1, :5] + 1) % n  # in place (an EdgeIndex's data too)
    before = len(calls)
    out, _ = step(compiled)
    assert len(calls) == before + 1
    graphs.clear_cache()
    want, _ = step(layer)
    assert torch.allclose(out, want, atol=1e-6)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_layer_backward_reads_the_kept_graph(backend):
    """A compiled GATConv on an edge list reads the graph kept for it in
    its forward and its backward (no copy saved between them): a graph the
    cache dropped in between is converted again, the same gradients; edges
    changed in place in between fail the backward (the step keeps the edge
    tensor), not a gradient of other edges."""
    torch.manual_seed(3)
    n = 12
    edge_index = torch.randint(0, n, (2, 40))
    x = torch.randn(n, 8)
    layer = pma.nn.GATConv(8, 4, heads=2)
    params = list(layer.parameters())
    torch._dynamo.reset()
    graphs._EDGES.clear()
    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    want = torch.autograd.grad(layer(x, edge_index).square().sum(), params)
    out = compiled(x, edge_index)
    graphs._EDGES.clear()
    got = torch.autograd.grad(out.square().sum(), params)
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, atol=1e-5)
    out = compiled(x, edge_index)
    edge_index[1, :5] = (edge_index[1, :5] + 1) % n
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_compiled_layer_bias_gradient_alone():
    """A compiled GATConv on an edge list whose bias alone needs a gradient
    (the rest frozen): the gradient of eager's, from a graph kept without
    its CSC (the bias's gradient is a sum)."""
    torch.manual_seed(4)
    n = 12
    edge_index = torch.randint(0, n, (2, 40))
    x = torch.randn(n, 8)
    layer = pma.nn.GATConv(8, 4, heads=2)
    for p in (layer.lin.weight, layer.att_src, layer.att_dst):
        p.requires_grad_(False)
    torch._dynamo.reset()
    graphs._EDGES.clear()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    compiled(x, edge_index).square().sum().backward()
    got, layer.bias.grad = layer.bias.grad, None
    assert [key[-1] for key in graphs._EDGES] == [False]  # (need_csc)
    layer(x, edge_index).square().sum().backward()
    assert torch.allclose(got, layer.bias.grad, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_inference_mode_graphs_are_converted_not_cached(device):
    """Indices made under torch.inference_mode keep no version counter: the
    layer (eager, and the compile-path operator) converts them at every
    call, so an in-place edit there is seen, and the output matches the same
    graph made outside inference mode."""
    torch.manual_seed(0)
    conv = pma.nn.GATConv(8, 4, heads=2).to(device)
    x = torch.randn(10, 8, device=device)
    edge_index = torch.randint(0, 10, (2, 30), device=device)
    want = conv(x, edge_index).detach()
    with torch.inference_mode():
        frozen = edge_index.clone()
        assert torch.allclose(conv(x, frozen), want, atol=1e-6)
        frozen[1, :10] = (frozen[1, :10] + 3) % 10  # unseen by any version counter
        edited = frozen.clone()
    assert torch.allclose(conv(x, frozen), conv(x, torch.tensor(edited.tolist(), device=device)),
                          atol=1e-6)
    graphs._EDGES.clear()
    with torch.inference_mode():
        rowptr, rest = torch.ops.pyg_multihead_agg._graph_of_edges(frozen[0], frozen[1], 10, 10,
                                                                   10, False)
    assert not graphs._EDGES and rowptr.numel() == 12 and rest.numel() == 2 * 40


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(), (3,), (2, 4)])
def test_cat_rows_compiled_is_cat(shape, device):
    """cat_rows, the layers' row concatenation: torch.cat eagerly, and the
    same values (bitwise) from its element-wise form under torch.compile."""
    gen = torch.Generator().manual_seed(0)
    first = torch.randn((5,) + shape, generator=gen).to(device)
    second = torch.randn((3,) + shape, generator=gen).to(device)
    first.view(-1)[0] = -0.0
    torch._dynamo.reset()
    compiled = torch.compile(graphs.cat_rows, backend="aot_eager", fullgraph=True)
    want = torch.cat([first, second])
    for got in (graphs.cat_rows(first, second), compiled(first, second)):
        assert got.shape == want.shape and torch.equal(got, want)
        assert torch.equal(got.signbit(), want.signbit())
