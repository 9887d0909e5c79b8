"""Operator benchmark: multihead_spmm against PyG's gather/scatter and torch.sparse.

For each graph and dtype, forward and forward + backward (grad x and grad
weight) of

- ``gather/scatter``: ``x.index_select(0, col) * w[..., None]`` then
  ``index_add_`` over the rows (what ``GATConv.message`` + ``aggregate`` do);
- ``torch.sparse per head``: one ``torch.sparse.mm`` per head of a
  ``torch.sparse_csr_tensor`` with that head's weights and the ``[N, D]`` slice
  of x (cuSPARSE on GPU, MKL on CPU), stacked;
- ``ours``: ``pyg_multihead_agg.multihead_spmm``; its backward with the CSC
  from ``csr_to_csc`` built outside the timed region (``ours, CSC cached``),
  with the CSC and its ``invert_perm`` (``ours, CSC + perm_inv cached``), and
  without it (``ours, no CSC``: atomic scatter on CUDA, CSC built in the
  backward on the CPU).

Every result is first checked against a float64 reference computed with plain
PyTorch on the same device (on a seeded sample of rows / sources / edges for
the big graphs, always including the longest rows and busiest sources).

    python benchmarks/bench_ops.py --device cuda
    python benchmarks/bench_ops.py --device cpu --shapes arxiv-like --dtypes float32

Writes benchmarks/reference/ops_<device>.{json,md,png} (see --out, --tag).
"""
import functools
import os
import statistics
import sys
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch
from torch import Tensor

import pyg_multihead_agg
from pyg_multihead_agg import csr_to_csc, invert_perm, multihead_spmm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import TOLERANCE, Row, log  # noqa: E402
from graphs import Graph, make_graph  # noqa: E402

GATHER_SCATTER = "gather/scatter"
TORCH_SPARSE = "torch.sparse per head"
OURS = "ours"
OURS_CSC = "ours, CSC cached"
OURS_CSC_INV = "ours, CSC + perm_inv cached"
OURS_NO_CSC = "ours, no CSC"
PEERS = (GATHER_SCATTER, TORCH_SPARSE)
FORWARD, BACKWARD = "forward", "forward+backward"

# torch.sparse CSR is "beta" and says so on every construction.
warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")


# The peers and ours, as functions of (x, w). Graph tensors are bound first.

def gather_scatter(col: Tensor, row: Tensor, num_dst: int) -> Callable:
    def fn(x: Tensor, w: Tensor) -> Tensor:
        msg = x.index_select(0, col) * w.unsqueeze(-1)
        return x.new_zeros(num_dst, x.size(1), x.size(2)).index_add_(0, row, msg)
    return fn


def sparse_per_head(rowptr: Tensor, col: Tensor, num_dst: int) -> Callable:
    def fn(x: Tensor, w: Tensor) -> Tensor:
        outs = []
        for h in range(x.size(1)):
            adj = torch.sparse_csr_tensor(rowptr, col, w[:, h], (num_dst, x.size(0)),
                                          check_invariants=False)
            outs.append(torch.sparse.mm(adj, x[:, h]))
        return torch.stack(outs, dim=1)
    return fn


def sparse_backward_unsupported(exc: RuntimeError) -> Exception:
    """Names the known torch.sparse limitation behind ``exc``, if it is the cause."""
    if "SparseCompressedTensorBackward0 returned an invalid gradient" in str(exc):
        return NotImplementedError(
            "torch.sparse CSR backward does not support duplicate edges (it coalesces the "
            "values' gradient; the synthetic graphs are multigraphs)")
    return exc


def ours(rowptr: Tensor, col: Tensor, csc=None, perm_inv=None) -> Callable:
    def fn(x: Tensor, w: Tensor) -> Tensor:
        return multihead_spmm(rowptr, col, w, x, csc=csc, perm_inv=perm_inv)
    return fn


# float64 references in plain PyTorch, chunked over edges to bound memory.

