"""multihead_spmm and its backward ops against a float64 plain-PyTorch reference."""
import pytest
import torch
from conftest import (
    DEVICES,
    FLOAT_DTYPES,
    INDEX_DTYPES,
    PERM_INV_CASES_BAD,
    TOLERANCE,
    random_csr,
    reference_spmm,
    rel_error,
)

import pyg_multihead_agg as pma

ops = torch.ops.pyg_multihead_agg

# (num_dst, num_src, num_edges, heads, channels, hub)
CASES = [
    (30, 30, 120, 4, 8, False),
    (17, 45, 200, 3, 5, False),     # bipartite, odd H and D
    (40, 10, 300, 1, 1, False),     # H = D = 1
    (25, 25, 60, 2, 33, False),     # D off every fast path
    (8, 50, 400, 8, 64, True),      # one hub row holds most edges
    (64, 64, 5, 2, 16, False),      # mostly empty rows
    (12, 9, 0, 4, 8, False),        # no edges
    (0, 7, 0, 2, 4, False),         # no destination rows
    (5, 0, 0, 2, 4, False),         # no source nodes
    (50, 60, 600, 4, 32, False),
    (20, 20, 150, 2, 256, False),
]


def make_inputs(case, dtype, index_dtype, device, seed, requires_grad=False):
    num_dst, num_src, num_edges, heads, channels, hub = case
    gen = torch.Generator().manual_seed(seed)
    rowptr, col = random_csr(num_dst, num_src, num_edges, index_dtype=index_dtype,
                             device=device, hub=hub, generator=gen)
    weight = torch.randn(col.numel(), heads, generator=gen).to(device, dtype)
    x = torch.randn(num_src, heads, channels, generator=gen).to(device, dtype)
    weight.requires_grad_(requires_grad)
    x.requires_grad_(requires_grad)
    return rowptr, col, weight, x


@pytest.mark.sweep
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_forward_matches_reference(case, dtype, index_dtype, device):
    rowptr, col, weight, x = make_inputs(case, dtype, index_dtype, device, seed=hash(case) % 1000)
    # Leave a NaN-filled block for the allocator to hand back: an unwritten
    # output element then shows as NaN.
    poison = torch.full((case[0], case[3], case[4]), float("nan"), dtype=dtype, device=device)
    del poison
    out = pma.multihead_spmm(rowptr, col, weight, x)
    assert out.dtype == dtype and out.device.type == device
    assert out.shape == (case[0], case[3], case[4])
    assert rel_error(out, reference_spmm(rowptr, col, weight, x)) <= TOLERANCE[dtype]


@pytest.mark.sweep
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("mode", ["csc", "csc_perm_inv", "no_csc", "no_csc_deterministic"])
@pytest.mark.parametrize("case", CASES[:6] + CASES[6:9])
def test_backward_matches_reference(case, dtype, index_dtype, device, mode):
    rowptr, col, weight, x = make_inputs(case, dtype, index_dtype, device, seed=7,
                                         requires_grad=True)
    gen = torch.Generator().manual_seed(11)
    grad_out = torch.randn(case[0], case[3], case[4], generator=gen).to(device, dtype)
    csc = pma.csr_to_csc(rowptr, col, x.size(0)) if mode.startswith("csc") else None
    perm_inv = pma.invert_perm(csc[2]) if mode == "csc_perm_inv" else None
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(mode == "no_csc_deterministic")
    try:
        # An unwritten element of grad_weight shows as NaN.
        torch.full((col.numel(), case[3]), float("nan"), dtype=dtype, device=device)
        out = pma.multihead_spmm(rowptr, col, weight, x, csc=csc, perm_inv=perm_inv)
        grad_weight, grad_x = torch.autograd.grad(out, (weight, x), grad_out)
    finally:
        torch.use_deterministic_algorithms(deterministic)

    weight64 = weight.detach().double().cpu().requires_grad_()
    x64 = x.detach().double().cpu().requires_grad_()
    ref = reference_spmm(rowptr, col, weight64, x64)
    ref_gw, ref_gx = torch.autograd.grad(ref, (weight64, x64), grad_out.double().cpu())
    assert grad_weight.dtype == dtype and grad_x.dtype == dtype
    assert rel_error(grad_x, ref_gx) <= TOLERANCE[dtype]
    assert rel_error(grad_weight, ref_gw) <= TOLERANCE[dtype] * 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("need", ["x", "weight"])
