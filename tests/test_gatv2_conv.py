"""pyg_multihead_agg.nn.GATv2Conv against torch_geometric.nn.GATv2Conv.

The reference is PyG's own GATv2Conv in float64 on a plain edge_index in the
adjacency's own edge order, with the same (loaded) weights; each adjacency
type of our layer must match it in outputs, attention weights and gradients
(inputs, edge features, every parameter), and the fused operator must have
run (its calls are counted). PyG's own tests of the layer, with our class
swapped in, close the file.
"""
import collections
import copy
import doctest
from typing import NamedTuple, Optional

import pytest
import torch
import torch_geometric.nn
from conftest import DEVICES, rel_error
from test_gat_conv import KINDS, assert_matches, make_adj, op_events, same_structure, weights_of
from test_gat_conv import make_graph as make_edges
from torch.utils._python_dispatch import TorchDispatchMode
from torch_geometric.explain.algorithm.utils import clear_masks, set_masks
from torch_geometric.typing import WITH_TORCH_SPARSE, SparseTensor
from torch_geometric.utils import to_torch_csc_tensor

from pyg_multihead_agg import graph as graphs
from pyg_multihead_agg.nn import GATConv, GATv2Conv
from pyg_multihead_agg.nn.gatv2_conv import fused_head_supported

FUSED_OP = "pyg_multihead_agg::gatv2_attention"
FUSED_BACKWARD = "pyg_multihead_agg::gatv2_attention_backward"
SPARSE = ("sparse_tensor", "torch_csr", "torch_coo")


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
    Case("share_weights", 20, 20, 60, False, None, dict(heads=2, share_weights=True)),
    Case("negative_slope", 20, 20, 60, False, None, dict(heads=2, negative_slope=0.6)),
    Case("no_bias", 20, 20, 60, False, None, dict(heads=2, bias=False)),
    # The bias goes into the fused op, the residual is added after it.
    Case("residual", 20, 20, 60, False, None, dict(heads=2, residual=True)),
    Case("residual_no_bias", 20, 20, 60, False, None, dict(heads=2, residual=True, bias=False)),
    Case("mean_heads_residual", 20, 20, 60, False, None,
         dict(heads=3, concat=False, residual=True)),
    Case("edge_dim", 20, 20, 70, False, 3, dict(heads=2, edge_dim=3, add_self_loops=False)),
    Case("edge_dim_loops", 20, 20, 70, False, 3, dict(heads=2, edge_dim=3, fill_value="mean")),
    Case("edge_dim_loops_max", 20, 20, 70, False, 3, dict(heads=2, edge_dim=3, fill_value="max")),
    Case("edge_dim_loops_add", 20, 20, 70, False, 3, dict(heads=2, edge_dim=3, fill_value="add")),
    Case("edge_dim_loops_const", 20, 20, 70, False, 2, dict(heads=2, edge_dim=2, fill_value=0.5)),
    Case("edge_dim_loops_tensor", 20, 20, 70, False, 2,
         dict(heads=2, edge_dim=2, fill_value=torch.tensor([0.3, -1.2], dtype=torch.float64))),
    # edge_dim=1 with edge features [E] (PyG views them as [E, 1]).
    Case("edge_dim1_vector", 20, 20, 70, False, 1, dict(heads=2, edge_dim=1)),
    Case("edge_dim_share_weights_concat_false", 20, 20, 70, False, 3,
         dict(heads=3, edge_dim=3, share_weights=True, concat=False)),
    Case("bipartite", 30, 12, 80, True, None, dict(heads=2, add_self_loops=False)),
    Case("bipartite_loops", 30, 12, 80, True, None, dict(heads=2)),
    Case("bipartite_more_dst_loops", 9, 25, 80, True, None, dict(heads=2)),
    Case("bipartite_share_weights", 30, 12, 80, True, None, dict(heads=2, share_weights=True)),
    Case("bipartite_residual_edge_dim", 30, 12, 80, True, 3,
         dict(heads=2, residual=True, edge_dim=3)),
    Case("isolated", 40, 40, 15, False, None, dict(heads=2, add_self_loops=False)),
    Case("no_edges", 10, 10, 0, False, None, dict(heads=2, add_self_loops=False)),
    Case("no_edges_loops", 10, 10, 0, False, None, dict(heads=2)),
]


def case_named(name: str) -> Case:
    return next(case for case in CASES if case.name == name)


