"""Node classification on OGB (ogbn-arxiv, ogbn-products) with a GAT, GATv2 or
graph transformer built from pyg_multihead_agg's layers: full-batch or
NeighborLoader mini-batches, on one process or several through torchrun (DDP:
NCCL on GPUs, gloo on the CPU).

    python examples/train_ogb.py --dataset ogbn-arxiv --device cuda
    python examples/train_ogb.py --dataset ogbn-products --fanout 15,10 --batch-size 1024
    python examples/train_ogb.py --dataset ogbn-products --synthetic 2449029 --conv gatv2
    torchrun --nproc_per_node 2 examples/train_ogb.py --dataset ogbn-products \\
        --fanout 15,10 --batch-size 1024 --device cuda

The model follows the OGB leaderboard's GAT entries: attention layers (--conv
gat, gatv2 or transformer; heads concatenated, the last layer's averaged) with
a linear skip connection each, batch normalisation, ELU and dropout between
them. --conv mlp keeps the skip connections alone: an MLP of each node's own
features, the baseline that shows what the graph adds. --layer pyg builds the
model from PyG's layers instead of ours.

The data comes from the ogb package's PygNodePropPredDataset (downloaded to
--root on first use; ogbn-arxiv is made undirected, as those entries do).
--synthetic N writes instead a seeded stand-in of N nodes under --root
(examples/ogb_synthetic.py: a stochastic block graph with power-law degrees,
homophilous edges and noisy class features, the real dataset's classes,
features, edges per node and split proportions) in ogb's binary layout, read
by ogb's loader where the ogb package is installed and by a reader of the same
files without it; a folder that holds the same graph is reused.

Under DDP every rank trains on an equal share of the training nodes, drawn
afresh each epoch (so every rank runs the same number of steps), with its
own attention-dropout stream; the loss and accuracy are all-reduced; rank 0
evaluates on the whole graph and writes the checkpoint, the JSON and the PNG.

--summarise RESULTS STEM gathers the --json files in RESULTS into STEM.md and
STEM.json (scripts/ogb_device.sh).
"""
import argparse
import datetime
import glob
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
import warnings
from contextlib import nullcontext
from typing import Any, Dict, List, Optional, Sequence, Tuple

import ogb_synthetic  # (examples/, the script's folder, is on the path)
import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch_geometric
from torch import Tensor
from torch_geometric.typing import WITH_PYG_LIB, WITH_TORCH_SPARSE
from train_cora import device_name, save_epoch_figure

import pyg_multihead_agg
import pyg_multihead_agg.nn

DATASETS = tuple(ogb_synthetic.SPECS)
# The layer class of each --conv (layer family) and --layer; mlp: no attention layer.
CONVS = {"gat": {"ours": pyg_multihead_agg.nn.GATConv, "pyg": torch_geometric.nn.GATConv},
         "gatv2": {"ours": pyg_multihead_agg.nn.GATv2Conv, "pyg": torch_geometric.nn.GATv2Conv},
         "transformer": {"ours": pyg_multihead_agg.nn.TransformerConv,
                         "pyg": torch_geometric.nn.TransformerConv},
         "mlp": {"ours": None, "pyg": None}}
LAYERS = ("ours", "pyg")
DEFAULT_ROOT = os.path.join("~", ".cache", "pyg_multihead_agg", "ogb")
HAS_SAMPLER = WITH_PYG_LIB or WITH_TORCH_SPARSE  # what PyG's NeighborLoader samples with
# Epochs left out of the timing median (allocator warm-up, torch.compile).
WARMUP_EPOCHS = 1
HISTORY_KEYS = ("train_loss", "train_acc", "val_loss", "val_acc", "test_acc", "epoch_ms",
                "wait_ms", "eval_ms", "eval_epoch")


