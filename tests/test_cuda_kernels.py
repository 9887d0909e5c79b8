"""The CUDA kernels of every op against a float64 plain-PyTorch reference.

Shapes are chosen to hit every specialisation of csrc/cuda/spmm/:
16-byte vectors with 1, 2 and 4 vectors per lane and several feature chunks,
groups of 1..32 lanes, the scalar path (D not a multiple of the vector width,
or unaligned x), the generic SDDMM (D / V not a power of two, or heads wider
than a chunk), and long rows handled by a whole block (more than 64 edges).
"""
import pytest
import torch
from conftest import poison, reference_grad_x, reference_sddmm, reference_spmm, rel_error
from gat_reference import (
    reference_gat_attention,
    reference_gatv2_attention,
    reference_transformer_attention,
)

import pyg_multihead_agg as pma
from pyg_multihead_agg import csr_to_csc, invert_perm
from pyg_multihead_agg._testing import force_kernel_path

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

ops = torch.ops.pyg_multihead_agg
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INDICES = [torch.int32, torch.int64]
# Relative error in norm against float64; half types round the output only
# (they accumulate in float32).
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5, torch.float64: 1e-12}
# (H, D): every D of the fast paths and the fallbacks, odd H; (2, 24) has a
# power-of-two-free D / V (generic SDDMM, vector gather), (1, 1024) has heads
# wider than a feature chunk in float32.
HEADS_CHANNELS = [(h, d) for h in (1, 3, 4, 8) for d in (1, 3, 8, 16, 32, 64, 128, 256, 33)]
HEADS_CHANNELS += [(2, 24), (1, 1024)]


# ---------------------------------------------------------------------------
# Graphs and references (float64, CPU, index_select / index_add)
# ---------------------------------------------------------------------------

def csr_from_degrees(deg, num_src, gen, skew=1.0):
    """CSR with the given row degrees; sources `num_src * v**skew` (popular low ids)."""
    rowptr = torch.zeros(deg.numel() + 1, dtype=torch.long)
    rowptr[1:] = deg.cumsum(0)
    num_edges = int(rowptr[-1])
    col = (num_src * torch.rand(num_edges, generator=gen) ** skew).long().clamp_max(num_src - 1)
    return rowptr, col


