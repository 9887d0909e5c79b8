"""The random-row gather ceiling of the GPU, against the package's kernels.

Sums table rows picked by an index list, chunk by chunk (``gather_ceiling.cu``:
no weights, no dots, only the loads), with the loads in flight either in
registers (``ldg``, U per lane per step) or as bulk copies into shared memory
(``tma``, S stages per warp), at several warps per SM. The index lists are
the benchmark graphs' CSC (the spmm backward's pattern: destination rows,
spread uniformly) and CSR (the forward's: skewed sources, with L2 reuse),
cut into chunks of at most 32 entries, plus a uniform random list. Each
result is checked against torch on the first chunks (output poisoned first)
before it is timed. In the same run, the package's own calls on the same
graphs (``--ops``): the spmm forward, the forward over the CSC (the backward's
gather alone) and the backward.

    python tools/gather_ceiling.py --shapes products-like,reddit-like --ops

Builds ``gather_ceiling.cu`` with nvcc for sm_90 unless ``--lib`` names a
built one.
"""
import argparse
import ctypes
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch

# common.py and graphs.py live in benchmarks/.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from common import copy_bandwidth, environment, time_fn  # noqa: E402
from graphs import make_graph  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CHUNK = 32


def build(out_dir: str) -> str:
    lib = os.path.join(out_dir, "gather_ceiling.so")
    subprocess.run(["nvcc", "-O3", "-arch=sm_90", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
                    os.path.join(HERE, "gather_ceiling.cu"), "-o", lib], check=True)
    return lib


def chunks_of(ptr: torch.Tensor, size: int = CHUNK) -> torch.Tensor:
    """Chunk boundaries (int32, [C + 1]) that cut each non-empty row of a
    compressed pointer into pieces of at most ``size`` entries."""
    ptr = ptr.long()
    deg = ptr.diff()
    n = (deg + size - 1) // size
    row = torch.repeat_interleave(torch.arange(deg.numel(), device=ptr.device), n)
    first = torch.cumsum(n, 0) - n
    k = torch.arange(row.numel(), device=ptr.device) - first[row]
    starts = ptr[row] + k * size
    return torch.cat([starts, ptr[-1:]]).int()


def warp_ranges(cptr: torch.Tensor, warps: int) -> torch.Tensor:
    """Per warp a contiguous run of chunks, balanced by entries (int32, [W + 1])."""
    total = int(cptr[-1])
    targets = torch.linspace(0, total, warps + 1, device=cptr.device).round().long()
    w = torch.searchsorted(cptr.long(), targets).int()
    w[0], w[-1] = 0, cptr.numel() - 1
    return w


class Ceiling:
    def __init__(self, lib: str):
        self.lib = ctypes.CDLL(lib)
        f = self.lib.gather_ceiling_launch
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_int] * 5 + [ctypes.c_void_p] * 5 + [ctypes.c_int, ctypes.c_void_p]

    def __call__(self, kind, param, R, bps, blocks, cptr, idx, wptr, table, out):
        rc = self.lib.gather_ceiling_launch(
            kind, param, R, bps, blocks, cptr.data_ptr(), idx.data_ptr(),
            wptr.data_ptr() if wptr is not None else None, table.data_ptr(), out.data_ptr(),
            cptr.numel() - 1, torch.cuda.current_stream().cuda_stream)
        if rc != 0:
            raise RuntimeError(f"launch kind={kind} param={param} R={R}: error {rc}")


def check(out, cptr, idx, table, chunks=20000):
    hi = int(cptr[chunks])
    seg = torch.repeat_interleave(torch.arange(chunks, device=idx.device),
                                  cptr[1:chunks + 1].long() - cptr[:chunks].long())
    ref = torch.zeros(chunks, table.size(1), dtype=torch.float64, device=idx.device)
    ref.index_add_(0, seg, table[idx[:hi].long()].double())
    err = float((out[:chunks].double() - ref).norm() / ref.norm())
    if not err < 1e-5:
        raise AssertionError(f"gather ceiling kernel wrong: rel err {err}")
    return err