class GAT(torch.nn.Module):
    """Attention layers `conv` (heads concatenated, the last one averaged)
    with a linear skip connection each, batch normalisation, ELU and dropout
    between; with `conv` None, the skip connections alone (an MLP)."""

    def __init__(self, conv: Optional[type], in_channels: int, hidden_channels: int,
                 out_channels: int, num_layers: int, heads: int, dropout: float,
                 attn_dropout: float):
        super().__init__()
        self.dropout = dropout
        self.convs = torch.nn.ModuleList()
        self.skips = torch.nn.ModuleList()
        self.norms = torch.nn.ModuleList()
        for i in range(num_layers):
            last = i == num_layers - 1
            width = in_channels if i == 0 else hidden_channels * heads
            out = out_channels if last else hidden_channels * heads
            if conv is not None:
                self.convs.append(conv(width, out_channels if last else hidden_channels,
                                       heads=1 if last else heads, concat=not last,
                                       dropout=attn_dropout))
            self.skips.append(torch.nn.Linear(width, out, bias=False))
            if not last:
                self.norms.append(torch.nn.BatchNorm1d(out))

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        x = F.dropout(x, p=self.dropout, training=self.training)
        for i, skip in enumerate(self.skips):
            x = self.convs[i](x, edge_index) + skip(x) if self.convs else skip(x)
            if i < len(self.norms):
                x = F.dropout(F.elu(self.norms[i](x)), p=self.dropout, training=self.training)
        return x


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------

def synthetic_params(args: argparse.Namespace) -> ogb_synthetic.Params:
    return ogb_synthetic.params_for(args.dataset, args.synthetic, homophily=args.homophily,
                                    feature_noise=args.feature_noise,
                                    label_noise=args.label_noise, seed=args.seed)


def load(name: str, root: str, synthetic: bool = False,
         use_ogb: Optional[bool] = None) -> Tuple[Any, Dict[str, Tensor], int]:
    """(data, split_idx, num_classes): the dataset from ogb's
    PygNodePropPredDataset, or its synthetic stand-in under `root` (written
    by ogb_synthetic.write) through ogb's loader or, without the ogb package
    (or with `use_ogb` False), through ogb_synthetic.read."""
    root = os.path.expanduser(root)
    # ogb makes tensors of read-only arrays (the split pandas reads), which
    # torch warns about on every load; nothing writes to them.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable",
                            category=UserWarning)
    if use_ogb is None:
        use_ogb = _has_ogb()
    if synthetic and not use_ogb:
        data, split_idx, num_classes = ogb_synthetic.read(ogb_synthetic.folder(root, name))
    else:
        dataset = _ogb_dataset(name, root, synthetic)
        data, split_idx, num_classes = dataset[0], dataset.get_idx_split(), dataset.num_classes
    data.y = data.y.view(-1)
    if name == "ogbn-arxiv":
        from torch_geometric.utils import to_undirected
        data.edge_index = to_undirected(data.edge_index, num_nodes=data.num_nodes)
    return data, split_idx, num_classes


def _has_ogb() -> bool:
    try:
        import ogb  # noqa: F401
    except ImportError:
        return False
    return True


def _ogb_dataset(name: str, root: str, synthetic: bool):
    if not _has_ogb():
        raise SystemExit(f"error: {name} needs the ogb package (pip install ogb); without it, "
                         f"--synthetic NODES writes a stand-in under --root and reads it")
    from ogb.nodeproppred import PygNodePropPredDataset

    # ogb saves and loads its processed file with torch.load; it holds PyG
    # data objects, which torch >= 2.6 loads only when allowed.
    torch.serialization.add_safe_globals(_pyg_data_classes())
    if synthetic:
        path = ogb_synthetic.folder(root, name)
        return PygNodePropPredDataset(name, meta_dict=ogb_synthetic.ogb_meta_dict(name, path))
    folder = os.path.join(root, name.replace("-", "_"))
    existed = os.path.isdir(folder)
    try:
        return PygNodePropPredDataset(name, root=root)
    except (OSError, EOFError) as err:  # urllib's URLError is an OSError
        if not existed:  # else ogb would take the empty folder for an old release next time
            shutil.rmtree(folder, ignore_errors=True)
        raise SystemExit(
            f"error: could not load {name} under --root {root} ({type(err).__name__}: {err}); "
            f"offline, run with --synthetic NODES to write a synthetic stand-in under --root, "
            f"or point --root at a folder that holds {os.path.basename(folder)}/") from None


def _pyg_data_classes() -> List[Any]:
    import numpy as np
    from torch_geometric.data.data import Data, DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import GlobalStorage

    # ogb's binary datasets (the synthetic ones) keep num_nodes as a numpy integer.
    numpy_core = getattr(np, "_core", None) or np.core
    return [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage, numpy_core.multiarray.scalar,
            np.dtype, type(np.dtype(np.int64))]


