"""Property-based differential tests: every op against a float64 plain-PyTorch
reference on hypothesis-generated CSR graphs.

Graphs cover E = 0, N_dst = 0, N_src = 0, rows without edges, duplicate edges,
self-loops, N_src != N_dst and one hub row holding most edges; H and D range
from 1 to a few hundred (odd sizes included); every value and index dtype;
contiguous, strided, transposed, offset and broadcast (stride 0) inputs.

Profiles: "ci" (default) keeps the file within about a minute on a small CPU;
"gpu" (``HYPOTHESIS_PROFILE=gpu``) draws many more and larger cases.
"""
import os
from collections import Counter
from typing import NamedTuple

import pytest
import torch
from conftest import (
    DEVICES,
    FLOAT_DTYPES,
    INDEX_DTYPES,
    TOLERANCE,
    poison,
    reference_grad_x,
    reference_sddmm,
    reference_spmm,
    rel_error_and_rounding,
)
from gat_reference import edge_rows, reference_gat_attention
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_gat_attention import (
    Inputs,
    assert_grads_close,
    assert_lse_close,
    grad_names,
    lse_dtype,
    reference_grads,
)
from torch import Tensor
from torch_geometric.index import index2ptr

import pyg_multihead_agg as pma

ops = torch.ops.pyg_multihead_agg

# No example database: nothing is written into the tree, and a failure prints
# the @reproduce_failure blob instead.
_COMMON = dict(deadline=None, database=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=60, **_COMMON)
settings.register_profile("gpu", max_examples=250, **_COMMON)
# A few examples each, for scripts/sanitize.sh (compute-sanitizer is slow).
settings.register_profile("sanitize", max_examples=8, **_COMMON)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)

# Size bounds per profile: nodes, edges, extra hub edges, heads * channels.
_BOUNDS = {
    "ci": dict(nodes=12, edges=40, hub=60, width=768),
    "gpu": dict(nodes=200, edges=1500, hub=3000, width=8192),
}
BOUNDS = _BOUNDS.get(PROFILE, _BOUNDS["ci"])
# Channel counts that hit the CUDA fast paths, their neighbours and odd sizes.
SPECIAL_CHANNELS = [1, 2, 3, 7, 8, 15, 16, 24, 32, 33, 64, 127, 128, 256, 257, 300]
LAYOUTS = ["contiguous", "x_strided", "x_offset", "x_every_other_row", "x_broadcast",
           "weight_transposed", "all"]


class Problem(NamedTuple):
    num_dst: int
    num_src: int
    edges: list  # (dst, src) pairs, unsorted
    heads: int
    channels: int
    dtype: torch.dtype
    index_dtype: torch.dtype
    layout: str
    seed: int