def pyg_unsupported(case: Case, kind: str) -> bool:
    # PyG itself refuses edge features + self-loops for sparse adjacencies.
    return (case.edge_dim is not None and case.kwargs.get("add_self_loops", True)
            and kind in SPARSE)


def in_channels(case: Case):
    # Shared weights apply lin_l to the destinations too: same widths.
    if case.bipartite:
        return (7, 7) if case.kwargs.get("share_weights") else (7, 5)
    return 7


def make_graph(case: Case, seed: int):
    """Unique edges [2, E] (source, destination) sorted by destination, some
    of them self-loops, node features (float64) and edge features (float64,
    [E] for edge_dim=1 vectors)."""
    edge_index, x_src, x_dst, edge_attr = make_edges(case, seed)
    if case.bipartite and case.kwargs.get("share_weights"):
        gen = torch.Generator().manual_seed(seed + 500)
        x_dst = torch.randn(case.num_dst, 7, generator=gen, dtype=torch.float64)
    if case.name == "edge_dim1_vector":
        edge_attr = edge_attr.view(-1)
    return edge_index, x_src, x_dst, edge_attr


def make_layers(case: Case, seed: int):
    torch.manual_seed(seed)
    ref = torch_geometric.nn.GATv2Conv(in_channels(case), 6, **case.kwargs)
    ours = GATv2Conv(in_channels(case), 6, **case.kwargs)
    with torch.no_grad():  # PyG initialises biases to zero: make them count
        gen = torch.Generator().manual_seed(seed + 1000)
        for name, p in ref.named_parameters():
            if name.endswith("bias"):
                p.normal_(generator=gen)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def features(case: Case, x_src, x_dst):
    return (x_src, x_dst) if case.bipartite else x_src


def run(layer, case, adj, x_src, x_dst, edge_attr, grad_seed=0):
    """Forward + backward with a random output gradient; returns the output
    and the gradients of inputs and parameters by name."""
    x_src = x_src.detach().requires_grad_()
    x_dst = x_dst.detach().requires_grad_()
    if edge_attr is not None:
        edge_attr = edge_attr.detach().requires_grad_()
    layer.zero_grad()
    out = layer(features(case, x_src, x_dst), adj, edge_attr)
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


def reference(case, seed, edge_index, x_src, x_dst, edge_attr, perm):
    """PyG's layer in float64 on the plain edge_index in the adjacency's edge
    order (edge features in that order too)."""
    ref, _ = make_layers(case, seed)
    edge_attr = None if edge_attr is None else edge_attr[perm.cpu()]
    return run(ref.double(), case, edge_index[:, perm.cpu()], x_src, x_dst, edge_attr)


RECORD_OP = "pyg_multihead_agg::_gatv2_attention_record"


class OpCalls(TorchDispatchMode):
    """Counts the calls of this package's operators (forward and backward).
    The training forward on CUDA, ``_gatv2_attention_record`` (the fused op
    that also keeps its record for the backward), counts as the fused op
    (FUSED_OP); ``records`` counts it apart."""

    def __init__(self):
        super().__init__()
        self.calls = collections.Counter()
        self.records = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "pyg_multihead_agg":
            name = func.name()
            if name == RECORD_OP:
                self.records += 1
                name = FUSED_OP
            self.calls[name] += 1
        return func(*args, **(kwargs or {}))


def _unwrap(kind):
    return (kind.values[0], kind.marks) if hasattr(kind, "values") else (kind, ())


MATCH_CASES = [
    pytest.param(case, name, id=f"{case.name}-{name}", marks=marks)
    for case in CASES for name, marks in map(_unwrap, KINDS)]


