"""Kernel-level timing of the operators on the synthetic graphs (CUDA).

Times, with CUDA events (median of >= 10 after warm-up), each operator call
on its own: ``multihead_spmm`` forward (float32, bfloat16), the fused
``gat_attention`` forward and its backward op (``gat_attention_backward``,
given the CSC), ``gatv2_attention`` and ``transformer_attention`` and their
backward (where the build has them; the transformer's in both CSC passes),
and the plain copy ceiling. It is the quick loop for kernel
tuning; ``bench_ops.py`` and ``bench_layer.py`` are the full comparisons with
the peers. Before timing, every call's results are checked against float64
references on a subset (the first rows of the spmm forward and of the fused
op, the first columns of grad_x and their edges' grad_weight); an error above
the dtype's tolerance stops the run, so a fast wrong kernel cannot be timed.
``--no-check`` still prints the errors but times anyway (to time a
deliberately wrong variant).

Also the driver for Nsight Compute: ``--ncu`` runs each call once, after one
warm-up, inside ``cudaProfilerStart/Stop`` so that ``ncu --profile-from-start
off`` sees only the calls of interest.

    python tools/bench_kernels.py --shapes products-like,reddit-like --out DIR
"""
import argparse
import json
import os
import statistics
import sys

import torch

# common.py and graphs.py live in benchmarks/.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from common import TOLERANCE, copy_bandwidth, environment, gather_bytes, rel_error, time_fn  # noqa: E402
from graphs import make_graph  # noqa: E402

import pyg_multihead_agg as pma  # noqa: E402

_ops = torch.ops.pyg_multihead_agg


