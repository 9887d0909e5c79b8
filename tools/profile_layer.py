"""Where an attention layer's forward + backward spends its GPU time:
torch.profiler's per-kernel totals for our GATConv, GATv2Conv or
TransformerConv (fused attention and, for comparison, the unfused path) on the
benchmark graphs, the layer of bench_layer.py (F_in = 128, one self-loop per
node, float32), and the step's peak memory above its inputs.

    python tools/profile_layer.py --device cuda --shapes products-like,reddit-like \
        --conv transformer --variants fused
    python tools/profile_layer.py --device cuda --shapes products-like --conv gat \
        --input edge_index --variants fused,compiled

Prints one Markdown table per (shape, variant): the kernels by total CUDA
time over the profiled steps, and the step's wall time.
"""
import argparse
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

# common.py and graphs.py live in benchmarks/.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

from graphs import make_graph  # noqa: E402

from pyg_multihead_agg import nn as ours  # noqa: E402

CONVS = {"gat": "GATConv", "gatv2": "GATv2Conv", "transformer": "TransformerConv"}

IN_CHANNELS = 128


def profile_step(layer: torch.nn.Module, x, adj, grad, steps: int, top: int, title: str,
                 autocast=None) -> None:
    params = list(layer.parameters())

    def step():
        with torch.autocast(x.device.type, dtype=autocast, enabled=autocast is not None):
            out = layer(x, adj)
        return torch.autograd.grad(out, params, grad.to(out.dtype))
    for _ in range(2):  # warm-up: caches, allocator
        step()
    torch.cuda.synchronize(x.device)
    torch.cuda.reset_peak_memory_stats(x.device)
    base = torch.cuda.memory_allocated(x.device)
    step()
    torch.cuda.synchronize(x.device)
    peak = (torch.cuda.max_memory_allocated(x.device) - base) / 2**30
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize(x.device)
    wall = (time.perf_counter() - t) * 1e3 / steps
    print(f"\n### {title}, {wall:.1f} ms per step (under the profiler), "
          f"peak {peak:.2f} GiB above the inputs\n")
    print("| kernel | total ms per step | calls per step |\n|---|---|---|")
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    events.sort(key=lambda e: e.device_time_total, reverse=True)
    for e in events[:top]:
        print(f"| `{e.key[:90]}` | {e.device_time_total / 1e3 / steps:.2f} | "
              f"{e.count // steps} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", default="products-like,reddit-like")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--conv", choices=sorted(CONVS), default="gat")
    parser.add_argument("--autocast", choices=["bfloat16", "float16"], default=None,
                        help="run the step under torch.autocast to this dtype")
    parser.add_argument("--variants", default="fused,unfused",
                        help="comma list of fused, unfused, compiled (the fused layer under "
                        "torch.compile(dynamic=False))")
    parser.add_argument("--input", choices=["csr", "edge_index", "EdgeIndex"], default="csr",
                        help="the adjacency the layer gets: a sparse CSR tensor, a plain "
                        "edge_index (whose prepared graph the layer caches in eager mode) "
                        "or a column-sorted EdgeIndex with its caches filled")
    args = parser.parse_args()
    device = torch.device(args.device)
    for shape in args.shapes.split(","):
        g = make_graph(shape, device=device, self_loops=True)
        n = g.num_nodes
        if args.input == "csr":
            adj = torch.sparse_csr_tensor(g.rowptr, g.col, torch.ones(g.num_edges, device=device),
                                          (n, n), check_invariants=False)
        else:
            dst = torch.repeat_interleave(torch.arange(n, device=device), g.rowptr.diff())
            adj = torch.stack([g.col.long(), dst])
            if args.input == "EdgeIndex":
                from torch_geometric import EdgeIndex
                adj = EdgeIndex(adj, sparse_size=(n, n), sort_order="col").fill_cache_()
        x = torch.randn(n, IN_CHANNELS, device=device)
        grad = torch.randn(n, g.heads * g.channels, device=device)
        names = {"fused": "fused attention", "unfused": "unfused (PyG softmax + multihead_spmm)",
                 "compiled": "fused attention, torch.compile"}
        for variant in args.variants.split(","):
            torch.manual_seed(0)
            conv = getattr(ours, CONVS[args.conv])
            kwargs = {} if args.conv == "transformer" else {"add_self_loops": False}
            layer = conv(IN_CHANNELS, g.channels, heads=g.heads,
                         fused_attention=variant != "unfused", **kwargs).to(device)
            if variant == "compiled":
                layer = torch.compile(layer, dynamic=False)
            name = f"{names[variant]}, {args.input}"
            autocast = getattr(torch, args.autocast) if args.autocast else None
            profile_step(layer, x, adj, grad, args.steps, args.top,
                         f"{g!r}: {CONVS[args.conv]}, {name}"
                         + (f", {args.autocast} autocast" if autocast else ""), autocast)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