@pytest.mark.sweep
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case,kind", MATCH_CASES)
def test_matches_pyg(case, kind, device):
    """float64: outputs and every gradient equal PyG's; the fused op ran
    once forward and once backward, and nothing else of ours."""
    seed = 1 + CASES.index(case)
    edge_index, x_src, x_dst, edge_attr = make_graph(case, seed)
    _, ours = make_layers(case, seed)
    adj, perm = make_adj(kind, edge_index.to(device), case.num_src, case.num_dst)
    to = dict(device=device, dtype=torch.float64)
    ours_attr = None if edge_attr is None else edge_attr[perm.cpu()].to(**to)
    ours = ours.to(**to)
    if pyg_unsupported(case, kind):
        # PyG refuses edge_attr with self-loops for sparse adjacencies; so do
        # we, with a message.
        with pytest.raises(NotImplementedError, match="edge_attr"):
            run(ours, case, adj, x_src.to(**to), x_dst.to(**to), ours_attr)
        return
    ref_out, ref_grads = reference(case, seed, edge_index, x_src, x_dst, edge_attr, perm)
    with OpCalls() as ops:
        out, grads = run(ours, case, adj, x_src.to(**to), x_dst.to(**to), ours_attr)
    assert ops.calls == {FUSED_OP: 1, FUSED_BACKWARD: 1}
    assert out.dtype == torch.float64 and out.device.type == device
    assert_matches(out, grads, ref_out, ref_grads, 1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case_name", ["heads3", "edge_dim", "bipartite_loops"])
def test_matches_pyg_float32(case_name, kind, device):
    case = case_named(case_name)
    edge_index, x_src, x_dst, edge_attr = make_graph(case, 2)
    _, ours = make_layers(case, 2)
    adj, perm = make_adj(kind, edge_index.to(device), case.num_src, case.num_dst)
    to = dict(device=device, dtype=torch.float32)
    ours_attr = None if edge_attr is None else edge_attr[perm.cpu()].to(**to)
    ref_out, ref_grads = reference(case, 2, edge_index, x_src, x_dst, edge_attr, perm)
    with OpCalls() as ops:
        out, grads = run(ours.to(**to), case, adj, x_src.to(**to), x_dst.to(**to), ours_attr)
    assert ops.calls == {FUSED_OP: 1, FUSED_BACKWARD: 1}
    assert out.dtype == torch.float32
    assert_matches(out, grads, ref_out, ref_grads, 1e-5)


@pytest.mark.parametrize("kind", ["edge_index", "edge_index_sorted", "torch_csr"])
def test_int32_indices(kind):
    case = case_named("edge_dim")
    edge_index, x_src, x_dst, edge_attr = make_graph(case, 3)
    _, ours = make_layers(case, 3)
    adj, perm = make_adj(kind, edge_index, case.num_src, case.num_dst, index_dtype=torch.int32)
    out, grads = run(ours.double(), case, adj, x_src, x_dst, edge_attr[perm])
    ref_out, ref_grads = reference(case, 3, edge_index, x_src, x_dst, edge_attr, perm)
    assert_matches(out, grads, ref_out, ref_grads, 1e-12)


@pytest.mark.parametrize("kind", ["edge_index", "sparse_tensor", "torch_csr"])
def test_autocast_bfloat16_loosely(kind):
    """Under CPU autocast the op runs in bfloat16 and the bias is added after
    it in float32: PyG's output dtype, PyG's values loosely."""
    if kind == "sparse_tensor" and not WITH_TORCH_SPARSE:
        pytest.skip("needs torch_sparse")
    case = case_named("heads3")
    edge_index, x_src, x_dst, _ = make_graph(case, 4)
    ref, ours = make_layers(case, 4)
    adj, _ = make_adj(kind, edge_index, case.num_src, case.num_dst)
    x = x_src.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with OpCalls() as ops:
            out = ours(x, adj)
        ref_out = ref(x, adj)
    assert ops.calls[FUSED_OP] == 1
    assert out.dtype == ref_out.dtype == torch.float32
    assert rel_error(out, ref_out) <= 5e-2


# PyG's own path: fused_attention=False, hooks, the explainer, decomposed
# layers, attention weights after dropout in training.

@pytest.mark.parametrize("kind", [_unwrap(k)[0] for k in KINDS])
def test_fused_attention_false_is_pyg(kind):
    if kind == "sparse_tensor" and not WITH_TORCH_SPARSE:
        pytest.skip("needs torch_sparse")
    case = case_named("heads3")
    edge_index, x_src, x_dst, _ = make_graph(case, 5)
    ref, ours = make_layers(case, 5)
    ours.fused_attention = False
    adj, _ = make_adj(kind, edge_index, case.num_src, case.num_dst)
    with OpCalls() as ops:
        out, grads = run(ours, case, adj, x_src.float(), x_dst.float(), None)
    ref_out, ref_grads = run(ref, case, adj, x_src.float(), x_dst.float(), None)
    assert not ops.calls
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=0, atol=0)


def test_fused_attention_is_a_constructor_argument():
    assert GATv2Conv(4, 2).fused_attention is True
    assert GATv2Conv(4, 2, heads=2, fused_attention=False).fused_attention is False


