"""Inputs where a drop-in must behave exactly as PyG's layer: the three layers
against PyG's on the same state_dict, with proof that our fused op ran."""
import functools
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch_geometric
from conftest import DEVICES
from torch_geometric.utils import to_torch_csc_tensor

from pyg_multihead_agg.nn import GATConv, GATv2Conv, TransformerConv

WITH_TORCH_SPARSE = importlib.util.find_spec("torch_sparse") is not None
if WITH_TORCH_SPARSE:
    from torch_sparse import SparseTensor

LAYERS = {  # ours, PyG's, the fused op
    "gat": (GATConv, torch_geometric.nn.GATConv, "pyg_multihead_agg::gat_attention"),
    "gatv2": (GATv2Conv, torch_geometric.nn.GATv2Conv, "pyg_multihead_agg::gatv2_attention"),
    "transformer": (TransformerConv, torch_geometric.nn.TransformerConv,
                    "pyg_multihead_agg::transformer_attention"),
}
NEEDS_TORCH_SPARSE = pytest.mark.skipif(not WITH_TORCH_SPARSE, reason="needs torch_sparse")


def pair(family, *args, **kwargs):
    ours_cls, pyg_cls, op = LAYERS[family]
    torch.manual_seed(0)
    theirs = pyg_cls(*args, **kwargs).double()
    ours = ours_cls(*args, **kwargs).double()
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs, op


def ops_run(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        result = fn()
    return result, {e.name for e in prof.events() if e.name.startswith("pyg_multihead_agg::")}


def assert_same(ours, theirs, op, *args, fused=True, their_adj=None):
    """Outputs and gradients (inputs, parameters) of ours(*args) and PyG's
    layer theirs(*args) (with their_adj for the adjacency, if given), and
    whether our fused op ran."""
    x_req = [a for a in args[0] if a is not None] if isinstance(args[0], tuple) else [args[0]]
    for t in x_req:
        t.requires_grad_()
    out, ran = ops_run(lambda: ours(*args))
    ref = theirs(*args) if their_adj is None else theirs(args[0], their_adj, *args[2:])
    assert (op in ran) == fused, ran
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)
    grads = torch.autograd.grad(out.sum(), [*x_req, *ours.parameters()], allow_unused=True)
    ref_grads = torch.autograd.grad(ref.sum(), [*x_req, *theirs.parameters()], allow_unused=True)
    for g, r in zip(grads, ref_grads, strict=True):
        if r is None:
            assert g is None or not g.any()
        else:
            torch.testing.assert_close(g, r, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["torch_csc", pytest.param("sparse_tensor",
                                                              marks=NEEDS_TORCH_SPARSE)])
@pytest.mark.parametrize("family", ["gat", "gatv2"])
def test_bipartite_sparse_adjacency_without_destination_features(family, layout, device):
    # PyG's self-loops of a sparse adj_t sit on its own diagonal, whatever
    # the features say: 2 here, for 4 sources and 2 destinations.
    edge_index = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]], device=device)
    if layout == "torch_csc":
        adj = to_torch_csc_tensor(edge_index, size=(4, 2)).t()
    else:
        adj = SparseTensor.from_edge_index(edge_index, sparse_sizes=(4, 2)).t()
    ours, theirs, op = pair(family, (8, 16), 6, heads=2)
    # (GATv2 needs the destinations' features.)
    x_dst = torch.randn(2, 16, dtype=torch.float64) if family == "gatv2" else None
    x = (torch.randn(4, 8, dtype=torch.float64), x_dst)
    ours, theirs = ours.to(device), theirs.to(device)
    x = tuple(None if t is None else t.to(device) for t in x)
    assert_same(ours, theirs, op, x, adj)
    if layout == "torch_csc":
        out, (looped, alpha) = ours(x, adj, return_attention_weights=True)
        assert out.shape == (2, 12)  # (PyG's own layer fails on a SparseTensor here, in set_diag)
        _, (ref_looped, ref_alpha) = theirs(x, adj, return_attention_weights=True)
        assert looped._nnz() == ref_looped._nnz() == 5
        torch.testing.assert_close(alpha, ref_alpha)


