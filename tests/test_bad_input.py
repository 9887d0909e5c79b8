"""Malformed input raises a clear exception naming the argument; never a crash."""
import pytest
import torch
from conftest import DEVICES, random_csr

import pyg_multihead_agg as pma

ops = torch.ops.pyg_multihead_agg


def good(device, index_dtype=torch.int64):
    gen = torch.Generator().manual_seed(0)
    rowptr, col = random_csr(6, 5, 20, index_dtype=index_dtype, device=device, generator=gen)
    weight = torch.randn(20, 2, generator=gen).to(device)
    x = torch.randn(5, 2, 3, generator=gen).to(device)
    return rowptr, col, weight, x


def _replace(args, **kw):
    names = ("rowptr", "col", "weight", "x")
    return tuple(kw.get(n, a) for n, a in zip(names, args, strict=True))


# (id, how to break the inputs, words the message must contain)
SHAPE_CASES = [
    ("weight_int", lambda a: _replace(a, weight=a[2].long()), ["weight", "float"]),
    ("x_int", lambda a: _replace(a, x=a[3].int()), ["x", "float"]),
    ("dtype_mismatch", lambda a: _replace(a, x=a[3].double()), ["weight", "x", "same dtype"]),
    ("rowptr_float", lambda a: _replace(a, rowptr=a[0].float()), ["rowptr", "int32 or int64"]),
    ("col_2d", lambda a: _replace(a, col=a[1].view(1, -1)), ["col", "1-D"]),
    ("index_dtype_mix", lambda a: _replace(a, col=a[1].int()), ["rowptr", "col", "same dtype"]),
    ("x_2d", lambda a: _replace(a, x=a[3].flatten(1)), ["x", "3 dimensions"]),
    ("weight_1d", lambda a: _replace(a, weight=a[2][:, 0]), ["weight", "2 dimensions"]),
    ("weight_too_few_edges", lambda a: _replace(a, weight=a[2][:-1]), ["weight", "col.numel()"]),
    ("heads_mismatch", lambda a: _replace(a, weight=a[2][:, :1]), ["heads", "x.size(1)"]),
    ("rowptr_empty", lambda a: _replace(a, rowptr=a[0][:0]), ["rowptr", "at least one"]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", SHAPE_CASES, ids=[c[0] for c in SHAPE_CASES])
def test_bad_shapes_and_dtypes(device, case):
    _, breaker, words = case
    args = breaker(good(device))
    with pytest.raises(RuntimeError) as info:
        pma.multihead_spmm(*args)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@pytest.mark.parametrize("case", SHAPE_CASES, ids=[c[0] for c in SHAPE_CASES])
def test_bad_shapes_under_fake_tensors(case):
    """The fake implementation rejects the same inputs (torch.compile path)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    _, breaker, words = case
    args = breaker(good("cpu"))
    with FakeTensorMode() as mode:
        fake = tuple(mode.from_tensor(a) for a in args)
        with pytest.raises(RuntimeError) as info:
            pma.multihead_spmm(*fake)
    assert words[0] in str(info.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_mismatch():
    rowptr, col, weight, x = good("cpu")
    with pytest.raises(RuntimeError, match="same device"):
        pma.multihead_spmm(rowptr, col, weight, x.cuda())


# Malformed graphs: (id, breaker, ValueError words of check_csr, words of the CPU kernel)
GRAPH_CASES = [
    ("rowptr_not_monotone", lambda r, c: (r.clone().index_fill_(0, torch.tensor([2]), 15), c),
     "non-decreasing", "non-decreasing"),
    ("rowptr_last_too_small", lambda r, c: (torch.cat([r[:-1], r[-1:] - 1]), c),
     "rowptr[-1]", "end at col.numel()"),
    ("rowptr_first_nonzero", lambda r, c: (r + 1, c), "rowptr[0]", "start at 0"),
    ("col_too_large", lambda r, c: (r, c.clone().index_fill_(0, torch.tensor([3]), 5)),
     "[0, 5)", "out of range"),
    ("col_negative", lambda r, c: (r, c.clone().index_fill_(0, torch.tensor([0]), -1)),
     "[0, 5)", "out of range"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", GRAPH_CASES, ids=[c[0] for c in GRAPH_CASES])
def test_validate_rejects_malformed_graph(device, case):
    _, breaker, words, _ = case
    rowptr, col, weight, x = good(device)
    rowptr, col = breaker(rowptr.cpu(), col.cpu())
    rowptr, col = rowptr.to(device), col.to(device)
    with pytest.raises(ValueError, match=None) as info:
        pma.multihead_spmm(rowptr, col, weight, x, validate=True)
    assert words in str(info.value)
    with pytest.raises(ValueError):
        pma.check_csr(rowptr, col, x.size(0))


@pytest.mark.parametrize("case", GRAPH_CASES, ids=[c[0] for c in GRAPH_CASES])
def test_cpu_kernels_reject_malformed_graph_without_validate(case):
    """The CPU kernels bounds-check every index, validate or not."""
    _, breaker, _, words = case
    rowptr, col, weight, x = good("cpu")
    rowptr, col = breaker(rowptr, col)
    with pytest.raises(RuntimeError, match=None) as info:
        pma.multihead_spmm(rowptr, col, weight, x)
    assert words in str(info.value)
    grad_out = torch.randn(6, 2, 3)
    with pytest.raises(RuntimeError):
        ops.multihead_sddmm(rowptr, col, grad_out, x)
    with pytest.raises(RuntimeError):
        ops.multihead_spmm_backward_x_scatter(rowptr, col, weight, grad_out, 5)


def test_validate_checks_the_csc():
    rowptr, col, weight, x = good("cpu")
    colptr, row, perm = pma.csr_to_csc(rowptr, col, x.size(0))
    bad_row = row.clone()
    bad_row[0] = 6
    with pytest.raises(ValueError, match="row"):
        pma.multihead_spmm(rowptr, col, weight, x, csc=(colptr, bad_row, perm), validate=True)
    with pytest.raises(RuntimeError, match="row"):
        ops.multihead_spmm_backward_csc(colptr, bad_row, perm, weight, x, torch.randn(6, 2, 3))


def test_nan_and_inf_propagate_like_the_reference():
    rowptr, col, weight, x = good("cpu")
    x[int(col[0])] = float("nan")
    x[int(col[-1]), 1, 0] = float("inf")
    out = pma.multihead_spmm(rowptr, col, weight, x)
    row = torch.repeat_interleave(torch.arange(6), rowptr.diff())
    ref = torch.zeros(6, 2, 3).index_add_(0, row, weight[..., None] * x[col])
    assert torch.equal(out.isnan(), ref.isnan())
    finite = ref.isfinite()
    torch.testing.assert_close(out[finite], ref[finite])
    assert torch.equal(out[~finite & ~ref.isnan()], ref[~finite & ~ref.isnan()])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build")
def test_cpu_only_build_says_how_to_rebuild():
    """A CPU-only build registers CUDA kernels that only raise: reach one
    through the dispatcher (no CUDA tensors exist on a CPU-only torch)."""
    assert torch._C._dispatch_has_kernel_for_dispatch_key(
        "pyg_multihead_agg::multihead_spmm", "CUDA")
    rowptr, col, weight, x = good("cpu")
    with pytest.raises(RuntimeError, match="built without CUDA.*FORCE_CUDA=1"):
        ops.multihead_spmm.default.redispatch(torch._C.DispatchKeySet("CUDA"),
                                              rowptr, col, weight, x)
