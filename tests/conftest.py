"""Shared test helpers and the selections.

Selections (markers; tests/README.md lists what each covers):
- default (`bash scripts/run_tests.sh`, `pytest`): every test except those
  marked `slow`. A test marked `sweep` runs a covering subset of its
  parameter combinations here (`_sweep_cover`); the rest of its
  combinations are marked `slow`.
- `--full` (`-m "not long"`; CI): every combination of every sweep.
- `-m long`: the multi-seed training runs (minutes each; also `slow`).
- `-m cuda`: the tests that need a GPU (deselected without one);
  `-m "cuda and not slow"` is the device's quick selection.
"""
import os
import re
from itertools import combinations

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
    weight, x = weight.double().cpu(), x.double().cpu()
    out = torch.zeros(rowptr.numel() - 1, x.size(1), x.size(2), dtype=torch.float64)
    return out.index_add_(0, _rows(rowptr), weight.unsqueeze(-1) * x[col.long().cpu()])


def _rows(rowptr):
    rowptr = rowptr.long().cpu()
    return torch.repeat_interleave(torch.arange(rowptr.numel() - 1), rowptr.diff())


def reference_sddmm(rowptr, col, a, b):
    """float64 out[e, h] = <a[row(e), h], b[col[e], h]>."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return (a[_rows(rowptr)] * b[col.long().cpu()]).sum(-1)


def reference_grad_x(rowptr, col, weight, grad_out, num_src):
    """float64 grad_x[j] = sum_{e: col[e] = j} weight[e] * grad_out[row(e)]."""
    weight, grad_out = weight.detach().double().cpu(), grad_out.detach().double().cpu()
    out = torch.zeros(num_src, grad_out.size(1), grad_out.size(2), dtype=torch.float64)
    return out.index_add_(0, col.long().cpu(), weight.unsqueeze(-1) * grad_out[_rows(rowptr)])


def poison(shape, dtype, device):
    """CUDA: leave a NaN block of this size for the caching allocator to hand
    out next, so an output element that is never written shows as NaN."""
    if torch.device(device).type == "cuda":
        t = torch.full(shape, float("nan"), dtype=dtype, device=device)
        del t


def rel_error(out, ref):
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert torch.isfinite(out).all(), "output has NaN or inf"
    denom = ref.norm().clamp_min(1e-30)
    return float((out - ref).norm() / denom) if ref.numel() else 0.0


def rel_error_and_rounding(out, ref, scale=0.0):
    """(error, rounding): ``||out - ref||`` and twice ``||ref rounded to
    out.dtype - ref||``, both over ``max(||ref||, scale)``. The second is the
    error that storing the exact result in out's dtype forces: next to a
    relative tolerance it matters only in a half type's subnormal range
    (below 6.1e-5 in float16, which holds few bits there), e.g. an attention
    output whose only kept edge has a weight of 1e-6. Asserts the shapes
    match and that out is finite."""
    rel_error(out, ref)  # shape and finiteness
    dtype = out.dtype
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    denom = max(float(ref.norm()), scale, 1e-30)
    rounding = 2 * float((ref.to(dtype).double() - ref).norm())
    return float((out - ref).norm()) / denom, rounding / denom


def check_without_grad_mode(run):
    """An attention op's run() -> (out, lse) without grad mode (no_grad,
    inference_mode), where the op runs below the autograd keys at once
    (csrc/autograd.cpp): the same bits as with grad mode, and no graph."""
    out, lse = run()
    assert out.grad_fn is not None and lse.grad_fn is not None
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            out_ng, lse_ng = run()
        assert out_ng.grad_fn is None and not out_ng.requires_grad
        assert torch.equal(out_ng, out) and torch.equal(lse_ng, lse)


def _inverse(perm):
    import pyg_multihead_agg as pma
    return pma.invert_perm(perm)


# Bad perm_inv arguments of the ops that take one: (id, perm -> a bad
# perm_inv, words of the RuntimeError).
PERM_INV_CASES_BAD = [
    ("perm_inv_size", lambda p: _inverse(p)[:-1], ["perm_inv", "one entry per edge"]),
    ("perm_inv_dtype", lambda p: _inverse(p).int(), ["perm_inv", "perm", "same dtype"]),
    ("perm_inv_float", lambda p: _inverse(p).float(), ["perm_inv"]),
    ("perm_inv_2d", lambda p: _inverse(p).view(1, -1), ["perm_inv"]),
]


# Without a GPU, the tests that need one are deselected and counted in one
# line, instead of a skip line each under -ra. A test needs CUDA if it is
# marked `cuda`, carries a skipif whose reason says it needs CUDA (the
# convention of these files), or is parametrized with device "cuda".
_NEEDS_CUDA_REASON = re.compile(r"^needs (a )?CUDA\b")
_CUDA_DESELECTED = pytest.StashKey[int]()


def _is_cuda_device(value) -> bool:
    if isinstance(value, torch.device):
        return value.type == "cuda"
    return isinstance(value, str) and value.split(":")[0] == "cuda"


def _needs_cuda(item) -> bool:
    if item.get_closest_marker("cuda") is not None:
        return True
    for mark in item.iter_markers("skipif"):
        if _NEEDS_CUDA_REASON.match(str(mark.kwargs.get("reason", ""))):
            return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and any(
        "device" in name and _is_cuda_device(value) for name, value in callspec.params.items())


def _value_key(value):
    try:
        hash(value)
        return value
    except TypeError:  # the same parameter object in every item that uses it
        return ("id", id(value))


def _sweep_requirements(item, groups):
    params = item.callspec.params
    return {(group, tuple(_value_key(params[name]) for name in group)) for group in groups}


def _sweep_cover(items):
    """The items of one sweep (one test function on one device, and one value
    of each parameter named in the marker's `by`) that run by default:
    greedily, the fewest that show every combination of values of each
    `cover` group of parameters at least once (default: every pair, so every
    dtype meets every index type, every case, and so on). Deterministic: the
    same subset on every run and in every xdist worker."""
    marker = items[0].get_closest_marker("sweep")
    apart = ("device", *marker.kwargs.get("by", ()))
    names = [n for n in items[0].callspec.params if n not in apart]
    cover = marker.kwargs.get("cover")
    groups = ([tuple(g) for g in cover] if cover is not None
              else list(combinations(names, 2)) or [tuple(names)])
    reqs = [_sweep_requirements(item, groups) for item in items]
    uncovered = set().union(*reqs)
    chosen = set()
    while uncovered:
        best = max(range(len(items)), key=lambda k: len(reqs[k] & uncovered))
        chosen.add(best)
        uncovered -= reqs[best]
    return chosen


def _mark_sweeps(items):
    sweeps = {}
    for item in items:
        if (item.get_closest_marker("sweep") is None or not hasattr(item, "callspec")
                or item.get_closest_marker("slow") is not None):
            continue
        params = item.callspec.params
        device = str(params.get("device", "cuda" if _needs_cuda(item) else "cpu"))
        apart = tuple(_value_key(params[name])
                      for name in item.get_closest_marker("sweep").kwargs.get("by", ()))
        sweeps.setdefault((item.module.__name__, item.originalname, device, apart),
                          []).append(item)
    for group in sweeps.values():
        chosen = _sweep_cover(group)
        for k, item in enumerate(group):
            if k not in chosen:
                item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # Every test that needs CUDA carries the "cuda" marker (-m cuda selects them).
    for item in items:
        if _needs_cuda(item):
            item.add_marker(pytest.mark.cuda)
        if item.get_closest_marker("long") is not None:
            item.add_marker(pytest.mark.slow)
    _mark_sweeps(items)
    if torch.cuda.is_available():
        return
    keep, deselected = [], []
    for item in items:
        (deselected if _needs_cuda(item) else keep).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = keep
    config.stash[_CUDA_DESELECTED] = len(deselected)


def pytest_terminal_summary(terminalreporter, config):
    count = config.stash.get(_CUDA_DESELECTED, 0)
    if count:
        terminalreporter.write_line(f"deselected {count} CUDA tests: no CUDA device")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    """A writable copy of the Planetoid Cora data (Planetoid writes processed/
    beside raw/), from PYG_MULTIHEAD_AGG_DATA or ../shared/data, processed
    once here (or downloaded, where there is internet)."""
    import shutil
    from pathlib import Path

    from torch_geometric.datasets import Planetoid

    root = tmp_path_factory.mktemp("data")
    repo = Path(__file__).resolve().parents[1]
    candidates = [os.environ.get("PYG_MULTIHEAD_AGG_DATA"), repo.parent / "shared" / "data"]
    source = next((Path(c) for c in candidates if c and (Path(c) / "Cora" / "raw").is_dir()), None)
    if source is not None:
        shutil.copytree(source / "Cora" / "raw", root / "Cora" / "raw")
    try:
        Planetoid(str(root), "Cora")
    except Exception as err:  # noqa: BLE001  (the download's error type depends on the PyG version)
        pytest.skip(f"no Cora data: set PYG_MULTIHEAD_AGG_DATA to a folder holding Cora/raw/ "
                    f"({err})")
    return root