def time_ops(g, gen, record) -> None:
    """The package's spmm forward, forward over the CSC and backward on `g`."""
    import pyg_multihead_agg as pma
    ops = torch.ops.pyg_multihead_agg
    device, E, N = g.rowptr.device, g.num_edges, g.num_nodes
    cp, rw, pm = pma.csr_to_csc(g.rowptr, g.col, N)
    for dt in (torch.float32, torch.bfloat16):
        x = torch.randn(N, g.heads, g.channels, device=device, generator=gen).to(dt)
        grad = torch.randn_like(x)
        w = torch.rand(E, g.heads, device=device, generator=gen).to(dt)
        wp = w[pm.long()]
        calls = {"spmm fwd (csr)": functools.partial(ops.multihead_spmm, g.rowptr, g.col, w, x),
                 "spmm fwd over csc": functools.partial(ops.multihead_spmm, cp, rw, wp, grad),
                 "spmm bwd (csc)": functools.partial(ops.multihead_spmm_backward_csc,
                                                     cp, rw, pm, w, x, grad)}
        row_bytes = x[0].numel() * x.element_size()
        for key, fn in calls.items():
            ms = statistics.median(time_fn(fn, device, repeats=10, budget_s=0.3))
            record({"shape": g.name, "pattern": "op", "row_B": row_bytes,
                    "method": f"{key} {str(dt)[6:]}", "ms": ms,
                    "GBps": E * row_bytes / ms / 1e6})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="products-like,reddit-like")
    parser.add_argument("--lib", default=None)
    parser.add_argument("--ops", action="store_true", help="also time the package's calls")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    lib = args.lib or build(tempfile.mkdtemp())
    run = Ceiling(lib)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    env = environment(device, sys.argv)
    bw = copy_bandwidth(device)
    env["copy_GBps"] = bw / 1e9
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s, {sms} SMs", flush=True)
    rows = []

    def record(r):
        rows.append(r)
        print(f"{r['shape']:14s} {r['pattern']:8s} {r['row_B']:4d} B {r['method']:22s} "
              f"{r['ms']:8.3f} ms {r['GBps']:6.0f} GB/s", flush=True)

    for name in args.shapes.split(","):
        g = make_graph(name, index_dtype=torch.int32, device=device)
        E, N = g.num_edges, g.num_nodes
        order = torch.sort(g.col.long(), stable=True)
        row = g.row()[order.indices].int()
        colptr = torch.zeros(N + 1, dtype=torch.long, device=device)
        colptr[1:] = torch.bincount(order.values, minlength=N).cumsum(0)
        gen = torch.Generator(device=device).manual_seed(0)
        uniform = torch.randint(0, N, (E,), device=device, dtype=torch.int32, generator=gen)
        uptr = torch.arange(0, E + 1, 26, device=device)
        uptr = torch.cat([uptr, torch.tensor([E], device=device)]) if uptr[-1] != E else uptr
        patterns = {"csc": (chunks_of(colptr), row), "csr": (chunks_of(g.rowptr), g.col),
                    "uniform": (uptr.int(), uniform)}
        del order
        print(f"## {g}", flush=True)
        for R in (32, 16):
            table = torch.randn(N, R * 4, device=device, generator=gen)
            for pat, (cptr, idx) in patterns.items():
                C = cptr.numel() - 1
                out = torch.empty(C, R * 4, device=device)
                configs = [(0, 4, 4), (0, 4, 8), (0, 4, 16), (0, 8, 4), (0, 8, 8), (0, 16, 4)]
                if R == 16:
                    configs.remove((0, 4, 4))
                if R == 32:
                    configs += [(1, S, bps) for S, bpss in ((8, (4, 8, 12)), (16, (2, 4, 6)),
                                                            (32, (2, 3))) for bps in bpss]
                for kind, param, bps in configs:
                    blocks = sms * bps
                    wptr = warp_ranges(cptr, blocks * 4) if kind == 1 else None
                    out.fill_(float("nan"))
                    fn = functools.partial(run, kind, param, R, bps, blocks, cptr, idx, wptr,
                                           table, out)
                    fn()
                    torch.cuda.synchronize()
                    err = check(out, cptr, idx, table)
                    ms = statistics.median(time_fn(fn, device, repeats=10, budget_s=0.3))
                    how = f"ldg U={param}" if kind == 0 else f"tma S={param}"
                    method = f"{how} {bps * 4} warps/SM"
                    record({"shape": name, "pattern": pat, "row_B": R * 16, "method": method,
                            "ms": ms, "GBps": E * R * 16 / ms / 1e6, "rel_err": err})
            del table, out
            torch.cuda.empty_cache()
        if args.ops:
            time_ops(g, gen, record)
        del g, patterns, row, uniform
        torch.cuda.empty_cache()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gather_ceiling.json"), "w") as f:
            json.dump({"environment": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
