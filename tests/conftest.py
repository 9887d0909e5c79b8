import pytest
import torch

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU")),
]
FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INDEX_DTYPES = [torch.int32, torch.int64]

# Relative error (in norm) allowed against the float64 reference.
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5,
             torch.float64: 1e-12}


def random_csr(num_dst, num_src, num_edges, *, index_dtype=torch.int64, device="cpu",
               hub=False, generator=None):
    """A random CSR graph (rowptr, col): duplicates and self-loops allowed, some
    rows empty; with ``hub`` one row holds most edges."""
    if num_dst == 0:
        num_edges = 0
    if hub and num_edges > 0:
        row = torch.full((num_edges,), num_dst // 2, dtype=torch.long)
        rest = num_edges // 4
        row[:rest] = torch.randint(0, num_dst, (rest,), generator=generator)
    else:
        row = torch.randint(0, max(num_dst, 1), (num_edges,), generator=generator)
    col = torch.randint(0, max(num_src, 1), (num_edges,), generator=generator)
    row, order = row.sort(stable=True)
    col = col[order]
    rowptr = torch._convert_indices_from_coo_to_csr(row, num_dst)
    return rowptr.to(device, index_dtype), col.to(device, index_dtype)


def reference_spmm(rowptr, col, weight, x):
    """float64 plain-PyTorch out[i] = sum_e weight[e] * x[col[e]]."""
    rowptr, col = rowptr.long().cpu(), col.long().cpu()
    weight, x = weight.double().cpu(), x.double().cpu()
    row = torch.repeat_interleave(torch.arange(rowptr.numel() - 1), rowptr.diff())
    out = torch.zeros(rowptr.numel() - 1, x.size(1), x.size(2), dtype=torch.float64)
    return out.index_add_(0, row, weight.unsqueeze(-1) * x[col])


def rel_error(out, ref):
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert torch.isfinite(out).all(), "output has NaN or inf"
    denom = ref.norm().clamp_min(1e-30)
    return float((out - ref).norm() / denom) if ref.numel() else 0.0
