"""pyg_multihead_agg.nn.TransformerConv against torch_geometric.nn.TransformerConv.

The reference is PyG's own TransformerConv in float64 on a plain edge_index
in the adjacency's own edge order, with the same (loaded) weights; each
adjacency type of our layer must match it in outputs, attention weights and
gradients (inputs, edge features, every parameter), and the fused operator
must have run (its calls are counted). PyG's own tests of the layer, with
our class swapped in, close the file.
"""
import copy
import doctest
from typing import NamedTuple, Optional

import pytest
import torch
import torch_geometric.nn
from conftest import DEVICES, rel_error
from test_gat_conv import KINDS, assert_matches, make_adj, same_structure, weights_of
from test_gat_conv import make_graph as make_edges
from test_gatv2_conv import (
    OpCalls,
    _unwrap,
    assert_compiled_matches_eager,
    assert_out_of_range_raises,
    assert_size_mismatch_like_pyg,
    count_builds,
    run,
)
from torch_geometric.explain.algorithm.utils import clear_masks, set_masks
from torch_geometric.typing import WITH_TORCH_SPARSE, SparseTensor
from torch_geometric.utils import to_torch_csc_tensor

from pyg_multihead_agg.nn import GATConv, TransformerConv
from pyg_multihead_agg.nn.gatv2_conv import fused_head_supported as gatv2_fused_head_supported
from pyg_multihead_agg.nn.transformer_conv import fused_head_supported

FUSED_OP = "pyg_multihead_agg::transformer_attention"
FUSED_BACKWARD = "pyg_multihead_agg::transformer_attention_backward"
PLAIN = ["edge_index", "edge_index_sorted", "torch_csr"]


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
    Case("heads1", 25, 25, 80, False, None, dict(heads=1)),
    Case("mean_heads", 20, 20, 60, False, None, dict(heads=4, concat=False)),
    Case("beta", 20, 20, 60, False, None, dict(heads=2, beta=True)),
    Case("beta_mean_heads", 20, 20, 60, False, None, dict(heads=3, concat=False, beta=True)),
    Case("no_root_weight", 20, 20, 60, False, None, dict(heads=2, root_weight=False)),
    # root_weight=False switches beta off (no lin_beta).
    Case("no_root_weight_beta", 20, 20, 60, False, None,
         dict(heads=2, root_weight=False, beta=True)),
    Case("no_bias", 20, 20, 60, False, None, dict(heads=2, bias=False)),
    Case("edge_dim", 20, 20, 70, False, 3, dict(heads=2, edge_dim=3)),
    Case("edge_dim_beta_mean_heads", 20, 20, 70, False, 3,
         dict(heads=3, edge_dim=3, concat=False, beta=True)),
    Case("edge_dim_no_root_weight_no_bias", 20, 20, 70, False, 2,
         dict(heads=2, edge_dim=2, root_weight=False, bias=False)),
    Case("bipartite", 30, 12, 80, True, None, dict(heads=2)),
    Case("bipartite_more_dst", 9, 25, 80, True, None, dict(heads=2)),
    Case("bipartite_edge_dim_beta", 30, 12, 80, True, 3, dict(heads=2, edge_dim=3, beta=True)),
    Case("isolated", 40, 40, 15, False, None, dict(heads=2)),
    Case("no_edges", 10, 10, 0, False, None, dict(heads=2)),
]


def case_named(name: str) -> Case:
    return next(case for case in CASES if case.name == name)


def make_graph(case: Case, seed: int):
    """Unique edges [2, E] (source, destination) sorted by destination, some
    of them self-loops, node features (float64, 7 source and 5 destination
    channels) and edge features (float64)."""
    return make_edges(case, seed)


def make_layers(case: Case, seed: int):
    in_channels = (7, 5) if case.bipartite else 7
    torch.manual_seed(seed)
    ref = torch_geometric.nn.TransformerConv(in_channels, 6, **case.kwargs)
    ours = TransformerConv(in_channels, 6, **case.kwargs)
    with torch.no_grad():  # every bias random, not PyG's initialisation
        gen = torch.Generator().manual_seed(seed + 1000)
        for name, p in ref.named_parameters():
            if name.endswith("bias"):
                p.normal_(generator=gen)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def features(case: Case, x_src, x_dst):
    return (x_src, x_dst) if case.bipartite else x_src


