"""pyg_multihead_agg.nn.GATConv against torch_geometric.nn.GATConv.

The reference is PyG's own GATConv in float64 on a plain edge_index in the
adjacency's own edge order, with the same (loaded) weights; each adjacency
type of our layer must match it in outputs, attention weights and gradients
(inputs, edge features, every parameter), and the fused operator must have
run.
"""
import copy
import pickle
from typing import NamedTuple, Optional

import pytest
import torch
import torch_geometric.nn
from conftest import DEVICES, rel_error
from torch_geometric import EdgeIndex
from torch_geometric.index import index2ptr
from torch_geometric.typing import WITH_TORCH_SPARSE, SparseTensor
from torch_geometric.utils import coalesce

from pyg_multihead_agg import graph as graphs
from pyg_multihead_agg.nn import GATConv

PLAIN_KINDS = ["edge_index", "edge_index_by_col", "edge_index_sorted", "edge_index_by_row",
               "edge_index_unsorted"]
SPARSE_KINDS = [
    pytest.param("sparse_tensor", marks=pytest.mark.skipif(
        not WITH_TORCH_SPARSE, reason="needs torch_sparse")),
    "torch_csr",
    "torch_coo",
]
KINDS = PLAIN_KINDS + SPARSE_KINDS
TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 5e-2}
OP = "pyg_multihead_agg::multihead_spmm"
OP_BACKWARD = "pyg_multihead_agg::multihead_spmm_backward_csc"
FUSED_OP = "pyg_multihead_agg::gat_attention"
FUSED_BACKWARD = "pyg_multihead_agg::gat_attention_backward"
SCORE_OPS = {"pyg_multihead_agg::_gat_scores", "pyg_multihead_agg::_gat_scores_backward"}
# The whole layer call as one op (GATConv._fused_layer), around the ops above.
LAYER_OP = "pyg_multihead_agg::_gat_conv"
# ... and the halves of its autograd node, which a training step calls.
LAYER_OPS = {LAYER_OP, "pyg_multihead_agg::_gat_conv_forward",
             "pyg_multihead_agg::_gat_conv_backward"}


def takes_layer_op(case, fold: bool, edge_attr) -> bool:
    # Where GATConv runs as _gat_conv: one feature matrix, no residual, no
    # edge features, the score products (and eager, no autocast, no hooks).
    return not (case.bipartite or fold or edge_attr is not None
                or case.kwargs.get("residual", False))


class Case(NamedTuple):
    name: str
    num_src: int
    num_dst: int
    num_edges: int
    bipartite: bool
    edge_dim: Optional[int]
    kwargs: dict


CASES = [
    Case("heads3", 30, 30, 120, False, None, dict(heads=3)),
    Case("heads1_no_loops", 25, 25, 80, False, None, dict(heads=1, add_self_loops=False)),
    Case("mean_heads", 20, 20, 60, False, None, dict(heads=4, concat=False)),
    Case("residual_no_bias", 20, 20, 60, False, None, dict(heads=2, residual=True, bias=False)),
    Case("edge_dim", 20, 20, 70, False, 3, dict(heads=2, edge_dim=3, add_self_loops=False)),
    Case("edge_dim_loops", 20, 20, 70, False, 3, dict(heads=2, edge_dim=3, fill_value="mean")),
    Case("edge_dim_loops_max", 20, 20, 70, False, 3, dict(heads=2, edge_dim=3, fill_value="max")),
    Case("edge_dim_loops_const", 20, 20, 70, False, 2, dict(heads=2, edge_dim=2, fill_value=0.5)),
    Case("bipartite", 30, 12, 80, True, None, dict(heads=2, add_self_loops=False)),
    Case("bipartite_loops", 30, 12, 80, True, None, dict(heads=2)),
    Case("bipartite_more_dst_loops", 9, 25, 80, True, None, dict(heads=2)),
    Case("isolated", 40, 40, 15, False, None, dict(heads=2, add_self_loops=False)),
    Case("no_edges", 10, 10, 0, False, None, dict(heads=2, add_self_loops=False)),
    Case("no_edges_loops", 10, 10, 0, False, None, dict(heads=2)),
    # The bias goes into the fused op, the residual is added after it.
    Case("residual_bias", 20, 20, 60, False, None, dict(heads=2, residual=True)),
    Case("mean_heads_residual", 20, 20, 60, False, None,
         dict(heads=3, concat=False, residual=True)),
]


def pyg_unsupported(case: Case, kind: str) -> bool:
    # PyG itself refuses edge features + self-loops for sparse adjacencies.
    return (case.edge_dim is not None and case.kwargs.get("add_self_loops", True)
            and kind in ("sparse_tensor", "torch_csr", "torch_coo"))