@st.composite
def problems(draw):
    b = BOUNDS
    num_dst = draw(st.integers(0, b["nodes"]))
    num_src = draw(st.integers(0, b["nodes"]))
    edges = []
    if num_dst > 0 and num_src > 0:
        pair = st.tuples(st.integers(0, num_dst - 1), st.integers(0, num_src - 1))
        edges = draw(st.lists(pair, max_size=b["edges"]))
        if edges and draw(st.booleans()):  # duplicates of existing edges
            edges += edges[: draw(st.integers(1, len(edges)))]
        if draw(st.booleans()):  # self-loops (node ids shared by both sides)
            edges += [(i, i) for i in range(min(num_dst, num_src))]
        if draw(st.booleans()):  # one hub row holding most edges
            hub = draw(st.integers(0, num_dst - 1))
            degree = draw(st.integers(len(edges) + 1, max(len(edges) + 1, b["hub"])))
            edges += [(hub, j % num_src) for j in range(degree)]
    heads = draw(st.one_of(st.integers(1, 8), st.integers(1, 300)))
    max_channels = max(1, min(300, b["width"] // heads))
    special = [c for c in SPECIAL_CHANNELS if c <= max_channels]
    channels = draw(st.one_of(st.sampled_from(special), st.integers(1, max_channels)))
    return Problem(num_dst, num_src, edges, heads, channels,
                   draw(st.sampled_from(FLOAT_DTYPES)), draw(st.sampled_from(INDEX_DTYPES)),
                   draw(st.sampled_from(LAYOUTS)), draw(st.integers(0, 2**31 - 1)))


def csr_of(p: Problem, device):
    """(rowptr, col) sorted by destination, in the problem's index dtype."""
    pairs = torch.tensor(p.edges, dtype=torch.long).view(-1, 2)
    row, order = pairs[:, 0].sort(stable=True)
    col = pairs[order, 1]
    rowptr = index2ptr(row, p.num_dst)
    return rowptr.to(device, p.index_dtype), col.to(device, p.index_dtype)


def shuffled_csc(rowptr, col, num_src, gen):
    """A valid CSC (colptr, row, perm) whose order within each column is random:
    the kernels must not rely on csr_to_csc's stable order."""
    rowptr_l, col_l = rowptr.cpu().long(), col.cpu().long()
    num_edges = col_l.numel()
    key = col_l * (num_edges + 1) + torch.randperm(num_edges, generator=gen)
    perm = key.argsort()
    rows = torch.repeat_interleave(torch.arange(rowptr_l.numel() - 1), rowptr_l.diff())
    colptr = index2ptr(col_l[perm], num_src)
    return tuple(t.to(col.device, col.dtype) for t in (colptr, rows[perm], perm))


def with_layout(t: Tensor, how: str, device) -> Tensor:
    """The same values as t in a differently laid out tensor."""
    if how == "strided":  # every other element of the last dim
        big = torch.full((*t.shape[:-1], 2 * t.shape[-1]), float("nan"), dtype=t.dtype,
                         device=device)
        big[..., ::2] = t
        return big[..., ::2]
    if how == "offset":  # contiguous, but starting 3 rows into the storage
        big = torch.full((t.shape[0] + 3, *t.shape[1:]), float("nan"), dtype=t.dtype,
                         device=device)
        big[3:] = t
        return big[3:]
    if how == "every_other_row":
        big = torch.full((2 * t.shape[0], *t.shape[1:]), float("nan"), dtype=t.dtype,
                         device=device)
        big[::2] = t
        return big[::2]
    if how == "transposed":  # column-major 2-D
        return t.t().contiguous().t()
    if how == "broadcast":  # every row the same, stride 0 on dim 0
        return t[:1].expand_as(t) if t.shape[0] > 0 else t
    return t


def values(p: Problem, num_edges: int, device):
    """weight [E, H], x [N_src, H, D], grad_out [N_dst, H, D] laid out as p asks."""
    gen = torch.Generator().manual_seed(p.seed)
    weight = torch.randn(num_edges, p.heads, generator=gen).to(device, p.dtype)
    x = torch.randn(p.num_src, p.heads, p.channels, generator=gen).to(device, p.dtype)
    grad_out = torch.randn(p.num_dst, p.heads, p.channels, generator=gen).to(device, p.dtype)
    everything = p.layout == "all"
    if everything or p.layout == "weight_transposed":
        weight = with_layout(weight, "transposed", device)
    for how in ("strided", "offset", "every_other_row", "broadcast"):
        if p.layout == f"x_{how}":
            x = with_layout(x, how, device)
    if everything:
        x = with_layout(with_layout(x, "every_other_row", device), "strided", device)
        grad_out = with_layout(grad_out, "strided", device)
    return weight, x, grad_out, gen


def accumulation(p: Problem) -> float:
    """The relative error that the problem's longest sum (the most edges into
    one destination or out of one source) may carry, accumulated in float32
    (float64 for float64 inputs): up to about n * eps, since n equal terms
    (a row of repeated edges) round alike instead of cancelling out."""
    into, out_of = Counter(d for d, _ in p.edges), Counter(s for _, s in p.edges)
    longest = max([*into.values(), *out_of.values()], default=0)
    return longest * (2.0 ** -53 if p.dtype == torch.float64 else 2.0 ** -24)


def assert_matches(out, ref, p: Problem, what: str):
    assert out.dtype == p.dtype, (what, out.dtype)
    err, rounding = rel_error_and_rounding(out, ref)
    bound = TOLERANCE[p.dtype] + rounding + accumulation(p)
    assert err <= bound, f"{what}: relative error {err:.3g} > {bound:.3g} for {p}"


def assert_grad_matches(g, r, p: Problem, name: str, tol: float, scale: float = 0.0,
                        allowance: float = 0.0):
    """A gradient against its float64 reference, relative to its norm or, for
    a gradient whose terms cancel, to the scale of those terms; beside the
    tolerance, an absolute allowance for a known error bound."""
    assert g.dtype == p.dtype, (name, g.dtype)
    err, rounding = rel_error_and_rounding(g, r, scale)
    bound = tol + rounding + accumulation(p) + allowance / max(float(r.norm()), scale, 1e-30)
    assert err <= bound, f"grad {name}: relative error {err:.3g} > {bound:.3g} for {p}"


@pytest.mark.parametrize("device", DEVICES)
@given(p=problems())
def test_forward(device, p):
    rowptr, col = csr_of(p, device)
    weight, x, _, _ = values(p, col.numel(), device)
    before = [t.clone() for t in (rowptr, col, weight, x)]
    poison((p.num_dst, p.heads, p.channels), p.dtype, device)
    out = pma.multihead_spmm(rowptr, col, weight, x)
    assert out.shape == (p.num_dst, p.heads, p.channels) and out.device.type == device
    assert_matches(out, reference_spmm(rowptr, col, weight, x), p, "forward")
    for t, saved in zip((rowptr, col, weight, x), before, strict=True):
        assert torch.equal(t, saved), "an input was modified"


@pytest.mark.parametrize("device", DEVICES)
@given(p=problems(), mode=st.sampled_from(["csc", "no_csc", "no_csc_deterministic"]),
       needs=st.sampled_from(["both", "x", "weight"]))
def test_autograd(device, p, mode, needs):
    rowptr, col = csr_of(p, device)
    weight, x, grad_out, gen = values(p, col.numel(), device)
    weight.requires_grad_(needs in ("both", "weight"))
    x.requires_grad_(needs in ("both", "x"))
    csc = shuffled_csc(rowptr, col, p.num_src, gen) if mode == "csc" else None
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(mode == "no_csc_deterministic")
    try:
        out = pma.multihead_spmm(rowptr, col, weight, x, csc=csc)
        inputs = [t for t in (weight, x) if t.requires_grad]
        grads = torch.autograd.grad(out, inputs, grad_out)
    finally:
        torch.use_deterministic_algorithms(deterministic)
    assert_matches(out, reference_spmm(rowptr, col, weight, x), p, "forward")
    expected = {"weight": lambda: reference_sddmm(rowptr, col, grad_out, x),
                "x": lambda: reference_grad_x(rowptr, col, weight, grad_out, p.num_src)}
    names = [n for n, t in (("weight", weight), ("x", x)) if t.requires_grad]
    for name, grad in zip(names, grads, strict=True):
        assert_matches(grad, expected[name](), p, f"grad_{name} ({mode})")


@pytest.mark.parametrize("device", DEVICES)
@given(p=problems())
def test_backward_ops_and_sddmm(device, p):
    rowptr, col = csr_of(p, device)
    weight, x, grad_out, gen = values(p, col.numel(), device)
    colptr, row, perm = shuffled_csc(rowptr, col, p.num_src, gen)
    H, D = p.heads, p.channels
    want_gx = reference_grad_x(rowptr, col, weight, grad_out, p.num_src)
    want_gw = reference_sddmm(rowptr, col, grad_out, x)

    poison((p.num_src, H, D), p.dtype, device)
    grad_x, grad_weight = ops.multihead_spmm_backward_csc(colptr, row, perm, weight, x, grad_out)
    assert_matches(grad_x, want_gx, p, "backward_csc grad_x")
    assert_matches(grad_weight, want_gw, p, "backward_csc grad_weight")
    grad_x, empty = ops.multihead_spmm_backward_csc(colptr, row, perm, weight, None, grad_out)
    assert_matches(grad_x, want_gx, p, "backward_csc grad_x only")
    assert empty.shape == (0, H)
    empty, grad_weight = ops.multihead_spmm_backward_csc(colptr, row, perm, None, x, grad_out)
    assert_matches(grad_weight, want_gw, p, "backward_csc grad_weight only")
    assert empty.shape == (0, H, D)

    poison((p.num_src, H, D), p.dtype, device)
    scattered = ops.multihead_spmm_backward_x_scatter(rowptr, col, weight, grad_out, p.num_src)
    assert_matches(scattered, want_gx, p, "backward_x_scatter")

    poison((col.numel(), H), p.dtype, device)
    assert_matches(ops.multihead_sddmm(rowptr, col, grad_out, x), want_gw, p, "sddmm")


# ---------------------------------------------------------------------------
# The fused GAT attention op (gat_attention and its backward)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@given(p=problems(), with_edge=st.booleans(), dropout=st.sampled_from([0.0, 0.4]),
       mode=st.sampled_from(["csc", "no_csc"]), through=st.sampled_from(["out", "out_and_lse"]))
def test_gat_attention(device, p, with_edge, dropout, mode, through):
    """out and lse of the fused attention, and the gradients of x, s_src, s_dst
    and s_edge, against the float64 reference (the same graphs, layouts and
    dtypes as the aggregation above, with and without dropout and edge scores).
    """
    rowptr, col = csr_of(p, device)
    num_edges, H = col.numel(), p.heads
    _, x, grad_out, gen = values(p, num_edges, device)

    def scores(rows):
        return torch.randn(rows, H, generator=gen).to(device, p.dtype).requires_grad_()

    inp = Inputs(rowptr, col, scores(p.num_src), scores(p.num_dst), x.requires_grad_(),
                 scores(num_edges) if with_edge else None)
    philox = torch.tensor([p.seed, 7], dtype=torch.int64) if dropout else None
    csc = shuffled_csc(rowptr, col, p.num_src, gen) if mode == "csc" else None
    poison((p.num_dst, H, p.channels), p.dtype, device)
    out, lse = pma.gat_attention(rowptr, col, inp.s_src, inp.s_dst, x, s_edge=inp.s_edge,
                                 dropout=dropout, philox=philox, csc=csc)
    ref_out, ref_lse = reference_gat_attention(rowptr, col, inp.s_src, inp.s_dst, x,
                                               s_edge=inp.s_edge, dropout=dropout, philox=philox)
    assert_matches(out, ref_out, p, "gat_attention out")
    assert_lse_close(lse, ref_lse, p.dtype)

    grad_lse = None
    if through == "out_and_lse":
        grad_lse = torch.randn(p.num_dst, H, generator=gen).to(device, lse_dtype(p.dtype))
    outputs, grads_in = ((out, lse), (grad_out, grad_lse)) if grad_lse is not None else (
        (out,), (grad_out,))
    try:
        grads = torch.autograd.grad(outputs, inp.floats(), grads_in)
    except RuntimeError as exc:
        # The CUDA backward takes heads of at most 128 vectors per lane group
        # (512 float32 channels when 16-byte aligned, 128 otherwise); wider
        # heads are refused with this message (the layer falls back then).
        if device == "cuda" and p.channels > 128 and "channels" in str(exc):
            return
        raise
    ref = reference_grads(inp, grad_out, grad_lse, dropout=dropout, philox=philox)
    assert_grads_close(grads[:1], ref[:1], p.dtype, ["x"], accumulation=accumulation(p))
    # Score gradients are alpha * (m * <g, x> - <g, out>) per edge, with out
    # rounded to the dtype: in float16 / bfloat16 they carry a rounding error
    # of about eps * |g| * |out| even where the exact value is 0 (a row with a
    # single kept edge), so their error is measured against that scale too.
    xs = x.detach().double().cpu()
    scale = float(grad_out.detach().double().cpu().norm()
                  * (xs.norm(dim=-1).max() if xs.numel() else 0.0) / (1.0 - dropout))
    for g, r, name in zip(grads[1:], ref[1:], grad_names(inp)[1:], strict=True):
        assert_grad_matches(g, r, p, name, 4 * TOLERANCE[p.dtype], scale)


# ---------------------------------------------------------------------------
# The fused GATv2 attention op (gatv2_attention and its backward)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@given(p=problems(), with_edge=st.booleans(), dropout=st.sampled_from([0.0, 0.4]),
       mode=st.sampled_from(["csc", "no_csc"]))
