"""Mini-batch training: a 2-layer GAT over NeighborLoader batches, per batch.

The model: GATConv(F_in, 32, heads=4) -> ELU -> GATConv(128, classes, heads=1),
cross-entropy on the seed nodes, Adam. The batches: NeighborLoader over a
synthetic graph of ``graphs.py`` (default products-like: 2.4M nodes, 61M
edges), ``--fanout 15,10``, ``--batch-size 1024``, each batch a new plain
``edge_index`` (what every PyG mini-batch loop passes to its layers).

Sampling and the copy to the device are timed apart; they are the same for
every model. The batches are drawn once and every model trains on the same
ones, from the same initial weights. Per model and batch: the model time
(forward + backward + optimizer step, CUDA events or perf_counter), the
steady-state batches per second, the peak memory above the resident batches,
and (CUDA) the host syncs per step (torch.cuda.set_sync_debug_mode). The
first batch's output is checked against PyG's layer in float64 before
timing. Every model is prepared (checked, compiled, warmed up) first; then
the models take turns, ``--rounds`` timed passes over the same batches each,
in an order rotated every round, so that the machine's drift reaches them
alike; the median is over every batch of every pass.

Models: PyG's GATConv eager and under torch.compile(dynamic=True), ours
(pyg_multihead_agg.nn.GATConv) eager, eager without the index check
(graph.set_index_check(False): no host sync) and compiled.

Edge orders (``--edge-orders``): ``loader``, the batches as NeighborLoader
returns them (grouped by destination), and ``shuffled``, the same batches
with each one's edges in a random order (a sampler's or a loader's output
that is not grouped by destination); every model in each.

    python benchmarks/bench_minibatch.py --device cuda
    python benchmarks/bench_minibatch.py --device cpu --batches 8
"""
import statistics
import sys
import time
import warnings
from typing import Callable, List, Optional, Sequence

import torch
import torch.nn.functional as F
import torch_geometric
from common import (
    Row,
    add_output_args,
    add_speedups,
    environment,
    fmt_bytes,
    free_memory,
    log,
    markdown_table,
    rel_error,
    result_stem,
    run_guarded,
    summary_line,
    sync,
    take_turns,
    write_results,
)
from graphs import SHAPES, make_graph

import pyg_multihead_agg.nn
from pyg_multihead_agg import graph as graphs

# PyG's compiled model is prepared last: on torch 2.11 its compile fails in
# Inductor, and a row timed right after that failure once ran 1.34x slower
# than the next.
METHODS = ("pyg", "ours", "ours_no_index_check", "ours_compiled", "pyg_compiled")
PEERS = ("pyg", "pyg_compiled")
LAYERS = {"pyg": torch_geometric.nn.GATConv, "ours": pyg_multihead_agg.nn.GATConv}


class GAT(torch.nn.Module):
    def __init__(self, conv: type, in_channels: int, hidden: int, heads: int,
                 out_channels: int):
        super().__init__()
        self.conv1 = conv(in_channels, hidden, heads=heads)
        self.conv2 = conv(hidden * heads, out_channels, heads=1, concat=False)

    def forward(self, x, edge_index):
        return self.conv2(F.elu(self.conv1(x, edge_index)), edge_index)


def sample_batches(shape: str, fanout: Sequence[int], batch_size: int, num_batches: int,
                   in_channels: int, num_classes: int, seed: int):
    """The graph, then `num_batches` NeighborLoader batches (CPU), each timed."""
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    log(f"building {shape}")
    g = make_graph(shape, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    data = Data(x=torch.randn(g.num_nodes, in_channels, generator=gen),
                y=torch.randint(0, num_classes, (g.num_nodes,), generator=gen),
                edge_index=g.edge_index(), num_nodes=g.num_nodes)
    del g
    log(f"{shape}: {data.num_nodes:,} nodes, {data.num_edges:,} edges; loader set-up")
    torch.manual_seed(seed)
    start = time.perf_counter()
    loader = NeighborLoader(data, num_neighbors=list(fanout), batch_size=batch_size,
                            shuffle=True)
    setup_s = time.perf_counter() - start
    batches, times = [], []
    iterator = iter(loader)
    for _ in range(num_batches):
        start = time.perf_counter()
        batch = next(iterator)
        times.append((time.perf_counter() - start) * 1e3)
        batches.append(batch)
    return batches, times, setup_s


def to_device(batches, device):
    out, times = [], []
    for batch in batches:
        sync(device)
        start = time.perf_counter()
        moved = (batch.x.to(device, non_blocking=False), batch.edge_index.to(device),
                 batch.y[:batch.batch_size].to(device))
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
        out.append(moved)
    return out, times


def shuffle_edges(batches, seed: int):
    """The same batches, each with its edges in a random order."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for x, edge_index, y in batches:
        order = torch.randperm(edge_index.size(1), generator=gen).to(edge_index.device)
        out.append((x, edge_index[:, order], y))
    return out


def make_model(method: str, in_channels: int, num_classes: int, device, seed: int):
    torch.manual_seed(seed)
    conv = LAYERS[method.split("_")[0]]
    model = GAT(conv, in_channels, 32, 4, num_classes).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    step_model = torch.compile(model, dynamic=True) if method.endswith("compiled") else model
    return model, step_model, optimizer


def reference_output(batch, in_channels, num_classes, device, seed):
    """PyG's model in float64 on the first batch (the check of every method)."""
    torch.manual_seed(seed)
    model = GAT(torch_geometric.nn.GATConv, in_channels, 32, 4, num_classes)
    model = model.to(device, torch.float64)
    x, edge_index, _ = batch
    with torch.no_grad():
        return model(x.double(), edge_index)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch) -> None:
    """One training step on a batch (x, edge_index, y of the seeds)."""
    x, edge_index, y = batch
    # Every batch is a new graph to the layers, as in a training loop (the
    # batches here are kept, and would stay cached).
    graphs.clear_cache()
    optimizer.zero_grad(set_to_none=True)
    out = model(x, edge_index)[:y.numel()]
    F.cross_entropy(out, y).backward()
    optimizer.step()


