"""CUDA kernels on tensors of more than 2**31 elements.

Offsets such as ``col[e] * H * D`` or ``row * H * D`` overflow 32-bit
arithmetic once a feature tensor holds more than 2**31 elements, whatever the
index dtype. A small graph whose edges reach the last rows of a ~4.3 GB
float16 tensor catches that: the untouched rows are NaN (inputs) or must stay
exactly zero (outputs), and the touched rows are compared with a float64
reference computed on just those rows.
"""
import pytest
import torch
from conftest import (
    TOLERANCE,
    poison,
    reference_grad_x,
    reference_sddmm,
    reference_spmm,
    rel_error,
)
from torch_geometric.index import index2ptr

from pyg_multihead_agg import csr_to_csc

ops = torch.ops.pyg_multihead_agg
NEEDED_BYTES = 12 * 2**30


def _enough_memory() -> bool:
    if not torch.cuda.is_available():
        return False
    free, _ = torch.cuda.mem_get_info()
    return free >= NEEDED_BYTES


pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(torch.cuda.is_available() and not _enough_memory(),
                       reason="needs 12 GB of free GPU memory"),
]

DTYPE = torch.float16
# (H, D): a vector fast path and the scalar path (D odd).
HEADS_CHANNELS = [(4, 64), (3, 85)]


def big_rows(heads: int, channels: int) -> int:
    """Rows such that rows * H * D exceeds 2**31 by a few rows."""
    return 2**31 // (heads * channels) + 64