def reference(case, seed, edge_index, x_src, x_dst, edge_attr, perm):
    """PyG's layer in float64 on the plain edge_index in the adjacency's edge
    order (edge features in that order too)."""
    ref, _ = make_layers(case, seed)
    edge_attr = None if edge_attr is None else edge_attr[perm.cpu()]
    return run(ref.double(), case, edge_index[:, perm.cpu()], x_src, x_dst, edge_attr)


def assert_matches_pyg(out, grads, ref_out, ref_grads, tol):
    """assert_matches, with lin_key's bias apart: it adds <query_i, bias> to
    every score of row i, which the softmax cancels, so its gradient is zero
    up to rounding, in PyG's layer as in ours. Both must be zero on the
    scale of the other gradients."""
    grads, ref_grads = dict(grads), dict(ref_grads)
    scale = max((float(g.abs().max()) for g in ref_grads.values()
                 if g is not None and g.numel()), default=1.0)
    for grad in (grads.pop("lin_key.bias", None), ref_grads.pop("lin_key.bias", None)):
        assert grad is None or float(grad.abs().max()) <= tol * scale
    assert_matches(out, grads, ref_out, ref_grads, tol)


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
    ref_out, ref_grads = reference(case, seed, edge_index, x_src, x_dst, edge_attr, perm)
    with OpCalls() as ops:
        out, grads = run(ours.to(**to), case, adj, x_src.to(**to), x_dst.to(**to), ours_attr)
    assert ops.calls == {FUSED_OP: 1, FUSED_BACKWARD: 1}
    assert out.dtype == torch.float64 and out.device.type == device
    assert_matches_pyg(out, grads, ref_out, ref_grads, 1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case_name", ["heads3", "bipartite_edge_dim_beta"])
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
    assert out.dtype == torch.float32 and out.device.type == device
    assert_matches_pyg(out, grads, ref_out, ref_grads, 1e-5)


def test_duplicate_edges_match_pyg():
    # A multigraph: every copy of an edge is its own softmax term.
    case = case_named("edge_dim")
    edge_index, x_src, x_dst, edge_attr = make_graph(case, 13)
    edge_index = torch.cat([edge_index, edge_index[:, :25]], dim=1)
    edge_attr = torch.cat([edge_attr, torch.randn(25, 3, dtype=torch.float64)])
    perm = torch.randperm(edge_index.size(1), generator=torch.Generator().manual_seed(1))
    _, ours = make_layers(case, 13)
    ref_out, ref_grads = reference(case, 13, edge_index, x_src, x_dst, edge_attr, perm)
    with OpCalls() as ops:
        out, grads = run(ours.double(), case, edge_index[:, perm], x_src, x_dst,
                         edge_attr[perm])
    assert ops.calls == {FUSED_OP: 1, FUSED_BACKWARD: 1}
    assert_matches_pyg(out, grads, ref_out, ref_grads, 1e-12)


@pytest.mark.parametrize("kind", PLAIN)
def test_int32_indices(kind):
    case = case_named("edge_dim")
    edge_index, x_src, x_dst, edge_attr = make_graph(case, 3)
    _, ours = make_layers(case, 3)
    adj, perm = make_adj(kind, edge_index, case.num_src, case.num_dst, index_dtype=torch.int32)
    with OpCalls() as ops:
        out, grads = run(ours.double(), case, adj, x_src, x_dst, edge_attr[perm])
    assert ops.calls == {FUSED_OP: 1, FUSED_BACKWARD: 1}
    ref_out, ref_grads = reference(case, 3, edge_index, x_src, x_dst, edge_attr, perm)
    assert_matches_pyg(out, grads, ref_out, ref_grads, 1e-12)


def test_edge_dim1_vector_edge_attr():
    # edge_dim=1 with edge features [E]: taken as [E, 1] (PyG's own layer
    # fails on them: lin_edge reads the last dimension as the channels).
    case = Case("edge_dim1", 20, 20, 70, False, 1, dict(heads=2, edge_dim=1))
    edge_index, x_src, x_dst, edge_attr = make_graph(case, 14)
    ref, ours = make_layers(case, 14)
    ref, ours = ref.double(), ours.double()
    with pytest.raises(RuntimeError):
        ref(x_src, edge_index, edge_attr.view(-1))
    with OpCalls() as ops:
        out = ours(x_src, edge_index, edge_attr.view(-1))
    assert ops.calls == {FUSED_OP: 1}
    assert rel_error(out, ref(x_src, edge_index, edge_attr)) <= 1e-12


@pytest.mark.parametrize("kind", ["edge_index", "sparse_tensor", "torch_csr"])
def test_autocast_bfloat16_loosely(kind):
    """Under CPU autocast the projections and the op run in bfloat16: PyG's
    output dtype, PyG's values loosely."""
    if kind == "sparse_tensor" and not WITH_TORCH_SPARSE:
        pytest.skip("needs torch_sparse")
    case = case_named("edge_dim_beta_mean_heads")
    edge_index, x_src, _, edge_attr = make_graph(case, 4)
    ref, ours = make_layers(case, 4)
    adj, perm = make_adj(kind, edge_index, case.num_src, case.num_dst)
    x, edge_attr = x_src.float(), edge_attr[perm].float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with OpCalls() as ops:
            out = ours(x, adj, edge_attr)
        ref_out = ref(x, adj, edge_attr)
    assert ops.calls[FUSED_OP] == 1
    assert out.dtype == ref_out.dtype
    assert rel_error(out.float(), ref_out.float()) <= 5e-2


# PyG's own path: fused_attention=False, hooks, the explainer, decomposed
# layers, edge features without edge_dim, CUDA heads wider than the kernels'.

@pytest.mark.parametrize("kind", [_unwrap(k)[0] for k in KINDS])
def test_fused_attention_false_is_pyg(kind):
    if kind == "sparse_tensor" and not WITH_TORCH_SPARSE:
        pytest.skip("needs torch_sparse")
    case = case_named("bipartite_edge_dim_beta")
    edge_index, x_src, x_dst, edge_attr = make_graph(case, 5)
    ref, ours = make_layers(case, 5)
    ours = TransformerConv((7, 5), 6, **case.kwargs, fused_attention=False)
    ours.load_state_dict(ref.state_dict())
    adj, perm = make_adj(kind, edge_index, case.num_src, case.num_dst)
    edge_attr = edge_attr[perm].float()
    with OpCalls() as ops:
        out, grads = run(ours, case, adj, x_src.float(), x_dst.float(), edge_attr)
    ref_out, ref_grads = run(ref, case, adj, x_src.float(), x_dst.float(), edge_attr)
    assert not ops.calls
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=0, atol=0)