def _sparse(kind, edge_index, values, size):
    num_src, num_dst = size
    if kind == "sparse_tensor":
        return SparseTensor.from_edge_index(edge_index, values, sparse_sizes=size).t()
    coo = torch.sparse_coo_tensor(edge_index.flip(0), values, (num_dst, num_src, *values.shape[1:]))
    return coo.coalesce().to_sparse_csr() if kind == "torch_csr" else coo.coalesce()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", [pytest.param("sparse_tensor", marks=NEEDS_TORCH_SPARSE),
                                  "torch_csr", "torch_coo"])
@pytest.mark.parametrize("family", list(LAYERS))
def test_edge_features_from_the_adjacency_values(family, kind, device):
    # PyG's propagate reads edge_attr from a SparseTensor's values, and from a
    # torch.sparse tensor's values of more than one dimension.
    gen = torch.Generator().manual_seed(3)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 0, 2], [1, 0, 1, 1, 2, 4, 3]])
    edge_attr = torch.randn(edge_index.size(1), 3, generator=gen, dtype=torch.float64)
    adj = _sparse(kind, edge_index, edge_attr, (5, 5))
    kwargs = dict(heads=2, edge_dim=3)
    if family != "transformer":
        kwargs["add_self_loops"] = False
    ours, theirs, op = pair(family, 4, 6, **kwargs)
    x = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    ours, theirs = ours.to(device), theirs.to(device)
    adj = adj.to(device)
    assert_same(ours, theirs, op, x.to(device), adj)
    # The same as the explicit features (the adjacency's own edge order).
    values = adj.storage.value() if kind == "sparse_tensor" else adj.values()
    torch.testing.assert_close(ours(x.to(device), adj), ours(x.to(device), adj, values))


@pytest.mark.parametrize("family", ["gat", "gatv2"])
def test_torch_sparse_values_with_self_loops_take_pygs_path(family):
    # PyG's add_self_loops fills the loops' features and sums those of
    # duplicate entries as it coalesces: PyG's own path serves this.
    edge_index = torch.tensor([[0, 1, 2, 3, 1], [1, 0, 1, 1, 0]])
    edge_attr = torch.randn(edge_index.size(1), 3, dtype=torch.float64)
    adj = _sparse("torch_csr", edge_index, edge_attr, (4, 4))
    ours, theirs, op = pair(family, 4, 6, heads=2, edge_dim=3)
    assert_same(ours, theirs, op, torch.randn(4, 4, dtype=torch.float64), adj, fused=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["csr", "coo"])
@pytest.mark.parametrize("family", ["gat", "gatv2"])
def test_torch_sparse_duplicates_with_self_loops_coalesce(family, layout, device):
    # With self-loops PyG rebuilds a torch.sparse adjacency coalesced, so its
    # duplicate entries count once; without them every entry counts.
    src = torch.tensor([0, 1, 1, 2, 3, 4, 4, 5, 5])
    dst = torch.tensor([1, 2, 2, 3, 3, 0, 0, 1, 5])
    order = dst.argsort(stable=True)
    values = torch.ones(src.numel(), dtype=torch.float64)
    rowptr = torch._convert_indices_from_coo_to_csr(dst[order], 6)
    csr = torch.sparse_csr_tensor(rowptr, src[order], values, (6, 6)).to(device)
    adj = csr if layout == "csr" else torch.sparse_coo_tensor(  # not coalesced
        torch.stack([dst, src]), values, (6, 6)).to(device)
    x = torch.randn(6, 4, dtype=torch.float64, device=device)
    for loops in (True, False):
        ours, theirs, op = pair(family, 4, 3, heads=2, add_self_loops=loops)
        ours, theirs = ours.to(device), theirs.to(device)
        # PyG's layer on the CSR of the same entries (PyG 2.8.0 cannot read
        # an uncoalesced COO adjacency without self-loops).
        assert_same(ours, theirs, op, x.clone(), adj, their_adj=csr)
        if layout == "coo":  # (the returned COO adjacency is coalesced, as PyG's)
            continue
        _, (looped, alpha) = ours(x, adj, return_attention_weights=True)
        _, (ref_looped, ref_alpha) = theirs(x, csr, return_attention_weights=True)
        assert looped._nnz() == ref_looped._nnz()
        torch.testing.assert_close(alpha, ref_alpha)