def make_graph(case: Case, seed: int):
    """Unique edges [2, E] (source, destination) sorted by (destination,
    source), some of them self-loops, with node and edge features."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, max(case.num_src, 1), (case.num_edges,), generator=gen)
    dst = torch.randint(0, max(case.num_dst, 1), (case.num_edges,), generator=gen)
    if case.num_edges:  # self-loops, which PyG removes before adding its own
        loops = torch.randint(0, min(case.num_src, case.num_dst), (case.num_edges // 10,),
                              generator=gen)
        src[:loops.numel()] = dst[:loops.numel()] = loops
    dst_src = coalesce(torch.stack([dst, src]), num_nodes=max(case.num_src, case.num_dst))
    edge_index = dst_src.flip(0)
    in_src, in_dst = 7, 5
    x_src = torch.randn(case.num_src, in_src, generator=gen, dtype=torch.float64)
    x_dst = torch.randn(case.num_dst, in_dst, generator=gen, dtype=torch.float64)
    edge_attr = None
    if case.edge_dim is not None:
        edge_attr = torch.randn(edge_index.size(1), case.edge_dim, generator=gen,
                                dtype=torch.float64)
    return edge_index, x_src, x_dst, edge_attr


def make_adj(kind: str, edge_index, num_src: int, num_dst: int, index_dtype=torch.int64,
             seed: int = 0):
    """The adjacency of `kind` for the edges of `edge_index` (CSR order), and
    the permutation from CSR order to the adjacency's own edge order (the
    order of its edge features)."""
    src, dst = edge_index[0].to(index_dtype), edge_index[1].to(index_dtype)
    num_edges = src.numel()
    identity = torch.arange(num_edges, device=src.device)
    shuffled = torch.randperm(num_edges, generator=torch.Generator().manual_seed(seed + 7))
    shuffled = shuffled.to(src.device)
    if kind == "edge_index":
        return torch.stack([src, dst])[:, shuffled], shuffled
    if kind == "edge_index_by_col":  # a plain edge list sorted by destination
        return torch.stack([src, dst]), identity
    if kind == "edge_index_sorted":
        return EdgeIndex(torch.stack([src, dst]), sparse_size=(num_src, num_dst),
                         sort_order="col"), identity
    if kind == "edge_index_by_row":
        index, perm = EdgeIndex(torch.stack([src, dst]),
                                sparse_size=(num_src, num_dst)).sort_by("row", stable=True)
        return index, perm
    if kind == "edge_index_unsorted":
        return EdgeIndex(torch.stack([src, dst])[:, shuffled],
                         sparse_size=(num_src, num_dst)), shuffled
    if kind == "sparse_tensor":
        return SparseTensor(row=dst, col=src, sparse_sizes=(num_dst, num_src),
                            is_sorted=True), identity
    value = torch.ones(num_edges, dtype=torch.float64, device=src.device)
    if kind == "torch_csr":
        rowptr = index2ptr(dst, num_dst).to(index_dtype)
        return torch.sparse_csr_tensor(rowptr, src, value, size=(num_dst, num_src)), identity
    assert kind == "torch_coo"
    return torch.sparse_coo_tensor(torch.stack([dst, src]), value, size=(num_dst, num_src),
                                   is_coalesced=True), identity


def make_layers(case: Case, seed: int):
    in_channels = (7, 5) if case.bipartite else 7
    torch.manual_seed(seed)
    ref = torch_geometric.nn.GATConv(in_channels, 6, **case.kwargs)
    ours = GATConv(in_channels, 6, **case.kwargs)
    if ref.bias is not None:  # PyG initialises the bias to zero: make it count
        with torch.no_grad():
            ref.bias.normal_(generator=torch.Generator().manual_seed(seed + 1000))
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def features(case, x_src, x_dst):
    return (x_src, x_dst) if case.bipartite else x_src


def size_arg(case, kind):
    return (case.num_src, case.num_dst) if kind in ("edge_index", "edge_index_by_col") else None


def run(layer, case, kind, adj, x_src, x_dst, edge_attr, grad_seed=0):
    """Forward + backward with a random output gradient; returns the output
    and the gradients of inputs and parameters by name."""
    x_src = x_src.detach().requires_grad_()
    x_dst = x_dst.detach().requires_grad_()
    if edge_attr is not None:
        edge_attr = edge_attr.detach().requires_grad_()
    layer.zero_grad()
    out = layer(features(case, x_src, x_dst), adj, edge_attr, size=size_arg(case, kind))
    gen = torch.Generator().manual_seed(grad_seed)
    grad = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out)
    out.backward(grad)
    grads = {"x_src": x_src.grad}
    if case.bipartite:
        grads["x_dst"] = x_dst.grad
    if edge_attr is not None:
        grads["edge_attr"] = edge_attr.grad
    for name, p in layer.named_parameters():
        grads[name.removeprefix("_orig_mod.")] = p.grad  # torch.compile's wrapper
    return out, grads


def op_events(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events() if e.name.startswith("pyg_multihead_agg::")}


def assert_matches(out, grads, ref_out, ref_grads, tol):
    assert rel_error(out, ref_out) <= tol
    assert grads.keys() == ref_grads.keys()
    for name, ref_grad in ref_grads.items():
        if ref_grad is None:  # e.g. a parameter that does not reach the output
            assert grads[name] is None or not grads[name].any(), name
            continue
        if not ref_grad.any():
            # Exactly zero: the attention parameters when every row has one
            # edge (a softmax over one logit). The fused op takes the
            # attention output as out - bias from the stored biased output,
            # so its score gradients are zero only up to that rounding.
            assert float(grads[name].abs().max()) <= tol, name
            continue
        assert rel_error(grads[name], ref_grad) <= tol, name


def reference(case, seed, kind, edge_index, x_src, x_dst, edge_attr, perm):
    """PyG's layer in float64 on the plain edge_index in the adjacency's edge
    order (edge features in that order too)."""
    ref, _ = make_layers(case, seed)
    edge_attr = None if edge_attr is None else edge_attr[perm.cpu()]
    return run(ref.double(), case, "edge_index", edge_index[:, perm.cpu()], x_src, x_dst,
               edge_attr)


def _unwrap(kind):
    return (kind.values[0], kind.marks) if hasattr(kind, "values") else (kind, ())


def _pyg_path_fails(case: Case, kind: str, fused: str) -> bool:
    # PyG's own path (fused_attention=False): its self-loops for a
    # torch.sparse adj_t with more destinations than sources index out of
    # bounds inside PyG (an IndexError on the CPU, a device-side assert on
    # CUDA), as PyG's layer does; test_pyg_path_fails_like_pyg.
    return (fused == "spmm" and kind in ("torch_csr", "torch_coo")
            and case.name == "bipartite_more_dst_loops")


MATCH_CASES = [
    pytest.param(case, name, fused, id=f"{case.name}-{name}-{fused_id}", marks=marks)
    for case in CASES for name, marks in map(_unwrap, KINDS)
    for fused, fused_id in (("fold", "fused_attention"), ("unfolded", "fused_unfolded_scores"),
                            ("spmm", "spmm"))
    if not _pyg_path_fails(case, name, fused)]


@pytest.mark.sweep
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case,kind,fused", MATCH_CASES)
def test_matches_pyg(case, kind, fused, dtype, device):
    seed = 1 + CASES.index(case)
    edge_index, x_src, x_dst, edge_attr = make_graph(case, seed)
    _, ours = make_layers(case, seed)
    adj, perm = make_adj(kind, edge_index.to(device), case.num_src, case.num_dst)
    to = dict(device=device, dtype=dtype)
    ours_attr = None if edge_attr is None else edge_attr[perm.cpu()].to(**to)
    if pyg_unsupported(case, kind):
        # PyG refuses edge_attr with self-loops for sparse adjacencies; so do
        # we, with a message.
        with pytest.raises(NotImplementedError, match="edge_attr"):
            run(ours, case, kind, adj, x_src.float(), x_dst.float(), ours_attr.float())
        return
    ref_out, ref_grads = reference(case, seed, kind, edge_index, x_src, x_dst, edge_attr, perm)

    ours = ours.to(device, dtype)
    ours.fused_attention = fused != "spmm"
    ours.fold_scores = fused == "fold"  # forced either way: the graphs here are small
    result = {}
    events = op_events(lambda: result.update(out_grads=run(
        ours, case, kind, adj, x_src.to(**to), x_dst.to(**to), ours_attr)))
    out, grads = result["out_grads"]
    assert out.dtype == dtype and out.device.type == device
    assert_matches(out, grads, ref_out, ref_grads, TOL[dtype])
    if fused != "spmm":
        # the scores as PyG's products (unfolded; edge scores always) in their own op
        scores = fused == "unfolded" or ours_attr is not None
        layer_op = takes_layer_op(case, fused == "fold", ours_attr)
        assert events == ({FUSED_OP, FUSED_BACKWARD} | (SCORE_OPS if scores else set())
                          | (LAYER_OPS if layer_op else set()))


@pytest.mark.parametrize("kind", ["torch_csr", "torch_coo"])
def test_pyg_path_fails_like_pyg(kind):
    """fused_attention=False runs PyG's self-loop code, which fails on a
    torch.sparse adj_t with more destinations than sources exactly as PyG's
    own layer does (CPU only: on CUDA PyG's failure is a device-side assert,
    which would end the process's CUDA context). The fused path serves it."""
    case = next(c for c in CASES if c.name == "bipartite_more_dst_loops")
    edge_index, x_src, x_dst, _ = make_graph(case, 3)
    ref, ours = make_layers(case, 3)
    adj, _ = make_adj(kind, edge_index, case.num_src, case.num_dst)
    x = (x_src.float(), x_dst.float())
    with pytest.raises(RuntimeError) as theirs:
        ref(x, adj)
    ours.fused_attention = False
    with pytest.raises(RuntimeError) as mine:
        ours(x, adj)
    assert str(mine.value) == str(theirs.value)
    ours.fused_attention = True
    assert_matches(*run(ours.double(), case, kind, adj, x_src, x_dst, None),
                   *reference(case, 3, kind, edge_index, x_src, x_dst, None,
                              torch.arange(edge_index.size(1))), 1e-12)


@pytest.mark.parametrize("kind", ["edge_index", "edge_index_sorted", "torch_csr", "torch_coo"])
def test_int32_indices(kind):
    case = CASES[0]
    edge_index, x_src, x_dst, _ = make_graph(case, 3)
    _, ours = make_layers(case, 3)
    adj, perm = make_adj(kind, edge_index, case.num_src, case.num_dst, index_dtype=torch.int32)
    out, grads = run(ours.double(), case, kind, adj, x_src, x_dst, None)
    ref_out, ref_grads = reference(case, 3, kind, edge_index, x_src, x_dst, None, perm)
    assert rel_error(out, ref_out) <= 1e-12
    assert rel_error(grads["x_src"], ref_grads["x_src"]) <= 1e-12


def cached_graph(adj) -> graphs.Graph:
    (graph,) = [value for _, value in graphs._CACHE[id(adj)].values()
                if isinstance(value, graphs.Graph)]
    return graph


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind,fused", [
    (kind, fused) for kind in ("edge_index", "edge_index_sorted", "torch_csr", "torch_coo")
    for fused in (True, False)
    # Without fused attention a plain edge_index takes PyG's own path: no
    # prepared graph.
    if fused or kind != "edge_index"],
    ids=lambda v: v if isinstance(v, str) else ("fused" if v else "spmm"))