def edges_to_ends(num_rows: int, count: int, gen):
    """`count` random node ids: mostly among the last 50 of num_rows, some among
    the first 5, and the very last one."""
    tail = num_rows - 1 - torch.randint(0, 50, (count,), generator=gen)
    head = torch.randint(0, 5, (count // 8,), generator=gen)
    return torch.cat([tail, head, torch.tensor([num_rows - 1])])


def local(ids):
    """The distinct ids and each id's position among them."""
    touched = ids.unique()
    return touched, torch.searchsorted(touched, ids)


def assert_close(out, ref, what):
    err = rel_error(out, ref)
    assert err <= TOLERANCE[DTYPE], f"{what}: relative error {err:.3g}"


def assert_zero_elsewhere(big, touched, what):
    """Rows of `big` not in `touched` are exactly zero (NaN counts as non-zero).
    Zeroes the touched rows in place: a copy would not fit the memory budget."""
    rest = torch.count_nonzero(big.index_fill_(0, touched.to(big.device), 0))
    assert int(rest) == 0, f"{what}: {int(rest)} non-zero elements outside the touched rows"


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("heads,channels", HEADS_CHANNELS)
def test_many_source_rows(heads, channels, index_dtype):
    """x and grad_x have more than 2**31 elements; col points at their last rows."""
    gen = torch.Generator().manual_seed(heads * channels)
    num_src, num_dst = big_rows(heads, channels), 64
    col = edges_to_ends(num_src, 300, gen)
    row = torch.randint(0, num_dst, (col.numel(),), generator=gen).sort().values
    rowptr = index2ptr(row, num_dst)
    touched, col_local = local(col)
    weight = torch.randn(col.numel(), heads, generator=gen).to(DTYPE)
    x_touched = torch.randn(touched.numel(), heads, channels, generator=gen).to(DTYPE)
    grad_out = torch.randn(num_dst, heads, channels, generator=gen).to(DTYPE)

    x = torch.full((num_src, heads, channels), float("nan"), dtype=DTYPE, device="cuda")
    assert x.numel() > 2**31
    x[touched.cuda()] = x_touched.cuda()
    rowptr_d, col_d = rowptr.cuda().to(index_dtype), col.cuda().to(index_dtype)
    weight_d, grad_out_d = weight.cuda(), grad_out.cuda()

    out = ops.multihead_spmm(rowptr_d, col_d, weight_d, x)
    assert_close(out, reference_spmm(rowptr, col_local, weight, x_touched), "forward")

    want_gx = reference_grad_x(rowptr, col_local, weight, grad_out, touched.numel())
    want_gw = reference_sddmm(rowptr, col_local, grad_out, x_touched)
    colptr, row_csc, perm = csr_to_csc(rowptr_d, col_d, num_src)
    poison(x.shape, DTYPE, "cuda")
    grad_x, grad_weight = ops.multihead_spmm_backward_csc(colptr, row_csc, perm, weight_d, x,
                                                          grad_out_d)
    assert_close(grad_x[touched.cuda()], want_gx, "backward_csc grad_x")
    assert_zero_elsewhere(grad_x, touched, "backward_csc grad_x")
    assert_close(grad_weight, want_gw, "backward_csc grad_weight")
    del grad_x

    poison(x.shape, DTYPE, "cuda")
    grad_x = ops.multihead_spmm_backward_x_scatter(rowptr_d, col_d, weight_d, grad_out_d, num_src)
    assert_close(grad_x[touched.cuda()], want_gx, "backward_x_scatter")
    assert_zero_elsewhere(grad_x, touched, "backward_x_scatter")
    del grad_x
    assert_close(ops.multihead_sddmm(rowptr_d, col_d, grad_out_d, x), want_gw, "sddmm")


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("heads,channels", HEADS_CHANNELS)
def test_many_destination_rows(heads, channels, index_dtype):
    """out and grad_out have more than 2**31 elements; the edges sit in their
    last rows, every other row is empty (and must come out zero)."""
    gen = torch.Generator().manual_seed(heads + channels)
    num_src, num_dst = 40, big_rows(heads, channels)
    row = edges_to_ends(num_dst, 300, gen).sort().values
    col = torch.randint(0, num_src, (row.numel(),), generator=gen)
    touched, row_local = local(row)
    rowptr_local = index2ptr(row_local, touched.numel())
    weight = torch.randn(col.numel(), heads, generator=gen).to(DTYPE)
    x = torch.randn(num_src, heads, channels, generator=gen).to(DTYPE)
    grad_touched = torch.randn(touched.numel(), heads, channels, generator=gen).to(DTYPE)

    rowptr_d = index2ptr(row.cuda(), num_dst).to(index_dtype)
    col_d, weight_d, x_d = col.cuda().to(index_dtype), weight.cuda(), x.cuda()
    poison((num_dst, heads, channels), DTYPE, "cuda")
    out = ops.multihead_spmm(rowptr_d, col_d, weight_d, x_d)
    assert out.numel() > 2**31
    assert_close(out[touched.cuda()], reference_spmm(rowptr_local, col, weight, x), "forward")
    assert_zero_elsewhere(out, touched, "forward")
    del out

    # Rows without edges are NaN: no kernel may read them.
    grad_out = torch.full((num_dst, heads, channels), float("nan"), dtype=DTYPE, device="cuda")
    grad_out[touched.cuda()] = grad_touched.cuda()
    want_gx = reference_grad_x(rowptr_local, col, weight, grad_touched, num_src)
    want_gw = reference_sddmm(rowptr_local, col, grad_touched, x)
    colptr, row_csc, perm = csr_to_csc(rowptr_d, col_d, num_src)
    grad_x, grad_weight = ops.multihead_spmm_backward_csc(colptr, row_csc, perm, weight_d, x_d,
                                                          grad_out)
    assert_close(grad_x, want_gx, "backward_csc grad_x")
    assert_close(grad_weight, want_gw, "backward_csc grad_weight")
    grad_x = ops.multihead_spmm_backward_x_scatter(rowptr_d, col_d, weight_d, grad_out, num_src)
    assert_close(grad_x, want_gx, "backward_x_scatter")
    assert_close(ops.multihead_sddmm(rowptr_d, col_d, grad_out, x_d), want_gw, "sddmm")


def _gat_many_rows(num_rows, heads, channels, index_dtype, device):
    """The fused attention on a square graph of `num_rows` nodes whose edges
    join the first and last rows: x, out, grad_out and grad_x have
    num_rows * H * D elements."""
    from gat_reference import reference_gat_attention

    from pyg_multihead_agg import gat_attention
    gen = torch.Generator().manual_seed(7 * heads + channels)
    dst = edges_to_ends(num_rows, 300, gen).sort().values
    src = edges_to_ends(num_rows, dst.numel() * 8 // 9, gen)[: dst.numel()]
    src = src[torch.randperm(src.numel(), generator=gen)]
    touched_dst, dst_local = local(dst)
    touched_src, src_local = local(src)
    rowptr_local = index2ptr(dst_local, touched_dst.numel())
    s_src = torch.randn(num_rows, heads, generator=gen).to(DTYPE)
    s_dst = torch.randn(num_rows, heads, generator=gen).to(DTYPE)
    x_touched = torch.randn(touched_src.numel(), heads, channels, generator=gen).to(DTYPE)
    grad_touched = torch.randn(touched_dst.numel(), heads, channels, generator=gen).to(DTYPE)

    # Source rows without edges are NaN: neither pass may use them.
    x = torch.full((num_rows, heads, channels), float("nan"), dtype=DTYPE, device=device)
    x[touched_src.to(device)] = x_touched.to(device)
    rowptr = index2ptr(dst.to(device), num_rows).to(index_dtype)
    col = src.to(device, index_dtype)
    out, lse = gat_attention(rowptr, col, s_src.to(device), s_dst.to(device), x)
    leaves = [t.double().requires_grad_() for t in (x_touched, s_src[touched_src],
                                                    s_dst[touched_dst])]
    ref_out, ref_lse = reference_gat_attention(rowptr_local, src_local, leaves[1], leaves[2],
                                               leaves[0])
    assert_close(out[touched_dst.to(device)], ref_out, "gat_attention out")
    assert rel_error(lse[touched_dst.to(device)], ref_lse) <= 1e-5
    assert int(torch.isneginf(lse).sum()) == (num_rows - touched_dst.numel()) * heads
    assert_zero_elsewhere(out, touched_dst, "gat_attention out")
    out[touched_dst.to(device)] = ref_out.to(device, DTYPE)  # zeroed by the check above

    grad_out = torch.zeros((num_rows, heads, channels), dtype=DTYPE, device=device)
    grad_out[touched_dst.to(device)] = grad_touched.to(device)
    want = torch.autograd.grad(ref_out, leaves, grad_touched.double())
    del ref_out
    colptr, row_csc, perm = csr_to_csc(rowptr, col, num_rows)
    grad_x, grad_s_src, grad_s_dst, _ = ops.gat_attention_backward(
        rowptr, col, colptr, row_csc, perm, s_src.to(device), s_dst.to(device), None, x, out,
        lse, grad_out, None, 0.2, 0.0, None)
    del grad_out, out
    assert_close(grad_x[touched_src.to(device)], want[0], "gat backward grad_x")
    assert_zero_elsewhere(grad_x, touched_src, "gat backward grad_x")
    for got, ids, ref, what in ((grad_s_src, touched_src, want[1], "grad_s_src"),
                                (grad_s_dst, touched_dst, want[2], "grad_s_dst")):
        err = rel_error(got[ids.to(device)], ref)
        assert err <= 4 * TOLERANCE[DTYPE], f"gat backward {what}: relative error {err:.3g}"
        assert_zero_elsewhere(got, ids, f"gat backward {what}")


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.mem_get_info()[0] < 24 * 2**30,
                    reason="needs 24 GB of free GPU memory")
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("heads,channels", HEADS_CHANNELS)
def test_gat_attention_many_rows(heads, channels, index_dtype):
    """The fused attention's forward and backward (all-heads kernels for
    4 x 64, per-head kernels for 3 x 85) with x, out, grad_out and grad_x of
    more than 2**31 elements each."""
    num_rows = big_rows(heads, channels)
    assert num_rows * heads * channels > 2**31
    _gat_many_rows(num_rows, heads, channels, index_dtype, "cuda")