# tools/pyg_upstream.py runs PyG's own test files with our layers swapped in;
# here on a stand-in PyG tree, so that it runs offline and can fail.
UPSTREAM = Path(__file__).resolve().parents[1] / "tools" / "pyg_upstream.py"
STAND_IN = '''
import torch
from torch_geometric.nn import GATConv


def test_swapped_and_fused():
    conv = GATConv(8, 4, heads=2)
    assert type(conv).__module__.startswith("pyg_multihead_agg")
    assert conv(torch.randn(3, 8), torch.tensor([[0, 1], [1, 2]])).shape == (3, 8)


def test_not_fused():
    assert GATConv(8, 4).heads == 1


def test_failing():
    assert GATConv(8, 4).heads == 2
'''


def test_upstream_tool_reports_swap_failures_and_fused_calls(tmp_path):
    conv = tmp_path / "test" / "nn" / "conv"
    conv.mkdir(parents=True)
    (conv / "test_gat_conv.py").write_text(STAND_IN)
    proc = subprocess.run([sys.executable, str(UPSTREAM), "--pyg", str(tmp_path), "--files",
                           "gat"], capture_output=True, text=True, timeout=300)
    assert "| test_gat_conv.py | 2 | 1 | 0 | 1 of 2 |" in proc.stdout, proc.stdout + proc.stderr
    assert "test_not_fused passed without our fused op: no known reason" in proc.stdout
    assert "test_failing failed" in proc.stdout
    assert proc.returncode == 1 and "FAILED" in proc.stdout


# The fused path runs inside PyG's propagate: the prepared graph reaches
# propagate as a column-sorted EdgeIndex, which propagate routes to the
# layer's message_and_aggregate, whose hooks fire around the fused op.

MESSAGE_AND_AGGREGATE_ARGS = {"gat": {"x", "alpha"}, "gatv2": {"x", "alpha"},
                              "transformer": {"query", "key", "value", "edge_attr"}}


@pytest.mark.parametrize("adj_kind", ["edge_index", "torch_csr"])
@pytest.mark.parametrize("family", list(LAYERS))
def test_fused_op_runs_inside_propagate_with_its_hooks(family, adj_kind):
    ours, theirs, op = pair(family, 4, 6, heads=2)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 0], [1, 0, 1, 1, 2, 4]])
    adj = edge_index if adj_kind == "edge_index" else to_torch_csc_tensor(
        edge_index, size=(5, 5)).t()
    x = torch.randn(5, 4, dtype=torch.float64)
    expected = theirs(x, adj)

    seen = []

    def pre_hook(module, inputs):
        edge, kwargs = inputs
        seen.append(("pre", type(edge).__name__, edge.is_sorted_by_col, set(kwargs)))

    def hook(module, inputs, out):
        seen.append(("post", tuple(out.shape)))
        return out * 2  # what the hook returns is the layer's aggregation

    inside = []
    propagate = type(ours).propagate

    def counting_propagate(self, *args, **kwargs):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out = propagate(self, *args, **kwargs)
        inside.extend(e.name for e in prof.events() if e.name == op)
        return out

    handles = [ours.register_message_and_aggregate_forward_pre_hook(pre_hook),
               ours.register_message_and_aggregate_forward_hook(hook)]
    try:
        type(ours).propagate = counting_propagate
        out = ours(x, adj)
    finally:
        type(ours).propagate = propagate
        for handle in handles:
            handle.remove()
    assert inside == [op]  # the fused op ran once, inside propagate
    num_nodes, width = 5, 12
    assert seen == [("pre", "EdgeIndex", True, MESSAGE_AND_AGGREGATE_ARGS[family]),
                    ("post", (num_nodes, 2, 6))]
    # The hook doubled the aggregation (before the bias / root weight).
    ours_plain = ours(x, adj)
    torch.testing.assert_close(ours_plain, expected)
    assert out.shape == (num_nodes, width) and not torch.allclose(out, ours_plain)