def test_int64_graph_cached_as_int32_on_cuda(kind, fused, monkeypatch):
    """On CUDA the prepared graph holds an int64 adjacency's CSR and CSC in
    int32 (the kernels' faster path), with the inverse of the CSC's perm
    (the fused backward's CSC-ordered logit gradients, or the spmm
    backward's CSC-ordered weight gradient without fused attention) from
    the graph's second backward on; outputs and gradients are those of the
    int64 indices and of the backward without perm_inv, bit for bit."""
    case = CASES[1] if not fused else CASES[0]  # spmm: PyG adds no self-loops to EdgeIndex
    edge_index, x_src, x_dst, _ = make_graph(case, 31)
    _, layer = make_layers(case, 31)
    results = {}
    for variant in ("int32", "int32_no_perm_inv", "int64"):
        if variant == "int32_no_perm_inv":
            monkeypatch.setattr(graphs, "invert_perm", lambda perm: None)
        if variant == "int64":
            monkeypatch.undo()
            monkeypatch.setattr(graphs, "_index_dtype", lambda device, *sizes: torch.int64)
        ours = copy.deepcopy(layer).cuda()
        ours.fused_attention = fused
        adj, _ = make_adj(kind, edge_index.cuda(), case.num_src, case.num_dst)
        first = run(ours, case, kind, adj, x_src.float().cuda(), x_dst.float().cuda(), None)
        assert cached_graph(adj).perm_inv is None  # a graph used once skips it
        results[variant] = run(ours, case, kind, adj, x_src.float().cuda(),
                               x_dst.float().cuda(), None)
        if fused:
            assert torch.equal(first[0], results[variant][0])
        else:  # PyG's softmax around the op uses atomics
            torch.testing.assert_close(first[0], results[variant][0], rtol=1e-5, atol=1e-6)
        graph = cached_graph(adj)
        (colptr, row, perm), perm_inv = graph.csc, graph.perm_inv
        expected = torch.int64 if variant == "int64" else torch.int32
        assert {t.dtype for t in (graph.rowptr, graph.col, colptr, row, perm)} == {expected}
        if variant == "int32_no_perm_inv":
            assert perm_inv is None
        else:
            assert perm_inv.dtype == expected
            assert torch.equal(perm[perm_inv.long()].long(),
                               torch.arange(perm.numel(), device=perm.device))
    out32, grads32 = results["int32"]
    for variant in ("int32_no_perm_inv", "int64"):
        out, grads = results[variant]
        assert torch.equal(out32, out), variant
        for name, grad in grads.items():
            if fused:
                assert torch.equal(grads32[name], grad), (variant, name)
            else:  # PyG's softmax and score gathers around the op use atomics
                torch.testing.assert_close(grads32[name], grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_bfloat16_loosely(kind):
    case = CASES[0]
    edge_index, x_src, x_dst, _ = make_graph(case, 4)
    _, ours = make_layers(case, 4)
    adj, perm = make_adj(kind, edge_index, case.num_src, case.num_dst)
    out, grads = run(ours.to(torch.bfloat16), case, kind, adj, x_src.bfloat16(),
                     x_dst.bfloat16(), None)
    ref_out, ref_grads = reference(case, 4, kind, edge_index, x_src, x_dst, None, perm)
    assert out.dtype == torch.bfloat16
    assert rel_error(out, ref_out) <= TOL[torch.bfloat16]
    assert rel_error(grads["lin.weight"], ref_grads["lin.weight"]) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("fused", [True, False], ids=["fused_attention", "spmm"])
@pytest.mark.parametrize("add_self_loops", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_fused_operator_runs(kind, add_self_loops, fused):
    case = CASES[0]._replace(kwargs=dict(heads=3, add_self_loops=add_self_loops))
    edge_index, x_src, x_dst, _ = make_graph(case, 5)
    _, ours = make_layers(case, 5)
    ours.fused_attention = fused
    adj, _ = make_adj(kind, edge_index, case.num_src, case.num_dst)
    events = op_events(lambda: run(ours, case, kind, adj, x_src.float(), x_dst.float(), None))
    if fused:
        # Softmax + aggregation in one op; backward over the prepared CSC; the
        # scores (PyG's products on a graph this small) in their own op; the
        # whole call (one feature matrix) as one op around them.
        assert events == {FUSED_OP, FUSED_BACKWARD} | LAYER_OPS | SCORE_OPS
    elif kind in ("sparse_tensor", "torch_csr", "torch_coo") or (
            kind == "edge_index_sorted" and not add_self_loops):
        # PyG's softmax; the aggregation on the CSR, backward over the CSC.
        assert events == {OP, OP_BACKWARD}
    else:  # PyG's gather/scatter (its self-loops unsort an EdgeIndex)
        assert events == set()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["edge_index", "edge_index_sorted", "torch_csr"])
def test_fused_layer_saves_its_output_once(kind, device):
    """The op adds the bias and autograd keeps its output, which the layer
    returns (concat=True, no residual): of the tensors saved for the
    backward, the only ones of N x H * C elements are x @ W and that output
    (the same storage). With the bias added after the op, autograd kept the
    attention output besides the returned biased copy."""
    heads, channels, num_nodes = 8, 16, 200
    case = Case("memory", num_nodes, num_nodes, 400, False, None, {})
    edge_index, x_src, _, _ = make_graph(case, 41)
    torch.manual_seed(41)
    ours = GATConv(7, channels, heads=heads, add_self_loops=False).to(device)
    with torch.no_grad():
        ours.bias.normal_()
    adj, _ = make_adj(kind, edge_index.to(device), num_nodes, num_nodes)
    x = x_src.float().to(device).requires_grad_()
    projected = []
    hook = ours.lin.register_forward_hook(lambda module, args, output: projected.append(output))
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = ours(x, adj)
    hook.remove()
    assert FUSED_OP in op_events(lambda: ours(x, adj))
    big = num_nodes * heads * channels
    storages = {}  # data_ptr -> bytes, each storage once
    for t in saved:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    big_ptrs = {t.untyped_storage().data_ptr() for t in saved if t.numel() == big}
    (xw,) = projected
    assert out.shape == (num_nodes, heads * channels)
    assert big_ptrs == {xw.untyped_storage().data_ptr(), out.untyped_storage().data_ptr()}
    total = sum(storages.values())
    big_bytes = big * out.element_size()
    # Everything else saved (indices, scores, lse, x, weights) is smaller
    # than one more output.
    assert total - 2 * big_bytes < big_bytes, (total, big_bytes)
    out.square().sum().backward()
    assert ours.bias.grad is not None and x.grad is not None


def _observed_copy(layer):
    # The same layer with a forward pre-hook on its projection that changes
    # nothing: the hook must see the call, so the layer takes its steps, not
    # _gat_conv.
    steps = copy.deepcopy(layer)
    steps.lin.register_forward_pre_hook(lambda module, args: None)
    return steps


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("concat,bias,loops,dropout,x_grad,checked", [
    (True, True, True, 0.0, True, True), (False, True, True, 0.0, True, True),
    (True, False, False, 0.0, False, True), (False, False, True, 0.5, True, True),
    (True, True, True, 0.5, False, True), (True, True, True, 0.5, True, False),
    (False, True, True, 0.0, True, False)])
def test_layer_op_matches_the_steps(concat, bias, loops, dropout, x_grad, checked, device):
    """_gat_conv (the whole call as one op) against the same layer's steps
    (projection, score op, attention op), from one state, in float64: output
    and every gradient, the dropout masks included (the same Philox key for
    the same seed). Without the index check (checked=False) the caller's own
    self-loops go to a spare row, which the op scores 0 and drops."""
    case = CASES[0]
    edge_index, x, _, _ = make_graph(case, 11)
    if not checked:  # with own self-loops, so that the spare row has edges
        edge_index = torch.cat([edge_index, torch.arange(3).repeat(2, 1)], dim=1)
    torch.manual_seed(11)
    layer = GATConv(7, 6, heads=3, concat=concat, bias=bias, add_self_loops=loops,
                    dropout=dropout).double().to(device)
    if bias:
        with torch.no_grad():
            layer.bias.normal_()
    steps = _observed_copy(layer)
    adj = edge_index.to(device)
    grad = torch.randn(case.num_src, 18 if concat else 6, dtype=torch.float64, device=device)
    results = []
    for model, op_expected in ((layer, True), (steps, False)):
        xi = x.to(device).requires_grad_(x_grad)
        torch.manual_seed(5)  # the dropout key
        graphs.clear_cache()
        graphs.set_index_check(checked)
        try:
            events = op_events(lambda m=model, xi=xi: results.append(m(xi, adj)))
            assert graphs.prepare(adj, case.num_src, case.num_src,
                                  self_loops=case.num_src if loops else None
                                  ).has_spare_row == (loops and not checked)
        finally:
            graphs.set_index_check(True)
        assert (LAYER_OP in events) == op_expected and FUSED_OP in events
        out = results[-1]
        inputs = [p for p in model.parameters()] + ([xi] if x_grad else [])
        results[-1] = (out, torch.autograd.grad(out, inputs, grad))
    (out, grads), (ref, ref_grads) = results
    assert rel_error(out, ref) <= 1e-12
    for g, r in zip(grads, ref_grads, strict=True):
        assert rel_error(g, r) <= 1e-12


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("concat", [True, False])
@pytest.mark.parametrize("with_csc", [True, False])
@pytest.mark.parametrize("spare_row", [False, True])
def test_layer_op_gradcheck(concat, with_csc, spare_row, device):
    gen = torch.Generator().manual_seed(3)
    num_nodes, heads, channels = 9, 2, 3
    edge_index = torch.randint(0, num_nodes, (2, 30), generator=gen)
    edge_index = torch.cat([edge_index, torch.arange(3).repeat(2, 1)], dim=1).to(device)
    graphs.set_index_check(not spare_row)  # unchecked: own self-loops to a spare row
    try:
        g = graphs.prepare(edge_index, num_nodes, num_nodes, self_loops=num_nodes)
    finally:
        graphs.set_index_check(True)
    assert g.has_spare_row == spare_row
    csc = g.csc if with_csc else (None, None, None)

    def leaf(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device).requires_grad_()

    x, weight = leaf(num_nodes, 4), leaf(heads * channels, 4)
    att_src, att_dst = leaf(1, heads, channels), leaf(1, heads, channels)
    bias = leaf(heads * channels if concat else channels)
    philox = torch.tensor([7, 0])

    def fn(x, weight, att_src, att_dst, bias):
        return torch.ops.pyg_multihead_agg._gat_conv(
            x, weight, att_src, att_dst, bias, g.rowptr, g.col, *csc, None, concat, 0.2, 0.3,
            philox)

    assert torch.autograd.gradcheck(fn, (x, weight, att_src, att_dst, bias))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_layer_op_backward_allocates_one_feature_sized_gradient():
    """_gat_conv's backward, while the caller still holds the layer's
    gradient [N, H * C] (concat), allocates one [N, H, C] tensor (h's
    gradient; the scores' share is added into it in place), not two:
    measured as the second step's backward peak above what was allocated
    before it (a first backward may make what is made once, such as the
    backward thread's cuBLAS workspace), on a graph whose edges
    weigh little next to N * H * C. Without a bias: its gradient, PyTorch's
    column sum of the layer's gradient, stages partial sums in a buffer of
    its own, 2.0x N * H * C at this size on the H100 (freed before h's
    gradient is made; PyG's layer sums the same way). (Averaged heads hold
    an [N, C] gradient; the attention backward's contiguous copy of its
    head broadcast is then the second, as before.)"""
    num_nodes, heads, channels = 20000, 4, 64
    gen = torch.Generator().manual_seed(6)
    edge_index = torch.randint(0, num_nodes, (2, 40000), generator=gen).cuda()
    torch.manual_seed(6)
    layer = GATConv(16, channels, heads=heads, bias=False).cuda()
    x = torch.randn(num_nodes, 16, device="cuda")
    events = op_events(lambda: layer(x, edge_index))
    assert LAYER_OP in events
    for _ in range(2):
        out = layer(x, edge_index)
        grad = torch.ones_like(out)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out.backward(grad)
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - before
        del out, grad
    feature_sized = num_nodes * heads * channels * 4
    assert feature_sized <= extra < 1.5 * feature_sized, extra / feature_sized
    assert layer.lin.weight.grad is not None


def test_layer_op_names_a_graph_of_other_rows():
    x, weight = torch.randn(4, 3), torch.randn(6, 3)
    att = torch.randn(1, 2, 3)
    rowptr, col = torch.zeros(7, dtype=torch.long), torch.zeros(0, dtype=torch.long)  # 6 rows
    with pytest.raises(RuntimeError, match="rowptr must describe 4 rows"):
        torch.ops.pyg_multihead_agg._gat_conv(x, weight, att, att, None, rowptr, col, None, None,
                                              None, None, True, 0.2, 0.0, None)


@pytest.mark.parametrize("concat", [True, False])
def test_layer_op_opcheck(concat):
    num_nodes = 8
    edge_index = torch.randint(0, num_nodes, (2, 20), generator=torch.Generator().manual_seed(1))
    g = graphs.prepare(edge_index, num_nodes, num_nodes, self_loops=num_nodes)
    args = (torch.randn(num_nodes, 5, requires_grad=True), torch.randn(6, 5, requires_grad=True),
            torch.randn(1, 2, 3, requires_grad=True), torch.randn(1, 2, 3, requires_grad=True),
            torch.randn(6 if concat else 3, requires_grad=True), g.rowptr, g.col, *g.csc, None,
            concat, 0.2, 0.0, None)
    torch.library.opcheck(torch.ops.pyg_multihead_agg._gat_conv.default, args)


@pytest.mark.parametrize("concat,bias,spare_row", [(True, True, False), (False, True, True),
                                                    (True, False, True)])
def test_layer_op_halves_opcheck(concat, bias, spare_row):
    """_gat_conv_forward and _gat_conv_backward, the halves that a compiled
    graph calls: schema, fake implementations (static and dynamic shapes)
    and the refusal of their own autograd, by torch.library.opcheck; the
    backward's results against _gat_conv's autograd."""
    num_nodes, heads, channels = 8, 2, 3
    gen = torch.Generator().manual_seed(1)
    edge_index = torch.randint(0, num_nodes, (2, 20), generator=gen)
    edge_index = torch.cat([edge_index, torch.arange(2).repeat(2, 1)], dim=1)
    graphs.set_index_check(not spare_row)
    try:
        g = graphs.prepare(edge_index, num_nodes, num_nodes, self_loops=num_nodes)
    finally:
        graphs.set_index_check(True)
    assert g.has_spare_row == spare_row
    x, weight = torch.randn(num_nodes, 5, generator=gen), torch.randn(heads * channels, 5,
                                                                      generator=gen)
    att_src, att_dst = torch.randn(1, heads, channels, generator=gen), torch.randn(
        1, heads, channels, generator=gen)
    b = torch.randn(heads * channels if concat else channels, generator=gen) if bias else None
    graph_args = (g.rowptr, g.col, *g.csc, None, concat, 0.2, 0.25, torch.tensor([3, 0]))
    fwd = torch.ops.pyg_multihead_agg._gat_conv_forward.default
    torch.library.opcheck(fwd, (x, weight, att_src, att_dst, b) + graph_args)
    out, h, s_src, s_dst, lse = fwd(x, weight, att_src, att_dst, b, *graph_args)
    assert out.shape == (g.rowptr.numel() - 1, heads, channels)
    result = out[:num_nodes].reshape(num_nodes, -1) if concat else out[:num_nodes].mean(1)
    grad = torch.randn(result.shape, generator=gen)
    bwd = torch.ops.pyg_multihead_agg._gat_conv_backward.default
    kept = result if concat else out
    bwd_args = (grad, x, weight, att_src, att_dst, b, h, s_src, s_dst, kept, lse) + graph_args \
        + ([True, True, True, True, bias],)
    torch.library.opcheck(bwd, bwd_args)
    grads = bwd(*bwd_args)
    leaves = [t.clone().requires_grad_() for t in (x, weight, att_src, att_dst)]
    leaves += [b.clone().requires_grad_()] if bias else []
    ref = torch.ops.pyg_multihead_agg._gat_conv(*leaves[:4], leaves[4] if bias else None,
                                                *graph_args)
    ref_grads = torch.autograd.grad(ref, leaves, grad)
    for got, want in zip(grads[:len(leaves)], ref_grads, strict=True):  # (no bias: no slot)
        assert rel_error(got, want) <= 1e-6
    assert bias or grads[4].numel() == 0
    if concat and spare_row:
        # The layer's result copied (its storage without the spare row's
        # output): a zero row stands for it, the same gradients.
        copied = bwd(*bwd_args[:9], kept.clone(), *bwd_args[10:])
        for got, want in zip(copied, grads, strict=True):
            assert torch.equal(got, want)
    partial = bwd(*bwd_args[:-1], [False, True, False, False, False])
    assert [t.numel() for t in partial] == [0, weight.numel(), 0, 0, 0]
    assert rel_error(partial[1], ref_grads[1]) <= 1e-6


@pytest.mark.parametrize("concat,loops", [(True, 8), (False, 8), (True, -1)])
def test_layer_op_on_edges_opcheck(concat, loops):
    """_gat_conv_edges_forward and _gat_conv_edges_backward, which a compiled
    GATConv on an edge list calls: schema, fakes and the refusal of their
    own autograd, by torch.library.opcheck; bitwise the results of
    _gat_conv's halves on the graph kept for the edge list, and again after
    the cache dropped it (the backward converts it again)."""
    num_nodes, heads, channels = 8, 2, 3
    gen = torch.Generator().manual_seed(2)
    edge_index = torch.randint(0, num_nodes, (2, 20), generator=gen)
    edge_index = torch.cat([edge_index, torch.arange(2).repeat(2, 1)], dim=1)  # own loops
    x, weight = torch.randn(num_nodes, 5, generator=gen), torch.randn(heads * channels, 5,
                                                                      generator=gen)
    att_src, att_dst = torch.randn(1, heads, channels, generator=gen), torch.randn(
        1, heads, channels, generator=gen)
    b = torch.randn(heads * channels if concat else channels, generator=gen)
    params = (x, weight, att_src, att_dst, b)
    settings = (concat, 0.2, 0.25, torch.tensor([3, 0]))
    graphs._EDGES.clear()
    fwd = torch.ops.pyg_multihead_agg._gat_conv_edges_forward.default
    fwd_args = params + (edge_index, None, loops, True) + settings
    torch.library.opcheck(fwd, fwd_args)
    got = fwd(*fwd_args)
    g = graphs.kept_graph(edge_index, None, num_nodes, num_nodes, loops, True)
    assert g.has_spare_row == (loops >= 0)
    graph_args = (g.rowptr, g.col, *g.csc, g.perm_inv)
    want = torch.ops.pyg_multihead_agg._gat_conv_forward(*params, *graph_args, *settings)
    for a, w in zip(got, want, strict=True):
        assert a.shape == w.shape and torch.equal(a, w)
    out, h, s_src, s_dst, lse = got
    result = out[:num_nodes].reshape(num_nodes, -1) if concat else out[:num_nodes].mean(1)
    saved = (h, s_src, s_dst, result if concat else out, lse)
    grad = torch.randn(result.shape, generator=gen)
    mask = [True, True, True, True, True]
    bwd = torch.ops.pyg_multihead_agg._gat_conv_edges_backward.default
    bwd_args = (grad,) + params + saved + (edge_index, None, loops) + settings + (mask,)
    torch.library.opcheck(bwd, bwd_args)
    want = torch.ops.pyg_multihead_agg._gat_conv_backward(grad, *params, *saved, *graph_args,
                                                          *settings, mask)
    for dropped in (False, True):
        if dropped:
            graphs._EDGES.clear()
        for a, w in zip(bwd(*bwd_args), want, strict=True):
            assert torch.equal(a, w)


@pytest.mark.parametrize("concat", [True, False])
def test_layer_op_output_changed_in_place_fails_the_backward(concat):
    """The op keeps its output (concat: the attention output's memory) for
    the backward: changing it in place is an error, not a wrong gradient."""
    case = CASES[0]
    edge_index, x, _, _ = make_graph(case, 2)
    layer = GATConv(7, 6, heads=3, concat=concat)
    out = layer(x.float(), edge_index)
    assert "GatConv" in out.grad_fn.name()  # the op's one autograd node
    out.add_(1.0)
    if concat:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()
    else:  # the mean is a new tensor: the op keeps the attention output instead
        out.sum().backward()
        assert layer.lin.weight.grad is not None


def test_layer_op_only_where_nothing_observes_it():
    """The layer takes its steps wherever a piece is observable or the op
    does not apply: a hook on the projection (it runs), autocast, a residual,
    attention weights, edge features, a bipartite input."""
    case = CASES[0]
    edge_index, x, _, _ = make_graph(case, 4)
    x = x.float()
    torch.manual_seed(4)
    layer = GATConv(7, 6, heads=3)
    assert LAYER_OP in op_events(lambda: layer(x, edge_index))
    calls = []
    hook = layer.lin.register_forward_hook(lambda *args: calls.append(1))
    assert LAYER_OP not in op_events(lambda: layer(x, edge_index)) and calls == [1]
    hook.remove()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert LAYER_OP not in op_events(lambda: layer(x, edge_index))
    assert LAYER_OP not in op_events(lambda: layer(x, edge_index, return_attention_weights=True))
    residual = GATConv(7, 6, heads=3, residual=True)
    assert LAYER_OP not in op_events(lambda: residual(x, edge_index))
    with_edges = GATConv(7, 6, heads=3, edge_dim=2)
    events = op_events(lambda: with_edges(x, edge_index, torch.randn(edge_index.size(1), 2)))
    assert LAYER_OP not in events and FUSED_OP in events
    assert LAYER_OP in op_events(lambda: with_edges(x, edge_index))  # no edge features given
    bipartite = GATConv((7, 7), 6, heads=3)
    assert LAYER_OP not in op_events(lambda: bipartite((x, x), edge_index))


def test_fused_attention_is_a_constructor_argument():
    assert GATConv(4, 2).fused_attention is True
    assert GATConv(4, 2, heads=2, fused_attention=False).fused_attention is False


@pytest.mark.parametrize("kind", ["edge_index", "edge_index_sorted", "torch_csr"])
def test_hooks_and_explain_take_pyg_path(kind):
    # PyG's hooks must see PyG's calls: with a hook the fused op stays out.
    case = CASES[0]
    edge_index, x_src, x_dst, _ = make_graph(case, 25)
    ref, ours = make_layers(case, 25)
    adj, perm = make_adj(kind, edge_index, case.num_src, case.num_dst)
    seen = []
    handle = ours.register_propagate_forward_hook(lambda *args: seen.append(1))
    events = op_events(lambda: run(ours, case, kind, adj, x_src.float(), x_dst.float(), None))
    handle.remove()
    assert seen and FUSED_OP not in events
    events = op_events(lambda: run(ours, case, kind, adj, x_src.float(), x_dst.float(), None))
    assert FUSED_OP in events
    if kind == "edge_index":
        # decomposed_layers > 1 is PyG's path, which fails as PyG's own layer
        # does: its decomposition chunks every propagate argument, and x is
        # a pair.
        ours.decomposed_layers = ref.decomposed_layers = 2
        with pytest.raises(AttributeError) as theirs:
            ref.float()(x_src.float(), edge_index[:, perm])
        with pytest.raises(AttributeError) as mine:
            ours(x_src.float(), adj, size=size_arg(case, kind))
        assert str(mine.value) == str(theirs.value)


@pytest.mark.parametrize("kind", ["edge_index", "torch_csr"])
def test_explain_masks_reach_pyg_path(kind):
    """The explainer's edge mask scales PyG's messages in our layer as in
    PyG's, also when a PyG GATConv was built first (make_layers builds it
    first), whose generated propagate knows no explainer."""
    from torch_geometric.explain.algorithm.utils import clear_masks, set_masks

    case = CASES[0]
    edge_index, x_src, _, _ = make_graph(case, 27)
    ref, ours = make_layers(case, 27)
    adj, perm = make_adj(kind, edge_index, case.num_src, case.num_dst)
    x = x_src.float()
    unmasked = ours(x, adj)
    mask = torch.rand(edge_index.size(1), generator=torch.Generator().manual_seed(3))
    set_masks(ours, mask, edge_index[:, perm], apply_sigmoid=True)
    set_masks(ref, mask, edge_index[:, perm], apply_sigmoid=True)
    events = op_events(lambda: ours(x, adj))
    out = ours(x, adj)
    assert FUSED_OP not in events
    assert rel_error(out, ref(x, adj)) <= 1e-6
    assert rel_error(out, unmasked) > 1e-3
    clear_masks(ours)
    assert FUSED_OP in op_events(lambda: ours(x, adj))


def same_structure(ours, pyg):
    """Our returned graph equals PyG's: type, layout and index values."""
    assert type(ours) is type(pyg)
    if isinstance(ours, SparseTensor):
        for a, b in zip(ours.coo()[:2], pyg.coo()[:2], strict=True):
            assert torch.equal(a, b)
        return
    assert ours.layout == pyg.layout
    if ours.layout == torch.sparse_csr:
        assert torch.equal(ours.crow_indices(), pyg.crow_indices())
        assert torch.equal(ours.col_indices(), pyg.col_indices())
    elif ours.layout == torch.sparse_coo:
        assert torch.equal(ours._indices(), pyg._indices())
    else:
        assert torch.equal(ours.as_subclass(torch.Tensor), pyg.as_subclass(torch.Tensor))


def weights_of(att):
    if isinstance(att, SparseTensor):
        return att.storage.value()
    return att[1]


# (PyG refuses edge features with self-loops for sparse adjacencies.)
ATTENTION_CASES = [
    pytest.param(case, name, id=f"{case.name}-{name}", marks=marks)
    for case in CASES if case.name in (
        "heads3", "edge_dim", "edge_dim_loops", "bipartite_loops", "no_edges", "no_edges_loops")
    for name, marks in map(_unwrap, KINDS) if not pyg_unsupported(case, name)]


@pytest.mark.parametrize("case,kind", ATTENTION_CASES)
def test_attention_weights(case, kind):
    """return_attention_weights: PyG's structure (self-loops where PyG puts
    them, the same index values, the same types) and PyG's weights, from
    PyG's layer on the same adjacency."""
    edge_index, x_src, x_dst, edge_attr = make_graph(case, 6)
    ref, ours = make_layers(case, 6)
    ref, ours = ref.double(), ours.double()
    adj, perm = make_adj(kind, edge_index, case.num_src, case.num_dst)
    if edge_attr is not None:
        edge_attr = edge_attr[perm]
    x = features(case, x_src, x_dst)
    size = size_arg(case, kind)
    events = op_events(lambda: ours(x, adj, edge_attr, size=size, return_attention_weights=True))
    assert FUSED_OP in events
    out, att = ours(x, adj, edge_attr, size=size, return_attention_weights=True)
    ref_out, ref_att = ref(x, adj, edge_attr, size=size, return_attention_weights=True)
    assert rel_error(out, ref_out) <= 1e-12
    if isinstance(att, tuple):
        assert isinstance(ref_att, tuple)
        same_structure(att[0], ref_att[0])
    else:
        same_structure(att, ref_att)
    assert rel_error(weights_of(att), weights_of(ref_att)) <= 1e-12


@pytest.mark.parametrize("kind", ["edge_index", "edge_index_sorted", "torch_csr"])
def test_dropout_in_training_unfused_matches_pyg(kind):
    case = CASES[0]._replace(kwargs=dict(heads=3, dropout=0.5, add_self_loops=False))
    edge_index, x_src, _, _ = make_graph(case, 7)
    ref, ours = make_layers(case, 7)
    ours.fused_attention = False
    adj, _ = make_adj(kind, edge_index, case.num_src, case.num_dst)
    ours.eval()
    eval_out = ours(x_src.float(), adj)
    ours.train()
    ref.train()
    # Same edge order and same RNG stream: PyG draws the same dropout mask.
    torch.manual_seed(11)
    out = ours(x_src.float(), adj)
    torch.manual_seed(11)
    pyg_out = ref(x_src.float(), adj)
    assert rel_error(out, pyg_out) <= 1e-5
    assert rel_error(out, eval_out) > 1e-2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["edge_index", "edge_index_sorted", "torch_csr"])