def test_fused_attention_is_a_constructor_argument():
    assert TransformerConv(4, 2).fused_attention is True
    assert TransformerConv(4, 2, heads=2, fused_attention=False).fused_attention is False


@pytest.mark.parametrize("kind", PLAIN)
def test_hooks_explain_and_decomposed_layers_take_pyg_path(kind):
    # PyG's hooks and the explainer must see PyG's calls: the fused op stays out.
    case = case_named("edge_dim")
    edge_index, x_src, _, edge_attr = make_graph(case, 25)
    ref, ours = make_layers(case, 25)
    adj, perm = make_adj(kind, edge_index, case.num_src, case.num_dst)
    x, edge_attr = x_src.float(), edge_attr[perm].float()
    expected = ref(x, edge_index[:, perm], edge_attr)
    seen = []
    handle = ours.register_message_forward_hook(lambda *args: seen.append(1))
    with OpCalls() as ops:
        out = ours(x, adj, edge_attr)
    handle.remove()
    assert seen and not ops.calls
    assert rel_error(out, expected) <= 1e-6

    # The explainer's edge mask (one per input edge) reaches PyG's messages.
    mask = torch.rand(edge_index.size(1), generator=torch.Generator().manual_seed(3))
    set_masks(ours, mask, edge_index[:, perm], apply_sigmoid=True)
    set_masks(ref, mask, edge_index[:, perm], apply_sigmoid=True)
    with OpCalls() as ops:
        out = ours(x, adj, edge_attr)
    assert not ops.calls
    assert rel_error(out, ref(x, adj, edge_attr)) <= 1e-6
    assert rel_error(out, expected) > 1e-3  # the mask counted
    clear_masks(ours)
    clear_masks(ref)

    with OpCalls() as ops:
        out = ours(x, adj, edge_attr)
    assert ops.calls[FUSED_OP] == 1
    assert rel_error(out, expected) <= 1e-5

    if kind == "edge_index":
        # decomposed_layers > 1 is PyG's path, which fails as PyG's own layer
        # does, with edge features or without: its decomposition chunks
        # query, key, value and edge features along different dimensions.
        plain_ref, plain = make_layers(case_named("heads3"), 25)
        for mine, theirs, attr in ((ours, ref, edge_attr), (plain, plain_ref, None)):
            mine.decomposed_layers = theirs.decomposed_layers = 2
            with pytest.raises(RuntimeError) as their_error:
                theirs(x, adj, attr)
            with OpCalls() as ops, pytest.raises(RuntimeError) as my_error:
                mine(x, adj, attr)
            assert not ops.calls
            assert str(my_error.value) == str(their_error.value)