@pytest.mark.parametrize("family", ["gat", "gatv2"])
def test_message_hooks_see_pygs_messages_on_sparse_adjacencies(family):
    # A message hook takes PyG's path; there PyG's propagate must not skip
    # message for message_and_aggregate, even for a sparse adjacency.
    ours, theirs, op = pair(family, 4, 6, heads=2)
    adj = to_torch_csc_tensor(torch.tensor([[0, 1, 2, 3], [1, 0, 1, 1]]), size=(4, 4)).t()
    x = torch.randn(4, 4, dtype=torch.float64)
    messages = []
    handle = ours.register_message_forward_hook(lambda m, i, out: messages.append(out.shape))
    out, ran = ops_run(lambda: ours(x, adj))
    handle.remove()
    assert messages and not ran
    torch.testing.assert_close(out, theirs(x, adj))


# Where nothing can observe PyG's propagate (no message_and_aggregate hook,
# nothing replaced), the layer calls the op itself; a subclass or an
# instance that replaces propagate, message_and_aggregate or update gets
# them called, on the fused path, with the op inside.

def _subclass(family, **overrides):
    ours_cls = LAYERS[family][0]
    return type(f"User{ours_cls.__name__}", (ours_cls,), overrides)


@pytest.mark.parametrize("replaced", ["message_and_aggregate", "update", "propagate", "instance"])
@pytest.mark.parametrize("family", list(LAYERS))
def test_replaced_propagate_steps_run_on_the_fused_path(family, replaced):
    ours, theirs, op = pair(family, 4, 6, heads=2)
    x = torch.randn(5, 4, dtype=torch.float64)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 0], [1, 0, 1, 1, 2, 4]])
    calls = []
    assert not ours._propagate_observed()
    if replaced == "instance":
        plain = ours.message_and_aggregate

        def message_and_aggregate(*args, **kwargs):
            calls.append("message_and_aggregate")
            return plain(*args, **kwargs)

        ours.message_and_aggregate = message_and_aggregate
        user = ours
    else:
        @functools.wraps(getattr(LAYERS[family][0], replaced))  # PyG inspects its signature
        def method(self, *args, **kwargs):
            calls.append(replaced)
            return getattr(super(type(self), self), replaced)(*args, **kwargs)

        torch.manual_seed(0)
        user = _subclass(family, **{replaced: method})(4, 6, heads=2).double()
        user.load_state_dict(ours.state_dict())
    assert user._propagate_observed()
    out, ran = ops_run(lambda: user(x, edge_index))
    # (GATConv's scores, PyG's products on a graph this small, in an op of their own)
    assert calls and ran - {"pyg_multihead_agg::_gat_scores"} == {op}
    torch.testing.assert_close(out, theirs(x, edge_index))


@pytest.mark.parametrize("family", list(LAYERS))
def test_a_message_and_aggregate_hook_routes_through_propagate(family):
    ours = pair(family, 4, 6, heads=2)[0]
    assert not ours._propagate_observed()
    handle = ours.register_message_and_aggregate_forward_pre_hook(lambda module, inputs: None)
    assert ours._propagate_observed()
    handle.remove()
    assert not ours._propagate_observed()
    # PyG's explain setter binds a propagate to the instance: PyG's own
    # generated one routes nothing through propagate.
    ours.explain = True
    ours.explain = False
    assert not ours._propagate_observed()