def test_dropout_in_training_fused(kind, device):
    # The fused op draws its mask from Philox, keyed by torch's RNG: seeded
    # runs repeat, the mask changes the output, and the gradient is that of
    # the same masked function (checked by gradcheck in float64).
    case = CASES[0]._replace(kwargs=dict(heads=3, dropout=0.5, add_self_loops=False))
    edge_index, x_src, _, _ = make_graph(case, 7)
    _, ours = make_layers(case, 7)
    ours = ours.double().to(device)
    adj, _ = make_adj(kind, edge_index.to(device), case.num_src, case.num_dst)
    x = x_src.to(device)
    ours.eval()
    eval_out = ours(x, adj)
    ours.train()

    def seeded(inp):
        torch.manual_seed(11)
        return ours(inp, adj)

    events = op_events(lambda: seeded(x))
    assert FUSED_OP in events
    out = seeded(x)
    torch.testing.assert_close(seeded(x), out, rtol=0, atol=0)
    assert rel_error(out, eval_out) > 1e-2
    torch.manual_seed(12)
    assert rel_error(ours(x, adj), out) > 1e-2
    assert torch.autograd.gradcheck(seeded, (x.clone().requires_grad_(),), eps=1e-6,
                                    atol=1e-6, nondet_tol=0.0)