def test_backward_only_requested_grad(device, need):
    rowptr, col, weight, x = make_inputs(CASES[0], torch.float32, torch.int64, device, seed=3)
    weight.requires_grad_(need == "weight")
    x.requires_grad_(need == "x")
    out = pma.multihead_spmm(rowptr, col, weight, x, csc=pma.csr_to_csc(rowptr, col, x.size(0)))
    out.square().sum().backward()
    assert (weight.grad is not None) == (need == "weight")
    assert (x.grad is not None) == (need == "x")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_backward_ops_direct(device, index_dtype):
    """The backward ops on their own, against the reference formulas."""
    case = (20, 15, 90, 3, 7, False)
    rowptr, col, weight, x = make_inputs(case, torch.float64, index_dtype, device, seed=5)
    grad_out = torch.randn(20, 3, 7, dtype=torch.float64, device=device)
    colptr, row, perm = pma.csr_to_csc(rowptr, col, x.size(0))
    gx, gw = ops.multihead_spmm_backward_csc(colptr, row, perm, weight, x, grad_out)
    row_of_edge = torch.repeat_interleave(torch.arange(20, device=device), rowptr.diff().long())
    messages = weight[..., None] * grad_out[row_of_edge]
    ref_gx = torch.zeros_like(x).index_add_(0, col.long(), messages)
    ref_gw = (grad_out[row_of_edge] * x[col.long()]).sum(-1)
    torch.testing.assert_close(gx, ref_gx)
    torch.testing.assert_close(gw, ref_gw)
    gx_only, empty = ops.multihead_spmm_backward_csc(colptr, row, perm, weight, None, grad_out)
    assert empty.shape == (0, 3)
    torch.testing.assert_close(gx_only, ref_gx)
    torch.testing.assert_close(ops.multihead_spmm_backward_x_scatter(
        rowptr, col, weight, grad_out, x.size(0)), ref_gx)
    torch.testing.assert_close(ops.multihead_sddmm(rowptr, col, grad_out, x), ref_gw)
    # With perm_inv: the same sums, so the same bits (CUDA: grad_weight by
    # CSC entry, then gathered into edge order; CPU: checked only).
    perm_inv = pma.invert_perm(perm)
    for w in (weight, None):
        got = ops.multihead_spmm_backward_csc(colptr, row, perm, w, x, grad_out, perm_inv)
        want = ops.multihead_spmm_backward_csc(colptr, row, perm, w, x, grad_out)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", PERM_INV_CASES_BAD, ids=[c[0] for c in PERM_INV_CASES_BAD])
def test_bad_perm_inv(case, device):
    _, breaker, words = case
    rowptr, col, weight, x = make_inputs(CASES[0], torch.float32, torch.int64, device, seed=4)
    grad_out = torch.randn(CASES[0][0], 4, 8, device=device)
    colptr, row, perm = pma.csr_to_csc(rowptr, col, x.size(0))
    with pytest.raises(RuntimeError) as info:
        ops.multihead_spmm_backward_csc(colptr, row, perm, weight, x, grad_out, breaker(perm))
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_perm_inv_on_another_device_cuda():
    rowptr, col, weight, x = make_inputs(CASES[0], torch.float32, torch.int64, "cuda", seed=4)
    grad_out = torch.randn(CASES[0][0], 4, 8, device="cuda")
    colptr, row, perm = pma.csr_to_csc(rowptr, col, x.size(0))
    with pytest.raises(RuntimeError, match="perm_inv"):
        ops.multihead_spmm_backward_csc(colptr, row, perm, weight, x, grad_out,
                                        pma.invert_perm(perm).cpu())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_out_of_range_perm_inv_does_not_fault_cuda(dtype):
    """Without validate a perm_inv that is no inverse gives wrong gradients,
    but the gather into edge order reads nothing out of bounds: an edge whose
    perm_inv is out of range gets zeros."""
    rowptr, col, weight, x = make_inputs(CASES[9], dtype, torch.int32, "cuda", seed=4)
    grad_out = torch.randn(CASES[9][0], 4, 32, device="cuda", dtype=dtype)
    colptr, row, perm = pma.csr_to_csc(rowptr, col, x.size(0))
    inv = pma.invert_perm(perm)
    _, want = ops.multihead_spmm_backward_csc(colptr, row, perm, weight, x, grad_out)
    bad = inv.clone()
    bad[::3] += inv.numel()
    bad[1::3] = -1 - bad[1::3]
    _, got = ops.multihead_spmm_backward_csc(colptr, row, perm, weight, x, grad_out, bad)
    torch.cuda.synchronize()
    assert not got[::3].any() and not got[1::3].any()
    assert torch.equal(got[2::3], want[2::3])
    _, flipped = ops.multihead_spmm_backward_csc(colptr, row, perm, weight, x, grad_out,
                                                 inv.flip(0))
    assert torch.isfinite(flipped).all()