class Reference:
    """float64 ``out``, ``grad_x`` and ``grad_weight`` on (a sample of) the
    destinations, sources and edges of one graph."""

    def __init__(self, g: Graph, row: Tensor, limit: int, chunk_bytes: int):
        n, e, dev = g.num_nodes, g.num_edges, g.col.device
        self.g, self.row, self.col = g, row, g.col.long()
        self.chunk = max(1, chunk_bytes // (g.heads * g.channels * 8))
        in_deg, out_deg = g.rowptr.diff().long(), torch.bincount(self.col, minlength=n)
        # Up to `limit` edges in all: every node, or a sample of that many edges'
        # worth, always with the 64 longest rows and busiest sources.
        top, sample = min(64, n), n if e <= limit else max(1, n * limit // e)
        self.rows = common.check_subset(n, sample, dev, always=in_deg.topk(top).indices)
        self.srcs = common.check_subset(n, sample, dev, seed=2, always=out_deg.topk(top).indices)
        self.edges = common.check_subset(e, limit, dev, seed=3)
        # Edges of the sampled rows / sources, and where each lands in the sample.
        if self.rows is None:
            self.fwd_eid, self.fwd_slot = torch.arange(e, device=dev), self.row
        else:
            slot = torch.full((n,), -1, dtype=torch.long, device=dev)
            slot[self.rows] = torch.arange(self.rows.numel(), device=dev)
            self.fwd_eid = (slot[self.row] >= 0).nonzero().view(-1)
            self.fwd_slot = slot[self.row[self.fwd_eid]]
        if self.srcs is None:
            self.bwd_eid, self.bwd_slot = torch.arange(e, device=dev), self.col
        else:
            slot = torch.full((n,), -1, dtype=torch.long, device=dev)
            slot[self.srcs] = torch.arange(self.srcs.numel(), device=dev)
            self.bwd_eid = (slot[self.col] >= 0).nonzero().view(-1)
            self.bwd_slot = slot[self.col[self.bwd_eid]]

    def coverage(self) -> str:
        def part(ids, n, what):
            return f"all {n:,} {what}" if ids is None else f"{ids.numel():,} of {n:,} {what}"
        return ", ".join([part(self.rows, self.g.num_nodes, "rows"),
                          part(self.srcs, self.g.num_nodes, "sources"),
                          part(self.edges, self.g.num_edges, "edges")])

    def _accumulate(self, size: int, eid: Tensor, slot: Tensor, idx: Tensor, w: Tensor,
                    feats: Tensor) -> Tensor:
        out = torch.zeros(size, feats.size(1), feats.size(2), dtype=torch.float64,
                          device=feats.device)
        for lo in range(0, eid.numel(), self.chunk):
            e = eid[lo:lo + self.chunk]
            msg = feats[idx[e]].double() * w[e].double().unsqueeze(-1)
            out.index_add_(0, slot[lo:lo + self.chunk], msg)
        return out

    def forward(self, x: Tensor, w: Tensor) -> Tensor:
        size = self.g.num_nodes if self.rows is None else self.rows.numel()
        return self._accumulate(size, self.fwd_eid, self.fwd_slot, self.col, w, x)

    def grad_x(self, w: Tensor, grad_out: Tensor) -> Tensor:
        size = self.g.num_nodes if self.srcs is None else self.srcs.numel()
        return self._accumulate(size, self.bwd_eid, self.bwd_slot, self.row, w, grad_out)

    def grad_weight(self, x: Tensor, grad_out: Tensor) -> Tensor:
        eid = self.edges if self.edges is not None else torch.arange(self.g.num_edges,
                                                                     device=x.device)
        out = []
        for lo in range(0, eid.numel(), self.chunk):
            e = eid[lo:lo + self.chunk]
            out.append((grad_out[self.row[e]].double() * x[self.col[e]].double()).sum(-1))
        return torch.cat(out)

    def pick(self, t: Tensor, ids: Optional[Tensor]) -> Tensor:
        return t if ids is None else t[ids]


@dataclass
class Inputs:
    """One graph's random inputs in one dtype and their float64 references."""
    x: Tensor
    w: Tensor
    grad_out: Tensor
    ref_out: Tensor
    ref_grad_x: Tensor
    ref_grad_weight: Tensor


def make_inputs(g: Graph, ref: Reference, dtype: torch.dtype) -> Inputs:
    dev = g.col.device
    gen = torch.Generator(dev).manual_seed(0)
    x = torch.randn(g.num_nodes, g.heads, g.channels, generator=gen, device=dev, dtype=dtype)
    w = torch.randn(g.num_edges, g.heads, generator=gen, device=dev, dtype=dtype)
    grad_out = torch.randn(g.num_nodes, g.heads, g.channels, generator=gen, device=dev,
                           dtype=dtype)
    return Inputs(x, w, grad_out, ref.forward(x, w), ref.grad_x(w, grad_out),
                  ref.grad_weight(x, grad_out))


def measure(r: Row, step: Callable, device: torch.device, args) -> None:
    r.peak_extra_bytes = common.peak_extra_memory(step, device)
    r.times_ms = common.time_fn(step, device, repeats=args.repeats, warmup=args.warmup)
    r.ms = statistics.median(r.times_ms)


def run_forward(r: Row, fn: Callable, inp: Inputs, ref: Reference, nbytes: int,
                ceiling: float, device: torch.device, args) -> None:
    def step():
        return fn(inp.x, inp.w)
    out = step()
    r.rel_err = common.rel_error(ref.pick(out, ref.rows), inp.ref_out)
    r.check = "ok" if r.rel_err <= TOLERANCE[inp.x.dtype] else "FAIL"
    del out
    measure(r, step, device, args)
    r.gbps = nbytes / (r.ms * 1e-3) / 1e9
    r.pct_copy = 100 * nbytes / (r.ms * 1e-3) / ceiling


def run_backward(r: Row, fn: Callable, inp: Inputs, ref: Reference, device: torch.device,
                 args) -> None:
    x, w = inp.x.detach().requires_grad_(), inp.w.detach().requires_grad_()

    def step():
        return torch.autograd.grad(fn(x, w), (x, w), inp.grad_out)
    try:
        grad_x, grad_w = step()
    except RuntimeError as exc:
        raise sparse_backward_unsupported(exc) from exc
    r.rel_errs = {"grad_x": common.rel_error(ref.pick(grad_x, ref.srcs), inp.ref_grad_x),
                  "grad_weight": common.rel_error(ref.pick(grad_w, ref.edges),
                                                  inp.ref_grad_weight)}
    r.rel_err = max(r.rel_errs.values())
    r.check = "ok" if r.rel_err <= TOLERANCE[inp.x.dtype] else "FAIL"
    del grad_x, grad_w
    measure(r, step, device, args)


def bench_shape(shape: str, dtypes: List[torch.dtype], args, device: torch.device,
                ceiling: float, rows_out: List[Row], notes: List[str],
                label: Optional[str] = None) -> bool:
    """Benchmarks one graph in every dtype (rows labelled ``label``, default the
    shape); returns False if ours failed a check."""
    label = label or shape
    index_dtype = torch.int32 if args.index_dtype == "int32" else torch.int64
    log(f"{shape}: generating")
    g = make_graph(shape, index_dtype=index_dtype, device=device, data_root=args.data_root)
    n, e = g.num_nodes, g.num_edges
    row = g.row()
    row_idx = row.to(index_dtype)  # peers get the same index dtype as ours
    csc = csr_to_csc(g.rowptr, g.col, n)
    chunk_bytes = (2 << 30) if device.type == "cuda" else (256 << 20)
    ref = Reference(g, row, args.check_limit, chunk_bytes)
    log(f"{g}; checking on {ref.coverage()}")
    notes.append(f"- {g.name}: N = {n:,}, E = {e:,}, H = {g.heads}, D = {g.channels}, "
                 f"max in-degree {int(g.rowptr.diff().max()):,}; checked on {ref.coverage()}")
    methods_fwd: Dict[str, Callable] = {
        GATHER_SCATTER: gather_scatter(g.col, row_idx, n),
        TORCH_SPARSE: sparse_per_head(g.rowptr, g.col, n),
        OURS: ours(g.rowptr, g.col),
    }
    methods_bwd: Dict[str, Callable] = {
        GATHER_SCATTER: methods_fwd[GATHER_SCATTER],
        TORCH_SPARSE: methods_fwd[TORCH_SPARSE],
        OURS_CSC: ours(g.rowptr, g.col, csc),
        # The layers' way for a reused graph: the CSC's inverse permutation
        # cached too (the CUDA backward writes grad_weight in CSC order).
        OURS_CSC_INV: ours(g.rowptr, g.col, csc, invert_perm(csc[2])),
        OURS_NO_CSC: methods_fwd[OURS],
    }
    all_ok = True
    for dtype in dtypes:
        dname = str(dtype).replace("torch.", "")
        inp = make_inputs(g, ref, dtype)
        nbytes = common.gather_bytes(e, n, g.heads, g.channels, inp.x.element_size(),
                                     g.col.element_size())
        jobs = [(FORWARD, method, functools.partial(run_forward, fn=fn, inp=inp, ref=ref,
                                                    nbytes=nbytes, ceiling=ceiling,
                                                    device=device, args=args))
                for method, fn in methods_fwd.items()]
        jobs += [(BACKWARD, method, functools.partial(run_backward, fn=fn, inp=inp, ref=ref,
                                                      device=device, args=args))
                 for method, fn in methods_bwd.items()]
        for pass_, method, body in jobs:
            r = common.run_guarded(Row(label, dname, method, pass_), body, device)
            rows_out.append(r)
            if method.startswith(OURS):
                all_ok &= r.check == "ok"
            log(f"{label} {dname} {pass_:16s} {method:22s} {common.fmt_ms(r):>12s} ms  "
                f"err {common.fmt_err(r)}  peak {common.fmt_bytes(r.peak_extra_bytes)}")
        del inp, jobs
        common.free_memory(device)
    return all_ok


def table(rows: List[Row]) -> str:
    headers = ["shape", "dtype", "pass", "method", "ms", f"x {GATHER_SCATTER}",
               f"x {TORCH_SPARSE}", "GB/s", "% copy", "peak extra", "rel err"]
    cells = [[r.shape, r.dtype, r.pass_, r.method, common.fmt_ms(r),
              common.fmt_speedup(r, GATHER_SCATTER), common.fmt_speedup(r, TORCH_SPARSE),
              "-" if r.gbps is None else f"{r.gbps:.3g}",
              "-" if r.pct_copy is None else f"{r.pct_copy:.0f}%",
              common.fmt_bytes(r.peak_extra_bytes), common.fmt_err(r)] for r in rows]
    return common.markdown_table(headers, cells)


def main(argv: Optional[List[str]] = None) -> int:
    parser = common.benchmark_parser(__doc__.split("\n\n")[0], check_limit=1 << 23)
    parser.add_argument("--index-dtype", choices=["int32", "int64"], default="int32")
    args, device, shapes, dtypes = common.parse_benchmark_args(parser, argv)

    meta = common.environment(device, sys.argv if argv is None else [__file__] + argv)
    meta["pyg_multihead_agg"] = pyg_multihead_agg.__version__
    meta["index_dtype"] = args.index_dtype
    rows: List[Row] = []
    notes: List[str] = []
    ok = True
    ceilings = {}
    for threads in common.thread_counts(args, device):
        common.set_threads(threads, "")
        ceiling = common.copy_bandwidth(device)
        common.free_memory(device)
        ceilings[threads or "default"] = round(ceiling / 1e9, 1)
        log(f"{meta['machine']}: copy ceiling {ceiling / 1e9:.0f} GB/s (read + write)"
            + (f" with {threads} threads" if threads else ""))
        for shape in shapes:
            ok &= bench_shape(shape, dtypes, args, device, ceiling, rows, notes,
                              label=common.set_threads(threads, shape))
    meta["copy_ceiling_GBps"] = (next(iter(ceilings.values())) if len(ceilings) == 1
                                 else {f"{t} threads": c for t, c in ceilings.items()})
    common.add_speedups(rows, PEERS)

    text = table(rows)
    notes_md = ("GB/s: (E*idx + E*H*s + E*H*D*s + N*H*D*s) / time (forward only); % copy: of "
                f"the copy bandwidth (read + write), {meta['copy_ceiling_GBps']} GB/s. peak extra: "
                "max_memory_allocated minus what was allocated before the call (CUDA only). "
                "rel err: ||out - ref|| / ||ref|| against float64 (forward+backward: the worse "
                "of grad x and grad weight); FAIL if above "
                + ", ".join(f"{str(k).replace('torch.', '')} {v:g}" for k, v in TOLERANCE.items())
                + ".\n\n" + "\n".join(notes))
    failures = common.failure_notes(rows)
    if failures:
        notes_md += "\n\nRows that did not run:\n" + failures
    stem = common.result_stem("ops", device, args.tag)
    paths = common.write_results(args.out, stem, "multihead_spmm operator benchmark", meta, rows,
                                 text, notes_md, chart_peers=PEERS)
    print()
    print(f"{common.summary_line(meta)}, copy ceiling {meta['copy_ceiling_GBps']} GB/s")
    print(text)
    if failures:
        print(failures)
    print("written: " + ", ".join(paths))
    if not ok:
        print("CHECK FAILED: ours differs from the float64 reference (rel err column)",
              file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