@pytest.mark.parametrize("kind", ["edge_index", "edge_index_sorted", "torch_csr"])
def test_attention_weights_with_dropout_in_training(kind):
    # Attention after dropout is PyG's path (the fused op keeps no mask).
    case = CASES[0]._replace(kwargs=dict(heads=3, dropout=0.5, add_self_loops=False))
    edge_index, x_src, _, _ = make_graph(case, 8)
    ref, ours = make_layers(case, 8)
    adj, _ = make_adj(kind, edge_index, case.num_src, case.num_dst)
    torch.manual_seed(3)
    out, att = ours(x_src.float(), adj, return_attention_weights=True)
    torch.manual_seed(3)
    ref_out, ref_att = ref(x_src.float(), adj, return_attention_weights=True)
    assert rel_error(out, ref_out) <= 1e-5
    assert rel_error(weights_of(att), weights_of(ref_att)) <= 1e-5


def test_sparse_tensor_edge_attr_with_self_loops_raises_like_pyg():
    pytest.importorskip("torch_sparse")
    case = CASES[5]
    edge_index, x_src, x_dst, edge_attr = make_graph(case, 8)
    _, ours = make_layers(case, 8)
    adj, _ = make_adj("sparse_tensor", edge_index, case.num_src, case.num_dst)
    with pytest.raises(NotImplementedError, match="edge_attr"):
        ours(x_src.float(), adj, edge_attr.float())