def rank_share(train_idx: Tensor, epoch: int, seed: int, rank: int, world: int) -> Tensor:
    """This rank's training nodes for `epoch`: an equal share of a shuffle that
    every rank draws alike (the remainder of the division waits for another
    epoch's shuffle), so that every rank runs the same number of steps."""
    gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = train_idx[torch.randperm(train_idx.numel(), generator=gen)]
    share = train_idx.numel() // world
    return order[rank * share:(rank + 1) * share]


def sampling(data, args):
    """(CPU data, NeighborSampler) for mini-batches, built once per run: a
    NeighborLoader built every epoch would convert the graph to CSC again."""
    if args.fanout is None:
        return None
    from torch_geometric.sampler import NeighborSampler
    return data, NeighborSampler(data, num_neighbors=args.fanout)


def batches(data, nodes: Tensor, args, device: torch.device, sampled=None):
    """(x, edge_index, y of the seeds, number of seeds) per step: the whole
    graph once (full batch) or NeighborLoader batches of `nodes` drawn by
    `sampled` (from sampling()), copied to `device`."""
    if sampled is None:
        yield data.x, data.edge_index, data.y[nodes], nodes
        return
    from torch_geometric.loader import NeighborLoader
    cpu_data, sampler = sampled
    loader = NeighborLoader(cpu_data, num_neighbors=args.fanout, input_nodes=nodes.cpu(),
                            batch_size=args.batch_size, shuffle=True, neighbor_sampler=sampler,
                            num_workers=args.num_workers,
                            pin_memory=args.num_workers > 0 and device.type == "cuda")
    for batch in loader:
        batch = batch.to(device, non_blocking=True)
        seeds = batch.batch_size
        yield batch.x, batch.edge_index, batch.y[:seeds], torch.arange(seeds, device=device)


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------

