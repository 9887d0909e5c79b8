"""What the spmm backward's edge-ordered grad_weight costs, against its forward.

The operator takes its weights and returns grad_weight in edge (CSR) order,
and its backward walks the CSC. So besides the gathers of grad_out rows over
the CSC, a backward pays two [E, H] permutations: the weights read at random
edge ids (or permuted first) and the per-edge dots put back into edge order.
Times, per graph and dtype, in one run (CUDA events, median of >= 10 after
warm-up; every result checked first):

- ``fwd``: the spmm forward (the target's denominator);
- ``bwd``: both gradients with ``perm_inv`` (the layer's way);
- ``bwd_x``: grad_x alone (the same CSC pass without the dots; weights read
  at random edge ids through ``perm``);
- ``bwd_x_seq``: grad_x alone with the weights already in CSC order
  (``perm`` = identity): the gathers with no permutation at all;
- ``perm_w``: the weights into CSC order (``w[perm]``), one permutation alone;
- ``to_edges``: [E, H] rows from CSC into edge order (``d[perm_inv]``), the
  other one alone.

``floor = min(bwd_x, perm_w + bwd_x_seq) + to_edges``: our grad_x pass plus
one pass that puts grad_weight into edge order, i.e. a backward whose dots
cost nothing. Where ``floor / fwd`` is above 2, the target "backward at most
2x the forward" cannot be met with this contract, whatever the dot kernel.

    python tools/backward_floor.py --shapes arxiv-like,products-like,reddit-like
"""
import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# common.py and graphs.py live in benchmarks/.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from bench_kernels import check_spmm, enforce, fused_inputs  # noqa: E402
from common import environment, time_fn  # noqa: E402
from graphs import make_graph  # noqa: E402

import pyg_multihead_agg as pma  # noqa: E402

_ops = torch.ops.pyg_multihead_agg


def as_rows(t):
    """[E, H] as [E] elements of the row's size (8 or 16 bytes), else as is."""
    nbytes = t.size(1) * t.element_size()
    kind = {8: torch.int64, 16: torch.complex128}.get(nbytes)
    return t.view(kind).view(-1) if kind is not None else t


def measure(g, csc, dtype, device):
    x, _, _, grad = fused_inputs(g, dtype, device)
    w = torch.rand(g.num_edges, g.heads, device=device, dtype=dtype)
    colptr, row, perm = csc
    perm_inv = pma.invert_perm(perm)
    identity = torch.arange(g.num_edges, device=device, dtype=perm.dtype)
    w_csc = w.index_select(0, perm)
    dots = torch.rand_like(w)  # stands for the CSC-ordered dots
    # The permutations move whole [H] rows as single elements (8 or 16 bytes
    # here): torch's index_select of [E, 4] float32 rows took 36.9 ms on
    # products-like, against 1.5 ms for bf16's.
    w_rows, dot_rows = as_rows(w), as_rows(dots)
    calls = {
        "fwd": lambda: _ops.multihead_spmm(g.rowptr, g.col, w, x),
        "bwd": lambda: _ops.multihead_spmm_backward_csc(colptr, row, perm, w, x, grad, perm_inv),
        "bwd_x": lambda: _ops.multihead_spmm_backward_csc(colptr, row, perm, w, None, grad),
        "bwd_x_seq": lambda: _ops.multihead_spmm_backward_csc(colptr, row, identity, w_csc, None,
                                                              grad),
        "perm_w": lambda: w_rows.index_select(0, perm),
        "to_edges": lambda: dot_rows.index_select(0, perm_inv),
    }
    # Checks: both gradients against float64 (rows / columns sampled);
    # grad_x with the weights pre-permuted is bitwise the one through perm
    # (the same products summed in the same order); the permutations are
    # copies, checked against scatters.
    grads = calls["bwd"]()
    errs = check_spmm(g, csc, w, x, grad, calls["fwd"](), grads)
    gx, gx_seq = calls["bwd_x"]()[0], calls["bwd_x_seq"]()[0]
    if not torch.equal(gx, gx_seq):
        raise SystemExit(f"{g.name} {dtype}: grad_x differs with the weights pre-permuted")
    errs["grad_x_alone"] = check_spmm(g, csc, w, x, grad, calls["fwd"](), (gx, grads[1]))["grad_x"]
    enforce(errs, dtype, f"{g.name} spmm", True)
    back = torch.empty_like(w_rows).index_copy_(0, perm.long(), calls["perm_w"]())
    edges = torch.empty_like(dot_rows).index_copy_(0, perm_inv.long(), calls["to_edges"]())
    if not (torch.equal(back, w_rows) and torch.equal(edges, dot_rows)):
        raise SystemExit(f"{g.name} {dtype}: a permutation is wrong")
    out = {"shape": g.name, "dtype": str(dtype).replace("torch.", ""),
           **{f"err_{k}": v for k, v in errs.items()}}
    for key, fn in calls.items():
        out[key] = statistics.median(time_fn(fn, device, repeats=10, budget_s=0.5))
    out["floor"] = min(out["bwd_x"], out["perm_w"] + out["bwd_x_seq"]) + out["to_edges"]
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) and not k.startswith("err") else
                   f"{k}={v}" for k, v in out.items() if not k.startswith("err")), flush=True)
    return out


def table(rows):
    head = ("| shape | dtype | fwd | bwd (x fwd) | bwd_x | bwd_x_seq | perm_w | to_edges "
            "| floor (x fwd) |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        f = r["fwd"]
        lines.append(f"| {r['shape']} | {r['dtype']} | {f:.3f} | {r['bwd']:.3f} "
                     f"({r['bwd'] / f:.2f}x) | {r['bwd_x']:.3f} | {r['bwd_x_seq']:.3f} | "
                     f"{r['perm_w']:.3f} | {r['to_edges']:.3f} | {r['floor']:.3f} "
                     f"({r['floor'] / f:.2f}x) |")
    return "\n".join(lines) + ("\n\nms, medians after warm-up (CUDA events on the GPU; see the "
                               "module docstring).\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="arxiv-like,products-like,reddit-like")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--index-dtype", default="int32")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    rows = []
    for name in args.shapes.split(","):
        g = make_graph(name, index_dtype=getattr(torch, args.index_dtype), device=device)
        csc = pma.csr_to_csc(g.rowptr, g.col, g.num_nodes)
        print(f"## {g}", flush=True)
        for dt in args.dtypes.split(","):
            rows.append(measure(g, csc, getattr(torch, dt), device))
            torch.cuda.empty_cache()
    md = table(rows)
    print(md)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "backward_floor.json"), "w") as f:
            json.dump({"environment": environment(device, sys.argv), "rows": rows}, f, indent=1)
        with open(os.path.join(args.out, "backward_floor.md"), "w") as f:
            f.write(md)


if __name__ == "__main__":
    main()