def test_container_caches_are_reused():
    case = CASES[1]
    edge_index, x_src, _, _ = make_graph(case, 9)
    _, ours = make_layers(case, 9)
    x = x_src.float()
    adj, _ = make_adj("edge_index_sorted", edge_index, case.num_src, case.num_dst)
    ours(x, adj).sum().backward()
    perm, indptr = adj._T_perm, adj._T_indptr
    assert perm is not None and indptr is not None
    ours(x, adj).sum().backward()
    assert adj._T_perm is perm and adj._T_indptr is indptr
    if WITH_TORCH_SPARSE:
        adj, _ = make_adj("sparse_tensor", edge_index, case.num_src, case.num_dst)
        ours(x, adj).sum().backward()
        csr2csc, colptr = adj.storage._csr2csc, adj.storage._colptr
        assert csr2csc is not None and colptr is not None
        ours(x, adj).sum().backward()
        assert adj.storage._csr2csc is csr2csc and adj.storage._colptr is colptr


def test_edge_index_without_sparse_size():
    # Trailing isolated nodes: the inferred sparse size is too small.
    case = Case("trailing", 12, 12, 20, False, None, dict(heads=2, add_self_loops=False))
    edge_index, x_src, x_dst, _ = make_graph(case, 10)
    edge_index = edge_index[:, (edge_index < 8).all(0)]
    ref, ours = make_layers(case, 10)
    adj = EdgeIndex(edge_index, sort_order="col")
    out = ours(x_src.float(), adj)
    assert rel_error(out, ref(x_src.float(), edge_index)) <= 1e-5


def test_repr():
    assert repr(GATConv(16, 8, heads=4)) == "GATConv(16, 8, heads=4)"
    assert repr(GATConv((16, 4), 8)) == "GATConv((16, 4), 8, heads=1)"


def test_state_dict_names_match_pyg():
    kwargs = dict(heads=2, edge_dim=3, residual=True)
    ref = torch_geometric.nn.GATConv((4, 5), 6, **kwargs)
    ours = GATConv((4, 5), 6, **kwargs)
    assert ref.state_dict().keys() == ours.state_dict().keys()


# Graph preparation: once per adjacency object, shared by the layers, redone
# for a new object or after an in-place edit of its indices.

def count_builds(monkeypatch):
    calls = []
    original = graphs._build

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(graphs, "_build", counting)
    return calls


@pytest.mark.parametrize("kind", KINDS)
def test_graph_prepared_once_per_graph(kind, monkeypatch):
    case = CASES[0]
    edge_index, x_src, _, _ = make_graph(case, 21)
    ref, ours = make_layers(case, 21)
    second = copy.deepcopy(ours)
    calls = count_builds(monkeypatch)
    adj, perm = make_adj(kind, edge_index, case.num_src, case.num_dst)
    size = size_arg(case, kind)
    first = ours(x_src.float(), adj, size=size)
    again = ours(x_src.float(), adj, size=size)
    second(x_src.float(), adj, size=size)  # another layer, the same graph
    assert len(calls) == 1
    assert torch.equal(first, again)
    # A new adjacency object (another graph): built again, and right.
    keep = torch.arange(edge_index.size(1)) % 3 != 0
    adj, perm = make_adj(kind, edge_index[:, keep], case.num_src, case.num_dst)
    out = ours(x_src.float(), adj, size=size)
    assert len(calls) == 2
    assert rel_error(out, ref.float()(x_src.float(), edge_index[:, keep][:, perm])) <= 1e-5


def test_graph_cache_sees_in_place_edits_and_drops_dead_graphs():
    case = CASES[0]
    edge_index, x_src, _, _ = make_graph(case, 22)
    ref, ours = make_layers(case, 22)
    adj = edge_index.clone()
    ours(x_src.float(), adj)
    assert id(adj) in graphs._CACHE
    adj[0].fill_(0)  # every edge from source 0
    edited = edge_index.clone()
    edited[0] = 0
    out = ours(x_src.float(), adj)
    assert rel_error(out, ref.float()(x_src.float(), edited)) <= 1e-5
    ident = id(adj)
    del adj
    assert ident not in graphs._CACHE


def test_layer_copies_and_pickles():
    case = CASES[0]
    edge_index, x_src, _, _ = make_graph(case, 23)
    _, ours = make_layers(case, 23)
    out = ours(x_src.float(), edge_index)
    for clone in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        torch.testing.assert_close(clone(x_src.float(), edge_index), out)


def test_no_csc_without_grad():
    case = CASES[0]
    edge_index, x_src, _, _ = make_graph(case, 24)
    _, ours = make_layers(case, 24)
    adj = edge_index.clone()
    with torch.no_grad():
        ours(x_src.float(), adj)
    assert cached_graph(adj).csc is None
    ours(x_src.float(), adj).sum().backward()
    assert cached_graph(adj).csc is not None


# Bad input: PyG's IndexError, never a device-side assert.

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fused", [True, False], ids=["fused_attention", "pyg_path"])
@pytest.mark.parametrize("bad", ["source_too_large", "source_negative", "destination_too_large",
                                 "destination_negative"])
