"""Where a whole training step's time goes when it is bound by the host: the
mini-batch step of benchmarks/bench_minibatch.py and the Cora epoch of
examples/train_cora.py, for PyG's GATConv and ours.

    python tools/profile_step.py --device cuda --steps minibatch,cora --root .device/data

Per (step, layer): the wall time per step without the profiler; then, under
torch.profiler, the kernels launched and their summed GPU time per step, the
host syncs (cudaStreamSynchronize, cudaMemcpy device-to-host), the ops with
the most host (self CPU) time and the kernels with the most GPU time; with
--cprofile, the Python functions with the most time of their own. With
``--layers ours,none`` the Cora step also prints ours minus the no-attention
floor, per op and per Python function: where the attention layers' own
time goes.
``--steps host`` prints the host time of one layer call on a tiny graph
(each family, PyG's against ours), the everyday-regime target:

    python tools/profile_step.py --device cpu --steps host

``--steps compile`` times one layer's training step (bench_layer.py's:
forward, then backward from a fixed output gradient) on ``--shape``,
eager and compiled (default mode, ``dynamic=True``) on a plain
``edge_index``, an ``EdgeIndex`` and ``prepare_adjacency``'s alias: the
host time (issuing the steps) against the wall time (until the GPU has
run them), which says whether a compiled step is bound by the host:

    python tools/profile_step.py --steps compile --shape arxiv-like --conv gat

With ``--compile-profile`` (and ``--cprofile``) each row is profiled too,
followed by where the compiled steps' extra host time goes, per op and per
Python function: compiled on the edge list minus compiled on
``prepare_adjacency``, and that minus eager.
"""
import argparse
import cProfile
import io
import os
import pstats
import re
import statistics
import sys
import time
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import torch_geometric  # noqa: E402
from bench_cora_epoch import NoAttention  # noqa: E402

import pyg_multihead_agg.nn  # noqa: E402
from pyg_multihead_agg import graph as graphs  # noqa: E402

# --layers: PyG's GATConv, ours, and "none", the Cora benchmark's floor (each
# layer cut to its projection, bias and head merge), against which a layer's
# own cost shows (--steps cora: a table of ours minus none, per op and per
# Python function with --cprofile).
LAYERS = {"pyg": torch_geometric.nn.GATConv, "ours": pyg_multihead_agg.nn.GATConv,
          "none": NoAttention}


def minibatch_steps(conv: type, device: torch.device, batches) -> List[Callable[[], None]]:
    from bench_minibatch import GAT, train_step
    torch.manual_seed(0)
    model = GAT(conv, 128, 32, 4, 47).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return [lambda b=b: train_step(model, optimizer, b) for b in batches]


def cora_steps(conv: type, device: torch.device, data, count: int) -> List[Callable[[], None]]:
    from train_cora import GAT, paper_settings
    s = paper_settings("Cora")
    torch.manual_seed(0)
    model = GAT(conv, data.num_features, s["hidden_channels"], 7, s["heads"], s["out_heads"],
                s["dropout"]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=s["lr"], weight_decay=s["weight_decay"])
    masks = (data.train_mask, data.val_mask, data.test_mask)

    def step():  # train_cora.train_run's epoch, without its logging
        model.train()
        optimizer.zero_grad()
        out = model(data.x, data.edge_index)
        F.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
        optimizer.step()
        model.eval()
        with torch.no_grad():
            out = model(data.x, data.edge_index)
            F.cross_entropy(out[data.val_mask], data.y[data.val_mask])
            pred = out.argmax(dim=-1)
            [(pred[m] == data.y[m]).float().mean() for m in masks]
    return [step] * count