def count_syncs(fn: Callable[[], None], steps: int) -> float:
    """Host syncs per call of fn, as torch.cuda.set_sync_debug_mode counts them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught) / steps


def prepare_method(row: Row, batches, ref, args, device) -> Callable[[], float]:
    """The row's model, from the seeded weights, checked on the first batch
    against PyG's in float64 and warmed up (compilation, allocator); its
    host syncs per step counted (CUDA). Returns one timed pass over the
    timed batches, which appends each batch's time to ``row.times_ms`` and
    returns the pass's total milliseconds; the first pass also records the
    peak memory above what was allocated before it."""
    model, step_model, optimizer = make_model(row.method, args.in_channels, args.classes,
                                              device, args.seed)
    index_check = row.method != "ours_no_index_check"

    def step(batch):
        train_step(step_model, optimizer, batch)

    timed = batches[args.warmup:]
    graphs.set_index_check(index_check)
    try:
        x, edge_index, y = batches[0]
        with torch.no_grad():
            out = step_model(x, edge_index)
        row.rel_err = rel_error(out, ref)
        row.check = "ok" if row.rel_err <= 1e-4 else "FAIL"
        for batch in batches[:args.warmup]:  # compilation, allocator, caches
            step(batch)
        sync(device)
        if device.type == "cuda":
            row.extra["host_syncs_per_step"] = count_syncs(lambda: step(timed[0]), 3)
    finally:
        graphs.set_index_check(True)

    def timed_pass() -> float:
        graphs.set_index_check(index_check)
        try:
            if device.type != "cuda":
                start = time.perf_counter()
                for batch in timed:
                    t = time.perf_counter()
                    step(batch)
                    row.times_ms.append((time.perf_counter() - t) * 1e3)
                return (time.perf_counter() - start) * 1e3
            first = row.peak_extra_bytes is None
            if first:
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
            events = [torch.cuda.Event(enable_timing=True) for _ in range(len(timed) + 1)]
            events[0].record()
            for i, batch in enumerate(timed):
                step(batch)
                events[i + 1].record()
            sync(device)
            row.times_ms += [a.elapsed_time(b) for a, b in zip(events[:-1], events[1:],
                                                                strict=True)]
            if first:
                row.peak_extra_bytes = torch.cuda.max_memory_allocated(device) - base
            return events[0].elapsed_time(events[-1])
        finally:
            graphs.set_index_check(True)

    return timed_pass


def bench_round_robin(rows: List[Row], batches, ref, args, device) -> None:
    """Every row's model prepared, then ``args.rounds`` rounds in which each
    model makes one timed pass, in an order rotated each round, so that a
    drift of the machine's speed (its clocks, the host's other work) reaches
    every model alike rather than whichever ran during it. A row whose
    preparation or pass fails is reported with its error and leaves the
    rounds."""
    passes = {}
    for row in rows:
        log(f"{row.method}, {row.extra['edge_order']} edge order: preparing")
        run_guarded(row, lambda r: passes.__setitem__(
            r.method, prepare_method(r, batches, ref, args, device)), device)
    total = dict.fromkeys(passes, 0.0)

    def one_pass(row: Row, timed_pass: Callable[[], float], k: int) -> None:
        total[row.method] += timed_pass()
    take_turns([(r, passes[r.method]) for r in rows if r.method in passes], args.rounds,
               one_pass, device)
    for row in rows:
        if row.status == "ok" and row.method in passes:
            row.ms = statistics.median(row.times_ms)
            row.extra["batches_per_s"] = len(row.times_ms) / total[row.method] * 1e3
            log(f"  {row.method}: {row.ms:.2f} ms/batch, "
                f"{row.extra['batches_per_s']:.1f} batches/s, "
                f"peak +{fmt_bytes(row.peak_extra_bytes)}, err {row.rel_err:.1e}")
        else:
            log(f"  {row.method}: {row.status}")


def main(argv: Optional[Sequence[str]] = None) -> List[Row]:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"],
                        default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shape", default="products-like", choices=list(SHAPES))
    parser.add_argument("--fanout", default="15,10")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=None,
                        help="timed batches per model (default: 40 on cuda, 8 on cpu)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="timed passes over the batches per model, the models taking "
                             "turns (default: 5 on cuda, 1 on cpu)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed batches first (default: 5 on cuda, 2 on cpu)")
    parser.add_argument("--in-channels", type=int, default=128)
    parser.add_argument("--classes", type=int, default=47)
    parser.add_argument("--methods", default=",".join(METHODS),
                        help="comma list of " + ", ".join(METHODS))
    parser.add_argument("--edge-orders", default="loader,shuffled",
                        help="comma list of loader (as NeighborLoader returns the edges, "
                             "grouped by destination), shuffled (each batch's edges in a "
                             "random order)")
    parser.add_argument("--seed", type=int, default=0)
    add_output_args(parser)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    args.batches = args.batches or (40 if cuda else 8)
    args.rounds = args.rounds or (5 if cuda else 1)
    args.warmup = args.warmup if args.warmup is not None else (5 if cuda else 2)
    methods = args.methods.split(",")
    unknown = set(methods) - set(METHODS)
    if unknown:
        parser.error(f"unknown methods {sorted(unknown)}; choose from {', '.join(METHODS)}")
    fanout = [int(f) for f in args.fanout.split(",")]
    orders = args.edge_orders.split(",")
    if not orders or set(orders) - {"loader", "shuffled"}:
        parser.error(f"--edge-orders: a comma list of loader, shuffled; got {args.edge_orders!r}")

    meta = environment(device, sys.argv if argv is None else ["bench_minibatch.py", *argv])
    cpu_batches, sample_ms, setup_s = sample_batches(
        args.shape, fanout, args.batch_size, args.warmup + args.batches, args.in_channels,
        args.classes, args.seed)
    batches, copy_ms = to_device(cpu_batches, device)
    nodes = [b.num_nodes for b in cpu_batches]
    edges = [b.num_edges for b in cpu_batches]
    meta.update(shape=args.shape, edge_orders=args.edge_orders, fanout=args.fanout,
                batch_size=args.batch_size,
                timed_batches=args.batches, rounds=args.rounds, warmup_batches=args.warmup,
                in_channels=args.in_channels, hidden="4 heads x 32", classes=args.classes,
                nodes_per_batch=round(statistics.mean(nodes)),
                edges_per_batch=round(statistics.mean(edges)),
                loader_setup_s=round(setup_s, 2),
                sampling_ms_per_batch=round(statistics.median(sample_ms), 2),
                copy_to_device_ms_per_batch=round(statistics.median(copy_ms), 2),
                threads=torch.get_num_threads())
    del cpu_batches
    log(f"{meta['nodes_per_batch']:,} nodes, {meta['edges_per_batch']:,} edges per batch; "
        f"sampling {meta['sampling_ms_per_batch']} ms, copy {meta['copy_to_device_ms_per_batch']}"
        " ms per batch")
    ref = reference_output(batches[0], args.in_channels, args.classes, device, args.seed)

    rows = []
    for order in orders:
        ordered = batches if order == "loader" else shuffle_edges(batches, args.seed)
        group = [Row(shape=args.shape, dtype="float32", method=method,
                     pass_="forward+backward+step", extra={"edge_order": order})
                 for method in methods]
        bench_round_robin(group, ordered, ref, args, device)
        rows += group
        del ordered
        free_memory(device)
    add_speedups(rows, PEERS, group=lambda r: r.extra["edge_order"])

    def cells(r: Row):
        speedups = [f"{r.speedup[p]:.2f}x" if p in r.speedup else "" for p in PEERS]
        return [r.extra["edge_order"], r.method, f"{r.ms:.2f}" if r.ms else r.status,
                f"{r.extra['batches_per_s']:.1f}" if r.ms else "",
                fmt_bytes(r.peak_extra_bytes), *speedups,
                str(r.extra.get("host_syncs_per_step", "")),
                f"{r.rel_err:.1e}" if r.rel_err is not None else ""]

    table = markdown_table(["edge order", "model", "ms / batch (median)", "batches / s",
                            "peak extra memory", "vs PyG eager", "vs PyG compiled",
                            "host syncs / step", "rel. error vs float64"],
                           [cells(r) for r in rows])
    notes = (f"Sampling (CPU, NeighborLoader) {meta['sampling_ms_per_batch']} ms and the copy to "
             f"the device {meta['copy_to_device_ms_per_batch']} ms per batch, not in the model "
             "time.")
    print(summary_line(meta))
    print(table)
    paths = write_results(args.out, result_stem("minibatch", device, args.tag),
                          f"Mini-batch GAT training on {args.shape} ({device.type})", meta,
                          rows, table, notes)
    log("wrote " + ", ".join(paths))
    return rows


if __name__ == "__main__":
    main()
