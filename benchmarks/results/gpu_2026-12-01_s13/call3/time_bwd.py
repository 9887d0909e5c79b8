"""Times the spmm backward over the CSC (and the forward) on the benchmark graphs,
fp32 and bf16, in this process's build; no checks (ablation builds are wrong by design)."""
import functools
import statistics
import sys

import torch

sys.path.insert(0, "benchmarks")
from common import time_fn  # noqa: E402
from graphs import make_graph  # noqa: E402

import pyg_multihead_agg as pma  # noqa: E402

ops = torch.ops.pyg_multihead_agg
tag = sys.argv[1]
for name in sys.argv[2].split(","):
    g = make_graph(name, index_dtype=torch.int32, device="cuda")
    cp, rw, pm = pma.csr_to_csc(g.rowptr, g.col, g.num_nodes)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for dt in (torch.float32, torch.bfloat16):
        x = torch.randn(g.num_nodes, g.heads, g.channels, device="cuda", generator=gen).to(dt)
        grad = torch.randn_like(x)
        w = torch.rand(g.num_edges, g.heads, device="cuda", generator=gen).to(dt)
        fn = functools.partial(ops.multihead_spmm_backward_csc, cp, rw, pm, w, x, grad)
        ms = statistics.median(time_fn(fn, torch.device("cuda"), repeats=10, budget_s=0.3))
        print(f"{tag:10s} {name:14s} {str(dt)[6:]:9s} spmm_bwd {ms:8.3f} ms", flush=True)
