"""A catalogue of malformed input, for the ops and for the layer.

Each case must raise an exception whose message names the problem on CPU; on
CUDA the process must survive (kernels never fault on bad index values, they
skip them) and the next valid call must give the right result.

Already covered in tests/test_bad_input.py (not repeated here): wrong value or
index dtypes, mixed dtypes, wrong ranks, too few weight rows, heads mismatch,
empty rowptr, device mismatch, non-monotone rowptr, rowptr[0] != 0,
rowptr[-1] < E, col too large and col negative (with validate=True and in the
CPU kernels), a bad CSC row under validate=True, NaN/inf in x on CPU.
tests/test_cuda_kernels.py checks that the CUDA argument checks give the CPU
messages and that malformed graphs do not fault.
"""
import warnings
from typing import Callable, List, NamedTuple, Type

import pytest
import torch
from conftest import DEVICES, reference_spmm, rel_error
from test_bad_input import good
from torch_geometric import EdgeIndex
from torch_geometric.index import index2ptr
from torch_geometric.typing import WITH_TORCH_SPARSE, SparseTensor

import pyg_multihead_agg as pma
from pyg_multihead_agg.nn import GATConv

ops = torch.ops.pyg_multihead_agg


class Case(NamedTuple):
    name: str
    call: Callable[[str], object]  # runs the malformed call on a device
    error: Type[Exception]
    words: List[str]  # the message must contain each
    cuda_may_pass: bool = False  # a bad index value without validate: skipped on CUDA


def _with(device, **kw):
    rowptr, col, weight, x = good(device)
    parts = dict(rowptr=rowptr, col=col, weight=weight, x=x)
    parts.update({k: (v(parts[k]) if callable(v) else v) for k, v in kw.items()})
    return parts


def spmm(device, validate=False, **kw):
    p = _with(device, **kw)
    return pma.multihead_spmm(p["rowptr"], p["col"], p["weight"], p["x"], validate=validate)


def _set(i, value):
    def apply(t):
        t = t.clone()
        t[i] = value
        return t
    return apply


def spmm_backward(device, validate=False, csc=None, needs=("weight", "x")):
    rowptr, col, weight, x = good(device)
    weight.requires_grad_("weight" in needs)
    x.requires_grad_("x" in needs)
    colptr, row, perm = csc(*pma.csr_to_csc(rowptr, col, x.size(0)))
    out = pma.multihead_spmm(rowptr, col, weight, x, csc=(colptr, row, perm), validate=validate)
    return torch.autograd.grad(out, [t for t in (weight, x) if t.requires_grad],
                               torch.ones_like(out))


