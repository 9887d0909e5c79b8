"""Attention layer benchmark: forward, and forward + backward, of one GATConv,
GATv2Conv or TransformerConv, PyG's against ours.

F_in = 128, heads H and channels D from the graph's shape, every layer of a
family with the same weights (one ``state_dict``) and (GAT, GATv2)
``add_self_loops=False`` on a graph that already holds exactly one self-loop
per node (so that every adjacency type sees the same edges and no row pays for
self-loop handling per call). ``--conv`` picks the layer family: ``gat`` (the
default), ``gatv2``, ``transformer`` or ``all``; each family has the rows
below, a GATv2 (Transformer) row's method starting with ``GATv2``
(``Transformer``): ``GATv2 PyG edge_index compiled``, ``GATv2 ours
edge_index eager``, ..., each measured against its own family's PyG rows:

- ``PyG edge_index``: ``torch_geometric.nn.GATConv`` (``GATv2Conv``) on a
  plain ``[2, E]`` ``edge_index``, eager and under ``torch.compile`` (the
  strongest peer);
- ``ours <adjacency>``: ``pyg_multihead_agg.nn.GATConv`` (``GATv2Conv``;
  fused attention:
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
destination rows. Then the checked rows of each graph, dtype and family
are timed in turns (``--rounds``, default 3 on CUDA: each row a share of
the repeats a round, the order rotated every round), so that a drift of the
machine's speed reaches every row alike; CUDA-graph rows are timed at once.
With every family (``--conv all``) each GATv2 and
Transformer row also reports its time over the GAT row of the same method,
graph, dtype and pass.

    python benchmarks/bench_layer.py --device cuda
    python benchmarks/bench_layer.py --device cuda --conv all

Writes benchmarks/reference/layer_<device>.{json,md,png}, or
layer_gatv2_<device>.* (layer_transformer_<device>.*) with ``--conv gatv2``
(``transformer``) (see --out, --tag).
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
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch._dynamo
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.nn import GATConv as PyGGATConv
from torch_geometric.nn import GATv2Conv as PyGGATv2Conv
from torch_geometric.nn import TransformerConv as PyGTransformerConv

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
REDUCE_OVERHEAD = "reduce-overhead"  # torch.compile's mode with CUDA graphs
PEERS = (PYG_EAGER, PYG_COMPILED)
# A whole layer rounds more often than the operator (linear, logits, softmax).
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-4,
             torch.float64: 1e-10}

warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
warnings.filterwarnings("ignore", message=".*does not implement _stable_hash_for_caching.*")


@dataclass(frozen=True)
class Family:
    """A layer family: PyG's class, the name of ours in ``pyg_multihead_agg.nn``
    and the prefix of its rows' methods (none for GAT, whose rows keep the
    names of the reference files)."""
    key: str  # the --conv value
    name: str  # the class name, in torch_geometric.nn and in pyg_multihead_agg.nn
    pyg: type
    prefix: str
    kwargs: Tuple[Tuple[str, object], ...] = (("add_self_loops", False),)  # both layers'

    def method(self, name: str) -> str:
        return self.prefix + name

    @property
    def peers(self) -> Tuple[str, str]:
        return self.method(PYG_EAGER), self.method(PYG_COMPILED)


GAT = Family("gat", "GATConv", PyGGATConv, "")
GATV2 = Family("gatv2", "GATv2Conv", PyGGATv2Conv, "GATv2 ")
TRANSFORMER = Family("transformer", "TransformerConv", PyGTransformerConv, "Transformer ", ())
FAMILIES = {f.key: f for f in (GAT, GATV2, TRANSFORMER)}
CONV_CHOICES = {"gat": (GAT,), "gatv2": (GATV2,), "transformer": (TRANSFORMER,),
                "all": (GAT, GATV2, TRANSFORMER)}


def family_of(method: str) -> Family:
    return next((f for f in (GATV2, TRANSFORMER) if method.startswith(f.prefix)), GAT)


def is_ours(method: str) -> bool:
    return method.removeprefix(family_of(method).prefix).startswith("ours")


def our_layer(name: str):
    """``pyg_multihead_agg.nn.<name>``, or the reason it cannot be imported."""
    try:
        import pyg_multihead_agg.nn as our_nn
        return getattr(our_nn, name), None
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
                device: torch.device, args, autocast: Optional[torch.dtype] = None,
                sets_baseline: bool = False) -> None:
    """Check, then measure one (layer, adjacency) in one pass (``r.pass_``):
    the forward under no_grad, or the forward and then the gradients of every
    parameter. Each error must stay within the dtype's tolerance or twice PyG
    eager's own error (``baseline``; PyG compiled's where PyG eager did not
    run, which ``sets_baseline`` marks), whichever is larger: in half
    precision some gradients are ill-conditioned (att_dst barely moves a
    row's softmax) and PyG itself is far off. With ``autocast``, every call runs under
    ``torch.autocast`` to that dtype (float32 parameters and inputs), checked
    with that dtype's tolerance."""
    model, adj = make()
    # A compiled module names its parameters "_orig_mod.<name>".
    names = [name.removeprefix("_orig_mod.") for name, _ in model.named_parameters()]
    params = list(model.parameters())

    def cast():
        return torch.autocast(device.type, dtype=autocast, enabled=autocast is not None)

    # CUDA graphs (reduce-overhead): each call is a new step, whose replay
    # may reuse the previous step's output memory.
    cuda_graphs = REDUCE_OVERHEAD in r.method
    begin = torch.compiler.cudagraph_mark_step_begin if cuda_graphs else (lambda: None)
    if r.pass_ == FORWARD:
        def step(grad_out=grad_out):
            begin()
            with torch.no_grad(), cast():
                return model(x, adj), ()
    else:
        def step(grad_out=grad_out):
            begin()
            with cast():
                out = model(x, adj)
            return out, torch.autograd.grad(out, params, grad_out.to(out.dtype))
    counters = torch._dynamo.utils.counters
    counters.clear()
    # A CUDA graph replay allocates nothing (its memory is the graph's pool,
    # taken while recording): the row's peak is that of the warm-up, the
    # recording and a replay, each with the previous step's output freed.
    graph_peak = None
    graph_memory = cuda_graphs and device.type == "cuda"
    if graph_memory:
        common.sync(device)
        graph_base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    t = time.perf_counter()
    out, grads = step(check.grad_out)  # compiles, for compiled layers
    common.sync(device)
    r.extra["first_call_s"] = round(time.perf_counter() - t, 2)
    if cuda_graphs:  # the first call warms up, the second records: check a replay
        for _ in range(2):
            del out, grads
            out, grads = step(check.grad_out)
        if graph_memory:
            common.sync(device)
            graph_peak = torch.cuda.max_memory_allocated(device) - graph_base
    if "compiled" in r.method:
        # A compiled row that silently ran eager (or in pieces) must show.
        r.extra["graphs_compiled"] = counters["stats"]["unique_graphs"]
        r.extra["graph_breaks"] = sum(counters["graph_break"].values())
    r.rel_errs = {"out": common.rel_error(out if check.rows is None else out[check.rows],
                                          check.out)}
    # A gradient that is zero in exact arithmetic (TransformerConv's
    # lin_key.bias: it adds <query_i, bias> to every logit of row i, which
    # the softmax cancels) is measured against the largest parameter
    # gradient instead of its own rounding noise.
    scale = max((float(g.double().norm()) for g in check.grads.values()), default=0.0)
    for name, grad in zip(names if grads else (), grads, strict=True):
        ref = check.grads[name]
        err = common.rel_error(grad, ref)
        if scale > 0 and float(ref.double().norm()) <= 1e-9 * scale and err != float("inf"):
            err = float((grad.detach().double() - ref.double()).norm()) / scale
        r.rel_errs[f"grad {name}"] = err
    r.rel_err = max(r.rel_errs.values())
    if sets_baseline:
        baseline.clear()
        baseline.update(r.rel_errs)
    tolerance = TOLERANCE[autocast or x.dtype]
    ok = all(err <= max(tolerance, 2 * baseline.get(k, 0.0))
             for k, err in r.rel_errs.items())
    r.check = "ok" if ok else "FAIL"
    del out, grads
    r.peak_extra_bytes = (graph_peak if cuda_graphs
                          else common.peak_extra_memory(step, device))
    if cuda_graphs:  # CUDA graph trees: timed at once, not in turns with other graphs
        r.times_ms = common.time_fn(step, device, repeats=args.repeats, warmup=args.warmup)
        r.ms = statistics.median(r.times_ms)
        return None
    return step


def time_in_turns(timed: List[Tuple[Row, Callable[[], object]]], device: torch.device,
                  args) -> None:
    """The checked rows of one graph, dtype and layer family timed in turns:
    ``args.rounds`` rounds, in each of which every row takes its share of
    the repeats (``common.time_fn``, after one untimed call: the row before
    may have emptied the graph cache), in an order rotated every round, so
    that a drift of the machine's speed (clocks, the host's other work)
    reaches every row alike rather than whichever ran during it; the median
    is over all of a row's repeats. A row whose step fails leaves the rounds
    with its error."""
    rounds = max(1, args.rounds)
    repeats = max(3, -(-args.repeats // rounds))
    common.take_turns(timed, rounds, lambda row, step, k: row.times_ms.extend(common.time_fn(
        step, device, repeats=repeats, warmup=args.warmup if k == 0 else 1,
        budget_s=0.5 / rounds)), device)
    for r, _ in timed:
        if r.status == "ok":
            r.ms = statistics.median(r.times_ms)


def variants(g: Graph, pyg: torch.nn.Module, ours: Optional[torch.nn.Module], dtype: torch.dtype,
             args, family: Family = GAT
             ) -> List[Tuple[str, Callable[[], Tuple[torch.nn.Module, object]]]]:
    """(name, make) per row of one layer family; ``make`` gives (layer,
    adjacency), compiling lazily. Each adjacency is built once, shared by its
    eager and compiled rows."""
    edge_index = g.edge_index()
    out = [(PYG_EAGER, lambda: (pyg, edge_index))]
    if not args.no_compile:
        out.append((PYG_COMPILED, lambda: (torch.compile(pyg, dynamic=args.dynamic), edge_index)))
        if args.reduce_overhead:
            out.append((f"{PYG_COMPILED}, {REDUCE_OVERHEAD}", lambda: (torch.compile(
                pyg, dynamic=args.dynamic, mode=REDUCE_OVERHEAD), edge_index)))
    if ours is not None:
        out += our_variants(g, ours, dtype, args)
    out = [(family.method(name), make) for name, make in out]
    if args.methods:
        keep = re.compile(args.methods)
        out = [(name, make) for name, make in out if keep.search(name)]
    return out


def our_variants(g: Graph, ours: torch.nn.Module, dtype: torch.dtype, args
                 ) -> List[Tuple[str, Callable[[], Tuple[torch.nn.Module, object]]]]:
    """The rows of our layer: every adjacency, eager and compiled, fused and not
    (the fold-off rows only for a layer with ``fold_scores``)."""
    out = []
    unfused = copy.deepcopy(ours)
    unfused.fused_attention = False
    unfolded = None
    if args.fold_off_rows and hasattr(ours, "fold_scores"):
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
            if args.reduce_overhead:
                out.append((f"ours {adj_name} compiled, {REDUCE_OVERHEAD}", functools.partial(
                    lambda a: (torch.compile(ours, dynamic=args.dynamic, mode=REDUCE_OVERHEAD),
                               a()), get_adj)))
        if adj_name == "edge_index":
            if not args.no_compile:
                modes = [None] + ([REDUCE_OVERHEAD] if args.reduce_overhead else [])
                for mode in modes:
                    out.append((f"ours edge_index compiled, prepared{f', {mode}' if mode else ''}",
                                functools.partial(lambda a, m: (
                                    torch.compile(ours, dynamic=args.dynamic, mode=m),
                                    prepare_adjacency(a(), num_nodes=g.num_nodes,
                                                      add_self_loops=False)), get_adj, mode)))
            continue  # unfused: PyG's own path for a plain edge_index
        out.append((f"ours {adj_name} unfused eager",
                    functools.partial(lambda a: (unfused, a()), get_adj)))
        if unfolded is not None:
            out.append((f"ours {adj_name} eager, scores unfolded",
                        functools.partial(lambda a: (unfolded, a()), get_adj)))
    return out


def make_pyg_layer(family: Family, heads: int, channels: int, device: torch.device,
                   dtype: torch.dtype) -> torch.nn.Module:
    """PyG's layer of ``family``, seeded; every bias drawn from N(0, 0.1) (the
    default zeros would leave them unchecked)."""
    torch.manual_seed(0)
    pyg = family.pyg(IN_CHANNELS, channels, heads=heads, **dict(family.kwargs))
    with torch.no_grad():
        for name, param in pyg.named_parameters():
            if name == "bias" or name.endswith(".bias"):
                param.normal_(0, 0.1)
    return pyg.to(device, dtype)


def bench_dtype(g: Graph, dtype: torch.dtype, args, device: torch.device,
                label: str, autocast: Optional[torch.dtype] = None) -> List[Row]:
    """Every row of every family of ``args.families`` on one graph and dtype
    (with ``autocast``: float32 under autocast to it): the same inputs for
    all."""
    dname = str(autocast or dtype).replace("torch.", "") + (" autocast" if autocast else "")
    gen = torch.Generator(device).manual_seed(0)
    x = torch.randn(g.num_nodes, IN_CHANNELS, generator=gen, device=device, dtype=dtype)
    grad_out = torch.randn(g.num_nodes, g.heads * g.channels, generator=gen, device=device,
                           dtype=dtype)
    rows = []
    for family in args.families:
        rows += bench_family(g, family, x, grad_out, args, device, label, dname, autocast)
        common.free_memory(device)
    return rows


def bench_family(g: Graph, family: Family, x: Tensor, grad_out: Tensor, args,
                 device: torch.device, label: str, dname: str,
                 autocast: Optional[torch.dtype] = None) -> List[Row]:
    """The rows of one layer family: PyG's layer and ours with one
    ``state_dict``, checked against PyG's in float64, then timed."""
    heads, channels, dtype = g.heads, g.channels, x.dtype
    if not args.dynamic:
        torch._dynamo.reset()  # static shapes: compile afresh for this graph, dtype and layer
    pyg = make_pyg_layer(family, heads, channels, device, dtype)
    try:
        check = reference(g, pyg, x, grad_out, args.check_limit)
    except Exception as exc:  # noqa: BLE001  (out of memory: the family's rows did not run)
        status = common.describe_failure(exc)
        log(f"{g.name} {dname} {family.name}: float64 reference failed ({status})")
        return [Row(label, dname, family.method(f"{name} (all rows)"), TRAIN, status=status,
                    extra={"error": f"float64 reference: {exc}"[:300]})
                for name in ("PyG", "ours")]
    log(f"{g.name} {dname} {family.name}: float64 reference on {check.what}")

    rows = []
    OurLayer, why = our_layer(family.name)
    ours = None
    if OurLayer is not None:
        try:
            ours = OurLayer(IN_CHANNELS, channels, heads=heads, **dict(family.kwargs))
            ours.load_state_dict(pyg.state_dict())
            ours = ours.to(device, dtype)
        except Exception as exc:  # noqa: BLE001  (reported as its rows' status)
            ours, why = None, f"{type(exc).__name__}: {exc}"
            OurLayer = None
    if OurLayer is None:
        log(f"pyg_multihead_agg.nn.{family.name} is not usable, skipping its rows ({why})")
        rows.append(Row(label, dname, family.method("ours (all adjacencies)"), "forward+backward",
                        status=f"skipped: pyg_multihead_agg.nn.{family.name} not usable: "
                        f"{why}"[:300]))
    baseline: Dict[str, Dict[str, float]] = {}  # per pass, PyG eager's errors once it ran
    timed: List[Tuple[Row, Callable[[], object]]] = []
    for method, make in variants(g, pyg, ours, dtype, args, family):
        for pass_ in args.passes:
            # PyG eager's errors scale the checks; PyG compiled's where PyG
            # eager did not run (left out, or out of memory).
            sets_baseline = method == family.method(PYG_EAGER) or (
                method == family.method(PYG_COMPILED) and not baseline.get(pass_))
            r = Row(label, dname, method, pass_, extra={"checked_on": check.what})

            def body(row, make=make, sets_baseline=sets_baseline, pass_=pass_):
                step = run_variant(row, make=make, x=x, grad_out=grad_out, check=check,
                                   baseline=baseline.setdefault(pass_, {}), device=device,
                                   args=args, autocast=autocast, sets_baseline=sets_baseline)
                if step is not None:
                    timed.append((row, step))
            rows.append(common.run_guarded(r, body, device))
    time_in_turns(timed, device, args)
    timed.clear()  # the steps hold their layers and adjacencies
    for r in rows:
        first = r.extra.get("first_call_s")
        graphs = (f", {r.extra['graphs_compiled']} graphs, {r.extra['graph_breaks']} breaks"
                  if "graphs_compiled" in r.extra else "")
        log(f"{label} {dname} {r.method:30s} {r.pass_:16s} {common.fmt_ms(r):>12s} ms  "
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
    runs = [(dtype, None) for dtype in dtypes]
    runs += [(torch.float32, common.DTYPES[name]) for name in args.autocast]
    for dtype, autocast in runs:
        rows = bench_dtype(g, dtype, args, device, label or shape, autocast)
        if (dtype, autocast) == runs[0] and rows:
            notes[-1] += f"; checked on {rows[-1].extra.get('checked_on')}"
        common.free_memory(device)
        rows_out += rows
        all_ok &= all(r.check == "ok" for r in rows if is_ours(r.method))
    return all_ok


def add_memory_ratios(rows: List[Row]) -> None:
    """``extra["mem_vs_pyg_compiled"]``: peak extra memory over PyG compiled's
    (of the row's own layer family)."""
    peer = {(r.shape, r.dtype, r.pass_, family_of(r.method)): r.peak_extra_bytes for r in rows
            if r.method == family_of(r.method).method(PYG_COMPILED) and r.peak_extra_bytes}
    for r in rows:
        base = peer.get((r.shape, r.dtype, r.pass_, family_of(r.method)))
        if base and r.peak_extra_bytes is not None and r.ms is not None:
            r.extra["mem_vs_pyg_compiled"] = r.peak_extra_bytes / base


def add_speedups(rows: List[Row]) -> None:
    """Speed-ups of each row over its own family's PyG rows."""
    for family in FAMILIES.values():
        common.add_speedups([r for r in rows if family_of(r.method) is family], family.peers)


def add_gat_ratios(rows: List[Row]) -> None:
    """``extra["ms_vs_gat"]`` of a GATv2 or Transformer row: its time over the
    GAT row of the same method, graph, dtype and pass (above 1: slower)."""
    gat = {(r.shape, r.dtype, r.pass_, r.method): r.ms for r in rows
           if family_of(r.method) is GAT and r.ms}
    for r in rows:
        family = family_of(r.method)
        if family is not GAT and r.ms:
            base = gat.get((r.shape, r.dtype, r.pass_, r.method.removeprefix(family.prefix)))
            if base:
                r.extra["ms_vs_gat"] = r.ms / base


def table(rows: List[Row], family: Family = GAT) -> str:
    """The rows of one layer family; the others' with their time over GAT's."""
    eager, compiled = family.peers
    with_gat = family is not GAT and any("ms_vs_gat" in r.extra for r in rows)
    headers = ["shape", "dtype", "method", "pass", "ms", "x PyG eager", "x PyG compiled",
               "peak extra", "mem / PyG compiled", "rel err out", "rel err grads", "check"]
    if with_gat:
        headers.insert(7, "ms / GAT")
    cells = []
    for r in rows:
        ratio = r.extra.get("mem_vs_pyg_compiled")
        grads = [v for k, v in r.rel_errs.items() if k.startswith("grad")]
        cells.append([r.shape, r.dtype, r.method, r.pass_, common.fmt_ms(r),
                      common.fmt_speedup(r, eager), common.fmt_speedup(r, compiled),
                      common.fmt_bytes(r.peak_extra_bytes),
                      "-" if ratio is None else f"{ratio:.2f}",
                      f"{r.rel_errs['out']:.1e}" if "out" in r.rel_errs else "-",
                      f"{max(grads):.1e}" if grads else "-", r.check or "-"])
        if with_gat:
            gat = r.extra.get("ms_vs_gat")
            cells[-1].insert(7, "-" if gat is None else f"{gat:.2f}")
    return common.markdown_table(headers, cells)


def tables(rows: List[Row], families: Sequence[Family]) -> str:
    """One table per family, each under its class name when there are several."""
    if len(families) == 1:
        return table(rows, families[0])
    return "\n\n".join(f"## {f.name}\n\n" + table([r for r in rows if family_of(r.method) is f], f)
                       for f in families)


def report(rows: List[Row], notes: List[str], meta, args, device: torch.device) -> None:
    """Speed-ups, the tables and the files of the rows so far."""
    families = args.families
    add_speedups(rows)
    add_memory_ratios(rows)
    add_gat_ratios(rows)

    text = tables(rows, families)
    layers = " or ".join(f"{f.name}(128, D, heads=H" + "".join(f", {k}={v}" for k, v in f.kwargs)
                         + ")" for f in families)
    notes_md = (f"One {layers} on a graph with one "
                "self-loop per node: pass forward+backward = the forward, then the gradients "
                "of all parameters; pass forward = the forward under torch.no_grad(). "
                "peak extra: max_memory_allocated minus what was allocated before the step "
                "(CUDA only; reduce-overhead rows: over the warm-up, the recording of the "
                "CUDA graph and a replay, as a replay allocates nothing). "
                "rel err: ||a - ref|| / ||ref|| against PyG's layer in float64, "
                "of the output and (worst of) the parameter gradients, every one in the JSON; "
                "FAIL if one is above twice PyG eager's error for it (PyG compiled's where "
                "PyG eager did not run) or the tolerance, "
                "whichever is larger: "
                + ", ".join(f"{str(k).replace('torch.', '')} {v:g}" for k, v in TOLERANCE.items())
                + f". {meta['compile']}.")
    for f in families:
        if f is GAT:
            continue
        notes_md += (f" {f.prefix.strip()} rows: speed-ups, memory and errors against PyG's "
                     f"{f.name}"
                     + ("; ms / GAT: the row's time over the GAT row of the same method, "
                        "graph, dtype and pass (above 1: slower than GAT)"
                        if GAT in families else "") + ".")
    notes_md += "\n\n" + "\n".join(notes)
    compiled = [f"- {r.shape} {r.dtype} {r.method}: first call took {r.extra['first_call_s']} s, "
                f"{r.extra['graphs_compiled']} graph(s), {r.extra['graph_breaks']} graph break(s)"
                for r in rows if "graphs_compiled" in r.extra]
    if compiled:
        notes_md += "\n\ntorch.compile (from torch._dynamo counters):\n" + "\n".join(compiled)
    failures = common.failure_notes(rows)
    if failures:
        notes_md += "\n\nRows that did not run:\n" + failures
    only = families[0] if len(families) == 1 else GAT
    kind = "layer" if only is GAT else f"layer_{only.key}"
    stem = common.result_stem(kind, device, args.tag)
    title = " and ".join(f.name.removesuffix("Conv") for f in families)
    paths = common.write_results(args.out, stem,
                                 f"{title} layer benchmark (forward; forward + backward)", meta,
                                 rows, text, notes_md,
                                 chart_peers=[p for f in families for p in f.peers],
                                 chart_methods=[m for m in dict.fromkeys(r.method for r in rows)
                                                if is_ours(m)])
    print()
    print(f"{common.summary_line(meta)}, {meta['compile']}")
    print(text)
    if failures:
        print(failures)
    print("written: " + ", ".join(paths))


def main(argv: Optional[List[str]] = None) -> int:
    parser = common.benchmark_parser(__doc__.split("\n\n")[0], check_limit=1 << 20)
    parser.add_argument("--conv", default="gat", choices=tuple(CONV_CHOICES),
                        help="layer family: gat (GATConv), gatv2 (GATv2Conv), transformer "
                        "(TransformerConv) or all (every one, with each other row's time over "
                        "GAT's)")
    parser.add_argument("--dynamic", action="store_true",
                        help="torch.compile(dynamic=True): one compile serves every graph "
                        "(faster to run; default: static shapes, compiled per graph)")
    parser.add_argument("--methods", default=None,
                        help="regular expression: run only the rows whose method matches "
                        "(e.g. 'compiled|csr'; GATv2 and Transformer rows' methods start "
                        "with 'GATv2 ' and 'Transformer ')")
    parser.add_argument("--fold-off-rows", action="store_true",
                        help="also run our fused GATConv with fold_scores=False")
    parser.add_argument("--reduce-overhead", action="store_true",
                        help="also run each compiled row under "
                        "torch.compile(mode='reduce-overhead') (CUDA graphs)")
    parser.add_argument("--no-compile", action="store_true",
                        help="eager rows only (skips torch.compile and its warm-up)")
    parser.add_argument("--autocast", default="",
                        help="comma list of bfloat16, float16: also run every row with float32 "
                        "parameters and inputs under torch.autocast to that dtype (the rows' "
                        "dtype reads e.g. 'bfloat16 autocast')")
    parser.add_argument("--rounds", type=int, default=None,
                        help="the checked rows of each graph and dtype take turns, this many "
                        "rounds of a share of the repeats each (default: 3 on cuda, 1 on cpu)")
    parser.add_argument("--passes", default=f"{FORWARD},{TRAIN}",
                        help=f"comma-separated: {FORWARD} (inference, under no_grad) and/or "
                        f"{TRAIN} (a training step)")
    args, device, shapes, dtypes = common.parse_benchmark_args(parser, argv)
    args.passes = [p for p in args.passes.split(",") if p]
    bad = [p for p in args.passes if p not in (FORWARD, TRAIN)]
    if bad or not args.passes:
        parser.error(f"--passes: expected {FORWARD} and/or {TRAIN}, got {args.passes!r}")
    args.families = CONV_CHOICES[args.conv]
    args.rounds = args.rounds or (3 if device.type == "cuda" else 1)
    args.autocast = [a for a in args.autocast.split(",") if a]
    if any(a not in ("bfloat16", "float16") for a in args.autocast):
        parser.error(f"--autocast: expected bfloat16 and/or float16, got {args.autocast!r}")
    # Every (layer, adjacency, graph, dtype) is its own compiled graph.
    torch._dynamo.config.recompile_limit = 64

    meta = common.environment(device, sys.argv if argv is None else [__file__] + argv)
    meta["in_channels"] = IN_CHANNELS
    meta["layers"] = ", ".join(f.name for f in args.families)
    meta["compile"] = ("no compiled rows" if args.no_compile else
                       f"torch.compile(dynamic={args.dynamic})")
    log(f"{meta['machine']}: {meta['layers']}, {' and '.join(args.passes)}")
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