def setup(device_name: str) -> Tuple[torch.device, int, int]:
    """(device, rank, world size); joins the process group under torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = torch.device(device_name)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device, rank, world


def all_sum(values: List[float], device: torch.device) -> List[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


def train_epoch(model, optimizer, data, nodes: Tensor, args, device: torch.device,
                autocast, sampled=None) -> Tuple[float, float, int, float]:
    """One pass over this rank's nodes; (loss sum, correct, count) over all
    ranks, and this rank's seconds spent waiting for batches (sampling and
    the copy to the device: the rest of the epoch is the steps)."""
    model.train()
    loss_sum = correct = count = wait = 0.0
    steps = iter(batches(data, nodes, args, device, sampled))
    while True:
        t = time.perf_counter()
        batch = next(steps, None)
        wait += time.perf_counter() - t
        if batch is None:
            break
        x, edge_index, y, seeds = batch
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            out = model(x, edge_index)[seeds]
            loss = F.cross_entropy(out.float(), y)
        loss.backward()
        optimizer.step()
        # (float() waits for the step: the next wait starts after it.)
        loss_sum += float(loss.detach()) * y.numel()
        correct += float((out.argmax(-1) == y).sum())
        count += y.numel()
    loss_sum, correct, count = all_sum([loss_sum, correct, count], device)
    return loss_sum, correct, int(count), wait


@torch.no_grad()
def evaluate(module, data, split_idx: Dict[str, Tensor], autocast) -> Dict[str, float]:
    """Full-graph inference: the validation loss and the accuracy per split
    (ogb's Evaluator's "acc" for these datasets)."""
    module.eval()
    with autocast:
        out = module(data.x, data.edge_index).float()
    pred = out.argmax(-1)
    metrics = {f"{split}_acc": float((pred[idx] == data.y[idx]).double().mean())
               for split, idx in (("train", split_idx["train"]), ("val", split_idx["valid"]),
                                  ("test", split_idx["test"]))}
    metrics["val_loss"] = float(F.cross_entropy(out[split_idx["valid"]],
                                                data.y[split_idx["valid"]]))
    return metrics


def plot(history: Dict[str, List[float]], title: str, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("cross-entropy loss", ("train_loss", "val_loss")),
              ("accuracy", ("train_acc", "val_acc", "test_acc")),
              ("epoch time (ms)", ("epoch_ms", "wait_ms")))
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4))
    evaluated = history.get("eval_epoch")
    for ax, (label, keys) in zip(axes, panels, strict=True):
        for key in keys:
            epochs = (evaluated if key in ("val_loss", "val_acc", "test_acc") and evaluated
                      else range(1, len(history[key]) + 1))
            ax.plot(epochs, history[key], label=key)
        ax.set_ylabel(label)
    save_epoch_figure(fig, axes, title, path)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--dataset", default="ogbn-arxiv", choices=DATASETS,
                        help="the OGB dataset (or the one --synthetic stands in for)")
    parser.add_argument("--root", default=DEFAULT_ROOT,
                        help="ogb's dataset folder (and the synthetic stand-ins')")
    parser.add_argument("--conv", default="gat", choices=tuple(CONVS),
                        help="layer family: gat (GATConv), gatv2 (GATv2Conv), transformer "
                             "(TransformerConv), or mlp (no attention layer: the baseline)")
    parser.add_argument("--layer", default="ours", choices=LAYERS,
                        help="ours: pyg_multihead_agg.nn's layers; pyg: PyG's (the baseline)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where the model trains")
    parser.add_argument("--layers", type=int, default=3, help="attention layers")
    parser.add_argument("--hidden", type=int, default=64, help="channels per head")
    parser.add_argument("--heads", type=int, default=4,
                        help="attention heads of every layer but the last (1)")
    parser.add_argument("--dropout", type=float, default=0.5,
                        help="dropout on the inputs and between the layers")
    parser.add_argument("--attn-dropout", type=float, default=0.1,
                        help="dropout on the attention coefficients")
    parser.add_argument("--lr", type=float, default=2e-3, help="Adam's learning rate")
    parser.add_argument("--epochs", type=int, default=100, help="training epochs")
    parser.add_argument("--eval-every", type=int, default=1, metavar="N",
                        help="evaluate on the whole graph every N epochs and after the last; "
                             "0: after the last only")
    parser.add_argument("--fanout", default=None,
                        help="NeighborLoader fan-out per hop, e.g. 15,10 (needs pyg-lib or "
                             "torch-sparse); none: full batch")
    parser.add_argument("--batch-size", type=int, default=1024,
                        help="seed nodes per mini-batch (with --fanout)")
    parser.add_argument("--num-workers", type=int, default=0,
                        help="NeighborLoader worker processes (0: sample in the main process)")
    parser.add_argument("--compile", action="store_true", help="torch.compile(dynamic=True)")
    parser.add_argument("--amp", choices=["bf16"], default=None,
                        help="autocast the forward to bfloat16")
    parser.add_argument("--checkpoint", default=None, help="saved after every epoch")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--json", default=None, help="write the history and results here")
    parser.add_argument("--png", default=None, help="plot loss, accuracy and epoch time here")
    parser.add_argument("--seed", type=int, default=0,
                        help="of the weights, dropout, batches and the synthetic graph")
    parser.add_argument("--quiet", action="store_true", help="print the result line only")
    parser.add_argument("--log-every", type=int, default=10, metavar="N",
                        help="where stderr is not a terminal (no progress bar), print a line "
                             "every N epochs; 0: none")
    synthetic = parser.add_argument_group("synthetic stand-in (examples/ogb_synthetic.py)")
    synthetic.add_argument("--synthetic", type=int, default=None, metavar="NODES",
                           help="write (or reuse) a synthetic graph of NODES nodes like "
                                "--dataset under --root and train on it (offline runs); "
                                "ogbn-products' size: 2449029")
    synthetic.add_argument("--homophily", type=float, default=0.8,
                           help="fraction of the edges within a community (a class)")
    synthetic.add_argument("--feature-noise", type=float, default=4.5,
                           help="noise over the class centroid in the features")
    synthetic.add_argument("--label-noise", type=float, default=0.2,
                           help="fraction of the nodes labelled with a random class")
    synthetic.add_argument("--write-only", action="store_true",
                           help="write the --synthetic graph, then stop")
    parser.add_argument("--summarise", nargs=2, default=None, metavar=("RESULTS", "STEM"),
                        help="gather the --json files in RESULTS into STEM.md and STEM.json, "
                             "then stop")
    args = parser.parse_args(argv)
    if args.fanout is not None:
        args.fanout = [int(f) for f in args.fanout.split(",")]
    if args.resume and not args.checkpoint:
        parser.error("--resume needs --checkpoint")
    if args.write_only and not args.synthetic:
        parser.error("--write-only needs --synthetic")
    for name in ("epochs", "eval_every", "log_every", "num_workers"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be at least 0")
    return args


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    if args.summarise:
        return summarise(*args.summarise)
    if args.fanout is not None and not HAS_SAMPLER:
        raise SystemExit("error: --fanout (mini-batches) needs pyg-lib or torch-sparse, which "
                         "PyG's NeighborLoader samples with; neither is installed: install "
                         "one, or train full-batch (no --fanout)")
    device, rank, world = setup(args.device)
    try:
        # The model lives in run(): DDP's reducer must go before its process
        # group (freed after it, it can hang).
        return run(args, device, rank, world)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run(args: argparse.Namespace, device: torch.device, rank: int, world: int) -> Dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel
    from tqdm.auto import tqdm

    say = print if rank == 0 and not args.quiet else (lambda *a, **k: None)
    synthetic = None
    if args.synthetic and rank == 0:
        path = ogb_synthetic.write(args.root, args.dataset, synthetic_params(args), log=say)
        with open(os.path.join(path, "synthetic.json")) as f:
            synthetic = json.load(f)
    if args.write_only:
        result = dict(kind="write", dataset=args.dataset, synthetic=synthetic,
                      host_peak_rss_bytes=_peak_rss(), **environment(device))
        if args.json and rank == 0:
            _write_json(args.json, result)
        return result
    if world > 1:
        dist.barrier()
    t = time.perf_counter()
    data, split_idx, num_classes = load(args.dataset, args.root, synthetic=bool(args.synthetic))
    sampled = sampling(data, args)  # on the CPU copy
    data = data.to(device)
    split_idx = {k: v.to(device) for k, v in split_idx.items()}
    load_s = time.perf_counter() - t

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    conv = CONVS[args.conv][args.layer]
    module = GAT(conv, data.num_features, args.hidden, num_classes, args.layers, args.heads,
                 args.dropout, args.attn_dropout).to(device)
    optimizer = torch.optim.Adam(module.parameters(), lr=args.lr)
    history: Dict[str, List[float]] = {k: [] for k in HISTORY_KEYS}
    start, best = 1, {"val_acc": -1.0}
    if args.resume and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, map_location=device, weights_only=True)
        module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        history, best, start = state["history"], state["best"], state["epoch"] + 1
    model = module
    if world > 1:
        model = DistributedDataParallel(
            module, device_ids=[device.index] if device.type == "cuda" else None)
    if args.compile:
        model = torch.compile(model, dynamic=True)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if args.amp
                else nullcontext())

    name = f"{args.dataset} {args.conv} {args.layer}"
    progress = rank == 0 and not args.quiet and sys.stderr.isatty()
    log_every = args.log_every if rank == 0 and not args.quiet and not progress else 0
    bar = tqdm(range(start, args.epochs + 1), disable=not progress, desc=name)
    status, steps, epoch, stage = "ok", 0, start, "training"
    try:
        for epoch in bar:
            # Each rank its own attention-dropout (Philox) stream, reproducible
            # on resume.
            torch.manual_seed(args.seed * 100_003 + 1_000 * epoch + rank)
            stage = "training"
            nodes = rank_share(split_idx["train"], epoch, args.seed, rank, world)
            synchronize(device)
            t = time.perf_counter()
            loss_sum, correct, count, wait = train_epoch(model, optimizer, data, nodes, args,
                                                         device, autocast, sampled)
            synchronize(device)
            history["epoch_ms"].append((time.perf_counter() - t) * 1e3)
            history["wait_ms"].append(wait * 1e3)
            history["train_loss"].append(loss_sum / count)
            history["train_acc"].append(correct / count)
            steps = -(-nodes.numel() // args.batch_size) if args.fanout else 1
            if rank == 0 and (epoch == args.epochs
                              or args.eval_every and epoch % args.eval_every == 0):
                stage = "evaluation"
                t = time.perf_counter()
                metrics = evaluate(module, data, split_idx, autocast)
                history["eval_ms"].append((time.perf_counter() - t) * 1e3)
                history["eval_epoch"].append(epoch)
                for key in ("val_loss", "val_acc", "test_acc"):
                    history[key].append(metrics[key])
                if metrics["val_acc"] > best["val_acc"]:
                    best = dict(metrics, epoch=epoch)
                bar.set_postfix(loss=f"{history['train_loss'][-1]:.3f}",
                                val=f"{metrics['val_acc']:.3f}",
                                test=f"{best['test_acc']:.3f}", refresh=False)
            if log_every and epoch % log_every == 0:
                recent = slice(-log_every, None)
                at = history["eval_epoch"][-1] if history["eval_epoch"] else None
                val = "" if at is None else (
                    f"val acc {100 * history['val_acc'][-1]:.1f}%"
                    f"{'' if at == epoch else f' (epoch {at})'}, test acc at best val "
                    f"{100 * best['test_acc']:.1f}%, ")
                print(f"{name} epoch {epoch}: loss {history['train_loss'][-1]:.3f}, {val}"
                      f"{statistics.median(history['epoch_ms'][recent]):.1f} ms/epoch"
                      + (f" ({statistics.median(history['wait_ms'][recent]):.1f} waiting "
                         f"for batches)" if args.fanout else ""), flush=True)
            if rank == 0 and args.checkpoint:
                torch.save({"model": module.state_dict(), "optimizer": optimizer.state_dict(),
                            "epoch": epoch, "history": history, "best": best}, args.checkpoint)
            if world > 1:
                dist.barrier()
    except torch.OutOfMemoryError as err:  # a result to record, not a crash
        status = f"out of memory in {stage}"
        say(f"{name}: out of memory in {stage} at epoch {epoch}: {str(err).splitlines()[0]}")
    bar.close()

    timed = history["epoch_ms"][WARMUP_EPOCHS:] or history["epoch_ms"]
    waits = history["wait_ms"][WARMUP_EPOCHS:] or history["wait_ms"]
    result = dict(
        kind="train", status=status, dataset=args.dataset, synthetic=synthetic,
        conv=args.conv, layer=args.layer, world_size=world,
        mode=run_mode(args), compile=args.compile, amp=args.amp, epochs=len(history["epoch_ms"]),
        num_nodes=int(data.num_nodes), num_edges=int(data.edge_index.size(1)),
        load_s=round(load_s, 2),
        epoch_ms_median=statistics.median(timed) if timed else None,
        wait_ms_median=statistics.median(waits) if waits else None,
        eval_ms_median=statistics.median(history["eval_ms"]) if history["eval_ms"] else None,
        steps_per_epoch=steps,
        batches_per_s=steps / statistics.median(timed) * 1e3 if timed else None,
        peak_memory_bytes=(torch.cuda.max_memory_allocated(device)
                           if device.type == "cuda" else None),
        host_peak_rss_bytes=_peak_rss(), best=best, history=history, args=vars(args),
        **environment(device))
    if rank == 0:
        print(f"{name} x{world}: best validation accuracy {best['val_acc']:.4f} (epoch "
              f"{best.get('epoch')}), test accuracy {best.get('test_acc', float('nan')):.4f}; "
              f"median epoch {result['epoch_ms_median'] or float('nan'):.1f} ms"
              f"{'' if status == 'ok' else '; ' + status}", flush=True)
        if args.json:
            _write_json(args.json, result)
        if args.png:
            plot(history, f"{args.dataset}, {args.layer} {args.conv}, {world} process(es), "
                 f"{result['mode']}", args.png)
    return result


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # (kB on Linux)


def _write_json(path: str, result: Dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def environment(device: torch.device) -> Dict[str, Any]:
    """Where a result was measured: machine, versions, commit."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], capture_output=True, text=True, timeout=10,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD") or None
        if commit and git("status", "--porcelain", "--untracked-files=no"):
            commit += "+dirty"
    except (OSError, subprocess.SubprocessError):
        commit = None
    return dict(machine=device_name(device), device=str(device), torch=torch.__version__,
                torch_geometric=torch_geometric.__version__,
                pyg_multihead_agg=pyg_multihead_agg.__version__,
                python=platform.python_version(), sampler=_sampler_name(), git_commit=commit)