OP_CASES = [
    Case("x_without_sources", lambda d: spmm(d, x=lambda x: x[:0]), RuntimeError,
         ["col[", "out of range [0, 0)"], cuda_may_pass=True),
    Case("x_without_sources_validate", lambda d: spmm(d, True, x=lambda x: x[:0]), ValueError,
         ["col", "[0, 0)"]),
    Case("weight_empty_with_edges", lambda d: spmm(d, weight=lambda w: w[:0]), RuntimeError,
         ["weight must have one row per edge", "col.numel() (20)"]),
    Case("col_empty_rowptr_not", lambda d: spmm(d, col=lambda c: c[:0], weight=lambda w: w[:0]),
         RuntimeError, ["rowptr", "end at col.numel() (0)"], cuda_may_pass=True),
    Case("rowptr_last_beyond_col", lambda d: spmm(d, rowptr=lambda r: torch.cat(
        [r[:-1], r[-1:] + 3])), RuntimeError, ["rowptr", "end at col.numel() (20)"],
        cuda_may_pass=True),
    Case("rowptr_last_beyond_col_validate", lambda d: spmm(d, True, rowptr=lambda r: torch.cat(
        [r[:-1], r[-1:] + 3])), ValueError, ["rowptr[-1] must equal col.numel() (20)"]),
    Case("col_int32_min", lambda d: spmm(d, rowptr=lambda r: r.int(),
                                         col=lambda c: _set(3, -2**31)(c.int())),
         RuntimeError, ["col[3] = -2147483648", "out of range"], cuda_may_pass=True),
    Case("col_int32_min_validate", lambda d: spmm(d, True, rowptr=lambda r: r.int(),
                                                  col=lambda c: _set(3, -2**31)(c.int())),
         ValueError, ["col entries must lie in [0, 5)", "-2147483648"]),
    Case("col_huge_int64", lambda d: spmm(d, col=_set(3, 2**40)), RuntimeError,
         ["col[3] = 1099511627776", "out of range"], cuda_may_pass=True),
    Case("grad_out_more_rows_than_rowptr",
         lambda d: ops.multihead_spmm_backward_x_scatter(*good(d)[:3], torch.randn(
             7, 2, 3, device=d), 5), RuntimeError, ["grad_out.size(0) (7)", "rowptr.numel() - 1"]),
    Case("sddmm_a_fewer_rows_than_rowptr",
         lambda d: ops.multihead_sddmm(*good(d)[:2], torch.randn(5, 2, 3, device=d), good(d)[3]),
         RuntimeError, ["a.size(0) (5)", "rowptr.numel() - 1 (6)"]),
    Case("csc_colptr_shorter_than_x",
         lambda d: spmm_backward(d, csc=lambda c, r, p: (c[:-1], r, p)), RuntimeError,
         ["x must have shape [4, 2, 3]", "colptr.numel() - 1"]),
    Case("csc_perm_too_short", lambda d: spmm_backward(d, csc=lambda c, r, p: (c, r, p[:-1])),
         RuntimeError, ["perm must have one entry per edge"]),
    Case("csc_perm_too_short_validate",
         lambda d: spmm_backward(d, True, csc=lambda c, r, p: (c, r, p[:-1])), ValueError,
         ["colptr[-1] must equal perm.numel() (19)"]),
    Case("csc_row_float_validate",
         lambda d: spmm_backward(d, True, csc=lambda c, r, p: (c, r.float(), p)), ValueError,
         ["row must be a 1-D int32 or int64 tensor"]),
    Case("x_not_a_tensor", lambda d: ops.multihead_spmm(*good(d)[:3], [1.0]), RuntimeError,
         ["argument 'x'", "Tensor"]),
    Case("values_complex", lambda d: spmm(d, weight=lambda w: w.cfloat(), x=lambda x: x.cfloat()),
         RuntimeError, ["weight must be float16, bfloat16, float32 or float64", "ComplexFloat"]),
    Case("indices_bool", lambda d: spmm(d, rowptr=lambda r: r.bool(), col=lambda c: c.bool()),
         RuntimeError, ["rowptr must be int32 or int64", "Bool"]),
    Case("x_sparse_layout", lambda d: spmm(d, x=lambda x: x.to_sparse()), NotImplementedError,
         ["pyg_multihead_agg::multihead_spmm", "Sparse"]),
    Case("num_src_overflows", lambda d: ops.multihead_spmm_backward_x_scatter(
        *good(d)[:3], torch.randn(6, 2, 3, device=d), 2**62), RuntimeError, ["overflow"]),
]


def _check_raises(case: Case, device: str):
    try:
        case.call(device)
    except case.error as error:
        message = str(error)
        for word in case.words:
            assert word in message, (case.name, word, message)
        return
    if device == "cuda" and case.cuda_may_pass:
        return
    pytest.fail(f"{case.name}: no {case.error.__name__} on {device}")


def _next_valid_call_works(device: str):
    rowptr, col, weight, x = good(device)
    out = pma.multihead_spmm(rowptr, col, weight, x)
    if device == "cuda":
        torch.cuda.synchronize()  # a sticky CUDA error would surface here
    assert rel_error(out, reference_spmm(rowptr, col, weight, x)) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", OP_CASES, ids=[c.name for c in OP_CASES])