def test_out_of_range_edge_index_raises_index_error(bad, fused, device):
    case = CASES[0]
    edge_index, x_src, _, _ = make_graph(case, 26)
    _, ours = make_layers(case, 26)
    ours = ours.to(device)
    ours.fused_attention = fused
    row = 0 if bad.startswith("source") else 1
    value = case.num_src + 3 if bad.endswith("large") else -2
    edge_index = edge_index.clone()
    edge_index[row, 5] = value
    name = "source" if row == 0 else "destination"
    # Only what is wrong, as PyG says it (an index too large is not negative).
    what = (rf"larger than {case.num_src - 1} \(got {value}\)" if value > 0
            else rf"negative indices in 'edge_index' \(got {value}\)")
    message = rf"{what} in its {name} row.*\[0, {case.num_src}\)"
    with pytest.raises(IndexError, match=message) as err:
        ours(x_src.float().to(device), edge_index.to(device))
    assert ("negative" in str(err.value)) == (value < 0)
    assert ("larger" in str(err.value)) == (value > 0)
    # The process and device stay usable.
    edge_index[row, 5] = 0
    out = ours(x_src.float().to(device), edge_index.to(device))
    assert torch.isfinite(out).all()


# torch.compile. EdgeIndex and SparseTensor caches are filled outside the
# compiled region (fill_cache_()); a plain edge_index is converted in the
# graph, or once outside by prepare_adjacency.

def compile_case(kind, add_self_loops, backend, fullgraph, device="cpu", dynamic=None,
                 edge_dim=None, fold_scores=None):
    """The compiled layer against eager: a training step, then (with
    fullgraph) an inference forward under no_grad, its own graph.
    fold_scores: the layer's score choice (None: by the graph's size)."""
    kwargs = dict(heads=3, add_self_loops=add_self_loops)
    if edge_dim is not None:
        kwargs.update(edge_dim=edge_dim)
    case = CASES[0]._replace(kwargs=kwargs, edge_dim=edge_dim)
    edge_index, x_src, x_dst, edge_attr = make_graph(case, 12)
    _, ours = make_layers(case, 12)
    ours = ours.to(device)
    ours.fold_scores = fold_scores
    adj, perm = make_adj(kind, edge_index.to(device), case.num_src, case.num_dst)
    if edge_attr is not None:
        edge_attr = edge_attr[perm.cpu()].float().to(device)
    if kind in ("edge_index_sorted", "sparse_tensor"):
        adj.fill_cache_()
    x, x_dst = x_src.float().to(device), x_dst.float().to(device)
    eager_out, eager_grads = run(ours, case, kind, adj, x, x_dst, edge_attr)
    torch._dynamo.reset()
    compiled = torch.compile(ours, backend=backend, fullgraph=fullgraph, dynamic=dynamic)
    events = op_events(lambda: run(compiled, case, kind, adj, x, x_dst, edge_attr))
    out, grads = run(compiled, case, kind, adj, x, x_dst, edge_attr)
    assert FUSED_OP in events
    assert rel_error(out, eager_out) <= 1e-5
    for name, grad in eager_grads.items():
        assert rel_error(grads[name], grad) <= 1e-5, name
    if fullgraph:
        with torch.no_grad():
            out = compiled(features(case, x, x_dst), adj, edge_attr,
                           size=size_arg(case, kind))
        assert rel_error(out, eager_out) <= 1e-5


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fold_fullgraph(backend):
    """The score fold (_FoldedScores, an autograd.Function; the CPU takes it
    from N * H * C of 2^17, CUDA from 2^25, so the small graphs of the other
    compile tests do not) traces in one graph."""
    compile_case("edge_index", True, backend, fullgraph=True, dynamic=True, fold_scores=True)


@pytest.mark.parametrize("add_self_loops", [False, True])
@pytest.mark.parametrize("kind", PLAIN_KINDS)
def test_compile_edge_index_fullgraph(kind, add_self_loops):
    compile_case(kind, add_self_loops, "aot_eager", fullgraph=True)


# Inductor's first compile takes seconds on a 2-core CPU: the EdgeIndex
# variant (traced with aot_eager by default above) runs with --full.
@pytest.mark.parametrize("kind", ["edge_index",
                                  pytest.param("edge_index_sorted", marks=pytest.mark.slow)])
