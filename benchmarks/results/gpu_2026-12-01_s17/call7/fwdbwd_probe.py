"""Session 17 call 7: where bench_ops' arxiv-like bf16 forward + backward
time goes, with the CSC cached and with its perm_inv too: the median of 50
CUDA-event-timed steps, the host time to enqueue a step (no sync), and the
kernels' time per step (torch.profiler)."""
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "benchmarks")
from graphs import make_graph  # noqa: E402

from pyg_multihead_agg import csr_to_csc, invert_perm, multihead_spmm  # noqa: E402

dev = torch.device("cuda")
for shape in ("arxiv-like",):
    g = make_graph(shape, index_dtype=torch.int32, device=dev)
    csc = csr_to_csc(g.rowptr, g.col, g.num_nodes)
    inv = invert_perm(csc[2])
    for dtype in (torch.float32, torch.bfloat16):
        gen = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(g.num_nodes, g.heads, g.channels, device=dev, generator=gen).to(dtype)
        w = torch.randn(g.num_edges, g.heads, device=dev, generator=gen).to(dtype)
        go = torch.randn(g.num_nodes, g.heads, g.channels, device=dev, generator=gen).to(dtype)
        x.requires_grad_()
        w.requires_grad_()
        for name, pinv in (("csc", None), ("csc+perm_inv", inv)):
            def step(g=g, w=w, x=x, csc=csc, pinv=pinv, go=go):
                out = multihead_spmm(g.rowptr, g.col, w, x, csc=csc, perm_inv=pinv)
                return torch.autograd.grad(out, (x, w), go)
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            ev = []
            for _ in range(50):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                step()
                b.record()
                ev.append((a, b))
            torch.cuda.synchronize()
            gpu = statistics.median(a.elapsed_time(b) for a, b in ev)
            host = []
            for _ in range(20):
                t0 = time.perf_counter()
                step()
                host.append((time.perf_counter() - t0) * 1e3)
                torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
            kern = sum(e.self_device_time_total for e in prof.key_averages()) / 5 / 1e3
            print(f"{shape} {str(dtype)[6:]:9s} {name:13s} event median {gpu:.3f} ms, "
                  f"host enqueue median {statistics.median(host):.3f} ms, "
                  f"kernels {kern:.3f} ms/step", flush=True)
            print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=12,
                                            max_name_column_width=70), flush=True)
