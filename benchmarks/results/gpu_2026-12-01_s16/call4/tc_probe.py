"""Session 16 call 4: is the tensor-core forward bound by its L1 requests?

Its lanes gather 2 * D / 8 bytes of an entry per load: 8 bytes for D = 32
(four entries x 64 bytes per warp load), 16 bytes for D = 64 (four entries
x 128 bytes, one whole line each). Same bytes per graph (H * D = 128), half
the L1 wavefronts at D = 64. Times the bf16 spmm forward on the benchmark
graphs for (H, D) = (4, 32), (2, 64), (8, 16), with the tensor cores forced
on and off, after checking each against float32 math.
"""
import functools
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
from common import time_fn  # noqa: E402
from graphs import make_graph  # noqa: E402

import pyg_multihead_agg  # noqa: E402,F401

ops = torch.ops.pyg_multihead_agg
dev = torch.device("cuda")
for name in ("arxiv-like", "products-like"):
    g = make_graph(name, index_dtype=torch.int32, device=dev)
    rowptr, col = g.rowptr, g.col
    n, e = rowptr.numel() - 1, col.numel()
    gen = torch.Generator(device=dev).manual_seed(0)
    for H, D in ((4, 32), (2, 64), (8, 16)):
        x = torch.randn(n, H, D, device=dev, generator=gen).bfloat16()
        w = torch.rand(e, H, device=dev, generator=gen).bfloat16()
        ref = None
        for tc in ("0", "1"):
            os.environ["PYG_MULTIHEAD_AGG_TENSOR_CORES"] = tc
            out = ops.multihead_spmm(rowptr, col, w, x)
            if ref is None:
                ref = ops.multihead_spmm(rowptr, col, w.float(), x.float())
            err = float((out.float() - ref).norm() / ref.norm())
            assert err < 1e-2, (name, H, D, tc, err)
            call = functools.partial(ops.multihead_spmm, rowptr, col, w, x)
            ms = sorted(time_fn(call, dev, repeats=20))
            print(f"{name:14s} H={H} D={D:2d} tensor_cores={tc}  {ms[len(ms) // 2]:.3f} ms"
                  f"  rel err {err:.1e}", flush=True)
        del x, w, out, ref, call
    del g, rowptr, col
    torch.cuda.empty_cache()