@pytest.mark.parametrize("kind", ["edge_index", "edge_index_sorted", "torch_csr"])
def test_hooks_explain_and_decomposed_layers_take_pyg_path(kind):
    # PyG's hooks and the explainer must see PyG's calls: the fused op stays out.
    case = case_named("heads3")
    edge_index, x_src, _, _ = make_graph(case, 25)
    ref, ours = make_layers(case, 25)
    adj, perm = make_adj(kind, edge_index, case.num_src, case.num_dst)
    x = x_src.float()
    expected = ref.float()(x, edge_index[:, perm])
    seen = []
    handle = ours.register_message_forward_hook(lambda *args: seen.append(1))
    with OpCalls() as ops:
        out = ours(x, adj)
    handle.remove()
    assert seen and not ops.calls
    assert rel_error(out, expected) <= 1e-6

    # The explainer's edge mask (one per input edge) reaches PyG's messages.
    mask = torch.rand(edge_index.size(1), generator=torch.Generator().manual_seed(3))
    set_masks(ours, mask, edge_index[:, perm], apply_sigmoid=True)
    set_masks(ref, mask, edge_index[:, perm], apply_sigmoid=True)
    with OpCalls() as ops:
        out = ours(x, adj)
    assert not ops.calls
    assert rel_error(out, ref(x, adj)) <= 1e-6
    assert rel_error(out, expected) > 1e-3  # the mask counted
    clear_masks(ours)
    clear_masks(ref)

    with OpCalls() as ops:
        out = ours(x, adj)
    assert ops.calls[FUSED_OP] == 1
    assert rel_error(out, expected) <= 1e-5
    if kind == "edge_index":
        # decomposed_layers > 1 is PyG's path, which fails as PyG's own layer
        # does: its decomposition chunks every propagate argument, and x is
        # a pair.
        ours.decomposed_layers = ref.decomposed_layers = 2
        with pytest.raises(AttributeError) as theirs:
            ref(x, adj)
        with pytest.raises(AttributeError) as mine:
            ours(x, adj)
        assert str(mine.value) == str(theirs.value)


# return_attention_weights

ATTENTION_CASES = [
    pytest.param(case, name, id=f"{case.name}-{name}", marks=marks)
    for case in CASES if case.name in (
        "heads3", "share_weights", "edge_dim", "edge_dim_loops", "edge_dim_loops_max",
        "bipartite_loops", "bipartite_residual_edge_dim", "no_edges", "no_edges_loops")
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
    with OpCalls() as ops:
        out, att = ours(x, adj, edge_attr, return_attention_weights=True)
    assert ops.calls == {FUSED_OP: 1}
    ref_out, ref_att = ref(x, adj, edge_attr, return_attention_weights=True)
    assert rel_error(out, ref_out) <= 1e-12
    if isinstance(att, tuple):
        assert isinstance(ref_att, tuple)
        same_structure(att[0], ref_att[0])
    else:
        same_structure(att, ref_att)
    assert rel_error(weights_of(att), weights_of(ref_att)) <= 1e-12


@pytest.mark.parametrize("layer", [GATConv, GATv2Conv])
def test_attention_weights_are_at_most_one(layer):
    """Rows of one edge (here each node's self-loop) weigh it 1, as PyG's
    softmax does, never 1 + eps: the weights come from the kernel's lse and
    a logit recomputed in the layer, which round differently."""
    torch.manual_seed(0)
    conv = layer(16, 8, heads=4)
    x, edge_index = torch.randn(300, 16), torch.randint(0, 300, (2, 300))
    edge_index = edge_index[:, edge_index[1] < 100]  # rows from 100 on: the self-loop only
    _, (looped, alpha) = conv(x, edge_index, return_attention_weights=True)
    assert alpha.max() <= 1
    torch.testing.assert_close(alpha[looped[1] >= 100], torch.ones(200, 4))


@pytest.mark.parametrize("kind", ["edge_index", "edge_index_sorted", "torch_csr"])
def test_attention_weights_with_dropout_in_training(kind):
    # Attention after dropout is PyG's path (the fused op keeps no mask).
    case = case_named("heads3")._replace(kwargs=dict(heads=3, dropout=0.5, add_self_loops=False))
    edge_index, x_src, _, _ = make_graph(case, 8)
    ref, ours = make_layers(case, 8)
    adj, _ = make_adj(kind, edge_index, case.num_src, case.num_dst)
    torch.manual_seed(3)
    with OpCalls() as ops:
        out, att = ours(x_src.float(), adj, return_attention_weights=True)
    assert not ops.calls
    torch.manual_seed(3)
    ref_out, ref_att = ref(x_src.float(), adj, return_attention_weights=True)
    assert rel_error(out, ref_out) <= 1e-6
    assert rel_error(weights_of(att), weights_of(ref_att)) <= 1e-6
    assert (weights_of(att) == 0).any()  # after dropout


# Attention dropout on the fused path: Philox masks keyed by torch's RNG.

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["edge_index", "edge_index_sorted", "torch_csr"])
def test_dropout_in_training_fused(kind, device):
    # Seeded runs repeat, the mask changes the output, another seed another
    # mask, and the gradient is that of the same masked function (gradcheck
    # in float64).
    case = case_named("heads3")._replace(kwargs=dict(heads=3, dropout=0.5, add_self_loops=False))
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

    with OpCalls() as ops:
        out = seeded(x)
    assert ops.calls == {FUSED_OP: 1}
    torch.testing.assert_close(seeded(x), out, rtol=0, atol=0)
    assert rel_error(out, eval_out) > 1e-2
    torch.manual_seed(12)
    assert rel_error(ours(x, adj), out) > 1e-2
    assert torch.autograd.gradcheck(seeded, (x.clone().requires_grad_(),), eps=1e-6,
                                    atol=1e-6, nondet_tol=0.0)


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_statistics_fused(device):
    """Each destination has one edge and no bias: out[i, h] is either 0
    (dropped) or x_l[j, h] / (1 - p). The dropped share is p, and the mean
    over seeds of the output is the output without dropout."""
    p, num_nodes, heads = 0.3, 200, 4
    torch.manual_seed(0)
    conv = GATv2Conv(5, 3, heads=heads, dropout=p, add_self_loops=False, bias=False)
    conv = conv.to(device)
    edge_index = torch.stack([torch.randperm(num_nodes), torch.arange(num_nodes)]).to(device)
    x = torch.randn(num_nodes, 5, device=device)
    with torch.no_grad():
        kept = conv.eval()(x, edge_index).view(num_nodes, heads, 3)
        conv.train()
        torch.manual_seed(5)
        out = conv(x, edge_index).view(num_nodes, heads, 3)
        dropped = (out == 0).all(-1)
        assert abs(dropped.float().mean().item() - p) < 0.06
        torch.testing.assert_close(out[~dropped], kept[~dropped] / (1 - p))
        mean = sum(conv(x, edge_index) for _ in range(200)) / 200
    assert rel_error(mean, kept.view(num_nodes, -1)) < 0.1


