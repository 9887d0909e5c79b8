"""GAT layer benchmark: forward, and forward + backward, of one GATConv, PyG's
against ours.

F_in = 128, heads H and channels D from the graph's shape, every layer with
the same weights (one ``state_dict``) and ``add_self_loops=False`` on a graph
that already holds exactly one self-loop per node (so that every adjacency
type sees the same edges and no row pays for self-loop handling per call):

- ``PyG edge_index``: ``torch_geometric.nn.GATConv`` on a plain ``[2, E]``
  ``edge_index``, eager and under ``torch.compile`` (the strongest peer);
- ``ours <adjacency>``: ``pyg_multihead_agg.nn.GATConv`` (fused attention:
  softmax, dropout and aggregation in one op) on the same plain
  ``edge_index``, a ``torch.sparse_csr`` ``adj_t``, a column-sorted
  ``EdgeIndex`` (caches filled) and a ``SparseTensor`` ``adj_t`` (caches
  filled; if torch_sparse is installed), eager and compiled. The plain
  ``edge_index`` is converted by the first eager call and cached; its
  compiled row converts it in every call (traced), ``compiled, prepared``
  reads it from ``prepare_adjacency`` (once, outside), and ``eager, new
  graph every call`` converts it in every call (the cost of a first call,
  and of a mini-batch);
- ``ours <adjacency> unfused``: the same layer with ``fused_attention=False``
  (PyG's softmax and dropout, then the aggregation operator).

A training step (pass ``forward+backward``) is ``out = layer(x, adj)`` then
``torch.autograd.grad`` of ``out`` for every parameter with a random
``grad_out``; an inference step (pass ``forward``) is ``layer(x, adj)`` under
``torch.no_grad()``. The output and every parameter gradient are checked first
against PyG's layer in float64, on the edges into (a sample of) the
destination rows.

    python benchmarks/bench_layer.py --device cuda

Writes benchmarks/reference/layer_<device>.{json,md,png} (see --out, --tag).
"""
import copy
import functools
import os
import re
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch._dynamo
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.nn import GATConv as PyGGATConv

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import Row, log  # noqa: E402
from graphs import Graph, make_graph  # noqa: E402

from pyg_multihead_agg import graph as prepared_graphs  # noqa: E402
from pyg_multihead_agg import prepare_adjacency  # noqa: E402

IN_CHANNELS = 128
FORWARD, TRAIN = "forward", "forward+backward"
PYG_EAGER = "PyG edge_index eager"
PYG_COMPILED = "PyG edge_index compiled"
PEERS = (PYG_EAGER, PYG_COMPILED)
# A whole layer rounds more often than the operator (linear, logits, softmax).
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-4,
             torch.float64: 1e-10}

warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
warnings.filterwarnings("ignore", message=".*does not implement _stable_hash_for_caching.*")


def our_gatconv():
    """``pyg_multihead_agg.nn.GATConv``, or the reason it cannot be imported."""
    try:
        from pyg_multihead_agg.nn import GATConv
        return GATConv, None
    except Exception as exc:  # noqa: BLE001  (any import failure skips its rows)
        return None, f"{type(exc).__name__}: {exc}"


def adjacencies(g: Graph, dtype: torch.dtype) -> List[Tuple[str, Callable[[], object]]]:
    """(name, builder) of each adjacency our layer takes; caches are filled in
    the builder, outside the timed region, as a training loop would reuse them."""
    n = g.num_nodes
    rowptr, col = g.rowptr.long(), g.col.long()

    def sparse_csr():
        values = torch.ones(g.num_edges, dtype=dtype, device=col.device)
        return torch.sparse_csr_tensor(rowptr, col, values, (n, n), check_invariants=False)

    def edge_index():
        return EdgeIndex(g.edge_index(), sparse_size=(n, n), sort_order="col").fill_cache_()

    out = [("edge_index", g.edge_index), ("torch.sparse_csr", sparse_csr),
           ("EdgeIndex", edge_index)]
    try:
        from torch_sparse import SparseTensor
    except ImportError:
        log("torch_sparse is not installed: no SparseTensor rows")
    else:
        def sparse_tensor():
            adj = SparseTensor(rowptr=rowptr, col=col, sparse_sizes=(n, n), is_sorted=True,
                               trust_data=True)
            return adj.fill_cache_()
        out.append(("SparseTensor", sparse_tensor))
    return out