def test_compile_edge_index_fullgraph_inductor(kind):
    compile_case(kind, True, "inductor", fullgraph=True, dynamic=True, edge_dim=3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("kind", ["edge_index", "edge_index_sorted"])
def test_compile_edge_index_fullgraph_cuda(kind, backend):
    """On torch 2.11 every compiled graph with an EdgeIndex input failed
    without pyg_multihead_agg.nn._compat (PendingUnbackedSymbolNotFound,
    from PyG's repr of a fake EdgeIndex): fullgraph raised."""
    compile_case(kind, True, backend, fullgraph=True, device="cuda", dynamic=True, edge_dim=3)


@pytest.mark.parametrize("concat,add_self_loops", [(True, True), (False, False)])
def test_compiled_layer_calls_the_layer_op_halves(concat, add_self_loops):
    """Compiled (fullgraph, dynamic shapes), GATConv's traced forward holds
    one _gat_conv_forward call and its backward one _gat_conv_backward
    call, none of the pieces (the projection's GEMM, the score and attention
    ops): one call each in the compiled graph's wrapper. Traced before any
    eager call of the class (whether propagate is observed is asked
    eagerly only), and matching eager."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    from pyg_multihead_agg.nn import _attention

    traced = []

    def backend(gm, inputs):
        def keep(graph, _):
            traced.append([str(n.target) for n in graph.graph.nodes if n.op == "call_function"])
            return make_boxed_func(graph.forward)
        return aot_module_simplified(gm, inputs, fw_compiler=keep, bw_compiler=keep)

    case = CASES[0]
    edge_index, x, _, _ = make_graph(case, 15)
    x = x.float()
    torch.manual_seed(15)
    layer = GATConv(7, 6, heads=3, concat=concat, add_self_loops=add_self_loops)
    eager_layer = copy.deepcopy(layer)
    _attention._OBSERVED.clear()
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend=backend, fullgraph=True, dynamic=True)
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = compiled(xc, edge_index)
    grad = torch.randn_like(out)
    out.backward(grad)
    forward, backward = traced
    ours = [[t for t in graph if t.startswith("pyg_multihead_agg.")] for graph in traced]
    assert ours == [["pyg_multihead_agg._gat_conv_edges_forward.default"],
                    ["pyg_multihead_agg._gat_conv_edges_backward.default"]], ours
    assert not any(t.startswith("aten.mm") or t.startswith("aten.addmm") for t in forward)
    assert not any(t.startswith("aten.mm") for t in backward)
    ref = eager_layer(xe, edge_index)
    ref.backward(grad)
    assert rel_error(out, ref) <= 1e-5
    assert rel_error(xc.grad, xe.grad) <= 1e-5
    for p, q in zip(layer.parameters(), eager_layer.parameters(), strict=True):
        assert rel_error(p.grad, q.grad) <= 1e-5


@pytest.mark.parametrize("concat", [True, False])
def test_compiled_layer_op_inductor_matches_eager(concat):
    """Inductor over _gat_conv's halves, with the caller's own self-loops in
    the traced graph's spare row (the backward reads the spare row's output
    past the layer's result, or stands a zero row for it): the output and
    every gradient bitwise equal to eager's."""
    torch.manual_seed(16)
    num_nodes = 60
    edge_index = torch.randint(0, num_nodes, (2, 300))
    edge_index[:, :5] = torch.arange(5).repeat(2, 1)  # own self-loops
    layer = GATConv(16, 8, heads=3, concat=concat)
    eager_layer = copy.deepcopy(layer)
    x = torch.randn(num_nodes, 16)
    torch._dynamo.reset()
    compiled = torch.compile(layer, dynamic=True, fullgraph=True)
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = compiled(xc, edge_index)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref = eager_layer(xe, edge_index)
    ref.backward(grad)
    assert torch.equal(out, ref) and torch.equal(xc.grad, xe.grad)
    for p, q in zip(layer.parameters(), eager_layer.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("edge_dim", [2, None])
def test_compile_dynamic_does_not_recompile_across_graph_sizes(device, edge_dim):
    """Mini-batches: a new plain edge_index of another size every call, with
    self-loops, with edge features (the layer's steps) and without (the
    layer operator's halves), under torch.compile(dynamic=True,
    fullgraph=True). One compiled graph serves three sizes (counted), each
    matching the eager layer."""
    from torch._dynamo.utils import counters

    torch.manual_seed(13)
    conv = GATConv(7, 6, heads=3, edge_dim=edge_dim).to(device)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(conv, dynamic=True, fullgraph=True)
    for num_nodes, num_edges in ((40, 150), (70, 260), (110, 500)):
        gen = torch.Generator().manual_seed(num_nodes)
        edge_index = torch.randint(0, num_nodes, (2, num_edges), generator=gen).to(device)
        edge_index[0, :4] = edge_index[1, :4]  # own self-loops
        x = torch.randn(num_nodes, 7, generator=gen).to(device)
        edge_attr = torch.randn(num_edges, 2, generator=gen).to(device) if edge_dim else None
        eager_x, compiled_x = x.clone().requires_grad_(), x.clone().requires_grad_()
        eager = conv(eager_x, edge_index, edge_attr)
        out = compiled(compiled_x, edge_index, edge_attr)
        assert rel_error(out, eager) <= 1e-5
        eager.square().sum().backward()
        out.square().sum().backward()
        assert rel_error(compiled_x.grad, eager_x.grad) <= 1e-5
    assert counters["stats"]["unique_graphs"] == 1  # one graph for the three sizes


def test_compile_reads_the_prepared_adjacency():
    """prepare_adjacency once outside: the compiled model neither sorts nor
    builds a CSC in its graph, and matches eager."""
    import pyg_multihead_agg as pma

    case = CASES[0]
    edge_index, x_src, _, _ = make_graph(case, 14)
    _, ours = make_layers(case, 14)
    adj, _ = make_adj("edge_index", edge_index, case.num_src, case.num_dst)
    prepared = pma.prepare_adjacency(adj, num_nodes=case.num_src)
    assert type(prepared) is type(adj) and prepared.data_ptr() == adj.data_ptr()
    eager = ours(x_src.float(), adj)
    torch._dynamo.reset()
    compiled = torch.compile(ours, dynamic=True, fullgraph=True)
    compiled(x_src.float(), prepared)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = compiled(x_src.float(), prepared)
    names = {e.name for e in prof.events()}
    assert FUSED_OP in names and "aten::sort" not in names
    assert rel_error(out, eager) <= 1e-5


def test_prepared_adjacency_is_not_state():
    import io

    import pyg_multihead_agg as pma

    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    prepared = pma.prepare_adjacency(edge_index, num_nodes=3)
    assert isinstance(prepared._pma_graph, graphs._Attached)
    assert not hasattr(edge_index, "_pma_graph")  # the caller's object is untouched
    buffer = io.BytesIO()
    torch.save(prepared, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert torch.equal(loaded, edge_index)
    assert not isinstance(getattr(loaded, "_pma_graph", None), graphs._Attached)
    assert copy.deepcopy(prepared)._pma_graph is None


@pytest.mark.skipif(not WITH_TORCH_SPARSE, reason="needs torch_sparse")
def test_compile_sparse_tensor_fullgraph():
    compile_case("sparse_tensor", False, "aot_eager", fullgraph=True)


@pytest.mark.skipif(not WITH_TORCH_SPARSE, reason="needs torch_sparse")
def test_compile_sparse_tensor_with_self_loops():
    # With its caches filled, the SparseTensor's indices are plain tensors:
    # the self-loops are traced like those of an edge_index.
    compile_case("sparse_tensor", True, "aot_eager", fullgraph=True)


@pytest.mark.parametrize("add_self_loops", [False, True])
@pytest.mark.parametrize("kind", ["torch_csr", "torch_coo"])
def test_compile_torch_sparse(kind, add_self_loops):
    # Dynamo cannot wrap sparse tensors: graph breaks around them, no fullgraph.
    compile_case(kind, add_self_loops, "aot_eager", fullgraph=False)


def _grad_fn_names(t: torch.Tensor) -> set:
    names, stack, seen = set(), [t.grad_fn], set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.add(type(fn).__name__)
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return names


@pytest.mark.parametrize("fold", [None, True, False])
@pytest.mark.parametrize("num_nodes", [50, 1100])
def test_score_fold_choice(fold, num_nodes):
    # fold_scores None folds the scores into one GEMM only where that pays:
    # here from N * H * C = 1100 * 128 (>= 2^17 on the CPU), not at 50 * 128.
    conv = GATConv(128, 32, heads=4)
    conv.fold_scores = fold
    gen = torch.Generator().manual_seed(num_nodes)
    x = torch.randn(num_nodes, 128, generator=gen)
    edge_index = torch.randint(0, num_nodes, (2, 4 * num_nodes), generator=gen)
    folded = "_FoldedScoresBackward" in _grad_fn_names(conv(x, edge_index))
    assert folded == (fold if fold is not None else num_nodes == 1100)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("conv", ["gat", pytest.param("gatv2", marks=pytest.mark.slow),
                                  pytest.param("transformer", marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind", ["edge_index", "prepared", "edge_index_sorted", "edge_attr"])
def test_compile_reduce_overhead_cuda(kind, conv):
    """torch.compile(mode="reduce-overhead") (CUDA graphs) over a layer: the
    replays match eager, output and gradients, step after step; a second
    edge tensor of the same shape (a new mini-batch) gets its own graph,
    never a replay of the first's conversion. Under Inductor's graph
    partition (the default from torch 2.9) the conversion operator runs
    between CUDA-graphed partitions, and the layers' padded per-destination
    inputs must be whole there (GATConv's scores were not, when padded by a
    concatenation)."""
    import pyg_multihead_agg as pma

    layer = {"gat": pma.nn.GATConv, "gatv2": pma.nn.GATv2Conv,
             "transformer": pma.nn.TransformerConv}[conv]
    torch.manual_seed(21)
    model = layer(16, 8, heads=4, edge_dim=3 if kind == "edge_attr" else None).cuda()
    x = torch.randn(300, 16, device="cuda")

    def adjacency(seed):
        gen = torch.Generator().manual_seed(seed)
        edge_index = torch.randint(0, 300, (2, 2000), generator=gen).cuda()
        edge_attr = torch.randn(2000, 3, generator=gen).cuda() if kind == "edge_attr" else None
        if kind == "prepared":
            return edge_index, pma.prepare_adjacency(edge_index, num_nodes=300), None
        if kind == "edge_index_sorted":
            adj = EdgeIndex(edge_index, sparse_size=(300, 300)).sort_by("col")[0]
            return adj.as_tensor(), adj.fill_cache_(), None
        return edge_index, edge_index, edge_attr

    def step(fn, adj, edge_attr):
        params = list(model.parameters())
        out = fn(x, adj, edge_attr)
        grads = torch.autograd.grad(out.square().sum(), params)
        return out.clone(), [g.clone() for g in grads]

    torch._dynamo.reset()
    compiled = torch.compile(model, mode="reduce-overhead")
    for seed in (1, 2):
        plain, adj, edge_attr = adjacency(seed)
        eager_out, eager_grads = step(model, plain, edge_attr)
        for call in range(4):  # warm-up, recording, replays
            torch.compiler.cudagraph_mark_step_begin()
            out, grads = step(compiled, adj, edge_attr)
            where = f"graph {seed}, call {call}"
            assert rel_error(out, eager_out) <= 1e-5, where
            # against the largest gradient: TransformerConv's lin_key.bias
            # gets none in exact arithmetic (the softmax cancels it)
            scale = max(float(g.norm()) for g in eager_grads)
            for grad, eager in zip(grads, eager_grads, strict=True):
                assert float((grad - eager).norm()) <= 1e-5 * scale, where


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compile_reduce_overhead_dropout_cuda():
    """Attention dropout under CUDA graphs (mode="reduce-overhead"): the
    operator given a key on the GPU matches eager at every replay as the key
    changes (the kernels read it there, so a replay draws the mask of the
    key it holds); a layer in training draws a fresh mask at each replay
    (compiled, its wrapper draws the key on the GPU), its gradients finite."""
    import pyg_multihead_agg as pma

    gen = torch.Generator().manual_seed(4)
    n, heads, channels = 300, 4, 8
    rowptr = torch.cat([torch.zeros(1, dtype=torch.int64),
                        torch.randint(0, 9, (n,), generator=gen).cumsum(0)]).cuda()
    col = torch.randint(0, n, (int(rowptr[-1]),), generator=gen).cuda()
    s_src, s_dst = (torch.randn(n, heads, generator=gen).cuda() for _ in range(2))
    x = torch.randn(n, heads, channels, generator=gen).cuda()

    def attend(key):
        return pma.gat_attention(rowptr, col, s_src, s_dst, x, dropout=0.5, philox=key)[0]

    torch._dynamo.reset()
    compiled = torch.compile(attend, mode="reduce-overhead")
    outs = []
    for step in range(5):  # warm-up, recording, replays
        key = torch.tensor([1234 + step, 0], dtype=torch.int64, device="cuda")
        torch.compiler.cudagraph_mark_step_begin()
        out = compiled(key).clone()
        assert torch.equal(out, attend(key)), step
        outs.append(out)
    assert not torch.equal(outs[-1], outs[-2])

    torch.manual_seed(5)
    model = pma.nn.GATConv(16, 8, heads=4, dropout=0.5).cuda().train()
    feats = torch.randn(n, 16, device="cuda")
    edge_index = torch.randint(0, n, (2, 2000), device="cuda")
    step_fn = torch.compile(model, mode="reduce-overhead")
    outs = []
    for _ in range(5):
        torch.compiler.cudagraph_mark_step_begin()
        out = step_fn(feats, edge_index)
        grads = torch.autograd.grad(out.square().sum(), list(model.parameters()))
        assert all(bool(torch.isfinite(g).all()) for g in grads)
        outs.append(out.detach().clone())
    assert not torch.equal(outs[-1], outs[-2])  # a fresh mask, not the recorded one