# The shared graph-preparation step.

def count_builds(monkeypatch):
    calls = []
    original = graphs._build

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(graphs, "_build", counting)
    return calls


@pytest.mark.parametrize("kind", ["edge_index", "edge_index_by_row", "torch_coo"])
def test_graph_prepared_once_for_gat_and_gatv2(kind, monkeypatch):
    # A GATConv and a GATv2Conv on the same graph share its preparation.
    case = case_named("heads3")
    edge_index, x_src, _, _ = make_graph(case, 21)
    ref, ours = make_layers(case, 21)
    calls = count_builds(monkeypatch)
    adj, perm = make_adj(kind, edge_index, case.num_src, case.num_dst)
    x = x_src.float()
    GATConv(7, 6, heads=3)(x, adj)
    out = ours(x, adj)
    assert len(calls) == 1
    assert rel_error(out, ref.float()(x, edge_index[:, perm])) <= 1e-5


# torch.compile

@pytest.mark.parametrize("kind,add_self_loops,edge_dim", [
    ("edge_index", True, 3),
    ("edge_index", False, None),
    ("edge_index_sorted", False, None),
    pytest.param("sparse_tensor", False, None, marks=pytest.mark.skipif(
        not WITH_TORCH_SPARSE, reason="needs torch_sparse")),
    pytest.param("sparse_tensor", True, None, marks=pytest.mark.skipif(
        not WITH_TORCH_SPARSE, reason="needs torch_sparse")),
])
def test_compile_fullgraph(kind, add_self_loops, edge_dim):
    """The compiled layer (fullgraph) against eager: a training step, then an
    inference forward under no_grad, its own graph. EdgeIndex and
    SparseTensor caches are filled outside the compiled region."""
    kwargs = dict(heads=3, add_self_loops=add_self_loops)
    if edge_dim is not None:
        kwargs.update(edge_dim=edge_dim)
    case = case_named("heads3")._replace(kwargs=kwargs, edge_dim=edge_dim)
    assert_compiled_matches_eager(case, kind, make_graph, make_layers, (FUSED_OP, FUSED_BACKWARD))