def fused_inputs(g, dtype, device, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    N, H, D = g.num_nodes, g.heads, g.channels
    x = torch.randn(N, H, D, device=device, dtype=dtype, generator=gen)
    s_src = torch.randn(N, H, device=device, dtype=dtype, generator=gen)
    s_dst = torch.randn(N, H, device=device, dtype=dtype, generator=gen)
    grad = torch.randn(N, H, D, device=device, dtype=dtype, generator=gen)
    return x, s_src, s_dst, grad


def check_fused(g, x, s_src, s_dst, grad, out, grads, rows=2000):
    """Float64 reference of forward and backward on the first `rows` destinations."""
    from torch_geometric.utils import softmax
    rowptr, col = g.rowptr, g.col
    hi = int(rowptr[rows])
    r = torch.repeat_interleave(torch.arange(rows, device=x.device),
                                rowptr[1:rows + 1] - rowptr[:rows])
    c = col[:hi].long()
    # Only these rows' edges: out and grad_s_dst of a row depend on nothing else.
    sd = s_dst[:rows].double().requires_grad_()
    z = torch.nn.functional.leaky_relu(s_src[c].double() + sd[r], 0.2)
    a = softmax(z, r, num_nodes=rows)
    ref = torch.zeros(rows, x.size(1), x.size(2), dtype=torch.float64, device=x.device)
    ref.index_add_(0, r, a.unsqueeze(-1) * x[c].double())
    ref.backward(grad[:rows].double())
    errs = {"out": (out[:rows].double() - ref).abs().max().item() / ref.abs().max().item(),
            "grad_s_dst": (grads[2][:rows].double() - sd.grad).abs().max().item()
            / max(sd.grad.abs().max().item(), 1e-30)}
    return errs


def check_spmm(g, csc, w, x, grad, out, grads, rows=2000, cols=256):
    """Float64 references of the spmm forward on the first `rows` destinations
    and of its backward on the first `cols` sources (grad_x, and grad_weight
    of those sources' edges, found through the CSC)."""
    rowptr, col = g.rowptr, g.col
    colptr, row, perm = csc
    rows = min(rows, rowptr.numel() - 1)
    hi = int(rowptr[rows])
    r = torch.repeat_interleave(torch.arange(rows, device=x.device),
                                rowptr[1:rows + 1] - rowptr[:rows])
    ref = torch.zeros(rows, x.size(1), x.size(2), dtype=torch.float64, device=x.device)
    ref.index_add_(0, r, w[:hi].double().unsqueeze(-1) * x[col[:hi].long()].double())
    cols = min(cols, colptr.numel() - 1)
    k_hi = int(colptr[cols])
    j = torch.repeat_interleave(torch.arange(cols, device=x.device),
                                colptr[1:cols + 1] - colptr[:cols])
    e, i = perm[:k_hi].long(), row[:k_hi].long()
    ref_gx = torch.zeros(cols, x.size(1), x.size(2), dtype=torch.float64, device=x.device)
    ref_gx.index_add_(0, j, w[e].double().unsqueeze(-1) * grad[i].double())
    ref_gw = (grad[i].double() * x[j].double()).sum(-1)
    gx, gw = grads
    return {"out": rel_error(out[:rows], ref), "grad_x": rel_error(gx[:cols], ref_gx),
            "grad_weight": rel_error(gw[e], ref_gw)}


def enforce(errs, dtype, what, check):
    """Stops the run (unless not `check`) when an error is above the
    benchmarks' tolerance for `dtype` (common.TOLERANCE, as bench_ops)."""
    tol = TOLERANCE[dtype]
    bad = {k: v for k, v in errs.items() if not v <= tol}
    if bad and check:
        raise SystemExit(f"{what} {dtype}: relative error {bad} above {tol:g}; "
                         "not timing a wrong kernel (--no-check times it anyway)")


def profile_calls(g, dt, calls, repeats=5):
    """Per-kernel CUDA time of each call (torch.profiler, `repeats` calls after
    a warm-up): which launches a call's time is made of (work lists, the main
    kernel, the slice sums)."""
    from torch.profiler import ProfilerActivity, profile
    rows = []
    for key, fn in calls.items():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                fn()
            torch.cuda.synchronize()
        for ev in prof.key_averages():
            us = ev.device_time_total / repeats if hasattr(ev, "device_time_total") \
                else ev.cuda_time_total / repeats
            if us <= 0:
                continue
            rows.append({"shape": g.name, "dtype": dt, "call": key, "kernel": ev.key[:90],
                         "us_per_call": us, "launches_per_call": ev.count / repeats})
            print(f"{g.name:14s} {dt:9s} {key:13s} {us:9.1f} us  x{ev.count / repeats:.0f}  "
                  f"{ev.key[:90]}", flush=True)
    return rows


def _has_perm_inv(op=None) -> bool:
    op = _ops.gat_attention_backward if op is None else op
    return "perm_inv" in str(op.default._schema)


def bench_dtype(g, csc, dtype, device, ncu, profile=False, check=True, only=()):
    """Times (or, with ncu, runs once for the profiler) each call in one dtype."""
    dt = str(dtype).replace("torch.", "")
    x, s_src, s_dst, grad = fused_inputs(g, dtype, device)
    w = torch.rand(g.num_edges, g.heads, device=device, dtype=dtype)
    colptr, row, perm = csc
    out, lse = _ops.gat_attention(g.rowptr, g.col, s_src, s_dst, None, x, 0.2, 0.0, None)
    # The layer's way (a cached graph): the fused backward with perm_inv, when
    # this build's op takes it (a baseline tree's may not).
    perm_inv = pma.invert_perm(perm) if _has_perm_inv() else None
    calls = {
        "spmm_fwd": lambda: _ops.multihead_spmm(g.rowptr, g.col, w, x),
        "spmm_bwd_csc": lambda: _ops.multihead_spmm_backward_csc(colptr, row, perm, w, x, grad),
        # grad_x alone (weights that need no gradient)
        "spmm_bwd_x": lambda: _ops.multihead_spmm_backward_csc(colptr, row, perm, w, None, grad),
        "gat_fwd": lambda: _ops.gat_attention(g.rowptr, g.col, s_src, s_dst, None, x, 0.2, 0.0,
                                              None),
        "gat_bwd": lambda: _ops.gat_attention_backward(
            g.rowptr, g.col, colptr, row, perm, s_src, s_dst, None, x, out, lse, grad, None,
            0.2, 0.0, None),
    }
    if perm_inv is not None:
        calls["gat_bwd_inv"] = lambda: _ops.gat_attention_backward(
            g.rowptr, g.col, colptr, row, perm, s_src, s_dst, None, x, out, lse, grad, None,
            0.2, 0.0, None, None, perm_inv)
    if hasattr(_ops, "gatv2_attention"):  # GATv2 on the same shapes (x_r, att: fresh values)
        x_r = torch.randn_like(x)
        att = torch.randn(g.heads, g.channels, device=device, dtype=dtype)
        v2_out, v2_lse = _ops.gatv2_attention(g.rowptr, g.col, x, x_r, None, att, 0.2, 0.0, None)
        calls["gatv2_fwd"] = lambda: _ops.gatv2_attention(g.rowptr, g.col, x, x_r, None, att,
                                                          0.2, 0.0, None)
        # The training forward (with the record its backward reads) and the
        # backward over that record, where this build has it.
        record = ()
        if hasattr(_ops, "_gatv2_attention_record"):
            calls["gatv2_fwd_record"] = lambda: _ops._gatv2_attention_record(
                g.rowptr, g.col, x, x_r, None, att, 0.2, 0.0, None)
            record = calls["gatv2_fwd_record"]()[2:]
        calls["gatv2_bwd_inv"] = lambda: _ops.gatv2_attention_backward(
            g.rowptr, g.col, colptr, row, perm, x, x_r, None, att, v2_out, v2_lse, grad, None,
            0.2, 0.0, None, None, perm_inv, *record)
    if hasattr(_ops, "transformer_attention") and perm_inv is not None:
        # The transformer on the same shapes (values: x; query, key: fresh),
        # its backward in the default CSC pass (transposed for heads of 4 or 8
        # lanes) and in the one that does an entry's work in every lane.
        from pyg_multihead_agg._testing import force_kernel_path
        query, keys = torch.randn_like(x), torch.randn_like(x)
        scale = g.channels ** -0.5
        tr_out, tr_lse = _ops.transformer_attention(g.rowptr, g.col, query, keys, x, None,
                                                    scale, 0.0, None)
        calls["tr_fwd"] = lambda: _ops.transformer_attention(g.rowptr, g.col, query, keys, x,
                                                             None, scale, 0.0, None)

        def tr_bwd(layout=None):
            with force_kernel_path(transposed=layout):
                return _ops.transformer_attention_backward(
                    g.rowptr, g.col, colptr, row, perm, query, keys, x, None, tr_out, tr_lse,
                    grad, None, scale, 0.0, None, None, perm_inv)
        calls["tr_bwd_inv"] = tr_bwd
        calls["tr_bwd_inv_lanes"] = lambda: tr_bwd(0)
    spmm_inv = perm_inv is not None and _has_perm_inv(_ops.multihead_spmm_backward_csc)
    if spmm_inv:  # the spmm backward's grad_weight through perm_inv
        calls["spmm_bwd_inv"] = lambda: _ops.multihead_spmm_backward_csc(
            colptr, row, perm, w, x, grad, perm_inv)
    if ncu:  # (only: the profiled calls)
        profiled = [fn for key, fn in calls.items() if not only or key in only]
        for fn in profiled:
            fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        for fn in profiled:
            fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        return []
    if profile:
        return profile_calls(g, dt, calls)
    errs = check_fused(g, x, s_src, s_dst, grad, out, calls["gat_bwd"]())
    if perm_inv is not None:
        inv_errs = check_fused(g, x, s_src, s_dst, grad, out, calls["gat_bwd_inv"]())
        enforce(inv_errs, dtype, f"{g.name} gat (perm_inv)", check)
    spmm_out, spmm_grads = calls["spmm_fwd"](), calls["spmm_bwd_csc"]()
    spmm_errs = check_spmm(g, csc, w, x, grad, spmm_out, spmm_grads)
    spmm_errs["grad_x_alone"] = check_spmm(g, csc, w, x, grad, spmm_out,
                                           (calls["spmm_bwd_x"]()[0], spmm_grads[1]))["grad_x"]
    print(f"{g.name:14s} {dt:9s} spmm rel err {spmm_errs}", flush=True)
    if spmm_inv:  # the same sums, stored elsewhere first: bitwise equal
        same = all(torch.equal(a, b) for a, b in zip(calls["spmm_bwd_csc"](),
                                                     calls["spmm_bwd_inv"](), strict=True))
        print(f"{g.name:14s} {dt:9s} spmm_bwd_inv bitwise equal: {same}", flush=True)
        if not same and check:
            raise SystemExit(f"{g.name} {dt}: spmm_bwd_inv differs from spmm_bwd_csc")
    for name in ("tr_bwd_inv",):  # the two CSC passes: bitwise equal
        if name not in calls:
            continue
        same = [torch.equal(a, b) for a, b in zip(calls[name](), calls[name + "_lanes"](),
                                                  strict=True) if a is not None]
        print(f"{g.name:14s} {dt:9s} {name}: transposed = every lane, bitwise per output: "
              f"{same}", flush=True)
        if not all(same) and check:
            raise SystemExit(f"{g.name} {dt}: {name}'s two CSC passes differ")
    enforce(errs, dtype, f"{g.name} gat", check)
    enforce(spmm_errs, dtype, f"{g.name} spmm", check)
    nbytes = gather_bytes(g.num_edges, g.num_nodes, g.heads, g.channels, x.element_size())
    rows = []
    for key, fn in calls.items():
        if only and key not in only:
            continue
        ms = statistics.median(time_fn(fn, device, repeats=10, budget_s=0.5))
        r = {"shape": g.name, "dtype": dt, "call": key, "ms": ms,
             "gather_GBps": nbytes / ms / 1e6}
        r.update({f"err_{k}": v for k, v in (errs if key.startswith("gat") else
                                               spmm_errs).items()})
        rows.append(r)
        print(f"{g.name:14s} {dt:9s} {key:13s} {ms:8.3f} ms  {nbytes / ms / 1e6:6.0f} GB/s"
              + (f"  rel err {errs}" if key == "gat_bwd" else ""), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="products-like,reddit-like")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--index-dtype", default="int32")
    parser.add_argument("--ncu", action="store_true")
    parser.add_argument("--profile", action="store_true",
                        help="per-kernel CUDA times of each call (torch.profiler), no timing")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="time even when a result is off its float64 reference")
    parser.add_argument("--out", default=None)
    parser.add_argument("--calls", default="",
                        help="time (with --ncu: profile) only these calls (comma-separated; "
                        "all are still checked)")
    args = parser.parse_args()
    device = torch.device(args.device)
    index_dtype = getattr(torch, args.index_dtype)
    rows = []
    env = environment(device, sys.argv)
    if not (args.ncu or args.profile):
        bw = copy_bandwidth(device)
        print(f"copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
        env["copy_GBps"] = bw / 1e9
    for name in args.shapes.split(","):
        g = make_graph(name, index_dtype=index_dtype, device=device)
        csc = pma.csr_to_csc(g.rowptr, g.col, g.num_nodes)
        print(f"## {g}", flush=True)
        for dt in args.dtypes.split(","):
            rows += bench_dtype(g, csc, getattr(torch, dt), device, args.ncu, args.profile,
                                args.check, tuple(c for c in args.calls.split(",") if c))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        name = "kernels_profile_cuda.json" if args.profile else "kernels_cuda.json"
        with open(os.path.join(args.out, name), "w") as f:
            json.dump({"environment": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