def random_graph(num_dst, num_src, num_edges, gen):
    """Uniform random rows, some of them empty."""
    if num_dst == 0 or num_src == 0:
        return torch.zeros(num_dst + 1, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    row = torch.randint(0, num_dst, (num_edges,), generator=gen).sort().values
    deg = torch.bincount(row, minlength=num_dst)
    return csr_from_degrees(deg, num_src, gen)


def power_law_graph(num_dst, num_src, gen, hub_degree=6000):
    """Pareto-like degrees, empty rows, one hub of `hub_degree` edges, skewed sources."""
    u = torch.rand(num_dst, generator=gen)
    deg = (3 * u ** -0.7).long().clamp_max(1500)
    deg[::7] = 0
    deg[num_dst // 3] = hub_degree
    return csr_from_degrees(deg, num_src, gen, skew=3.0)


def layout_graphs(gen):
    """(index dtype, (rowptr, col, num_src)) on the CPU: power-law rows with a
    hub and empty rows in int32, short uniform rows in int64 (both built
    before any value is drawn from gen)."""
    graphs = [(*power_law_graph(300, 200, gen, hub_degree=700), 200),
              (*random_graph(40, 31, 150, gen), 31)]
    return zip(INDICES, graphs, strict=True)


def assert_close(out, ref, dtype, what):
    assert out.dtype == dtype, (what, out.dtype)
    out = out.detach().cpu().double()
    assert out.shape == ref.shape, (what, tuple(out.shape), tuple(ref.shape))
    assert torch.isfinite(out).all(), f"{what}: NaN or inf in the output"
    if ref.numel() == 0:
        return
    err = float((out - ref).norm() / ref.norm().clamp_min(1e-30))
    assert err <= TOL[dtype], f"{what}: relative error {err:.3g} > {TOL[dtype]:.3g}"


def make_values(rowptr, col, num_src, heads, channels, dtype, gen):
    num_dst = rowptr.numel() - 1
    weight = torch.randn(col.numel(), heads, generator=gen).to(dtype)
    x = torch.randn(num_src, heads, channels, generator=gen).to(dtype)
    grad_out = torch.randn(num_dst, heads, channels, generator=gen).to(dtype)
    return weight.cuda(), x.cuda(), grad_out.cuda()


def check_all_ops(rowptr, col, weight, x, grad_out, dtype):
    """Every op against the reference, outputs poisoned first; returns the outputs."""
    num_dst, num_src = rowptr.numel() - 1, x.size(0)
    H, D = x.size(1), x.size(2)
    poison((num_dst, H, D), dtype, "cuda")
    out = ops.multihead_spmm(rowptr, col, weight, x)
    assert_close(out, reference_spmm(rowptr, col, weight, x), dtype, "forward")

    colptr, row, perm = csr_to_csc(rowptr, col, num_src)
    assert colptr.dtype == row.dtype == perm.dtype == col.dtype
    ref_gx = reference_grad_x(rowptr, col, weight, grad_out, num_src)
    ref_gw = reference_sddmm(rowptr, col, grad_out, x)
    E = col.numel()
    poison((num_src, H, D), dtype, "cuda")
    poison((E, H), dtype, "cuda")
    gx, gw = ops.multihead_spmm_backward_csc(colptr, row, perm, weight, x, grad_out)
    assert_close(gx, ref_gx, dtype, "backward_csc grad_x")
    assert_close(gw, ref_gw, dtype, "backward_csc grad_weight")
    poison((num_src, H, D), dtype, "cuda")
    gx_only, gw_empty = ops.multihead_spmm_backward_csc(colptr, row, perm, weight, None, grad_out)
    assert_close(gx_only, ref_gx, dtype, "backward_csc grad_x only")
    assert gw_empty.shape == (0, H)
    poison((E, H), dtype, "cuda")
    gx_empty, gw_only = ops.multihead_spmm_backward_csc(colptr, row, perm, None, x, grad_out)
    assert_close(gw_only, ref_gw, dtype, "backward_csc grad_weight only")
    assert gx_empty.shape == (0, H, D)
    # With perm_inv: grad_weight by CSC entry, then gathered into edge order;
    # the same sums, so the same bits (both gradients, each alone, and a
    # weight viewed at an odd element offset, which 2-byte types with H * D =
    # 128 run on other kernels than the aligned one: compared with that
    # view's own run without perm_inv).
    perm_inv = invert_perm(perm)
    flat = torch.empty(E * H + 1, dtype=dtype, device="cuda")
    odd_weight = flat[1:].view(E, H)
    odd_weight.copy_(weight)
    for w in (weight, odd_weight):
        gx_w, gw_w = ops.multihead_spmm_backward_csc(colptr, row, perm, w, x, grad_out)
        assert_close(gx_w, ref_gx, dtype, "backward_csc grad_x, weight view")
        assert_close(gw_w, ref_gw, dtype, "backward_csc grad_weight, weight view")
        nans = [torch.full((E, H), float("nan"), dtype=dtype, device="cuda") for _ in range(2)]
        del nans  # two NaN blocks: the dots by CSC entry and grad_weight
        gx_inv, gw_inv = ops.multihead_spmm_backward_csc(colptr, row, perm, w, x, grad_out,
                                                         perm_inv)
        assert torch.equal(gx_inv, gx_w) and torch.equal(gw_inv, gw_w), \
            "perm_inv: not bitwise equal"
        poison((num_src, H, D), dtype, "cuda")
        gx_only_w, _ = ops.multihead_spmm_backward_csc(colptr, row, perm, w, None, grad_out)
        assert_close(gx_only_w, ref_gx, dtype, "backward_csc grad_x only, weight view")
        poison((num_src, H, D), dtype, "cuda")
        gx_inv, _ = ops.multihead_spmm_backward_csc(colptr, row, perm, w, None, grad_out,
                                                    perm_inv)
        assert torch.equal(gx_inv, gx_only_w), "perm_inv, grad_x only: not bitwise equal"
    poison((E, H), dtype, "cuda")
    _, gw_only_inv = ops.multihead_spmm_backward_csc(colptr, row, perm, None, x, grad_out,
                                                     perm_inv)
    assert torch.equal(gw_only_inv, gw_only), "perm_inv, grad_weight only: not bitwise equal"

    poison((num_src, H, D), dtype, "cuda")
    gx_scatter = ops.multihead_spmm_backward_x_scatter(rowptr, col, weight, grad_out, num_src)
    assert_close(gx_scatter, ref_gx, dtype, "backward_x_scatter")

    poison((col.numel(), H), dtype, "cuda")
    sddmm = ops.multihead_sddmm(rowptr, col, grad_out, x)
    assert_close(sddmm, ref_gw, dtype, "sddmm")
    return out, gx, gw


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------

@pytest.mark.sweep
@pytest.mark.parametrize("index_dtype", INDICES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("heads,channels", HEADS_CHANNELS)
def test_every_specialisation(heads, channels, dtype, index_dtype):
    gen = torch.Generator().manual_seed(heads * 1000 + channels)
    rowptr, col = random_graph(23, 31, 150, gen)
    weight, x, grad_out = make_values(rowptr, col, 31, heads, channels, dtype, gen)
    check_all_ops(rowptr.cuda().to(index_dtype), col.cuda().to(index_dtype), weight, x,
                  grad_out, dtype)


@pytest.mark.sweep
@pytest.mark.parametrize("index_dtype", INDICES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("heads,channels", [(1, 1), (8, 8), (4, 32), (8, 128), (3, 33), (1, 1024)])
def test_power_law_with_hub(heads, channels, dtype, index_dtype):
    """Rows above 64 edges (and the 6000-edge hub) take the block-wide path;
    popular sources in the CSC of the backward are cut into slices."""
    gen = torch.Generator().manual_seed(channels)
    rowptr, col = power_law_graph(300, 200, gen)
    assert int(rowptr.diff().max()) > 5000 and int((rowptr.diff() == 0).sum()) > 0
    weight, x, grad_out = make_values(rowptr, col, 200, heads, channels, dtype, gen)
    check_all_ops(rowptr.cuda().to(index_dtype), col.cuda().to(index_dtype), weight, x,
                  grad_out, dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("heads,channels", [(4, 32), (8, 16), (2, 64), (3, 33)])
def test_sliced_columns_every_size(heads, channels, dtype):
    """The backward over the CSC cuts columns of more than 64 entries (the
    long threshold of a graph this small) into slices of 64, and
    sum_slices_kernel adds a column's slices with one warp when it has at
    most 16 of them, with a block when it has more. Columns of 2, 8, 9, 16
    and 17 slices and a hub, on both sides of those boundaries."""
    gen = torch.Generator().manual_seed(heads * 31 + channels)
    lengths = [65, 128, 129, 512, 513, 576, 1024, 1025, 1088, 3000, 64, 5, 0, 1]
    num_src, num_dst = len(lengths) + 20, 300
    col = torch.cat([torch.full((n,), j) for j, n in enumerate(lengths)])
    col = torch.cat([col, torch.randint(len(lengths), num_src, (400,), generator=gen)])
    row = torch.randint(0, num_dst, (col.numel(),), generator=gen)
    order = torch.argsort(row * num_src + col)  # CSR order (rows, then columns)
    row, col = row[order], col[order]
    rowptr = torch.zeros(num_dst + 1, dtype=torch.long)
    rowptr[1:] = torch.bincount(row, minlength=num_dst).cumsum(0)
    counts = torch.bincount(col, minlength=num_src)
    assert counts[:10].tolist() == lengths[:10] and col.numel() < 64 * 32768
    weight, x, grad_out = make_values(rowptr, col, num_src, heads, channels, dtype, gen)
    for index_dtype in INDICES:
        check_all_ops(rowptr.cuda().to(index_dtype), col.cuda().to(index_dtype), weight, x,
                      grad_out, dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("heads,channels", [(4, 32), (8, 16), (2, 64)])
def test_forced_short_slices(heads, channels, dtype):
    """force_kernel_path(slice_len=8) cuts every CSC column of more than 8
    entries into slices of 8 (the heuristic's threshold is 64 on a graph this
    small), in the dot-gather and tensor-core backwards: the popular sources
    get more than 16 slices (sum_slices_kernel's block-wide rows), columns of
    9 to 64 entries are sliced too. Every op still matches the reference."""
    gen = torch.Generator().manual_seed(heads * 53 + channels)
    rowptr, col = power_law_graph(300, 200, gen, hub_degree=700)
    assert int(torch.bincount(col, minlength=200).max()) > 16 * 8
    weight, x, grad_out = make_values(rowptr, col, 200, heads, channels, dtype, gen)
    for index_dtype in INDICES:
        with force_kernel_path(slice_len=8):
            check_all_ops(rowptr.cuda().to(index_dtype), col.cuda().to(index_dtype), weight, x,
                          grad_out, dtype)


@pytest.mark.sweep
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("heads,channels", [(4, 16), (3, 32), (1, 32), (2, 64), (8, 8)])
def test_forward_transposed_weights(heads, channels, dtype):
    """The spmm forward with heads of 4 or 8 lanes loads each entry's weight in
    one lane of the head and shuffles it to the others (the default) or loads
    it in every lane (force_kernel_path(transposed=0)): both match the
    reference, row per group and row per warp, and agree bit for bit."""
    gen = torch.Generator().manual_seed(heads * 77 + channels)
    for index_dtype, (rowptr, col, num_src) in layout_graphs(gen):
        weight, x, _ = make_values(rowptr, col, num_src, heads, channels, dtype, gen)
        rowptr, col = rowptr.cuda().to(index_dtype), col.cuda().to(index_dtype)
        ref = reference_spmm(rowptr, col, weight, x)
        for split in (0, 1):
            got = []
            for layout in (0, 1):
                with force_kernel_path(split_rows=split, transposed=layout):
                    poison((rowptr.numel() - 1, heads, channels), dtype, "cuda")
                    out = ops.multihead_spmm(rowptr, col, weight, x)
                assert_close(out, ref, dtype, f"layout {layout}, split {split}, {index_dtype}")
                got.append(out)
            assert torch.equal(*got), f"split {split}, {index_dtype}"


@pytest.mark.sweep
@pytest.mark.parametrize("index_dtype", INDICES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("heads,channels", [(4, 32), (4, 16), (2, 64), (1, 32), (3, 32)])
def test_gather_rows_around_the_step(heads, channels, dtype, index_dtype):
    """Rows of every length around the gathers' 8-entry step (0, 1, 7, 8, 9,
    16, 17, ...; the last step is partial, predicated) and long rows (a whole
    block), shuffled; the forward and the CSC grad_x gather, a row per group
    of lanes and a row per warp."""
    gen = torch.Generator().manual_seed(heads * 1000 + channels)
    pattern = torch.tensor([0, 1, 2, 7, 8, 9, 15, 16, 17, 24, 3, 0, 200, 5, 33, 64, 65, 4])
    deg = pattern.repeat(40)[torch.randperm(40 * pattern.numel(), generator=gen)]
    num_src = 500
    rowptr, col = csr_from_degrees(deg, num_src, gen, skew=2.0)
    weight, x, _ = make_values(rowptr, col, num_src, heads, channels, dtype, gen)
    rowptr, col = rowptr.cuda().to(index_dtype), col.cuda().to(index_dtype)
    ref = reference_spmm(rowptr, col, weight, x)
    for split in (0, 1):
        with force_kernel_path(split_rows=split):
            poison((rowptr.numel() - 1, heads, channels), dtype, "cuda")
            out = ops.multihead_spmm(rowptr, col, weight, x)
            assert_close(out, ref, dtype, f"split {split}")
            # grad_x over the CSC runs the same gather with the perm
            colptr, row, perm = csr_to_csc(rowptr, col, num_src)
            grad_out = torch.randn(rowptr.numel() - 1, heads, channels,
                                   generator=gen).to(dtype).cuda()
            poison((num_src, heads, channels), dtype, "cuda")
            gx, _ = ops.multihead_spmm_backward_csc(colptr, row, perm, weight, None, grad_out)
            assert_close(gx, reference_grad_x(rowptr, col, weight, grad_out, num_src), dtype,
                         f"grad_x, split {split}")


@pytest.mark.sweep
@pytest.mark.parametrize("split", [0, 1], ids=["row_per_group", "row_per_warp"])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("heads,channels", [(1, 1), (1, 3), (1, 8), (8, 8), (4, 32), (2, 24)])
def test_forward_narrow_rows_both_layouts(heads, channels, dtype, split):
    """Rows narrower than a warp (G < 32 lanes) are gathered either one row per
    group of lanes or one row per warp, the warp's groups splitting its entries
    (force_kernel_path(split_rows=...) forces the choice the launcher otherwise
    makes from the average degree): both match the reference on power-law rows
    (a hub, empty rows) and on short uniform rows, int32 and int64."""
    gen = torch.Generator().manual_seed(heads * 100 + channels)
    for index_dtype, (rowptr, col, num_src) in layout_graphs(gen):
        weight, x, _ = make_values(rowptr, col, num_src, heads, channels, dtype, gen)
        rowptr, col = rowptr.cuda().to(index_dtype), col.cuda().to(index_dtype)
        with force_kernel_path(split_rows=split):
            poison((rowptr.numel() - 1, heads, channels), dtype, "cuda")
            out = ops.multihead_spmm(rowptr, col, weight, x)
            assert_close(out, reference_spmm(rowptr, col, weight, x), dtype,
                         f"forward, {index_dtype}")
            assert torch.equal(ops.multihead_spmm(rowptr, col, weight, x), out)  # deterministic


@pytest.mark.sweep
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("heads,channels", [(4, 16), (3, 32), (1, 32), (2, 64), (8, 8)])
def test_dot_products_both_layouts(heads, channels, dtype):
    """The dot-gather kernels (spmm backward over the CSC, SDDMM) with heads of
    4 or 8 lanes reduce each step's dot products with a transposing butterfly
    (the default) or one butterfly per entry (force_kernel_path(transposed=0)):
    both match the reference on a power-law graph with a hub (sliced columns)
    and on short uniform rows, int32 and int64, and agree bit for bit."""
    gen = torch.Generator().manual_seed(heads * 1000 + channels)
    for index_dtype, (rowptr, col, num_src) in layout_graphs(gen):
        weight, x, grad_out = make_values(rowptr, col, num_src, heads, channels, dtype, gen)
        rowptr, col = rowptr.cuda().to(index_dtype), col.cuda().to(index_dtype)
        colptr, row, perm = csr_to_csc(rowptr, col, num_src)
        got = []
        for layout in (0, 1):
            with force_kernel_path(transposed=layout):
                poison((num_src, heads, channels), dtype, "cuda")
                gx, gw = ops.multihead_spmm_backward_csc(colptr, row, perm, weight, x, grad_out)
                poison((col.numel(), heads), dtype, "cuda")
                sddmm = ops.multihead_sddmm(rowptr, col, grad_out, x)
            what = f"layout {layout}, {index_dtype}"
            assert_close(gx, reference_grad_x(rowptr, col, weight, grad_out, num_src), dtype,
                         f"grad_x, {what}")
            ref_gw = reference_sddmm(rowptr, col, grad_out, x)
            assert_close(gw, ref_gw, dtype, f"grad_weight, {what}")
            assert_close(sddmm, ref_gw, dtype, f"sddmm, {what}")
            got.append((gx, gw, sddmm))
        for other in got[1:]:
            for a, b, name in zip(got[0], other, ("grad_x", "grad_weight", "sddmm"), strict=True):
                assert torch.equal(a, b), name


@pytest.mark.sweep
@pytest.mark.parametrize("index_dtype", INDICES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("heads,channels", [(4, 32), (4, 16), (1, 32), (1, 8), (1, 1), (3, 32),
                                            (4, 64)])
def test_sorted_fetch_same_results(heads, channels, dtype, index_dtype):
    """The 2-byte spmm kernels (the forward's transposed gathers, the
    dot-gathers of the backward and the SDDMM) sort a warp's fetch of short
    rows by degree before its groups take them (the default), or take them in
    fetch order (force_kernel_path(sort_fetch=0)); the others always do the
    latter. Rows
    narrower than a warp (2 to 32 groups a warp; fetches of 64 items, two
    sorted windows of 32, at 8 groups; none sorted above), on rows of many
    lengths, empty and long ones among them, and a row count that is no
    multiple of a fetch: every op matches the reference both ways, and the two
    are bitwise equal (only which group computes a row changes)."""
    gen = torch.Generator().manual_seed(heads * 31 + channels)
    pattern = torch.tensor([0, 1, 2, 3, 5, 7, 8, 9, 12, 16, 17, 23, 31, 40, 64, 0, 1, 300])
    deg = pattern.repeat(58)[torch.randperm(58 * pattern.numel(), generator=gen)][:1037]
    num_src = 700
    rowptr, col = csr_from_degrees(deg, num_src, gen, skew=2.0)
    weight, x, grad_out = make_values(rowptr, col, num_src, heads, channels, dtype, gen)
    rowptr, col = rowptr.cuda().to(index_dtype), col.cuda().to(index_dtype)
    got = []
    for sort in (0, 1):
        with force_kernel_path(sort_fetch=sort):
            outs = check_all_ops(rowptr, col, weight, x, grad_out, dtype)
            poison((rowptr.numel() - 1, heads, channels), dtype, "cuda")
            with force_kernel_path(split_rows=0):  # a row per group
                per_group = ops.multihead_spmm(rowptr, col, weight, x)
        assert_close(per_group, reference_spmm(rowptr, col, weight, x), dtype,
                     f"forward, a row per group, sort {sort}")
        got.append((*outs, per_group))
    for a, b, name in zip(*got, ("forward", "grad_x", "grad_weight", "forward per group"),
                          strict=True):
        assert torch.equal(a, b), name


def _attention_results(op, rowptr, col, inputs, grad_out):
    """out, lse and the gradients of (grad_out * out).sum() + lse[finite].sum()
    of a fused attention op on CUDA, and the same in float64 by its reference."""
    results = []
    for device in ("cuda", "cpu"):
        leaves = [t.to(device, torch.float64 if device == "cpu" else t.dtype)
                  .detach().requires_grad_() for t in inputs]
        fn = op if device == "cuda" else REFERENCES[op]
        out, lse = fn(rowptr if device == "cuda" else rowptr.cpu(),
                      col if device == "cuda" else col.cpu(), *leaves)
        finite = torch.isfinite(lse)
        loss = (out.to(torch.float64) * grad_out.to(out.device, torch.float64)).sum() \
            + lse.to(torch.float64)[finite].sum()
        results.append([out, lse, *torch.autograd.grad(loss, leaves)])
    return results


REFERENCES = {pma.gat_attention: reference_gat_attention,
              pma.gatv2_attention: reference_gatv2_attention,
              pma.transformer_attention: reference_transformer_attention}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("heads,channels", [(4, 32), (3, 7)])
def test_fetch_rounds_same_results(heads, channels, dtype):
    """A persistent kernel's warps take 1 to 8 rounds of short rows per
    fetch (fetch_rounds in csrc/cuda/utils/fetch_order.cuh: fewer on small
    graphs, so that their rows spread over the device). Forced to 1, 3 and 8
    rounds, on power-law rows with a hub, empty rows and sliced columns: every
    op's forward and backward (spmm, SDDMM, GAT, GATv2 and transformer
    attention; all-heads and per-head layouts) matches the float64 reference,
    and every result but GATv2's grad_att, which is summed per fetch range, is
    the same bits at every round count (only which group computes a row
    changes)."""
    gen = torch.Generator().manual_seed(heads * 7 + channels)
    num_dst, num_src = 300, 200
    rowptr, col = power_law_graph(num_dst, num_src, gen, hub_degree=700)
    weight, x, grad_out = make_values(rowptr, col, num_src, heads, channels, dtype, gen)
    rowptr, col = rowptr.cuda().to(torch.int32), col.cuda().to(torch.int32)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to("cuda", dtype)
    attention = [
        (pma.gat_attention, [rand(num_src, heads), rand(num_dst, heads), x]),
        (pma.gatv2_attention, [x, rand(num_dst, heads, channels), rand(heads, channels)]),
        (pma.transformer_attention, [rand(num_dst, heads, channels), x,
                                     rand(num_src, heads, channels)]),
    ]
    got = []
    for rounds in (1, 3, 8):
        with force_kernel_path(fetch_rounds=rounds):
            outs = list(check_all_ops(rowptr, col, weight, x, grad_out, dtype))
            for op, inputs in attention:
                ours, ref = _attention_results(op, rowptr, col, inputs, grad_out)
                for k, (a, r) in enumerate(zip(ours, ref, strict=True)):
                    what = f"{op.__name__} result {k}, {rounds} rounds"
                    if k == 1:  # lse, in float32: -inf on the empty rows
                        empty = torch.isneginf(r)
                        assert torch.equal(torch.isneginf(a).cpu(), empty), what
                        assert rel_error(a.cpu()[~empty], r[~empty]) <= 1e-5, what
                    else:
                        assert_close(a, r.detach(), dtype, what)
                outs += ours
        got.append(outs)
    # spmm's out, grad_x, grad_weight; then out, lse and the gradients of
    # each attention op: GAT's three, GATv2's x_l, x_r and att.
    gatv2_att = 3 + 5 + 4
    for k, (a, b, c) in enumerate(zip(*got, strict=True)):
        if k != gatv2_att:
            assert torch.equal(a, b) and torch.equal(a, c), f"result {k}: not bitwise equal"


TC_HEADS = [(2, 64), (4, 32), (8, 16)]  # H * D = 128: the tensor-core forward's shapes


def tile_graphs(gen):
    """(index dtype, (rowptr, col, num_src)) for the tensor-core forward, on
    the CPU: rows of every length around its 16-entry chunks and 8-row tiles
    (a row count that is no multiple of 8), long rows among them (inside
    tiles, summed block-wide), in int32; a power-law graph with a hub and
    empty rows in int64."""
    pattern = torch.tensor([0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 3, 0, 200, 5, 64, 65, 4])
    deg = pattern.repeat(30)[torch.randperm(30 * pattern.numel(), generator=gen)][:565]
    assert deg.numel() % 8 != 0
    graphs = [(*csr_from_degrees(deg, 400, gen, skew=2.0), 400),
              (*power_law_graph(301, 200, gen, hub_degree=900), 200)]
    return zip(INDICES, graphs, strict=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads,channels", TC_HEADS)
def test_tensor_core_forward(heads, channels, dtype):
    """The spmm forward of 2-byte types on the tensor cores
    (force_kernel_path(tensor_cores=1); spmm/tensor_core_gather.cuh), in both
    its kernels (tc_staged=1: rows staged in shared memory, 0: in registers),
    and on the register kernels (tensor_cores=0) match the float64 reference,
    int32 and int64, with a poisoned output (every row written, long and empty
    ones included), and each is bitwise reproducible. Not forced, the
    heuristics pick one of them."""
    gen = torch.Generator().manual_seed(heads * 13 + channels)
    for index_dtype, (rowptr, col, num_src) in tile_graphs(gen):
        weight, x, _ = make_values(rowptr, col, num_src, heads, channels, dtype, gen)
        rowptr, col = rowptr.cuda().to(index_dtype), col.cuda().to(index_dtype)
        ref = reference_spmm(rowptr, col, weight, x)
        for mode, staged in ((1, 1), (1, 0), (0, 1)):
            with force_kernel_path(tensor_cores=mode, tc_staged=staged):
                poison((rowptr.numel() - 1, heads, channels), dtype, "cuda")
                out = ops.multihead_spmm(rowptr, col, weight, x)
                what = f"tensor cores {mode}, staged {staged}, {index_dtype}"
                assert_close(out, ref, dtype, what)
                assert torch.equal(ops.multihead_spmm(rowptr, col, weight, x), out), what
        assert_close(ops.multihead_spmm(rowptr, col, weight, x), ref, dtype, "default")


@pytest.mark.parametrize("index_dtype", INDICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tensor_core_forward_non_finite(dtype, index_dtype):
    """An inf or NaN gathered for one row must not reach the rows that share
    its 16-entry chunks (a zero weight times inf is NaN in an mma): with
    sources holding inf, -inf and NaN, the tensor-core forward gives NaN and
    inf exactly where the float64 reference does (the tile is recomputed
    one entry at a time), and matches it elsewhere, long rows included; the
    staged kernel on one graph, the register one on the other."""
    gen = torch.Generator().manual_seed(17)
    for (_, (rowptr, col, num_src)), staged in zip(tile_graphs(gen), (1, 0), strict=True):
        weight, x, _ = make_values(rowptr, col, num_src, 4, 32, dtype, gen)
        x[num_src - 1, 1, 5] = float("inf")  # rarely gathered (skewed sources)
        x[num_src - 2, 0, :] = float("-inf")
        x[num_src - 3, 3, 31] = float("nan")
        rowptr, col = rowptr.cuda().to(index_dtype), col.cuda().to(index_dtype)
        ref = reference_spmm(rowptr, col, weight, x)
        poison((rowptr.numel() - 1, 4, 32), dtype, "cuda")
        with force_kernel_path(tensor_cores=1, tc_staged=staged):
            out = ops.multihead_spmm(rowptr, col, weight, x).double().cpu()
        bad = ~torch.isfinite(ref)
        assert 0 < int(bad.any(-1).any(-1).sum()) < rowptr.numel() - 1
        assert torch.equal(torch.isnan(out), torch.isnan(ref))
        assert torch.equal(out[torch.isinf(ref)], ref[torch.isinf(ref)])
        good = torch.isfinite(ref).all(-1).all(-1)  # rows without a non-finite value
        assert_close(out[good].to(dtype), ref[good], dtype, f"finite rows, {index_dtype}")


@pytest.mark.parametrize("index_dtype", INDICES)
def test_tensor_core_forward_malformed_and_unaligned(index_dtype):
    """The tensor-core forward on malformed graphs (out-of-range sources,
    decreasing, negative, overflowing and overlapping pointers) neither faults
    nor hangs (scripts/sanitize.sh runs it under memcheck); on weights and x
    that are not aligned for it, it steps aside for the register kernels and
    the result is right."""
    gen = torch.Generator().manual_seed(23)
    num_dst, num_src, num_edges = 43, 30, 600
    for rowptr, col in malformed_graphs(num_dst, num_src, num_edges, gen):
        rowptr, col = rowptr.cuda().to(index_dtype), col.cuda().to(index_dtype)
        for heads, channels in TC_HEADS:
            weight, x, _ = make_values(rowptr, col, num_src, heads, channels, torch.bfloat16, gen)
            for staged in (1, 0):
                with force_kernel_path(tensor_cores=1, tc_staged=staged):
                    ops.multihead_spmm(rowptr, col, weight, x)
    torch.cuda.synchronize()
    rowptr, col = power_law_graph(100, 80, gen, hub_degree=500)
    weight, x, _ = make_values(rowptr, col, 80, 4, 32, torch.bfloat16, gen)
    rowptr, col = rowptr.cuda().to(index_dtype), col.cuda().to(index_dtype)
    ref = reference_spmm(rowptr, col, weight, x)
    for w_off, x_off in ((1, 0), (0, 1), (0, 0)):
        w_flat = torch.empty(weight.numel() + w_off, dtype=weight.dtype, device="cuda")
        x_flat = torch.empty(x.numel() + x_off, dtype=x.dtype, device="cuda")
        w = w_flat[w_off:].view(weight.shape).copy_(weight)
        xx = x_flat[x_off:].view(x.shape).copy_(x)
        poison((100, 4, 32), torch.bfloat16, "cuda")
        with force_kernel_path(tensor_cores=1):
            out = ops.multihead_spmm(rowptr, col, w, xx)
        assert_close(out, ref, torch.bfloat16, f"weight offset {w_off}, x offset {x_off}")


def cuda_kernel_names(fn):
    """The names of the CUDA kernels that fn() launches (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.key for e in prof.key_averages()]


@pytest.mark.parametrize("heads,channels", TC_HEADS)
def test_tensor_core_kernels_are_the_ones_that_run(heads, channels):
    """The other tensor-core tests compare results, which the register
    kernels would pass too if a launcher stepped aside: by kernel name,
    force_kernel_path(tensor_cores=1) runs the tensor-core forward (the staged
    or the register kernel, as tc_staged asks), the tensor-core backward of
    both gradients and the one of grad_x alone, 0 none of them, and the
    heuristics (14 entries a row) all, the staged forward for heads of 32 and
    64 channels; the heuristics with 100 entries a row keep the forward on its
    register kernels, and the backwards (of 20 entries a CSC row) do not."""
    gen = torch.Generator().manual_seed(heads)
    # (The profiler names a kernel with its signature: "k<T, int, 4, true>(...)".)
    kinds = {"register": ("tc_gather_kernel<", ""), "staged": ("tc_gather_staged_kernel<", ""),
             "backward": ("tc_dot_gather_kernel<", ", true>("),
             "grad_x": ("tc_dot_gather_kernel<", ", false>(")}
    default_forward = "staged" if heads <= 4 else "register"
    for num_rows, num_src, num_edges, cases in (
            (300, 200, 300 * 14, ((1, 1, {"staged", "backward", "grad_x"}),
                                  (1, 0, {"register", "backward", "grad_x"}),
                                  (0, 1, set()),
                                  (None, None, {default_forward, "backward", "grad_x"}))),
            (20, 100, 2000, ((None, None, {"backward", "grad_x"}),))):
        rowptr, col = random_graph(num_rows, num_src, num_edges, gen)
        weight, x, grad_out = make_values(rowptr, col, num_src, heads, channels,
                                          torch.bfloat16, gen)
        rowptr, col = rowptr.cuda().int(), col.cuda().int()
        colptr, row, perm = csr_to_csc(rowptr, col, num_src)

        def run(rowptr=rowptr, col=col, colptr=colptr, row=row, perm=perm, weight=weight, x=x,
                grad_out=grad_out):
            ops.multihead_spmm(rowptr, col, weight, x)
            ops.multihead_spmm_backward_csc(colptr, row, perm, weight, x, grad_out)
            ops.multihead_spmm_backward_csc(colptr, row, perm, weight, None, grad_out)

        for mode, staged, expected in cases:
            with force_kernel_path(tensor_cores=mode, tc_staged=staged):
                names = cuda_kernel_names(run)
            ran = {kind for kind, (key, end) in kinds.items()
                   if any(key in n and end in n for n in names)}
            assert ran == expected, (num_edges, mode, staged, sorted(ran), names)


def transposed_too(graphs):
    """Each (index dtype, (rowptr, col, num_src)) and its transpose, so that
    the backward's CSC has the graph's rows (every length around the chunks
    and tiles, empty ones, long ones cut into slices) as well as its skewed
    sources (hubs of hundreds of entries)."""
    for index_dtype, (rowptr, col, num_src) in graphs:
        yield index_dtype, (rowptr, col, num_src)
        colptr, row, _ = csr_to_csc(rowptr, col, num_src)
        yield index_dtype, (colptr, row, rowptr.numel() - 1)


def backward_both(colptr, row, perm, weight, x, grad_out, perm_inv, num_src):
    """Both gradients of the CSC backward, the outputs poisoned first (grad_x,
    grad_weight and, with perm_inv, the dots by CSC entry)."""
    heads, channels = grad_out.shape[1:]
    poison((num_src, heads, channels), grad_out.dtype, "cuda")
    for _ in range(2):
        poison((row.numel(), heads), grad_out.dtype, "cuda")
    return ops.multihead_spmm_backward_csc(colptr, row, perm, weight, x, grad_out, perm_inv)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads,channels", TC_HEADS)
def test_tensor_core_backward(heads, channels, dtype):
    """Both gradients of the spmm backward of 2-byte types on the tensor cores
    (force_kernel_path(tensor_cores=1); spmm/tensor_core_backward.cuh) and on
    the dot-gather kernel (0) match the float64 reference, int32 and int64,
    with grad_weight stored by edge id and by CSC entry (perm_inv), poisoned
    outputs, long CSC rows (cut into slices) and empty ones; each is bitwise
    reproducible, and perm_inv changes no bit. Not forced, the heuristic picks
    one of them. grad_x alone (no x: its kernel without the dots, or the
    dot-gather kernel without them) matches too, and on the tensor cores
    equals the grad_x of both bit for bit."""
    gen = torch.Generator().manual_seed(heads * 7 + channels)
    for index_dtype, (rowptr, col, num_src) in transposed_too(tile_graphs(gen)):
        weight, x, grad_out = make_values(rowptr, col, num_src, heads, channels, dtype, gen)
        ref_gx = reference_grad_x(rowptr, col, weight, grad_out, num_src)
        ref_gw = reference_sddmm(rowptr, col, grad_out, x)
        rowptr, col = rowptr.cuda().to(index_dtype), col.cuda().to(index_dtype)
        colptr, row, perm = csr_to_csc(rowptr, col, num_src)
        perm_inv = invert_perm(perm)
        for mode in (1, 0, None):
            what = f"tensor cores {mode}, {index_dtype}"
            with force_kernel_path(tensor_cores=mode):
                gx, gw = backward_both(colptr, row, perm, weight, x, grad_out, None, num_src)
                assert_close(gx, ref_gx, dtype, f"grad_x, {what}")
                assert_close(gw, ref_gw, dtype, f"grad_weight, {what}")
                gx_inv, gw_inv = backward_both(colptr, row, perm, weight, x, grad_out, perm_inv,
                                               num_src)
                assert torch.equal(gx_inv, gx) and torch.equal(gw_inv, gw), f"perm_inv, {what}"
                again = backward_both(colptr, row, perm, weight, x, grad_out, perm_inv, num_src)
                assert torch.equal(again[0], gx) and torch.equal(again[1], gw), f"repeat, {what}"
                gx_only, gw_none = backward_both(colptr, row, perm, weight, None, grad_out, None,
                                                 num_src)
            assert gw_none.numel() == 0
            assert_close(gx_only, ref_gx, dtype, f"grad_x alone, {what}")
            if mode == 1:
                assert torch.equal(gx_only, gx), f"grad_x alone, {what}"


@pytest.mark.parametrize("index_dtype", INDICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tensor_core_backward_non_finite(dtype, index_dtype):
    """inf and NaN in grad_out (gathered by the CSC's chunks, so a zero weight
    times inf would reach the other rows of a chunk), in x (a tile row's B
    column of the dots) and in the weights: the tensor-core backward gives
    NaN and +-inf in grad_x and grad_weight exactly where the float64
    reference does, and matches it elsewhere."""
    gen = torch.Generator().manual_seed(29)
    for _, (rowptr, col, num_src) in transposed_too(tile_graphs(gen)):
        num_dst = rowptr.numel() - 1
        weight, x, grad_out = make_values(rowptr, col, num_src, 4, 32, dtype, gen)
        grad_out[num_dst - 1, 1, 5] = float("inf")
        grad_out[num_dst // 2, 0, :] = float("-inf")
        grad_out[num_dst // 3, 3, 31] = float("nan")
        x[num_src - 1, 2, 7] = float("inf")
        x[1, 0, 0] = float("nan")
        weight[col.numel() // 2, 1] = float("inf")
        ref_gx = reference_grad_x(rowptr, col, weight, grad_out, num_src)
        ref_gw = reference_sddmm(rowptr, col, grad_out, x)
        rowptr, col = rowptr.cuda().to(index_dtype), col.cuda().to(index_dtype)
        colptr, row, perm = csr_to_csc(rowptr, col, num_src)
        with force_kernel_path(tensor_cores=1):
            gx_only, _ = backward_both(colptr, row, perm, weight, None, grad_out, None, num_src)
        for inv in (None, invert_perm(perm)):
            with force_kernel_path(tensor_cores=1):
                gx, gw = backward_both(colptr, row, perm, weight, x, grad_out, inv, num_src)
            for name, out, ref in (("grad_x", gx, ref_gx), ("grad_weight", gw, ref_gw),
                                   ("grad_x alone", gx_only, ref_gx)):
                out = out.double().cpu()
                assert 0 < int((~torch.isfinite(ref)).sum()) < ref.numel(), name
                assert torch.equal(torch.isnan(out), torch.isnan(ref)), name
                assert torch.equal(out[torch.isinf(ref)], ref[torch.isinf(ref)]), name
                good = torch.isfinite(ref)
                if name.startswith("grad_x"):  # rows without a non-finite value
                    good = good.all(-1).all(-1)
                assert_close(out[good].to(dtype), ref[good], dtype, f"finite {name}")


@pytest.mark.parametrize("index_dtype", INDICES)
def test_tensor_core_backward_malformed_and_unaligned(index_dtype):
    """The tensor-core backward on malformed CSCs (out-of-range rows and edge
    ids, decreasing, negative, overflowing and overlapping pointers) neither
    faults nor hangs (scripts/sanitize.sh runs it under memcheck); with a
    weight or x not aligned for it, it steps aside and the result is right."""
    with force_kernel_path(tensor_cores=1):
        gen = torch.Generator().manual_seed(31)
        num_dst, num_src, num_edges = 43, 30, 600
        for colptr, row in malformed_graphs(num_src, num_dst, num_edges, gen):
            colptr, row = colptr.cuda().to(index_dtype), row.cuda().to(index_dtype)
            bad_perm = torch.randperm(num_edges, generator=gen).cuda().to(index_dtype)
            bad_perm[::9] = num_edges + 3
            bad_perm[1::9] = -2
            for heads, channels in TC_HEADS:
                weight, x, grad_out = (
                    torch.randn(shape, generator=gen).to(torch.bfloat16).cuda()
                    for shape in ((num_edges, heads), (num_src, heads, channels),
                                  (num_dst, heads, channels)))
                for inv in (None, torch.arange(num_edges, device="cuda").to(index_dtype)):
                    ops.multihead_spmm_backward_csc(colptr, row, bad_perm, weight, x, grad_out, inv)
                ops.multihead_spmm_backward_csc(colptr, row, bad_perm, weight, None, grad_out)
        torch.cuda.synchronize()
        rowptr, col = power_law_graph(100, 80, gen, hub_degree=500)
        weight, x, grad_out = make_values(rowptr, col, 80, 4, 32, torch.bfloat16, gen)
        ref_gx = reference_grad_x(rowptr, col, weight, grad_out, 80)
        ref_gw = reference_sddmm(rowptr, col, grad_out, x)
        rowptr, col = rowptr.cuda().to(index_dtype), col.cuda().to(index_dtype)
        colptr, row, perm = csr_to_csc(rowptr, col, 80)
        for w_off, x_off in ((1, 0), (0, 1), (0, 0)):
            w_flat = torch.empty(weight.numel() + w_off, dtype=weight.dtype, device="cuda")
            x_flat = torch.empty(x.numel() + x_off, dtype=x.dtype, device="cuda")
            w = w_flat[w_off:].view(weight.shape).copy_(weight)
            xx = x_flat[x_off:].view(x.shape).copy_(x)
            gx, gw = backward_both(colptr, row, perm, w, xx, grad_out, None, 80)
            what = f"weight offset {w_off}, x offset {x_off}"
            assert_close(gx, ref_gx, torch.bfloat16, f"grad_x, {what}")
            assert_close(gw, ref_gw, torch.bfloat16, f"grad_weight, {what}")
            gx, _ = backward_both(colptr, row, perm, w, None, grad_out, None, 80)
            assert_close(gx, ref_gx, torch.bfloat16, f"grad_x alone, {what}")


@pytest.mark.parametrize("index_dtype", INDICES)
@pytest.mark.parametrize("num_dst,num_src,num_edges", [
    (12, 9, 0),      # no edges
    (0, 7, 0),       # no destination rows
    (5, 0, 0),       # no source nodes
    (64, 64, 5),     # mostly empty rows
    (7, 300, 40),    # N_src > N_dst
    (300, 7, 900),   # N_src < N_dst
])
def test_empty_and_bipartite(num_dst, num_src, num_edges, index_dtype):
    gen = torch.Generator().manual_seed(num_dst + num_src + num_edges)
    for dtype in (torch.float32, torch.bfloat16):
        rowptr, col = random_graph(num_dst, num_src, num_edges, gen)
        weight, x, grad_out = make_values(rowptr, col, num_src, 4, 16, dtype, gen)
        check_all_ops(rowptr.cuda().to(index_dtype), col.cuda().to(index_dtype), weight, x,
                      grad_out, dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_unaligned_and_non_contiguous_inputs(dtype):
    gen = torch.Generator().manual_seed(3)
    rowptr, col = power_law_graph(100, 80, gen, hub_degree=500)
    rowptr, col = rowptr.cuda(), col.cuda()
    H, D = 4, 32
    weight, x, grad_out = make_values(rowptr, col, 80, H, D, dtype, gen)

    def unaligned(t):  # contiguous, but starting one element past a 16-byte boundary
        flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
        out = flat[1:].view(t.shape)
        out.copy_(t)
        assert out.is_contiguous() and out.data_ptr() % 16 != 0
        return out

    sliced_x = torch.cat([x, x], dim=-1)[:, :, :D]  # non-contiguous view
    assert not sliced_x.is_contiguous()
    check_all_ops(rowptr, col, unaligned(weight), unaligned(x), unaligned(grad_out), dtype)
    check_all_ops(rowptr, col, weight.t().contiguous().t(), sliced_x, grad_out, dtype)
    # Only a or only b unaligned in the SDDMM.
    ref = reference_sddmm(rowptr, col, grad_out, x)
    assert_close(ops.multihead_sddmm(rowptr, col, unaligned(grad_out), x), ref, dtype, "sddmm a")
    assert_close(ops.multihead_sddmm(rowptr, col, grad_out, unaligned(x)), ref, dtype, "sddmm b")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deterministic(dtype):
    """Forward and backward_csc are bitwise reproducible, long rows included."""
    gen = torch.Generator().manual_seed(4)
    rowptr, col = power_law_graph(400, 300, gen)
    rowptr, col = rowptr.cuda(), col.cuda()
    colptr, row, perm = csr_to_csc(rowptr, col, 300)
    for H, D in ((4, 32), (3, 33)):  # vector and scalar paths
        weight, x, grad_out = make_values(rowptr, col, 300, H, D, dtype, gen)
        out = ops.multihead_spmm(rowptr, col, weight, x)
        grad_x, grad_weight = ops.multihead_spmm_backward_csc(colptr, row, perm, weight, x,
                                                              grad_out)
        for _ in range(2):
            assert torch.equal(ops.multihead_spmm(rowptr, col, weight, x), out)
            again = ops.multihead_spmm_backward_csc(colptr, row, perm, weight, x, grad_out)
            assert torch.equal(again[0], grad_x) and torch.equal(again[1], grad_weight)


def malformed_graphs(num_dst, num_src, num_edges, gen):
    rowptr, col = random_graph(num_dst, num_src, num_edges, gen)
    bad_col = col.clone()
    bad_col[::5] = num_src + 7
    bad_col[1::5] = -3
    decreasing = rowptr.clone()
    decreasing[num_dst // 2] = num_edges + 50
    decreasing[num_dst // 2 + 1] = 2
    shifted = rowptr - 10  # negative start, ends short of E
    overflow = rowptr.clone()
    overflow[-1] = num_edges * 4
    # Back to 0 at every other row: rows [0, E) again and again, more long
    # rows (and slices of them) than E edges can make, so more than the
    # backward's slice lists hold (writes past them are what memcheck, in
    # scripts/sanitize.sh, would report).
    overlapping = torch.zeros_like(rowptr)
    overlapping[1::2] = num_edges
    overlapping[-1] = num_edges
    return [(rowptr, bad_col), (decreasing, col), (shifted, col), (overflow, col),
            (overlapping, col)]


@pytest.mark.parametrize("index_dtype", INDICES)
def test_malformed_graphs_do_not_fault(index_dtype):
    """No validation in the kernels, but no out-of-bounds access either: the
    CUDA context stays usable and a following valid call is right."""
    gen = torch.Generator().manual_seed(5)
    num_dst, num_src, num_edges = 40, 30, 400
    dtype = torch.float32
    # (8, 8): 16-lane rows, gathered a row per group and a row per warp
    # (see test_forward_narrow_rows_both_layouts).
    for H, D in ((4, 32), (8, 8), (3, 33)):
        for rowptr, col in malformed_graphs(num_dst, num_src, num_edges, gen):
            rowptr, col = rowptr.cuda().to(index_dtype), col.cuda().to(index_dtype)
            weight, x, grad_out = make_values(rowptr, col, num_src, H, D, dtype, gen)
            for split in (0, 1):
                with force_kernel_path(split_rows=split):
                    ops.multihead_spmm(rowptr, col, weight, x)
            ops.multihead_sddmm(rowptr, col, grad_out, x)
            ops.multihead_spmm_backward_x_scatter(rowptr, col, weight, grad_out, num_src)
            # A CSC with the same defects: out-of-range rows and perm entries.
            ops.multihead_spmm_backward_csc(rowptr[: num_src + 1], col[:num_edges] % 1000,
                                            col, weight, x, grad_out)
            ops.multihead_spmm_backward_csc(rowptr[: num_src + 1], col, col, weight, None,
                                            grad_out)
            torch.cuda.synchronize()
    rowptr, col = random_graph(num_dst, num_src, num_edges, gen)
    weight, x, grad_out = make_values(rowptr, col, num_src, 4, 32, dtype, gen)
    check_all_ops(rowptr.cuda().to(index_dtype), col.cuda().to(index_dtype), weight, x,
                  grad_out, dtype)
    torch.cuda.synchronize()


def test_argument_checks_match_cpu():
    """The CUDA entry points raise the CPU kernels' errors."""
    gen = torch.Generator().manual_seed(6)
    rowptr, col = random_graph(10, 12, 50, gen)
    weight = torch.randn(50, 4, generator=gen)
    x = torch.randn(12, 4, 8, generator=gen)
    grad_out = torch.randn(10, 4, 8, generator=gen)
    colptr, row, perm = csr_to_csc(rowptr, col, 12)
    cases = [
        lambda d: ops.multihead_spmm(rowptr.to(d), col.to(d), weight[:-1].to(d), x.to(d)),
        lambda d: ops.multihead_spmm(rowptr.to(d), col.to(d), weight[:, :3].to(d), x.to(d)),
        lambda d: ops.multihead_spmm(rowptr.to(d).int(), col.to(d), weight.to(d), x.to(d)),
        lambda d: ops.multihead_spmm(rowptr.to(d), col.to(d), weight.to(d), x.to(d).half()),
        lambda d: ops.multihead_spmm(rowptr.to(d).float(), col.to(d), weight.to(d), x.to(d)),
        lambda d: ops.multihead_spmm_backward_csc(colptr.to(d), row.to(d), perm.to(d)[:-1],
                                                  weight.to(d), x.to(d), grad_out.to(d)),
        lambda d: ops.multihead_spmm_backward_csc(colptr.to(d), row.to(d), perm.to(d),
                                                  weight.to(d), x.to(d)[:-1], grad_out.to(d)),
        lambda d: ops.multihead_spmm_backward_csc(colptr.to(d), row.to(d), perm.to(d),
                                                  weight.to(d)[:, :2], None, grad_out.to(d)),
        lambda d: ops.multihead_spmm_backward_x_scatter(rowptr.to(d), col.to(d), weight.to(d),
                                                        grad_out.to(d)[:-1], 12),
        lambda d: ops.multihead_spmm_backward_x_scatter(rowptr.to(d), col.to(d), weight.to(d),
                                                        grad_out.to(d), -1),
        lambda d: ops.multihead_sddmm(rowptr.to(d), col.to(d), grad_out.to(d)[:-1], x.to(d)),
        lambda d: ops.multihead_sddmm(rowptr.to(d), col.to(d), grad_out.to(d),
                                      x.to(d)[:, :, :4]),
    ]
    for i, case in enumerate(cases):
        with pytest.raises(RuntimeError) as cpu_error:
            case("cpu")
        with pytest.raises(RuntimeError) as cuda_error:
            case("cuda")
        cpu_msg = str(cpu_error.value).splitlines()[0]
        cuda_msg = str(cuda_error.value).splitlines()[0]
        assert cpu_msg == cuda_msg, (i, cpu_msg, cuda_msg)