def assert_compiled_matches_eager(case, kind, graph_of, layers_of, fused_ops):
    """The layer of ``case`` (``layers_of``, on the graph of ``graph_of``)
    compiled with fullgraph=True against eager: a training step that runs
    ``fused_ops``, then an inference forward under no_grad, its own graph.
    EdgeIndex and SparseTensor caches are filled outside the compiled region."""
    edge_index, x_src, x_dst, edge_attr = graph_of(case, 12)
    _, ours = layers_of(case, 12)
    adj, perm = make_adj(kind, edge_index, case.num_src, case.num_dst)
    if edge_attr is not None:
        edge_attr = edge_attr[perm].float()
    if kind in ("edge_index_sorted", "sparse_tensor"):
        adj.fill_cache_()
    x, x_dst = x_src.float(), x_dst.float()
    eager_out, eager_grads = run(ours, case, adj, x, x_dst, edge_attr)
    torch._dynamo.reset()
    compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)
    events = op_events(lambda: run(compiled, case, adj, x, x_dst, edge_attr))
    out, grads = run(compiled, case, adj, x, x_dst, edge_attr)
    assert set(fused_ops) <= events
    assert rel_error(out, eager_out) <= 1e-5
    scale = max(grad.norm() for grad in eager_grads.values())
    for name, grad in eager_grads.items():
        if grad.norm() <= 1e-5 * scale:
            # zero but for rounding (TransformerConv's key bias: the softmax
            # of a row ignores a score added to all its entries), which
            # depends on the order of the sums
            assert grads[name].norm() <= 1e-5 * scale, name
        else:
            assert rel_error(grads[name], grad) <= 1e-5, name
    with torch.no_grad():
        out = compiled(x, adj, edge_attr)
    assert rel_error(out, eager_out) <= 1e-5


# Bad input: clear errors.

def test_missing_destination_features_raise():
    conv = GATv2Conv((7, 5), 6, heads=2)
    ref = torch_geometric.nn.GATv2Conv((7, 5), 6, heads=2)
    x = (torch.randn(10, 7), None)
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    with pytest.raises(AssertionError):  # PyG: a bare assert
        ref(x, edge_index)
    for fused in (True, False):
        conv.fused_attention = fused
        with pytest.raises(ValueError, match="destination node features"):
            conv(x, edge_index)


def test_edge_attr_without_edge_dim_raises():
    conv = GATv2Conv(7, 6, heads=2)
    ref = torch_geometric.nn.GATv2Conv(7, 6, heads=2)
    x, edge_index = torch.randn(10, 7), torch.tensor([[0, 1, 2], [1, 2, 0]])
    edge_attr = torch.randn(3, 4)
    with pytest.raises(AssertionError):  # PyG: a bare assert in edge_update
        ref(x, edge_index, edge_attr)
    for fused in (True, False):
        conv.fused_attention = fused
        with pytest.raises(ValueError, match="edge_dim"):
            conv(x, edge_index, edge_attr)


@pytest.mark.parametrize("kind", ["edge_index", "edge_index_sorted", "torch_csr"])
def test_edge_attr_of_wrong_length_raises(kind):
    case = case_named("edge_dim")
    edge_index, x_src, _, edge_attr = make_graph(case, 9)
    _, ours = make_layers(case, 9)
    adj, _ = make_adj(kind, edge_index, case.num_src, case.num_dst)
    with pytest.raises(RuntimeError, match="one row per edge"):
        ours(x_src.float(), adj, edge_attr[:-1].float())


@pytest.mark.parametrize("kind", ["sparse_tensor", "torch_csr", "torch_coo"])
def test_sparse_edge_attr_with_self_loops_raises(kind):
    if kind == "sparse_tensor" and not WITH_TORCH_SPARSE:
        pytest.skip("needs torch_sparse")
    case = case_named("edge_dim_loops")
    edge_index, x_src, _, edge_attr = make_graph(case, 8)
    _, ours = make_layers(case, 8)
    adj, _ = make_adj(kind, edge_index, case.num_src, case.num_dst)
    for fused in (True, False):
        ours.fused_attention = fused
        with pytest.raises(NotImplementedError, match="edge_attr"):
            ours(x_src.float(), adj, edge_attr.float())


@pytest.mark.parametrize("kind", ["sparse_tensor", "torch_csr", "edge_index_sorted"])
def test_adjacency_size_mismatch_raises_like_pyg(kind):
    if kind == "sparse_tensor" and not WITH_TORCH_SPARSE:
        pytest.skip("needs torch_sparse")
    assert_size_mismatch_like_pyg(case_named("heads1_no_loops"), kind, make_graph, make_layers)