@pytest.mark.parametrize("edge_attr_shape", [(2, 6), (1, 1), (3,)])
def test_edge_attr_without_edge_dim_is_pyg(edge_attr_shape):
    # PyG adds raw edge features to the values only (the keys get none):
    # its path runs, with its result or its error.
    torch.manual_seed(0)
    ref = torch_geometric.nn.TransformerConv(7, 6, heads=2)
    ours = TransformerConv(7, 6, heads=2)
    ours.load_state_dict(ref.state_dict())
    x, edge_index = torch.randn(10, 7), torch.randint(0, 10, (2, 30))
    edge_attr = torch.randn(30, *edge_attr_shape)
    try:
        expected = ref(x, edge_index, edge_attr)
    except RuntimeError as error:
        with pytest.raises(RuntimeError) as mine:
            ours(x, edge_index, edge_attr)
        assert str(mine.value) == str(error)
        return
    with OpCalls() as ops:
        out = ours(x, edge_index, edge_attr)
    assert not ops.calls
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_fused_head_supported_is_gatv2s_rule():
    # The scaled dot product shares GATv2's padded head layout on CUDA.
    for heads, channels in ((1, 8), (4, 32), (3, 48), (2, 100), (1, 256), (8, 64), (16, 8)):
        for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            assert (fused_head_supported(heads, channels, dtype)
                    == gatv2_fused_head_supported(heads, channels, dtype))
    assert fused_head_supported(4, 32, torch.float32)
    assert not fused_head_supported(1, 256, torch.float32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("channels,fused", [(16, True), (256, False)])
def test_cuda_wide_heads_take_pyg_path(channels, fused):
    # Heads the CUDA kernels serve run the fused op; wider ones PyG's path.
    torch.manual_seed(0)
    ref = torch_geometric.nn.TransformerConv(8, channels, heads=2, edge_dim=3).cuda()
    ours = TransformerConv(8, channels, heads=2, edge_dim=3).cuda()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(30, 8, device="cuda")
    edge_index = torch.randint(0, 30, (2, 100), device="cuda")
    edge_attr = torch.randn(100, 3, device="cuda")
    with OpCalls() as ops:
        out = ours(x, edge_index, edge_attr)
    assert bool(ops.calls) == fused
    torch.testing.assert_close(out, ref(x, edge_index, edge_attr), rtol=1e-4, atol=1e-5)


# return_attention_weights

ATTENTION_CASES = [
    pytest.param(case, name, id=f"{case.name}-{name}", marks=marks)
    for case in CASES if case.name in ("heads3", "edge_dim", "bipartite_edge_dim_beta",
                                       "no_edges")
    for name, marks in map(_unwrap, KINDS)]


@pytest.mark.parametrize("case,kind", ATTENTION_CASES)
def test_attention_weights(case, kind):
    """return_attention_weights: PyG's structure (the adjacency as given, a
    SparseTensor holding the weights) and PyG's weights, from PyG's layer on
    the same adjacency; gradients through the weights too."""
    edge_index, x_src, x_dst, edge_attr = make_graph(case, 6)
    ref, ours = make_layers(case, 6)
    adj, perm = make_adj(kind, edge_index, case.num_src, case.num_dst)
    if edge_attr is not None:
        edge_attr = edge_attr[perm]

    def forward(layer):
        x_s, x_d = x_src.clone().requires_grad_(), x_dst.clone().requires_grad_()
        out, att = layer.double()(features(case, x_s, x_d), adj, edge_attr,
                                  return_attention_weights=True)
        weights = weights_of(att)
        gen = torch.Generator().manual_seed(1)
        loss = ((out * torch.randn(out.shape, generator=gen, dtype=out.dtype)).sum()
                + (weights * torch.randn(weights.shape, generator=gen,
                                         dtype=weights.dtype)).sum())
        names, params = zip(*layer.named_parameters(), strict=True)
        grads = torch.autograd.grad(loss, (x_s, x_d) + params, allow_unused=True)
        return out, att, dict(zip(("x_src", "x_dst") + names, grads, strict=True))

    with OpCalls() as ops:
        out, att, grads = forward(ours)
    assert ops.calls == {FUSED_OP: 1, FUSED_BACKWARD: 1}
    ref_out, ref_att, ref_grads = forward(ref)
    assert_matches_pyg(out, grads, ref_out, ref_grads, 1e-12)
    if isinstance(att, tuple):
        assert isinstance(ref_att, tuple)
        assert att[0] is adj and ref_att[0] is adj
    else:
        same_structure(att, ref_att)
    num_edges = edge_index.size(1)
    assert weights_of(att).shape == (num_edges, case.kwargs["heads"])
    assert rel_error(weights_of(att), weights_of(ref_att)) <= 1e-12
    assert ((weights_of(att) >= 0) & (weights_of(att) <= 1)).all()


def test_attention_weights_when_false_as_pyg():
    # PyG returns the weights for any bool, False included.
    torch.manual_seed(0)
    conv = TransformerConv(7, 6, heads=2)
    x, edge_index = torch.randn(10, 7), torch.randint(0, 10, (2, 30))
    out, (returned, alpha) = conv(x, edge_index, return_attention_weights=False)
    assert returned is edge_index and alpha.shape == (30, 2)
    torch.testing.assert_close(out, conv(x, edge_index))
    assert isinstance(conv(x, edge_index, return_attention_weights=None), torch.Tensor)


def test_attention_weights_are_at_most_one():
    """Rows of one edge weigh it 1, as PyG's softmax does, never 1 + eps:
    the weights come from the kernel's lse and a score recomputed in the
    layer, which round differently."""
    torch.manual_seed(0)
    conv = TransformerConv(16, 8, heads=4)
    x = torch.randn(300, 16)
    edge_index = torch.stack([torch.randint(0, 300, (300,)), torch.arange(300)])
    _, (_, alpha) = conv(x, edge_index, return_attention_weights=True)
    assert alpha.max() <= 1
    torch.testing.assert_close(alpha, torch.ones(300, 4))


@pytest.mark.parametrize("kind", PLAIN)
def test_attention_weights_with_dropout_in_training(kind):
    # PyG returns the weights before dropout: the fused path serves them.
    case = case_named("heads3")._replace(kwargs=dict(heads=3, dropout=0.5))
    edge_index, x_src, _, _ = make_graph(case, 8)
    ref, ours = make_layers(case, 8)
    adj, _ = make_adj(kind, edge_index, case.num_src, case.num_dst)
    x = x_src.float()
    with OpCalls() as ops:
        out, att = ours(x, adj, return_attention_weights=True)
    assert ops.calls == {FUSED_OP: 1}
    _, ref_att = ref(x, adj, return_attention_weights=True)
    assert rel_error(weights_of(att), weights_of(ref_att)) <= 1e-6
    assert (weights_of(att) > 0).all()  # before dropout
    with torch.no_grad():
        assert rel_error(out, ours.eval()(x, adj)) > 1e-2  # dropout applied


# Attention dropout on the fused path: Philox masks keyed by torch's RNG.

@pytest.mark.parametrize("kind", PLAIN)
def test_dropout_in_training_fused(kind):
    # Seeded runs repeat, the mask changes the output, another seed another
    # mask, and the gradient is that of the same masked function (gradcheck
    # in float64).
    case = case_named("edge_dim")._replace(kwargs=dict(heads=3, dropout=0.5, edge_dim=3))
    edge_index, x_src, _, edge_attr = make_graph(case, 7)
    _, ours = make_layers(case, 7)
    ours = ours.double()
    adj, perm = make_adj(kind, edge_index, case.num_src, case.num_dst)
    edge_attr = edge_attr[perm]
    ours.eval()
    eval_out = ours(x_src, adj, edge_attr)
    ours.train()

    def seeded(inp, attr):
        torch.manual_seed(11)
        return ours(inp, adj, attr)

    with OpCalls() as ops:
        out = seeded(x_src, edge_attr)
    assert ops.calls == {FUSED_OP: 1}
    torch.testing.assert_close(seeded(x_src, edge_attr), out, rtol=0, atol=0)
    assert rel_error(out, eval_out) > 1e-2
    torch.manual_seed(12)
    assert rel_error(ours(x_src, adj, edge_attr), out) > 1e-2
    assert torch.autograd.gradcheck(
        seeded, (x_src.clone().requires_grad_(), edge_attr.clone().requires_grad_()),
        eps=1e-6, atol=1e-6, nondet_tol=0.0, fast_mode=True)


def test_dropout_statistics_fused():
    """Each destination has one edge and no root weight: out[i, h] is either
    0 (dropped) or value[j, h] / (1 - p). The dropped share is p, and the
    mean over seeds of the output is the output without dropout."""
    p, num_nodes, heads = 0.3, 200, 4
    torch.manual_seed(0)
    conv = TransformerConv(5, 3, heads=heads, dropout=p, root_weight=False)
    edge_index = torch.stack([torch.randperm(num_nodes), torch.arange(num_nodes)])
    x = torch.randn(num_nodes, 5)
    with torch.no_grad():
        kept = conv.eval()(x, edge_index).view(num_nodes, heads, 3)
        conv.train()
        torch.manual_seed(5)
        with OpCalls() as ops:
            out = conv(x, edge_index).view(num_nodes, heads, 3)
        assert ops.calls == {FUSED_OP: 1}
        dropped = (out == 0).all(-1)
        assert abs(dropped.float().mean().item() - p) < 0.06
        torch.testing.assert_close(out[~dropped], kept[~dropped] / (1 - p))
        mean = sum(conv(x, edge_index) for _ in range(200)) / 200
    assert rel_error(mean, kept.view(num_nodes, -1)) < 0.1


# The shared graph-preparation step.

@pytest.mark.parametrize("kind", ["edge_index", "edge_index_by_row", "torch_coo"])
def test_graph_prepared_once_per_graph(kind, monkeypatch):
    # Two TransformerConv layers and a GATConv without self-loops on the same
    # graph share its preparation.
    case = case_named("heads3")
    edge_index, x_src, _, _ = make_graph(case, 21)
    ref, ours = make_layers(case, 21)
    calls = count_builds(monkeypatch)
    adj, perm = make_adj(kind, edge_index, case.num_src, case.num_dst)
    x = x_src.float()
    TransformerConv(7, 6, heads=3)(x, adj)
    GATConv(7, 6, heads=3, add_self_loops=False)(x, adj)
    out = ours(x, adj)
    assert len(calls) == 1
    assert rel_error(out, ref.float()(x, edge_index[:, perm])) <= 1e-5


# torch.compile

@pytest.mark.parametrize("kind,edge_dim,beta", [
    ("edge_index", 3, False),
    ("edge_index", None, True),
    ("edge_index_sorted", 3, True),
    pytest.param("sparse_tensor", None, False, marks=pytest.mark.skipif(
        not WITH_TORCH_SPARSE, reason="needs torch_sparse")),
    pytest.param("sparse_tensor", 3, True, marks=pytest.mark.skipif(
        not WITH_TORCH_SPARSE, reason="needs torch_sparse")),
])
def test_compile_fullgraph(kind, edge_dim, beta):
    """The compiled layer (fullgraph) against eager: a training step, then an
    inference forward under no_grad, its own graph. EdgeIndex and
    SparseTensor caches are filled outside the compiled region."""
    kwargs = dict(heads=3, beta=beta)
    if edge_dim is not None:
        kwargs.update(edge_dim=edge_dim)
    case = case_named("heads3")._replace(kwargs=kwargs, edge_dim=edge_dim)
    assert_compiled_matches_eager(case, kind, make_graph, make_layers, (FUSED_OP, FUSED_BACKWARD))


# Bad input: clear errors.

def test_missing_destination_features_raise():
    conv = TransformerConv((7, 5), 6, heads=2)
    ref = torch_geometric.nn.TransformerConv((7, 5), 6, heads=2)
    x = (torch.randn(10, 7), None)
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    with pytest.raises(TypeError):  # PyG: lin_query on None
        ref(x, edge_index)
    for fused in (True, False):
        conv.fused_attention = fused
        with pytest.raises(ValueError, match="destination node features"):
            conv(x, edge_index)


def test_edge_dim_without_edge_attr_raises():
    conv = TransformerConv(7, 6, heads=2, edge_dim=3)
    ref = torch_geometric.nn.TransformerConv(7, 6, heads=2, edge_dim=3)
    x, edge_index = torch.randn(10, 7), torch.tensor([[0, 1, 2], [1, 2, 0]])
    with pytest.raises(AssertionError):  # PyG: a bare assert in message
        ref(x, edge_index)
    for fused in (True, False):
        conv.fused_attention = fused
        with pytest.raises(ValueError, match="needs edge_attr"):
            conv(x, edge_index)


@pytest.mark.parametrize("kind", PLAIN)
def test_edge_attr_of_wrong_length_raises(kind):
    case = case_named("edge_dim")
    edge_index, x_src, _, edge_attr = make_graph(case, 9)
    _, ours = make_layers(case, 9)
    adj, _ = make_adj(kind, edge_index, case.num_src, case.num_dst)
    with pytest.raises(RuntimeError, match="one row per edge"):
        ours(x_src.float(), adj, edge_attr[:-1].float())


@pytest.mark.parametrize("kind", ["sparse_tensor", "torch_csr", "edge_index_sorted"])
def test_adjacency_size_mismatch_raises_like_pyg(kind):
    if kind == "sparse_tensor" and not WITH_TORCH_SPARSE:
        pytest.skip("needs torch_sparse")
    assert_size_mismatch_like_pyg(case_named("heads1"), kind, make_graph, make_layers)


@pytest.mark.parametrize("fused", [True, False], ids=["fused_attention", "pyg_path"])
@pytest.mark.parametrize("bad", ["source_too_large", "destination_negative"])
def test_out_of_range_edge_index_raises_index_error(bad, fused):
    assert_out_of_range_raises(case_named("heads3"), bad, fused, make_graph, make_layers)


# The layer as a PyG layer.

def test_repr_and_state_dict_names_match_pyg():
    assert repr(TransformerConv(16, 8, heads=4)) == "TransformerConv(16, 8, heads=4)"
    for kwargs in (dict(heads=2, edge_dim=3, beta=True), dict(concat=False, bias=False),
                   dict(root_weight=False, beta=True)):
        ref = torch_geometric.nn.TransformerConv((4, 5), 6, **kwargs)
        ours = TransformerConv((4, 5), 6, **kwargs)
        assert ref.state_dict().keys() == ours.state_dict().keys()
        assert ours.beta == ref.beta


def test_lazy_in_channels():
    torch.manual_seed(0)
    ours = TransformerConv(-1, 6, heads=2, beta=True)
    x, edge_index = torch.randn(10, 7), torch.randint(0, 10, (2, 30))
    with OpCalls() as ops:
        out = ours(x, edge_index)
    assert ops.calls[FUSED_OP] == 1 and out.shape == (10, 12)
    ref = torch_geometric.nn.TransformerConv(7, 6, heads=2, beta=True)
    ref.load_state_dict(ours.state_dict())
    assert rel_error(out, ref(x, edge_index)) <= 1e-5


def test_layer_copies():
    case = case_named("edge_dim")
    edge_index, x_src, _, edge_attr = make_graph(case, 23)
    _, ours = make_layers(case, 23)
    x, edge_attr = x_src.float(), edge_attr.float()
    out = ours(x, edge_index, edge_attr)
    torch.testing.assert_close(copy.deepcopy(ours)(x, edge_index, edge_attr), out)


def test_docstring_example_runs():
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = finder.find(TransformerConv, "TransformerConv", globs={})
    for test in tests:
        runner.run(test)
    assert runner.failures == 0 and runner.tries > 0


# PyG's own test of TransformerConv (test/nn/conv/test_transformer_conv.py)
# with our class; every call must take the fused path. Left out: the
# TorchScript checks (conv.jittable; PyG runs them only in full tests, and
# our layer is compiled by torch.compile, tested above).

def test_pyg_transformer_conv():
    with OpCalls() as ops:
        x1 = torch.randn(4, 8)
        x2 = torch.randn(2, 16)
        edge_index = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
        adj1 = to_torch_csc_tensor(edge_index, size=(4, 4))

        conv = TransformerConv(8, 32, heads=2, beta=True)
        assert str(conv) == "TransformerConv(8, 32, heads=2)"

        out = conv(x1, edge_index)
        assert out.size() == (4, 64)
        assert torch.allclose(conv(x1, adj1.t()), out, atol=1e-6)

        if WITH_TORCH_SPARSE:
            adj2 = SparseTensor.from_edge_index(edge_index, sparse_sizes=(4, 4))
            assert torch.allclose(conv(x1, adj2.t()), out, atol=1e-6)

        # Test `return_attention_weights`.
        result = conv(x1, edge_index, return_attention_weights=True)
        assert torch.allclose(result[0], out)
        assert result[1][0].size() == (2, 4)
        assert result[1][1].size() == (4, 2)
        assert result[1][1].min() >= 0 and result[1][1].max() <= 1
        assert conv._alpha is None

        if WITH_TORCH_SPARSE:
            result = conv(x1, adj2.t(), return_attention_weights=True)
            assert torch.allclose(result[0], out, atol=1e-6)
            assert result[1].sizes() == [4, 4, 2] and result[1].nnz() == 4
            assert conv._alpha is None

        # Test bipartite message passing:
        adj1 = to_torch_csc_tensor(edge_index, size=(4, 2))

        conv = TransformerConv((8, 16), 32, heads=2, beta=True)
        assert str(conv) == "TransformerConv((8, 16), 32, heads=2)"

        out = conv((x1, x2), edge_index)
        assert out.size() == (2, 64)
        assert torch.allclose(conv((x1, x2), adj1.t()), out, atol=1e-6)

        if WITH_TORCH_SPARSE:
            adj2 = SparseTensor.from_edge_index(edge_index, sparse_sizes=(4, 2))
            assert torch.allclose(conv((x1, x2), adj2.t()), out, atol=1e-6)
    assert ops.calls == {FUSED_OP: 8 if WITH_TORCH_SPARSE else 5}