@pytest.mark.parametrize("device", DEVICES)
def test_validate_checks_perm_inv(device):
    rowptr, col, weight, x = make_inputs(CASES[0], torch.float32, torch.int64, device, seed=4)
    csc = pma.csr_to_csc(rowptr, col, x.size(0))
    inv = pma.invert_perm(csc[2])
    pma.multihead_spmm(rowptr, col, weight, x, csc=csc, perm_inv=inv, validate=True)
    for bad, match in ((inv.flip(0), "inverse of perm"), (inv + inv.numel(), "CSC entries in"),
                       (inv[:-1], "one per edge"), (inv.int(), "dtype of perm")):
        with pytest.raises(ValueError, match=match):
            pma.multihead_spmm(rowptr, col, weight, x, csc=csc, perm_inv=bad, validate=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("with_csc", [True, False, "perm_inv"])
def test_gradcheck(device, index_dtype, with_csc):
    rowptr, col, weight, x = make_inputs((9, 11, 40, 2, 3, False), torch.float64, index_dtype,
                                         device, seed=1, requires_grad=True)
    csc = pma.csr_to_csc(rowptr, col, x.size(0)) if with_csc else None
    perm_inv = pma.invert_perm(csc[2]) if with_csc == "perm_inv" else None
    assert torch.autograd.gradcheck(
        lambda w, f: pma.multihead_spmm(rowptr, col, w, f, csc=csc, perm_inv=perm_inv),
        (weight, x))


def _opcheck_samples(device, index_dtype, dtype, case):
    """Every signature of the family's ops (8) on one graph."""
    rowptr, col, weight, x = make_inputs(case, dtype, index_dtype, device, seed=2,
                                         requires_grad=True)
    colptr, row, perm = pma.csr_to_csc(rowptr, col, x.size(0))
    grad_out = torch.randn(case[0], case[3], case[4], dtype=dtype, device=device)
    yield "multihead_spmm", (rowptr, col, weight, x)
    yield "multihead_spmm", (rowptr, col, weight, x, colptr, row, perm)
    perm_inv = pma.invert_perm(perm)
    yield "multihead_spmm", (rowptr, col, weight, x, colptr, row, perm, perm_inv)
    yield "multihead_spmm_backward_csc", (colptr, row, perm, weight.detach(),
                                          x.detach(), grad_out)
    yield "multihead_spmm_backward_csc", (colptr, row, perm, weight.detach(),
                                          x.detach(), grad_out, perm_inv)
    yield "multihead_spmm_backward_csc", (colptr, row, perm, None, x.detach(),
                                          grad_out)
    yield "multihead_spmm_backward_x_scatter", (rowptr, col, weight.detach(),
                                                grad_out, x.size(0))
    yield "multihead_sddmm", (rowptr, col, grad_out, x.detach())


@pytest.mark.sweep(cover=[("index_dtype", "dtype"), ("case",)])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[6]], ids=["case0", "case1", "case6"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_opcheck(index_dtype, dtype, case, device):
    count = 0
    for name, args in _opcheck_samples(device, index_dtype, dtype, case):
        torch.library.opcheck(getattr(ops, name), args)
        count += 1
    assert count == 8


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_with_csc(device):
    rowptr, col, weight, x = make_inputs((50, 40, 2000, 4, 32, True), torch.float32, torch.int32,
                                         device, seed=9, requires_grad=True)
    csc = pma.csr_to_csc(rowptr, col, x.size(0))
    results = []
    for _ in range(2):
        out = pma.multihead_spmm(rowptr, col, weight, x, csc=csc)
        gw, gx = torch.autograd.grad(out, (weight, x), torch.ones_like(out))
        results.append((out, gw, gx))
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_csr_to_csc_matches_transpose():
    rowptr, col = random_csr(13, 17, 80, generator=torch.Generator().manual_seed(4))
    colptr, row, perm = pma.csr_to_csc(rowptr, col, 17)
    dense = torch.zeros(13, 17, dtype=torch.long)
    row_of_edge = torch.repeat_interleave(torch.arange(13), rowptr.diff())
    dense.index_put_((row_of_edge, col), torch.arange(1, 81), accumulate=True)
    # Entry k of the CSC is edge perm[k], from row[k] to its column.
    assert torch.equal(row, row_of_edge[perm])
    assert torch.equal(colptr.diff(), torch.bincount(col, minlength=17))
    assert torch.equal(col[perm], torch.sort(col, stable=True).values)
    assert colptr.dtype == row.dtype == perm.dtype == col.dtype


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_csc", [True, False])
def test_double_backward_raises(device, with_csc):
    rowptr, col, weight, x = make_inputs(CASES[0], torch.float64, torch.int64, device, seed=8,
                                         requires_grad=True)
    csc = pma.csr_to_csc(rowptr, col, x.size(0)) if with_csc else None
    out = pma.multihead_spmm(rowptr, col, weight, x, csc=csc)
    (grad_x,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(grad_x.sum(), weight)
