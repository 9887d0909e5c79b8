"""Session 12 call 1: the spmm backward as two passes from the existing ops
(SDDMM over the CSR for grad_weight, the forward gather over the CSC with the
weight permuted for grad_x) against the one-pass backward_csc, same inputs.

    PYTHONPATH=. python twopass.py OUT.json   (from the repository root)
"""
import json
import statistics
import sys

import torch

sys.path.insert(0, "benchmarks")
from common import time_fn  # noqa: E402
from graphs import make_graph  # noqa: E402

import pyg_multihead_agg as pma  # noqa: E402

ops = torch.ops.pyg_multihead_agg
dev = torch.device("cuda")


def measure(name, g, colptr, row, perm, dt):
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(g.num_nodes, g.heads, g.channels, device=dev, generator=gen).to(dt)
    grad = torch.randn(g.num_nodes, g.heads, g.channels, device=dev, generator=gen).to(dt)
    w = torch.rand(g.num_edges, g.heads, device=dev, generator=gen).to(dt)
    w_csc = w[perm.long()]
    calls = {
        "fwd": lambda: ops.multihead_spmm(g.rowptr, g.col, w, x),
        "bwd_csc": lambda: ops.multihead_spmm_backward_csc(colptr, row, perm, w, x, grad),
        "sddmm": lambda: ops.multihead_sddmm(g.rowptr, g.col, grad, x),
        "gx_gather_wperm": lambda: ops.multihead_spmm_backward_csc(colptr, row, perm, w, None,
                                                                   grad),
        "gx_gather_wcsc": lambda: ops.multihead_spmm(colptr, row, w_csc, grad),
    }
    gx, gw = calls["bwd_csc"]()
    r = {"shape": name, "dtype": str(dt),
         "sddmm_vs_bwd_maxdiff": float((calls["sddmm"]().float() - gw.float()).abs().max())}
    for k, fn in calls.items():
        r[k] = statistics.median(time_fn(fn, dev, repeats=10, budget_s=0.5))
    r["two_pass"] = r["sddmm"] + r["gx_gather_wperm"]
    return r


rows = []
for name in ("arxiv-like", "products-like", "reddit-like"):
    g = make_graph(name, index_dtype=torch.int32, device=dev)
    colptr, row, perm = pma.csr_to_csc(g.rowptr, g.col, g.num_nodes)
    for dt in (torch.float32, torch.bfloat16):
        r = measure(name, g, colptr, row, perm, dt)
        rows.append(r)
        print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in r.items()), flush=True)
        torch.cuda.empty_cache()
with open(sys.argv[1], "w") as f:
    json.dump(rows, f, indent=1)