def assert_size_mismatch_like_pyg(case, kind, graph_of, layers_of):
    """Fewer node features than the adjacency's size: PyG's error, word for word."""
    edge_index, x_src, _, _ = graph_of(case, 10)
    ref, ours = layers_of(case, 10)
    adj, _ = make_adj(kind, edge_index, case.num_src, case.num_dst)
    x = x_src[:-3].float()  # fewer nodes than the adjacency's size
    with pytest.raises(ValueError) as theirs:
        ref(x, adj)
    with pytest.raises(ValueError) as mine:
        ours(x, adj)
    assert str(mine.value) == str(theirs.value)


@pytest.mark.parametrize("fused", [True, False], ids=["fused_attention", "pyg_path"])
@pytest.mark.parametrize("bad", ["source_too_large", "destination_negative"])
def test_out_of_range_edge_index_raises_index_error(bad, fused):
    assert_out_of_range_raises(case_named("heads3"), bad, fused, make_graph, make_layers)


def assert_out_of_range_raises(case, bad, fused, graph_of, layers_of):
    """An edge_index entry out of range: PyG's IndexError on either path."""
    edge_index, x_src, _, _ = graph_of(case, 26)
    _, ours = layers_of(case, 26)
    ours.fused_attention = fused
    row = 0 if bad.startswith("source") else 1
    edge_index = edge_index.clone()
    edge_index[row, 5] = case.num_src + 3 if bad.endswith("large") else -2
    name = "source" if row == 0 else "destination"
    with pytest.raises(IndexError, match=rf"{name} row.*\[0, {case.num_src}\)"):
        ours(x_src.float(), edge_index)


# CUDA head widths.