def host_times(device: torch.device, repeats: int = 5, calls: int = 1000) -> None:
    """The host time of one layer call on a tiny graph (16 nodes, 48 random
    edges, 16 -> 4 x 8, one thread), where launches and Python, not the
    kernels, take the time: forward (no_grad) and forward + backward, PyG's
    GATConv, GATv2Conv and TransformerConv against ours from one state_dict;
    the best of ``repeats`` averages over ``calls`` calls."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(16, 16, device=device)
    edge_index = torch.randint(0, 16, (2, 48), device=device)

    def per_call_us(layer: torch.nn.Module, train: bool) -> float:
        params = list(layer.parameters())

        def step():
            with torch.set_grad_enabled(train):
                out = layer(x, edge_index)
                if train:
                    torch.autograd.grad(out.sum(), params)
        for _ in range(200):
            step()
        best = float("inf")
        for _ in range(repeats):
            sync(device)
            t = time.perf_counter()
            for _ in range(calls):
                step()
            sync(device)
            best = min(best, (time.perf_counter() - t) / calls * 1e6)
        return best

    print(f"\n### host time per layer call, 16 nodes, 48 edges, {device}\n")
    print("| layer | pass | PyG (us) | ours (us) |\n|---|---|---|---|")
    for name in ("GATConv", "GATv2Conv", "TransformerConv"):
        pyg = getattr(torch_geometric.nn, name)(16, 8, heads=4).to(device)
        ours = getattr(pyg_multihead_agg.nn, name)(16, 8, heads=4).to(device)
        ours.load_state_dict(pyg.state_dict())
        for train in (False, True):
            print(f"| {name} | {'forward + backward' if train else 'forward'} | "
                  f"{per_call_us(pyg, train):.1f} | {per_call_us(ours, train):.1f} |", flush=True)


CONVS = {"gat": "GATConv", "gatv2": "GATv2Conv", "transformer": "TransformerConv"}


def training_step(model: Callable, x: torch.Tensor, adj, grad_out: torch.Tensor
                  ) -> Callable[[], None]:
    """bench_layer.py's training pass: forward, then the parameters'
    gradients from a fixed output gradient."""
    params = [p for p in getattr(model, "_orig_mod", model).parameters()]

    def step():
        torch.autograd.grad(model(x, adj), params, grad_out)
    return step


def host_and_wall(step: Callable[[], None], device: torch.device, steps: int,
                  repeats: int, warmup: int = 10) -> Tuple[float, float]:
    """ms per step: ``steps`` steps issued back to back, host time until the
    loop returns and wall time until the device has run them; the best of
    ``repeats`` each."""
    for _ in range(warmup):
        step()
    host = wall = float("inf")
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        for _ in range(steps):
            step()
        issued = time.perf_counter()
        sync(device)
        done = time.perf_counter()
        host = min(host, (issued - t) / steps * 1e3)
        wall = min(wall, (done - t) / steps * 1e3)
    return host, wall


def compile_times(device: torch.device, shape: str, conv: str, steps: int = 60,
                  repeats: int = 3, profile_top: int = 0,
                  use_cprofile: bool = False) -> List[Dict[str, object]]:
    """Host and wall ms per training step of one layer (F_in 128, the
    shape's heads and channels; bench_layer.py's step: forward, backward
    from a fixed output gradient), eager and compiled on each adjacency: per
    repeat, ``steps`` steps issued back to back (host: until the loop
    returns; wall: until the device has finished them), the best of
    ``repeats``. Prints a table; returns its rows. With ``profile_top``,
    each row is also profiled (``report``: kernels, host syncs, the ops with
    the most host time) and the differences are printed that say where a
    compiled step's extra host time goes: compiled on the edge list minus
    compiled on ``prepare_adjacency``, and that minus eager."""
    from graphs import make_graph
    from torch_geometric import EdgeIndex

    import pyg_multihead_agg as pma

    g = make_graph(shape, device=device)
    n = g.num_nodes
    edge_index = g.edge_index()
    layer = getattr(pyg_multihead_agg.nn, CONVS[conv])
    torch.manual_seed(0)
    x = torch.randn(n, 128, device=device)

    def adjacency(kind: str):
        if kind == "EdgeIndex":
            return EdgeIndex(edge_index, sparse_size=(n, n), sort_order="col").fill_cache_()
        if kind == "prepare_adjacency":
            return pma.prepare_adjacency(edge_index, num_nodes=n)
        return edge_index

    rows, profiles = [], {}
    for mode, kind in (("eager", "edge_index"), ("compiled", "edge_index"),
                       ("compiled", "EdgeIndex"), ("compiled", "prepare_adjacency")):
        torch.manual_seed(0)
        model = layer(128, g.channels, heads=g.heads).to(device)
        run = torch.compile(model, dynamic=True) if mode == "compiled" else model
        grad_out = torch.randn(n, g.heads * g.channels, device=device)
        host, wall = host_and_wall(training_step(run, x, adjacency(kind), grad_out), device,
                                   steps, repeats)
        rows.append({"mode": mode, "adjacency": kind, "host_ms": host, "wall_ms": wall})
        if profile_top:
            step = training_step(run, x, adjacency(kind), grad_out)
            profiles[mode, kind] = report(f"{CONVS[conv]} step, {shape}, {mode}, {kind}",
                                          [step] * 35, device, 5, profile_top, use_cprofile)
        torch._dynamo.reset()
    print(f"\n### {CONVS[conv]} training step, {shape}, {device}: {steps} steps, best of "
          f"{repeats}\n")
    print("| step | adjacency | host (ms) | wall (ms) |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | `{r['adjacency']}` | {r['host_ms']:.3f} | {r['wall_ms']:.3f} |")
    pairs = ((("compiled", "edge_index"), ("compiled", "prepare_adjacency")),
             (("compiled", "prepare_adjacency"), ("eager", "edge_index")))
    for (a, b) in pairs if profiles else ():
        for part, what in (("ops", "host self time by op"),
                           ("python", "own time by Python function (cProfile)")):
            if profiles[a][part]:
                print_difference(f"{CONVS[conv]} step, {shape}, {' '.join(a)} minus "
                                 f"{' '.join(b)}, {what}", profiles[a][part], profiles[b][part],
                                 profile_top, names=(" ".join(a), " ".join(b)))
    return rows


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def first_call_steps(device: torch.device, shape: str, count: int) -> List[Callable[[], None]]:
    from graphs import make_graph
    g = make_graph(shape, device=device, self_loops=True)
    edge_index, n = g.edge_index(), g.num_nodes
    del g
    torch.manual_seed(0)
    layer = pyg_multihead_agg.nn.GATConv(128, 32, heads=4, add_self_loops=False).to(device)
    x = torch.randn(n, 128, device=device)
    params = list(layer.parameters())

    def step():  # bench_layer.py's "new graph every call"
        graphs.clear_cache()
        out = layer(x, edge_index)
        torch.autograd.grad(out, params, torch.ones_like(out))
    return [step] * count


def report(title: str, steps: List[Callable[[], None]], device: torch.device, warmup: int,
           top: int, use_cprofile: bool) -> Dict[str, Dict[str, float]]:
    """Prints the step's profile; returns host ms per step by op name ("ops")
    and, with use_cprofile, own time by Python function ("python")."""
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for fn in steps[:warmup]:
        fn()
    timed = steps[warmup:]
    sync()
    wall = []
    for fn in timed:
        t = time.perf_counter()
        fn()
        sync()
        wall.append((time.perf_counter() - t) * 1e3)
    n = len(timed)
    print(f"\n## {title}: {statistics.median(wall):.2f} ms per step (median of {n}, "
          "synchronised after each)\n")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for fn in timed:
            fn()
        sync()
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type.name == "CUDA"]
    gpu_ms = sum(e.device_time_total for e in kernels) / 1e3 / n
    launches = sum(e.count for e in kernels) / n
    runtime = {e.key: e for e in events if e.key.startswith("cuda")}
    syncs = sum(runtime[k].count for k in runtime
                if k in ("cudaStreamSynchronize", "cudaDeviceSynchronize")) / n
    memcpy = sum(runtime[k].count for k in runtime if k.startswith("cudaMemcpy")) / n
    cpu_ops = [e for e in events if e.device_type.name == "CPU" and not e.key.startswith("cuda")]
    print(f"- GPU kernels: {launches:.0f} per step, {gpu_ms:.2f} ms summed")
    print(f"- host syncs: {syncs:.1f} stream/device syncs, {memcpy:.1f} cudaMemcpy per step")
    for k in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMalloc", "cudaFree"):
        if k in runtime:
            e = runtime[k]
            print(f"- {k}: {e.count / n:.0f} per step, {e.cpu_time_total / 1e3 / n:.2f} ms")
    print("\n| op (host self time) | ms per step | calls per step |\n|---|---|---|")
    cpu_ops.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    for e in cpu_ops[:top]:
        print(f"| `{e.key[:80]}` | {e.self_cpu_time_total / 1e3 / n:.3f} | {e.count / n:.1f} |")
    if kernels:
        print("\n| kernel | GPU ms per step | calls per step |\n|---|---|---|")
        kernels.sort(key=lambda e: e.device_time_total, reverse=True)
        for e in kernels[:top]:
            print(f"| `{e.key[:80]}` | {e.device_time_total / 1e3 / n:.3f} | {e.count / n:.1f} |")
    result = {"ops": {e.key: e.self_cpu_time_total / 1e3 / n for e in cpu_ops}, "python": {}}
    if use_cprofile:
        pr = cProfile.Profile()
        pr.enable()
        for fn in timed:
            fn()
        sync()
        pr.disable()
        buf = io.StringIO()
        stats = pstats.Stats(pr, stream=buf)
        stats.sort_stats("tottime").print_stats(top)
        print("\n```\n" + buf.getvalue().strip() + "\n```")
        for (path, line, func), (_, _, own, _, _) in stats.stats.items():
            where = f"{os.path.basename(path)}:{line}({func})"
            result["python"][where] = result["python"].get(where, 0.0) + own * 1e3 / n
    return result


_INDUCTOR_HASH = re.compile(r"[a-z0-9]{40,}")


def _unhashed(times: Dict[str, float]) -> Dict[str, float]:
    # times with Inductor's content hashes in the keys replaced by "#", summed
    out: Dict[str, float] = {}
    for key, value in times.items():
        key = _INDUCTOR_HASH.sub("#", key)
        out[key] = out.get(key, 0.0) + value
    return out


def print_difference(title: str, ours: Dict[str, float], floor: Dict[str, float],
                     top: int, names: Tuple[str, str] = ("ours", "none")) -> None:
    """Where a layer's own time goes: per key, ours minus the floor's, the
    largest differences first (both are ms per step). Inductor's hashed
    names (compiled graphs, generated modules, kernels) count as one name,
    so that two compilations of the same step compare."""
    ours, floor = _unhashed(ours), _unhashed(floor)
    keys = sorted(set(ours) | set(floor), key=lambda k: ours.get(k, 0) - floor.get(k, 0),
                  reverse=True)
    total = sum(ours.values()) - sum(floor.values())
    print(f"\n{title}: {total:.3f} ms per step in all\n")
    print(f"| | {names[0]} (ms per step) | {names[1]} | difference |\n|---|---|---|---|")
    for k in keys[:top]:
        print(f"| `{k[:80]}` | {ours.get(k, 0):.3f} | {floor.get(k, 0):.3f} | "
              f"{ours.get(k, 0) - floor.get(k, 0):+.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", default="minibatch,cora",
                        help="comma list of minibatch, cora, firstcall, host (one layer "
                        "call's host time on a tiny graph), compile (a layer's step on --shape, "
                        "eager and compiled: host against wall time)")
    parser.add_argument("--conv", default="gat", choices=tuple(CONVS))
    parser.add_argument("--compile-steps", type=int, default=60)
    parser.add_argument("--compile-profile", action="store_true",
                        help="--steps compile: profile each row too, and print where the "
                        "compiled steps' extra host time goes (see compile_times)")
    parser.add_argument("--layers", default="pyg,ours",
                        help="comma list of pyg, ours, none (see LAYERS)")
    parser.add_argument("--batches", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--shape", default="products-like")
    parser.add_argument("--first-call-shape", default="reddit-like")
    parser.add_argument("--root", default=os.environ.get("PYG_MULTIHEAD_AGG_DATA", "data"))
    parser.add_argument("--cprofile", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    kinds = args.steps.split(",")
    if "minibatch" in kinds:
        from bench_minibatch import sample_batches, to_device
        cpu_batches, _, _ = sample_batches(args.shape, [15, 10], 1024,
                                           args.warmup + args.batches, 128, 47, 0)
        batches, _ = to_device(cpu_batches, device)
        del cpu_batches
        for layer in args.layers.split(","):
            report(f"mini-batch step, {args.shape}, {layer}",
                   minibatch_steps(LAYERS[layer], device, batches), device, args.warmup,
                   args.top, args.cprofile)
    if "firstcall" in kinds:
        report(f"first call (graph converted every call), {args.first_call_shape}, ours",
               first_call_steps(device, args.first_call_shape, args.warmup + 10), device,
               args.warmup, args.top, args.cprofile)
    if "host" in kinds:
        host_times(device)
    if "compile" in kinds:
        compile_times(device, args.shape, args.conv, args.compile_steps,
                      profile_top=args.top if args.compile_profile else 0,
                      use_cprofile=args.cprofile)
    if "cora" in kinds:
        from train_cora import load_dataset
        data = load_dataset(args.root, "Cora")[0].to(device)
        profiles = {}
        for layer in args.layers.split(","):
            profiles[layer] = report(f"Cora epoch, {layer}",
                                     cora_steps(LAYERS[layer], device, data, args.warmup + 30),
                                     device, args.warmup, args.top, args.cprofile)
        if "ours" in profiles and "none" in profiles:
            for part, what in (("ops", "host self time by op"),
                               ("python", "own time by Python function (cProfile)")):
                if profiles["ours"][part]:
                    print_difference(f"Cora epoch, ours minus none, {what}",
                                     profiles["ours"][part], profiles["none"][part], args.top)


if __name__ == "__main__":
    main()