def test_op_rejects(case, device):
    _check_raises(case, device)
    _next_valid_call_works(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("heads,channels", [(0, 3), (2, 0)], ids=["H0", "D0"])
def test_zero_heads_or_channels_give_empty_results(heads, channels, device):
    """Degenerate but valid: every op returns its usual shape, with no work to do."""
    rowptr, col, weight, x = good(device)
    weight, x = weight[:, :heads].contiguous(), x[:, :heads, :channels].contiguous()
    grad_out = torch.randn(6, heads, channels, device=device)
    colptr, row, perm = pma.csr_to_csc(rowptr, col, 5)
    assert pma.multihead_spmm(rowptr, col, weight, x).shape == (6, heads, channels)
    grad_x, grad_weight = ops.multihead_spmm_backward_csc(colptr, row, perm, weight, x, grad_out)
    assert grad_x.shape == (5, heads, channels) and grad_weight.shape == (20, heads)
    assert not grad_x.any() and not grad_weight.any()
    scattered = ops.multihead_spmm_backward_x_scatter(rowptr, col, weight, grad_out, 5)
    assert scattered.shape == (5, heads, channels)
    assert ops.multihead_sddmm(rowptr, col, grad_out, x).shape == (20, heads)
    assert not ops.multihead_sddmm(rowptr, col, grad_out, x).any()
    _next_valid_call_works(device)


# ---------------------------------------------------------------------------
# NaN / inf: propagate exactly like the float64 reference, on every device, in
# the forward, both backward ops and the SDDMM; rows that no edge reads stay
# out of it (a NaN there must not leak).
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("H,D", [(2, 16), (4, 32)], ids=["2x16", "4x32"])
def test_nan_and_inf_propagate_like_the_reference(H, D, dtype, device):
    """(4, 32) in float16 / bfloat16 on CUDA takes the tensor-core forward,
    whose tiles with a non-finite sum are recomputed one entry at a time."""
    gen = torch.Generator().manual_seed(1)
    num_dst, num_src = 9, 8
    row = torch.randint(0, num_dst - 1, (40,), generator=gen).sort().values  # last row empty
    col = torch.randint(0, num_src - 2, (40,), generator=gen)  # last two sources unread
    rowptr = index2ptr(row, num_dst)
    weight = torch.randn(40, H, generator=gen)
    x = torch.randn(num_src, H, D, generator=gen)
    grad_out = torch.randn(num_dst, H, D, generator=gen)
    x[num_src - 2:] = float("nan")
    x[int(col[0]), 0, :3] = float("nan")
    x[int(col[5]), 1, 4] = float("inf")
    x[int(col[9]), 0, 7] = -float("inf")
    weight[11, 1] = float("inf")
    weight[17, 0] = 0.0  # 0 * inf where the edge reads an inf
    x[int(col[17]), 0, 2] = float("inf")
    grad_out[int(row[3]), 1, 5] = float("nan")
    grad_out[num_dst - 1] = float("nan")  # empty row: no edge reads it

    refs = {
        "forward": reference_spmm(rowptr, col, weight, x),
        "grad_x": torch.zeros(num_src, H, D, dtype=torch.float64).index_add_(
            0, col, weight.double()[..., None] * grad_out.double()[row]),
        "sddmm": (grad_out.double()[row] * x.double()[col]).sum(-1),
    }
    to = dict(device=device, dtype=dtype)
    rowptr_d, col_d = rowptr.to(device), col.to(device)
    weight_d, x_d, grad_out_d = weight.to(**to), x.to(**to), grad_out.to(**to)
    colptr, row_csc, perm = pma.csr_to_csc(rowptr_d, col_d, num_src)
    got = {
        "forward": pma.multihead_spmm(rowptr_d, col_d, weight_d, x_d),
        "grad_x": ops.multihead_spmm_backward_x_scatter(rowptr_d, col_d, weight_d, grad_out_d,
                                                        num_src),
        "sddmm": ops.multihead_sddmm(rowptr_d, col_d, grad_out_d, x_d),
    }
    got["grad_x (csc)"], got["sddmm (csc)"] = ops.multihead_spmm_backward_csc(
        colptr, row_csc, perm, weight_d, x_d, grad_out_d)
    refs["grad_x (csc)"], refs["sddmm (csc)"] = refs["grad_x"], refs["sddmm"]
    assert refs["forward"].isnan().any() and refs["forward"].isinf().any()
    for name, ref in refs.items():
        out = got[name].double().cpu()
        assert torch.equal(out.isnan(), ref.isnan()), name
        assert torch.equal(out.isposinf(), ref.isposinf()), name
        assert torch.equal(out.isneginf(), ref.isneginf()), name
        finite = ref.isfinite()
        assert rel_error(out[finite], ref[finite]) <= 2e-2, name
    _next_valid_call_works(device)


# ---------------------------------------------------------------------------
# The layer: mismatched inputs give PyG's (or PyTorch's) clear errors on every
# adjacency type, before any kernel runs.
# ---------------------------------------------------------------------------

NUM_NODES, IN_CHANNELS = 12, 7


def _graph(device):
    gen = torch.Generator().manual_seed(2)
    src = torch.randint(0, NUM_NODES, (40,), generator=gen)
    dst = torch.randint(0, NUM_NODES, (40,), generator=gen)
    dst, order = dst.sort(stable=True)
    return torch.stack([src[order], dst]).to(device)


def _adj(kind, edge_index, num_src, num_dst):
    src, dst = edge_index
    if kind == "edge_index":
        return edge_index
    if kind == "edge_index_sorted":
        return EdgeIndex(edge_index, sparse_size=(num_src, num_dst), sort_order="col")
    if kind == "sparse_tensor":
        return SparseTensor(row=dst, col=src, sparse_sizes=(num_dst, num_src))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.sparse_csr "beta" warning
        return torch.sparse_csr_tensor(index2ptr(dst, num_dst), src,
                                       torch.ones(src.numel(), device=src.device),
                                       size=(num_dst, num_src))


KINDS = ["edge_index", "edge_index_sorted", "torch_csr", pytest.param(
    "sparse_tensor", marks=pytest.mark.skipif(not WITH_TORCH_SPARSE, reason="needs torch_sparse"))]


def layer_call(kind, device, *, loops=True, width=IN_CHANNELS, dtype=torch.float32,
               adj_nodes=(NUM_NODES, NUM_NODES), edge_dim=None, edge_attr=None, x_dst=None):
    torch.manual_seed(0)
    conv = GATConv(IN_CHANNELS if x_dst is None else (IN_CHANNELS, IN_CHANNELS), 5, heads=2,
                   add_self_loops=loops, edge_dim=edge_dim).to(device)
    x = torch.randn(NUM_NODES, width, dtype=dtype, device=device)
    edge_index = _graph(device)
    if edge_attr is not None:
        edge_attr = edge_attr(edge_index.size(1)).to(device)
    features = x if x_dst is None else (x, torch.randn(x_dst, IN_CHANNELS, device=device))
    return conv(features, _adj(kind, edge_index, *adj_nodes), edge_attr)


LAYER_CASES = [
    Case("x_wrong_width", lambda k, d: layer_call(k, d, width=9), RuntimeError,
         ["shapes cannot be multiplied", "x9"]),
    Case("x_wrong_dtype", lambda k, d: layer_call(k, d, dtype=torch.float64), RuntimeError,
         ["same dtype"]),
    Case("adj_more_sources_than_x", lambda k, d: layer_call(
        k, d, loops=False, adj_nodes=(NUM_NODES + 4, NUM_NODES)), ValueError,
        [f"size {NUM_NODES} in dimension 0", f"expected size {NUM_NODES + 4}"]),
    Case("adj_more_destinations_than_x", lambda k, d: layer_call(
        k, d, adj_nodes=(NUM_NODES, NUM_NODES + 4)), ValueError,
        [f"size {NUM_NODES} in dimension 0", f"expected size {NUM_NODES + 4}"]),
    Case("adj_fewer_destinations_than_x_dst", lambda k, d: layer_call(
        k, d, loops=False, x_dst=NUM_NODES + 3), ValueError,
        [f"size {NUM_NODES + 3} in dimension 0", f"expected size {NUM_NODES}"]),
    Case("edge_attr_float64", lambda k, d: layer_call(
        k, d, loops=False, edge_dim=3, edge_attr=lambda e: torch.randn(e, 3).double()),
        RuntimeError, ["same dtype", "double"]),
    Case("edge_attr_int64", lambda k, d: layer_call(
        k, d, loops=False, edge_dim=3, edge_attr=lambda e: torch.ones(e, 3, dtype=torch.long)),
        RuntimeError, ["same dtype", "long"]),
    Case("edge_attr_one_row_too_many", lambda k, d: layer_call(
        k, d, loops=False, edge_dim=3, edge_attr=lambda e: torch.randn(e + 1, 3)),
        RuntimeError, ["must match the size", "41"]),
    Case("edge_attr_wrong_width", lambda k, d: layer_call(
        k, d, loops=False, edge_dim=3, edge_attr=lambda e: torch.randn(e, 4)),
        RuntimeError, ["shapes cannot be multiplied"]),
]


# (A plain edge_index carries no sizes of its own to mismatch.)
def _unwrap(kind):
    return (kind.values[0], kind.marks) if hasattr(kind, "values") else (kind, ())


LAYER_PAIRS = [pytest.param(case, name, id=f"{case.name}-{name}", marks=marks)
               for case in LAYER_CASES for name, marks in map(_unwrap, KINDS)
               if not (name == "edge_index" and case.name.startswith("adj_"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case,kind", LAYER_PAIRS)
def test_layer_rejects(case, kind, device):
    _check_raises(case._replace(call=lambda d: case.call(kind, d)), device)
    _next_valid_call_works(device)


@pytest.mark.parametrize("device", DEVICES)
def test_edge_index_beyond_x_without_sparse_size(device):
    edge_index = _graph(device)
    edge_index[0, -1] = NUM_NODES + 2
    conv = GATConv(IN_CHANNELS, 5, heads=2, add_self_loops=False).to(device)
    with pytest.raises(IndexError, match=rf"larger than {NUM_NODES - 1} \(got {NUM_NODES + 2}\)"):
        conv(torch.randn(NUM_NODES, IN_CHANNELS, device=device),
             EdgeIndex(edge_index, sort_order="col"))
    _next_valid_call_works(device)


# ---------------------------------------------------------------------------
# Gaps found by this catalogue, now closed.
# ---------------------------------------------------------------------------

def _none_for(name: str):
    # Each op's wrapper and its arguments on a 2-row graph, `name` None.
    rowptr, col = torch.tensor([0, 1, 2]), torch.tensor([0, 1])
    a = dict(x=torch.randn(2, 2, 3), x_l=torch.randn(2, 2, 3), x_r=torch.randn(2, 2, 3),
             query=torch.randn(2, 2, 3), key=torch.randn(2, 2, 3), value=torch.randn(2, 2, 3),
             weight=torch.rand(2, 2), s_src=torch.randn(2, 2), s_dst=torch.randn(2, 2),
             att=torch.randn(2, 3), att_src=torch.randn(1, 2, 3))
    a[name] = None
    return {
        "multihead_spmm": (pma.multihead_spmm, (rowptr, col, a["weight"], a["x"])),
        "gat_attention": (pma.gat_attention, (rowptr, col, a["s_src"], a["s_dst"], a["x"])),
        "gatv2_attention": (pma.gatv2_attention, (rowptr, col, a["x_l"], a["x_r"], a["att"])),
        "transformer_attention": (pma.transformer_attention,
                                  (rowptr, col, a["query"], a["key"], a["value"])),
        "_gat_scores": (ops._gat_scores, (a["x"], a["att_src"])),
    }


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("op, arg", [
    ("multihead_spmm", "weight"), ("multihead_spmm", "x"), ("gat_attention", "s_src"),
    ("gat_attention", "s_dst"), ("gat_attention", "x"), ("gatv2_attention", "x_l"),
    ("gatv2_attention", "x_r"), ("gatv2_attention", "att"), ("transformer_attention", "query"),
    ("transformer_attention", "key"), ("transformer_attention", "value"), ("_gat_scores", "x"),
    ("_gat_scores", "att_src")])
def test_none_tensor_argument_is_named(op, arg, grad):
    # With grad mode the op's autograd kernel sees the None first: it names
    # the argument as the kernels' checks do without it.
    fn, args = _none_for(arg)[op]
    for t in args:
        if t is not None and t.is_floating_point():
            t.requires_grad_(grad)
    with torch.set_grad_enabled(grad), pytest.raises(RuntimeError,
                                                     match=f"^{arg} must be a tensor, got None"):
        fn(*args)


def test_validate_checks_colptr_length():
    with pytest.raises(ValueError, match="colptr"):
        spmm_backward("cpu", True, csc=lambda c, r, p: (torch.cat([c, c[-1:]]), r, p),
                      needs=("x",))


def test_validate_checks_perm_is_the_csr_permutation():
    with pytest.raises(ValueError, match="perm"):
        spmm_backward("cpu", True, csc=lambda c, r, p: (c, r, torch.zeros_like(p)))


def test_torch_csr_edge_attr_with_self_loops_has_a_message():
    with pytest.raises(Exception, match="edge_attr"):
        layer_call("torch_csr", "cpu", loops=True, edge_dim=3,
                   edge_attr=lambda e: torch.randn(e, 3))