def test_fused_head_supported():
    assert fused_head_supported(4, 128, torch.float32)
    assert not fused_head_supported(1, 129, torch.float32)
    assert fused_head_supported(4, 256, torch.bfloat16)
    assert fused_head_supported(4, 256, torch.float16)
    assert not fused_head_supported(1, 257, torch.float16)
    assert fused_head_supported(4, 64, torch.float64)
    assert not fused_head_supported(1, 65, torch.float64)
    # rows of heads * next_pow2(vectors) <= 128 vectors: 8 x 64 float32 (8 x 16), 5 x 48
    # float32 (5 x 16: 80), not 8 x 64 float64 (8 x 32) or 9 x 64 float32 (9 x 16)
    assert fused_head_supported(8, 64, torch.float32) and fused_head_supported(5, 48, torch.float32)
    assert not fused_head_supported(8, 64, torch.float64)
    assert not fused_head_supported(9, 64, torch.float32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("channels,fused", [(128, True), (129, False)])
def test_cuda_wide_heads_take_pyg_path(channels, fused):
    torch.manual_seed(0)
    ref = torch_geometric.nn.GATv2Conv(8, channels, heads=2).cuda()
    ours = GATv2Conv(8, channels, heads=2).cuda()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(30, 8, device="cuda")
    edge_index = torch.randint(0, 30, (2, 100), device="cuda")
    with OpCalls() as ops:
        out = ours(x, edge_index)
    assert (ops.calls[FUSED_OP] == 1) == fused
    assert rel_error(out, ref(x, edge_index)) <= 1e-5


# The layer as a PyG layer.

def test_repr_and_state_dict_names_match_pyg():
    assert repr(GATv2Conv(16, 8, heads=4)) == "GATv2Conv(16, 8, heads=4)"
    for kwargs in (dict(heads=2, edge_dim=3, residual=True), dict(share_weights=True)):
        ref = torch_geometric.nn.GATv2Conv((4, 4), 6, **kwargs)
        ours = GATv2Conv((4, 4), 6, **kwargs)
        assert ref.state_dict().keys() == ours.state_dict().keys()


def test_lazy_in_channels():
    torch.manual_seed(0)
    ours = GATv2Conv(-1, 6, heads=2)
    x, edge_index = torch.randn(10, 7), torch.randint(0, 10, (2, 30))
    with OpCalls() as ops:
        out = ours(x, edge_index)
    assert ops.calls[FUSED_OP] == 1 and out.shape == (10, 12)
    ref = torch_geometric.nn.GATv2Conv(7, 6, heads=2)
    ref.load_state_dict(ours.state_dict())
    assert rel_error(out, ref(x, edge_index)) <= 1e-5


def test_layer_copies():
    case = case_named("edge_dim_loops")
    edge_index, x_src, _, edge_attr = make_graph(case, 23)
    _, ours = make_layers(case, 23)
    x, edge_attr = x_src.float(), edge_attr.float()
    out = ours(x, edge_index, edge_attr)
    torch.testing.assert_close(copy.deepcopy(ours)(x, edge_index, edge_attr), out)


def test_docstring_example_runs():
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = finder.find(GATv2Conv, "GATv2Conv", globs={})
    for test in tests:
        runner.run(test)
    assert runner.failures == 0 and runner.tries > 0


# PyG's own tests of GATv2Conv (test/nn/conv/test_gatv2_conv.py) with our
# class; every call must take the fused path. Left out: the TorchScript
# checks (PyG runs them only in full tests; our layer is compiled by
# torch.compile, tested above) and `conv._alpha is None` (PyG 2.8's
# GATv2Conv has no _alpha).

def test_pyg_gatv2_conv():
    with OpCalls() as ops:
        x1 = torch.randn(4, 8)
        x2 = torch.randn(2, 8)
        edge_index = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
        adj1 = to_torch_csc_tensor(edge_index, size=(4, 4))

        conv = GATv2Conv(8, 32, heads=2)
        assert str(conv) == "GATv2Conv(8, 32, heads=2)"
        out = conv(x1, edge_index)
        assert out.size() == (4, 64)
        assert torch.allclose(conv(x1, edge_index), out)
        assert torch.allclose(conv(x1, adj1.t()), out, atol=1e-6)

        if WITH_TORCH_SPARSE:
            adj2 = SparseTensor.from_edge_index(edge_index, sparse_sizes=(4, 4))
            assert torch.allclose(conv(x1, adj2.t()), out, atol=1e-6)

        # return_attention_weights
        result = conv(x1, edge_index, return_attention_weights=True)
        assert torch.allclose(result[0], out)
        assert result[1][0].size() == (2, 7)
        assert result[1][1].size() == (7, 2)
        assert result[1][1].min() >= 0 and result[1][1].max() <= 1

        result = conv(x1, adj1.t(), return_attention_weights=True)
        assert torch.allclose(result[0], out, atol=1e-6)
        assert result[1][0].size() == torch.Size([4, 4, 2])
        assert result[1][0]._nnz() == 7

        if WITH_TORCH_SPARSE:
            result = conv(x1, adj2.t(), return_attention_weights=True)
            assert torch.allclose(result[0], out, atol=1e-6)
            assert result[1].sizes() == [4, 4, 2] and result[1].nnz() == 7

        # Bipartite message passing
        adj1 = to_torch_csc_tensor(edge_index, size=(4, 2))

        out = conv((x1, x2), edge_index)
        assert out.size() == (2, 64)
        assert torch.allclose(conv((x1, x2), edge_index), out)
        assert torch.allclose(conv((x1, x2), adj1.t()), out, atol=1e-6)

        if WITH_TORCH_SPARSE:
            adj2 = SparseTensor.from_edge_index(edge_index, sparse_sizes=(4, 2))
            assert torch.allclose(conv((x1, x2), adj2.t()), out, atol=1e-6)
    assert ops.calls == {FUSED_OP: 11 if WITH_TORCH_SPARSE else 8}


def test_pyg_gatv2_conv_with_edge_attr():
    with OpCalls() as ops:
        x = torch.randn(4, 8)
        edge_index = torch.tensor([[0, 1, 2, 3], [1, 0, 1, 1]])
        edge_weight = torch.randn(edge_index.size(1))
        edge_attr = torch.randn(edge_index.size(1), 4)

        conv = GATv2Conv(8, 32, heads=2, edge_dim=1, fill_value=0.5)
        out = conv(x, edge_index, edge_weight)
        assert out.size() == (4, 64)

        conv = GATv2Conv(8, 32, heads=2, edge_dim=1, fill_value="mean")
        out = conv(x, edge_index, edge_weight)
        assert out.size() == (4, 64)

        conv = GATv2Conv(8, 32, heads=2, edge_dim=4, fill_value=0.5)
        out = conv(x, edge_index, edge_attr)
        assert out.size() == (4, 64)

        conv = GATv2Conv(8, 32, heads=2, edge_dim=4, fill_value="mean")
        out = conv(x, edge_index, edge_attr)
        assert out.size() == (4, 64)
    assert ops.calls == {FUSED_OP: 4}
