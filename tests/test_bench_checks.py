"""tools/bench_kernels.py checks every call against float64 before timing it: the
spmm checks find a wrong forward, grad_x or grad_weight, and a wrong result
stops the run unless --no-check (CPU kernels, cora-like)."""
import os
import sys

import pytest
import torch

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [os.path.join(REPO, "tools"), os.path.join(REPO, "benchmarks")]
import bench_kernels as bk  # noqa: E402
from graphs import make_graph  # noqa: E402

import pyg_multihead_agg as pma  # noqa: E402


@pytest.fixture(scope="module")
def spmm_case():
    g = make_graph("cora-like", index_dtype=torch.int32, device=torch.device("cpu"))
    csc = pma.csr_to_csc(g.rowptr, g.col, g.num_nodes)
    x, _, _, grad = bk.fused_inputs(g, torch.float32, torch.device("cpu"))
    w = torch.rand(g.num_edges, g.heads, generator=torch.Generator().manual_seed(1))
    out = bk._ops.multihead_spmm(g.rowptr, g.col, w, x)
    gx, gw = bk._ops.multihead_spmm_backward_csc(*csc, w, x, grad)
    return g, csc, w, x, grad, out, gx, gw


def test_spmm_check_passes_the_kernels(spmm_case):
    g, csc, w, x, grad, out, gx, gw = spmm_case
    errs = bk.check_spmm(g, csc, w, x, grad, out, (gx, gw))
    assert set(errs) == {"out", "grad_x", "grad_weight"}
    assert all(v <= bk.TOLERANCE[torch.float32] for v in errs.values()), errs
    bk.enforce(errs, torch.float32, "cora-like spmm", True)


@pytest.mark.parametrize("wrong", ["out", "grad_x", "grad_weight"])
def test_spmm_check_stops_a_wrong_result(spmm_case, wrong):
    g, csc, w, x, grad, out, gx, gw = spmm_case
    got = {"out": out, "grad_x": gx, "grad_weight": gw}
    got[wrong] = got[wrong].roll(1, 0)  # right values, wrong rows
    errs = bk.check_spmm(g, csc, w, x, grad, got["out"], (got["grad_x"], got["grad_weight"]))
    assert errs[wrong] > 0.1, errs
    with pytest.raises(SystemExit, match=wrong):
        bk.enforce(errs, torch.float32, "cora-like spmm", True)
    bk.enforce(errs, torch.float32, "cora-like spmm", False)  # --no-check: reported, timed anyway


def test_nan_is_never_within_tolerance():
    with pytest.raises(SystemExit):
        bk.enforce({"out": float("nan")}, torch.bfloat16, "x", True)