@dataclass
class Check:
    """float64 reference of PyG's layer on (a sample of) the destination rows."""
    rows: Optional[Tensor]  # the rows compared, None for all
    out: Tensor  # output on those rows
    grad_out: Tensor  # the step's grad_out, zero outside those rows
    grads: Dict[str, Tensor]  # parameter gradients for that grad_out
    what: str


def reference(g: Graph, model: torch.nn.Module, x: Tensor, grad_out: Tensor,
              limit: int, seed: int = 1) -> Check:
    """PyG's layer in float64 on the edges into a sample of destination rows
    (all rows if the graph has at most ``limit`` edges, always the 64
    longest). A row's output depends only on its own in-edges, so with
    ``grad_out`` zero elsewhere the parameter gradients match too."""
    n, e = g.num_nodes, g.num_edges
    in_deg = g.rowptr.diff().long()
    sample = n if e <= limit else max(1, n * limit // e)
    rows = common.check_subset(n, sample, x.device, seed=seed,
                               always=in_deg.topk(min(64, n)).indices)
    edge_index = g.edge_index()
    if rows is not None:
        keep = torch.zeros(n, dtype=torch.bool, device=x.device)
        keep[rows] = True
        edge_index = edge_index[:, keep[edge_index[1]]]
        grad_out = grad_out * keep.unsqueeze(-1)
    ref_model = copy.deepcopy(model).double()
    names, params = zip(*ref_model.named_parameters(), strict=True)
    out = ref_model(x.double(), edge_index)
    grads = torch.autograd.grad(out, params, grad_out.double())
    what = (f"all {n:,} rows" if rows is None else
            f"{rows.numel():,} of {n:,} rows ({edge_index.size(1):,} edges)")
    return Check(rows, (out if rows is None else out[rows]).detach(), grad_out,
                 dict(zip(names, grads, strict=True)), what)


def run_variant(r: Row, make: Callable[[], Tuple[torch.nn.Module, object]], x: Tensor,
                grad_out: Tensor, check: Check, baseline: Dict[str, float],
                device: torch.device, args) -> None:
    """Check, then measure one (layer, adjacency) in one pass (``r.pass_``):
    the forward under no_grad, or the forward and then the gradients of every
    parameter. Each error must stay within the dtype's tolerance or twice PyG
    eager's own error (``baseline``), whichever is larger: in half precision
    some gradients are ill-conditioned (att_dst barely moves a row's softmax)
    and PyG itself is far off."""
    model, adj = make()
    # A compiled module names its parameters "_orig_mod.<name>".
    names = [name.removeprefix("_orig_mod.") for name, _ in model.named_parameters()]
    params = list(model.parameters())

    if r.pass_ == FORWARD:
        def step(grad_out=grad_out):
            with torch.no_grad():
                return model(x, adj), ()
    else:
        def step(grad_out=grad_out):
            out = model(x, adj)
            return out, torch.autograd.grad(out, params, grad_out)
    counters = torch._dynamo.utils.counters
    counters.clear()
    t = time.perf_counter()
    out, grads = step(check.grad_out)  # compiles, for compiled layers
    common.sync(device)
    r.extra["first_call_s"] = round(time.perf_counter() - t, 2)
    if r.method.endswith("compiled"):
        # A compiled row that silently ran eager (or in pieces) must show.
        r.extra["graphs_compiled"] = counters["stats"]["unique_graphs"]
        r.extra["graph_breaks"] = sum(counters["graph_break"].values())
    r.rel_errs = {"out": common.rel_error(out if check.rows is None else out[check.rows],
                                          check.out)}
    for name, grad in zip(names if grads else (), grads, strict=True):
        r.rel_errs[f"grad {name}"] = common.rel_error(grad, check.grads[name])
    r.rel_err = max(r.rel_errs.values())
    ok = all(err <= max(TOLERANCE[x.dtype], 2 * baseline.get(k, 0.0))
             for k, err in r.rel_errs.items())
    r.check = "ok" if ok else "FAIL"
    del out, grads
    r.peak_extra_bytes = common.peak_extra_memory(step, device)
    r.times_ms = common.time_fn(step, device, repeats=args.repeats, warmup=args.warmup)
    r.ms = statistics.median(r.times_ms)


def variants(g: Graph, pyg: torch.nn.Module, ours: Optional[torch.nn.Module], dtype: torch.dtype,
             args) -> List[Tuple[str, Callable[[], Tuple[torch.nn.Module, object]]]]:
    """(name, make) per row; ``make`` gives (layer, adjacency), compiling lazily.
    Each adjacency is built once, shared by its eager and compiled rows."""
    edge_index = g.edge_index()
    out = [(PYG_EAGER, lambda: (pyg, edge_index))]
    if not args.no_compile:
        out.append((PYG_COMPILED, lambda: (torch.compile(pyg, dynamic=args.dynamic), edge_index)))
    if ours is None:
        return out

    unfused = copy.deepcopy(ours)
    unfused.fused_attention = False
    unfolded = copy.deepcopy(ours)  # fused attention, PyG's score products
    unfolded.fold_scores = False
    uncached = copy.deepcopy(ours)  # every call converts its graph, as a first call does
    uncached.register_forward_pre_hook(lambda module, args: prepared_graphs.clear_cache())
    for adj_name, build in adjacencies(g, dtype):
        get_adj = functools.cache(build)
        out.append((f"ours {adj_name} eager", functools.partial(lambda a: (ours, a()), get_adj)))
        if adj_name == "edge_index":
            out.append(("ours edge_index eager, new graph every call",
                        functools.partial(lambda a: (uncached, a()), get_adj)))
        if not args.no_compile:
            out.append((f"ours {adj_name} compiled", functools.partial(
                lambda a: (torch.compile(ours, dynamic=args.dynamic), a()), get_adj)))
        if adj_name == "edge_index":
            if not args.no_compile:
                out.append(("ours edge_index compiled, prepared", functools.partial(
                    lambda a: (torch.compile(ours, dynamic=args.dynamic),
                               prepare_adjacency(a(), num_nodes=g.num_nodes,
                                                 add_self_loops=False)), get_adj)))
            continue  # unfused: PyG's own path for a plain edge_index
        out.append((f"ours {adj_name} unfused eager",
                    functools.partial(lambda a: (unfused, a()), get_adj)))
        if args.fold_off_rows:
            out.append((f"ours {adj_name} eager, scores unfolded",
                        functools.partial(lambda a: (unfolded, a()), get_adj)))
    if args.methods:
        keep = re.compile(args.methods)
        out = [(name, make) for name, make in out if keep.search(name)]
    return out


def bench_dtype(g: Graph, dtype: torch.dtype, args, device: torch.device,
                label: str) -> List[Row]:
    dname = str(dtype).replace("torch.", "")
    heads, channels, n = g.heads, g.channels, g.num_nodes
    if not args.dynamic:
        torch._dynamo.reset()  # static shapes: compile afresh for this graph and dtype
    torch.manual_seed(0)
    pyg = PyGGATConv(IN_CHANNELS, channels, heads=heads, add_self_loops=False)
    with torch.no_grad():
        pyg.bias.normal_(0, 0.1)  # the default zeros would leave the bias unchecked
    pyg = pyg.to(device, dtype)
    gen = torch.Generator(device).manual_seed(0)
    x = torch.randn(n, IN_CHANNELS, generator=gen, device=device, dtype=dtype)
    grad_out = torch.randn(n, heads * channels, generator=gen, device=device, dtype=dtype)
    check = reference(g, pyg, x, grad_out, args.check_limit)
    log(f"{g.name} {dname}: float64 reference on {check.what}")

    rows = []
    OurGATConv, why = our_gatconv()
    ours = None
    if OurGATConv is None:
        log(f"pyg_multihead_agg.nn.GATConv is not importable, skipping its rows ({why})")
        rows.append(Row(label, dname, "ours (all adjacencies)", "forward+backward",
                        status=f"skipped: pyg_multihead_agg.nn.GATConv not importable: {why}"))
    else:
        ours = OurGATConv(IN_CHANNELS, channels, heads=heads, add_self_loops=False)
        ours.load_state_dict(pyg.state_dict())
        ours = ours.to(device, dtype)
    baseline: Dict[str, Dict[str, float]] = {}  # per pass, PyG eager's errors once it ran
    for method, make in variants(g, pyg, ours, dtype, args):
        for pass_ in args.passes:
            body = functools.partial(run_variant, make=make, x=x, grad_out=grad_out,
                                     check=check, baseline=baseline.setdefault(pass_, {}),
                                     device=device, args=args)
            r = common.run_guarded(Row(label, dname, method, pass_,
                                       extra={"checked_on": check.what}), body, device)
            rows.append(r)
            if method == PYG_EAGER:
                baseline[pass_].update(r.rel_errs)
            first = r.extra.get("first_call_s")
            graphs = (f", {r.extra['graphs_compiled']} graphs, {r.extra['graph_breaks']} breaks"
                      if "graphs_compiled" in r.extra else "")
            log(f"{label} {dname} {method:30s} {pass_:16s} {common.fmt_ms(r):>12s} ms  "
                f"err {common.fmt_err(r)}  peak {common.fmt_bytes(r.peak_extra_bytes)}"
                + (f"  (first call {first} s{graphs})" if first is not None else ""))
    return rows


def bench_shape(shape: str, dtypes: List[torch.dtype], args, device: torch.device,
                rows_out: List[Row], notes: List[str], label: Optional[str] = None) -> bool:
    """Benchmarks one graph in every dtype; returns False if ours failed a
    check or did not run."""
    log(f"{shape}: generating (with one self-loop per node)")
    g = make_graph(shape, device=device, self_loops=True, data_root=args.data_root)
    log(str(g))
    notes.append(f"- {g.name}: N = {g.num_nodes:,}, E = {g.num_edges:,} (with self-loops), "
                 f"H = {g.heads}, D = {g.channels}, max in-degree {int(g.rowptr.diff().max()):,}")
    all_ok = True
    for dtype in dtypes:
        rows = bench_dtype(g, dtype, args, device, label or shape)
        if dtype == dtypes[0] and rows:
            notes[-1] += f"; checked on {rows[-1].extra.get('checked_on')}"
        common.free_memory(device)
        rows_out += rows
        all_ok &= all(r.check == "ok" for r in rows if r.method.startswith("ours"))
    return all_ok


def add_memory_ratios(rows: List[Row]) -> None:
    """``extra["mem_vs_pyg_compiled"]``: peak extra memory over PyG compiled's."""
    peer = {(r.shape, r.dtype, r.pass_): r.peak_extra_bytes for r in rows
            if r.method == PYG_COMPILED and r.peak_extra_bytes}
    for r in rows:
        base = peer.get((r.shape, r.dtype, r.pass_))
        if base and r.peak_extra_bytes is not None and r.ms is not None:
            r.extra["mem_vs_pyg_compiled"] = r.peak_extra_bytes / base


def table(rows: List[Row]) -> str:
    headers = ["shape", "dtype", "method", "pass", "ms", "x PyG eager", "x PyG compiled",
               "peak extra", "mem / PyG compiled", "rel err out", "rel err grads", "check"]
    cells = []
    for r in rows:
        ratio = r.extra.get("mem_vs_pyg_compiled")
        grads = [v for k, v in r.rel_errs.items() if k.startswith("grad")]
        cells.append([r.shape, r.dtype, r.method, r.pass_, common.fmt_ms(r),
                      common.fmt_speedup(r, PYG_EAGER), common.fmt_speedup(r, PYG_COMPILED),
                      common.fmt_bytes(r.peak_extra_bytes),
                      "-" if ratio is None else f"{ratio:.2f}",
                      f"{r.rel_errs['out']:.1e}" if "out" in r.rel_errs else "-",
                      f"{max(grads):.1e}" if grads else "-", r.check or "-"])
    return common.markdown_table(headers, cells)


def report(rows: List[Row], notes: List[str], meta, args, device: torch.device) -> None:
    """Speed-ups, the table and the files of the rows so far."""
    common.add_speedups(rows, PEERS)
    add_memory_ratios(rows)

    text = table(rows)
    notes_md = ("One GATConv(128, D, heads=H, add_self_loops=False) on a graph with one "
                "self-loop per node: pass forward+backward = the forward, then the gradients "
                "of all parameters; pass forward = the forward under torch.no_grad(). "
                "peak extra: max_memory_allocated minus what was allocated before the step "
                "(CUDA only). rel err: ||a - ref|| / ||ref|| against PyG's layer in float64, "
                "of the output and (worst of) the parameter gradients, every one in the JSON; "
                "FAIL if one is above twice PyG eager's error for it or the tolerance, "
                "whichever is larger: "
                + ", ".join(f"{str(k).replace('torch.', '')} {v:g}" for k, v in TOLERANCE.items())
                + f". {meta['compile']}.\n\n" + "\n".join(notes))
    compiled = [f"- {r.shape} {r.dtype} {r.method}: first call took {r.extra['first_call_s']} s, "
                f"{r.extra['graphs_compiled']} graph(s), {r.extra['graph_breaks']} graph break(s)"
                for r in rows if "graphs_compiled" in r.extra]
    if compiled:
        notes_md += "\n\ntorch.compile (from torch._dynamo counters):\n" + "\n".join(compiled)
    failures = common.failure_notes(rows)
    if failures:
        notes_md += "\n\nRows that did not run:\n" + failures
    stem = common.result_stem("layer", device, args.tag)
    paths = common.write_results(args.out, stem,
                                 "GAT layer benchmark (forward; forward + backward)", meta,
                                 rows, text, notes_md, chart_peers=PEERS,
                                 chart_methods=[m for m in dict.fromkeys(r.method for r in rows)
                                                if m.startswith("ours")])
    print()
    print(f"{common.summary_line(meta)}, {meta['compile']}")
    print(text)
    if failures:
        print(failures)
    print("written: " + ", ".join(paths))


def main(argv: Optional[List[str]] = None) -> int:
    parser = common.benchmark_parser(__doc__.split("\n\n")[0], check_limit=1 << 20)
    parser.add_argument("--dynamic", action="store_true",
                        help="torch.compile(dynamic=True): one compile serves every graph "
                        "(faster to run; default: static shapes, compiled per graph)")
    parser.add_argument("--methods", default=None,
                        help="regular expression: run only the rows whose method matches "
                        "(e.g. 'compiled|csr')")
    parser.add_argument("--fold-off-rows", action="store_true",
                        help="also run our fused layer with fold_scores=False")
    parser.add_argument("--no-compile", action="store_true",
                        help="eager rows only (skips torch.compile and its warm-up)")
    parser.add_argument("--passes", default=f"{FORWARD},{TRAIN}",
                        help=f"comma-separated: {FORWARD} (inference, under no_grad) and/or "
                        f"{TRAIN} (a training step)")
    args, device, shapes, dtypes = common.parse_benchmark_args(parser, argv)
    args.passes = [p for p in args.passes.split(",") if p]
    bad = [p for p in args.passes if p not in (FORWARD, TRAIN)]
    if bad or not args.passes:
        parser.error(f"--passes: expected {FORWARD} and/or {TRAIN}, got {args.passes!r}")
    # Every (layer, adjacency, graph, dtype) is its own compiled graph.
    torch._dynamo.config.recompile_limit = 64

    meta = common.environment(device, sys.argv if argv is None else [__file__] + argv)
    meta["in_channels"] = IN_CHANNELS
    meta["compile"] = ("no compiled rows" if args.no_compile else
                       f"torch.compile(dynamic={args.dynamic})")
    log(f"{meta['machine']}: GAT layer, {' and '.join(args.passes)}")
    rows: List[Row] = []
    notes: List[str] = []
    ok = True
    for threads in common.thread_counts(args, device):
        for shape in shapes:
            ok &= bench_shape(shape, dtypes, args, device, rows, notes,
                              label=common.set_threads(threads, shape))
            report(rows, notes, meta, args, device)  # after each graph: a cut-short run keeps it
    if not ok:
        print("ours failed a check or did not run (rel err / ms columns)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