def test_gatv2_attention(device, p, with_edge, dropout, mode):
    """out and lse of the fused GATv2 attention, and the gradients of x_l,
    x_r, att and e_feat, against the float64 reference on the same graphs,
    layouts and dtypes. CUDA takes heads up to 32 vectors with
    heads * next_pow2(vectors) <= 128, and refuses wider ones by name."""
    from gat_reference import reference_gatv2_attention

    rowptr, col = csr_of(p, device)
    num_edges, H, C = col.numel(), p.heads, p.channels
    _, x_l, grad_out, gen = values(p, num_edges, device)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device, p.dtype).requires_grad_()

    x_l = x_l.requires_grad_()
    x_r, att = rand(p.num_dst, H, C), rand(H, C)
    e_feat = rand(num_edges, H, C) if with_edge else None
    philox = torch.tensor([p.seed, 7], dtype=torch.int64) if dropout else None
    csc = shuffled_csc(rowptr, col, p.num_src, gen) if mode == "csc" else None
    poison((p.num_dst, H, C), p.dtype, device)
    try:
        out, lse = pma.gatv2_attention(rowptr, col, x_l, x_r, att, e_feat=e_feat,
                                       dropout=dropout, philox=philox, csc=csc)
    except RuntimeError as exc:
        if device == "cuda" and "supports heads of at most" in str(exc):
            vec = 16 // x_l.element_size()
            vectors = -(-C // vec)
            assert vectors > 32 or H * (1 << (vectors - 1).bit_length()) > 128, str(exc)
            return
        raise
    leaves = [t.detach().double().cpu().requires_grad_() for t in (x_l, x_r, att)]
    leaves.append(e_feat.detach().double().cpu().requires_grad_() if with_edge else None)
    ref_out, ref_lse = reference_gatv2_attention(rowptr, col, *leaves[:3], leaves[3],
                                                 dropout=dropout, philox=philox)
    assert_matches(out, ref_out, p, "gatv2_attention out")
    # The logits sum att * leaky(z) over the channels, terms that can cancel.
    z = leaves[0].detach()[col.long().cpu()] + leaves[1].detach()[edge_rows(rowptr)]
    if with_edge:
        z = z + leaves[3].detach()
    terms = (torch.nn.functional.leaky_relu(z, 0.2) * leaves[2].detach()).abs().sum(-1)
    assert_lse_close(lse, ref_lse, p.dtype, float(terms.norm()))
    inputs = [t for t in (x_l, x_r, att, e_feat) if t is not None]
    grads = torch.autograd.grad(out, inputs, grad_out)
    ref = torch.autograd.grad(ref_out, [t for t in leaves if t is not None],
                              grad_out.detach().double().cpu())
    # The score gradients cancel (alpha * (m * dot - delta)) and att's sums
    # over every edge: measured against the scale of |g| * |x_l| per edge.
    xs = x_l.detach().double().cpu()
    scale = float(grad_out.detach().double().cpu().norm()
                  * (xs.norm(dim=-1).max() if xs.numel() else 0.0) / (1.0 - dropout))
    # x_l's gradient, measured against its own norm, takes the score path too
    # (z = x_l[j] + x_r[i] + e), where the backward reads the output rounded to
    # the dtype: delta_i = <g_i, out_i> errs by up to |g_i| |round(out_i) -
    # out_i|, which each logit gradient of row i carries (its weights sum to at
    # most 1) into x_l's through att.
    ref_o = ref_out.detach()
    out_rounding = (ref_o.to(p.dtype).double() - ref_o).norm(dim=-1)  # [N_dst, H]
    delta_error = grad_out.detach().double().cpu().norm(dim=-1) * out_rounding
    att_norm = float(leaves[2].detach().norm(dim=-1).max()) if leaves[2].numel() else 0.0
    for g, r, name in zip(grads, ref, ["x_l", "x_r", "att", "e_feat"], strict=False):
        tol = (4 if name != "x_l" else 2) * TOLERANCE[p.dtype] * (4 if name == "att" else 1)
        if name == "x_l":
            assert_grad_matches(g, r, p, name, tol, allowance=float(delta_error.norm()) * att_norm)
        else:
            assert_grad_matches(g, r, p, name, tol, scale)


# ---------------------------------------------------------------------------
# The fused graph-transformer attention op (CPU kernels)
# ---------------------------------------------------------------------------

@given(p=problems(), with_edge=st.booleans(), dropout=st.sampled_from([0.0, 0.4]),
       mode=st.sampled_from(["csc", "no_csc"]))
def test_transformer_attention(p, with_edge, dropout, mode):
    """out and lse of the fused graph-transformer attention, and the gradients
    of query, key, value and e_feat, against the float64 reference."""
    from gat_reference import reference_transformer_attention

    rowptr, col = csr_of(p, "cpu")
    num_edges, H, C = col.numel(), p.heads, p.channels
    _, value, grad_out, gen = values(p, num_edges, "cpu")

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(p.dtype).requires_grad_()

    value = value.requires_grad_()
    query, key = rand(p.num_dst, H, C), rand(p.num_src, H, C)
    e_feat = rand(num_edges, H, C) if with_edge else None
    philox = torch.tensor([p.seed, 7], dtype=torch.int64) if dropout else None
    csc = shuffled_csc(rowptr, col, p.num_src, gen) if mode == "csc" else None
    out, lse = pma.transformer_attention(rowptr, col, query, key, value, e_feat=e_feat,
                                         dropout=dropout, philox=philox, csc=csc)
    leaves = [t.detach().double().requires_grad_() for t in (query, key, value)]
    leaves.append(e_feat.detach().double().requires_grad_() if with_edge else None)
    ref_out, ref_lse = reference_transformer_attention(rowptr, col, *leaves[:3], leaves[3],
                                                       dropout=dropout, philox=philox)
    assert_matches(out, ref_out, p, "transformer_attention out")
    # The logits sum query * (key + e_feat) / sqrt(C) over the channels.
    k = leaves[1].detach()[col.long()] + (leaves[3].detach() if with_edge else 0.0)
    terms = (leaves[0].detach()[edge_rows(rowptr)] * k).abs().sum(-1) / max(C, 1) ** 0.5
    assert_lse_close(lse, ref_lse, p.dtype, float(terms.norm()))
    inputs = [t for t in (query, key, value, e_feat) if t is not None]
    grads = torch.autograd.grad(out, inputs, grad_out)
    ref = torch.autograd.grad(ref_out, [t for t in leaves if t is not None],
                              grad_out.detach().double())
    # The logit gradients cancel (alpha * (m * dot - delta)): measured against
    # the scale of |g| * |message| per edge, a message being value[j] + e_feat[e]
    # (delta reads the output, rounded to the dtype, dot the messages).
    msgs = value.detach().double()[col.long()]
    if with_edge:
        msgs = msgs + e_feat.detach().double()
    scale = float(grad_out.detach().double().norm()
                  * (msgs.norm(dim=-1).max() if msgs.numel() else 0.0) / (1.0 - dropout))
    for g, r, name in zip(grads, ref, ["query", "key", "value", "e_feat"], strict=False):
        tol = (4 if name != "value" else 2) * TOLERANCE[p.dtype]
        assert_grad_matches(g, r, p, name, tol, scale if name != "value" else 0.0)