def _sampler_name() -> Optional[str]:
    return "pyg-lib" if WITH_PYG_LIB else "torch-sparse" if WITH_TORCH_SPARSE else None


# ---------------------------------------------------------------------------
# Summary of several runs (scripts/ogb_device.sh)
# ---------------------------------------------------------------------------

def run_mode(args: argparse.Namespace) -> str:
    """The run's mode as the results name it: full batch, or mini-batch."""
    if args.fanout is None:
        return "full batch"
    return f"mini-batch {','.join(map(str, args.fanout))}, batch {args.batch_size}"


def summarise(results: str, stem: str) -> Dict[str, Any]:
    """STEM.json (every result in the folder `results`, history left out) and
    STEM.md (the machine, the synthetic graph, a table of the runs). A result
    file holds what --json writes, or {"row": ..., "status": ...} for a run
    that wrote none (timed out, crashed)."""
    rows = []
    for path in sorted(glob.glob(os.path.join(results, "*.json"))):
        with open(path) as f:
            row = json.load(f)
        row.pop("history", None)
        row.setdefault("row", os.path.splitext(os.path.basename(path))[0])
        if isinstance(row.get("args"), list) and "conv" not in row:
            # A run that wrote no result: its settings from its arguments.
            args = parse_args(row["args"])
            row.update(conv=args.conv, layer=args.layer, compile=args.compile, amp=args.amp,
                       mode=run_mode(args))
        rows.append(row)
    if not rows:
        raise SystemExit(f"error: no result files (*.json) in {results}")
    described = [r for r in rows if "machine" in r]
    meta = {k: described[-1][k] for k in ("machine", "torch", "torch_geometric",
                                          "pyg_multihead_agg", "python", "sampler",
                                          "git_commit")} if described else {}
    if described:
        # The runs may come from several calls: every commit (each row names
        # its own), and the sampler of the mini-batch runs, the ones it serves.
        commits = [r["git_commit"] for r in described if r.get("git_commit")]
        meta["git_commit"] = ", ".join(dict.fromkeys(commits)) or None
        sampled = [r for r in described if str(r.get("mode", "")).startswith("mini")]
        if sampled:
            meta["sampler"] = sampled[-1]["sampler"]
    meta["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    graph = next((r["synthetic"] for r in rows if r.get("synthetic")), None)
    writes = [r for r in rows if r.get("kind") == "write"]
    if writes and writes[-1].get("synthetic"):
        meta["synthetic_write_s"] = writes[-1]["synthetic"]["write_s"]
        meta["synthetic_write_host_peak_rss"] = _fmt_bytes(writes[-1]["host_peak_rss_bytes"])
    lines = [f"# {rows[0].get('dataset', 'OGB')} training runs", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    if graph:
        p, s = graph["params"], graph["stats"]
        lines.append(f"- synthetic graph: {p['num_nodes']:,} nodes, {s['num_pairs']:,} "
                     f"undirected edges, homophily {s['homophily']:.3f}, {p['num_classes']} "
                     f"classes, {p['num_features']} features (noise {p['feature_noise']}), "
                     f"max degree {s['max_degree']:,}, seed {p['seed']}")
    header = ["row", "conv", "layer", "compile", "amp", "mode", "status", "epochs",
              "s / epoch (median)", "of which waiting for batches", "eval s", "peak GPU memory",
              "best val acc", "test acc", "commit"]
    table = [header, ["---"] * len(header)]
    for r in rows:
        if r.get("kind") == "write":
            continue
        ok = r.get("epoch_ms_median") is not None
        best = r.get("best") or {}
        table.append([
            r["row"], r.get("conv", ""), r.get("layer", ""), "yes" if r.get("compile") else "",
            r.get("amp") or "", r.get("mode", ""), r.get("status", ""), str(r.get("epochs", "")),
            f"{r['epoch_ms_median'] / 1e3:.3f}" if ok else "",
            f"{r['wait_ms_median'] / 1e3:.3f}" if ok and r.get("mode", "").startswith("mini")
            else "",
            f"{r['eval_ms_median'] / 1e3:.3f}" if r.get("eval_ms_median") else "",
            _fmt_bytes(r.get("peak_memory_bytes")),
            f"{best['val_acc']:.4f}" if best.get("val_acc", -1) >= 0 else "",
            f"{best['test_acc']:.4f}" if "test_acc" in best else "", r.get("git_commit") or ""])
    lines += ["", *("| " + " | ".join(row) + " |" for row in table), ""]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines))
    summary = dict(meta=meta, rows=rows)
    _write_json(stem + ".json", summary)
    print(f"wrote {stem}.md and {stem}.json ({len(rows)} results)")
    return summary


def _fmt_bytes(n: Optional[int]) -> str:
    return "" if n is None else f"{n / 2 ** 30:.1f} GiB"


if __name__ == "__main__":
    main()
