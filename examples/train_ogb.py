"""Node classification on OGB (ogbn-arxiv, ogbn-products) with a GAT built from
pyg_multihead_agg's layers: full-batch or NeighborLoader mini-batches, on one
process or several through torchrun (DDP: NCCL on GPUs, gloo on the CPU).

    python examples/train_ogb.py --dataset ogbn-arxiv --device cuda
    python examples/train_ogb.py --dataset ogbn-products --fanout 15,10 --batch-size 1024
    torchrun --nproc_per_node 2 examples/train_ogb.py --dataset ogbn-products \\
        --fanout 15,10 --batch-size 1024 --device cuda

The model follows the OGB leaderboard's GAT entries: GAT layers with a linear
skip connection, batch normalisation, ELU and dropout between them. The data
comes from the ogb package's PygNodePropPredDataset (downloaded to --root on
first use; ogbn-arxiv is made undirected, as those entries do). --synthetic N
first writes a random graph of N nodes in the dataset's own on-disk format
under --root, so that the same loader runs offline (tests, benchmarks).

Under DDP every rank trains on an equal share of the training nodes, drawn
afresh each epoch (so every rank runs the same number of steps), with its
own attention-dropout stream; the loss and accuracy are all-reduced; rank 0
evaluates on the whole graph and writes the checkpoint, the JSON and the PNG.
--layer pyg builds the same model from PyG's GATConv (the baseline).
"""
import argparse
import json
import os
import statistics
import time
from contextlib import nullcontext
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch_geometric
from torch import Tensor
from train_cora import save_epoch_figure  # (examples/, the script's folder, is on the path)

import pyg_multihead_agg.nn

DATASETS = ("ogbn-arxiv", "ogbn-products")
LAYERS = {"ours": pyg_multihead_agg.nn.GATConv, "pyg": torch_geometric.nn.GATConv}
DEFAULT_ROOT = os.path.join("~", ".cache", "pyg_multihead_agg", "ogb")


class GAT(torch.nn.Module):
    """GAT layers (heads concatenated, the last one averaged) with a linear
    skip connection each, batch normalisation, ELU and dropout between."""

    def __init__(self, conv: type, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int, heads: int, dropout: float, attn_dropout: float):
        super().__init__()
        self.dropout = dropout
        self.convs = torch.nn.ModuleList()
        self.skips = torch.nn.ModuleList()
        self.norms = torch.nn.ModuleList()
        for i in range(num_layers):
            last = i == num_layers - 1
            width = in_channels if i == 0 else hidden_channels * heads
            out = out_channels if last else hidden_channels * heads
            self.convs.append(conv(width, out_channels if last else hidden_channels,
                                   heads=1 if last else heads, concat=not last,
                                   dropout=attn_dropout))
            self.skips.append(torch.nn.Linear(width, out, bias=False))
            if not last:
                self.norms.append(torch.nn.BatchNorm1d(out))

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        x = F.dropout(x, p=self.dropout, training=self.training)
        for i, (conv, skip) in enumerate(zip(self.convs, self.skips, strict=True)):
            x = conv(x, edge_index) + skip(x)
            if i < len(self.norms):
                x = F.dropout(F.elu(self.norms[i](x)), p=self.dropout, training=self.training)
        return x


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------

def write_synthetic(root: str, name: str, num_nodes: int, avg_degree: int = 10,
                    num_features: Optional[int] = None, seed: int = 0) -> None:
    """A random graph in the on-disk format that ogb's PygNodePropPredDataset
    reads for `name` (raw CSVs, the split, the release marker), so that the
    real loader runs without a download. Labels depend on the features, so
    that a model can learn them. Features: as many as the real dataset's
    (128 for ogbn-arxiv, 100 for ogbn-products) unless `num_features`."""
    import numpy as np
    import pandas as pd

    folder = os.path.join(os.path.expanduser(root), name.replace("-", "_"))
    meta = _master(name)
    gen = np.random.default_rng(seed)
    if num_features is None:
        num_features = {"ogbn-arxiv": 128, "ogbn-products": 100}[name]
    num_edges = num_nodes * avg_degree
    edge = gen.integers(0, num_nodes, size=(num_edges, 2))
    feat = gen.standard_normal((num_nodes, num_features)).astype(np.float32)
    num_classes = int(meta["num classes"])
    logits = feat @ gen.standard_normal((num_features, num_classes))
    label = (logits + 0.5 * gen.standard_normal((num_nodes, num_classes))).argmax(1)
    order = gen.permutation(num_nodes)
    splits = np.split(order, [int(0.6 * num_nodes), int(0.8 * num_nodes)])
    raw = os.path.join(folder, "raw")
    split = os.path.join(folder, "split", meta["split"])
    os.makedirs(raw, exist_ok=True)
    os.makedirs(split, exist_ok=True)

    def write(path: str, values, fmt: Optional[str] = None) -> None:
        # (gzip's fastest level: the default level takes 2.7x as long here)
        pd.DataFrame(values).to_csv(path, header=False, index=False, float_format=fmt,
                                    compression={"method": "gzip", "compresslevel": 1})

    write(os.path.join(raw, "edge.csv.gz"), edge)
    write(os.path.join(raw, "num-node-list.csv.gz"), [num_nodes])
    write(os.path.join(raw, "num-edge-list.csv.gz"), [num_edges])
    write(os.path.join(raw, "node-feat.csv.gz"), feat, "%.6f")
    write(os.path.join(raw, "node-label.csv.gz"), label)
    if meta["additional node files"] != "None":
        for extra in meta["additional node files"].split(","):
            write(os.path.join(raw, f"{extra}.csv.gz"), gen.integers(2000, 2020, size=num_nodes))
    for part, idx in zip(("train", "valid", "test"), splits, strict=True):
        write(os.path.join(split, f"{part}.csv.gz"), np.sort(idx))
    with open(os.path.join(folder, f"RELEASE_v{meta['version']}.txt"), "w") as f:
        f.write("synthetic\n")


def _master(name: str) -> Dict[str, str]:
    import ogb.nodeproppred
    import pandas as pd
    path = os.path.join(os.path.dirname(ogb.nodeproppred.__file__), "master.csv")
    return pd.read_csv(path, index_col=0, keep_default_na=False)[name].to_dict()


def load(name: str, root: str):
    """(data, split_idx, num_classes) from ogb's PygNodePropPredDataset."""
    from ogb.nodeproppred import PygNodePropPredDataset
    from torch_geometric.utils import to_undirected

    root = os.path.expanduser(root)
    # ogb saves and loads its processed file with torch.load; it holds PyG
    # data objects, which torch >= 2.6 loads only when allowed.
    torch.serialization.add_safe_globals(_pyg_data_classes())
    dataset = PygNodePropPredDataset(name, root=root)
    data = dataset[0]
    data.y = data.y.view(-1)
    if name == "ogbn-arxiv":
        data.edge_index = to_undirected(data.edge_index, num_nodes=data.num_nodes)
    return data, dataset.get_idx_split(), dataset.num_classes


def _pyg_data_classes() -> List[type]:
    from torch_geometric.data.data import Data, DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import GlobalStorage
    return [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage]


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
    `sampled` (from sampling())."""
    if sampled is None:
        yield data.x, data.edge_index, data.y[nodes], nodes
        return
    from torch_geometric.loader import NeighborLoader
    cpu_data, sampler = sampled
    loader = NeighborLoader(cpu_data, num_neighbors=args.fanout, input_nodes=nodes.cpu(),
                            batch_size=args.batch_size, shuffle=True, neighbor_sampler=sampler)
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
                autocast, sampled=None) -> Tuple[float, float, int]:
    """One pass over this rank's nodes; (loss sum, correct, count) over all ranks."""
    model.train()
    loss_sum = correct = count = 0.0
    for x, edge_index, y, seeds in batches(data, nodes, args, device, sampled):
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            out = model(x, edge_index)[seeds]
            loss = F.cross_entropy(out.float(), y)
        loss.backward()
        optimizer.step()
        loss_sum += float(loss.detach()) * y.numel()
        correct += float((out.argmax(-1) == y).sum())
        count += y.numel()
    loss_sum, correct, count = all_sum([loss_sum, correct, count], device)
    return loss_sum, correct, int(count)


@torch.no_grad()
def evaluate(module, data, split_idx: Dict[str, Tensor], name: str,
             autocast) -> Dict[str, float]:
    """Full-graph inference: the validation loss and ogb's accuracy per split."""
    from ogb.nodeproppred import Evaluator
    module.eval()
    with autocast:
        out = module(data.x, data.edge_index).float()
    pred = out.argmax(-1, keepdim=True)
    evaluator = Evaluator(name)
    metrics = {f"{split}_acc": evaluator.eval({"y_true": data.y[idx].view(-1, 1),
                                                 "y_pred": pred[idx]})["acc"]
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
              ("epoch time (ms)", ("epoch_ms",)))
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4))
    for ax, (label, keys) in zip(axes, panels, strict=True):
        for key in keys:
            ax.plot(range(1, len(history[key]) + 1), history[key], label=key)
        ax.set_ylabel(label)
    save_epoch_figure(fig, axes, title, path)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="ogbn-arxiv", choices=DATASETS)
    parser.add_argument("--root", default=DEFAULT_ROOT, help="ogb's dataset folder")
    parser.add_argument("--synthetic", type=int, default=None, metavar="NODES",
                        help="first write a random graph of NODES nodes in the dataset's "
                             "format under --root (offline runs)")
    parser.add_argument("--conv", default="gat", choices=["gat"])
    parser.add_argument("--layer", default="ours", choices=list(LAYERS),
                        help="our fused GATConv or PyG's (the baseline)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=64, help="channels per head")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--attn-dropout", type=float, default=0.1)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--fanout", default=None,
                        help="NeighborLoader fan-out per hop, e.g. 15,10 (default: full batch)")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--compile", action="store_true", help="torch.compile(dynamic=True)")
    parser.add_argument("--amp", choices=["bf16"], default=None,
                        help="autocast the forward to bfloat16")
    parser.add_argument("--checkpoint", default=None, help="saved after every epoch")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--json", default=None, help="write the history and results here")
    parser.add_argument("--png", default=None, help="plot loss, accuracy and epoch time here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.fanout is not None:
        args.fanout = [int(f) for f in args.fanout.split(",")]
    if args.resume and not args.checkpoint:
        parser.error("--resume needs --checkpoint")
    return args


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
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

    if args.synthetic and rank == 0:
        write_synthetic(args.root, args.dataset, args.synthetic, seed=args.seed)
    if world > 1:
        dist.barrier()
    data, split_idx, num_classes = load(args.dataset, args.root)
    sampled = sampling(data, args)  # on the CPU copy
    data = data.to(device)
    split_idx = {k: v.to(device) for k, v in split_idx.items()}

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    module = GAT(LAYERS[args.layer], data.num_features, args.hidden, num_classes,
                 args.layers, args.heads, args.dropout, args.attn_dropout).to(device)
    optimizer = torch.optim.Adam(module.parameters(), lr=args.lr)
    history: Dict[str, List[float]] = {k: [] for k in (
        "train_loss", "train_acc", "val_loss", "val_acc", "test_acc", "epoch_ms")}
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

    steps = 0
    bar = tqdm(range(start, args.epochs + 1), disable=args.quiet or rank != 0,
               desc=f"{args.dataset} {args.layer}")
    for epoch in bar:
        # Each rank its own attention-dropout (Philox) stream, reproducible
        # on resume.
        torch.manual_seed(args.seed * 100_003 + 1_000 * epoch + rank)
        nodes = rank_share(split_idx["train"], epoch, args.seed, rank, world)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        loss_sum, correct, count = train_epoch(model, optimizer, data, nodes, args, device,
                                               autocast, sampled)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        history["epoch_ms"].append((time.perf_counter() - t) * 1e3)
        history["train_loss"].append(loss_sum / count)
        history["train_acc"].append(correct / count)
        steps = -(-nodes.numel() // args.batch_size) if args.fanout else 1
        if rank == 0:
            metrics = evaluate(module, data, split_idx, args.dataset, autocast)
            for key in ("val_loss", "val_acc", "test_acc"):
                history[key].append(metrics[key])
            if metrics["val_acc"] > best["val_acc"]:
                best = dict(metrics, epoch=epoch)
            bar.set_postfix(loss=f"{history['train_loss'][-1]:.3f}",
                            val=f"{metrics['val_acc']:.3f}",
                            test=f"{best['test_acc']:.3f}", refresh=False)
            if args.checkpoint:
                torch.save({"model": module.state_dict(), "optimizer": optimizer.state_dict(),
                            "epoch": epoch, "history": history, "best": best},
                           args.checkpoint)
        if world > 1:
            dist.barrier()
    bar.close()

    times = history["epoch_ms"][1:] or history["epoch_ms"]
    result = dict(
        dataset=args.dataset, layer=args.layer, conv=args.conv, world_size=world,
        device=str(device), mode="full batch" if args.fanout is None else
        f"mini-batch {args.fanout}, batch {args.batch_size}",
        compile=args.compile, amp=args.amp, epochs=len(history["epoch_ms"]),
        epoch_ms_median=statistics.median(times) if times else None,
        steps_per_epoch=steps,
        batches_per_s=steps / statistics.median(times) * 1e3 if times else None,
        peak_memory_bytes=(torch.cuda.max_memory_allocated(device)
                           if device.type == "cuda" else None),
        best=best, history=history, args=vars(args))
    if rank == 0:
        print(f"{args.dataset} {args.layer} x{world}: best validation accuracy "
              f"{best['val_acc']:.4f} (epoch {best.get('epoch')}), test accuracy "
              f"{best.get('test_acc', float('nan')):.4f}; median epoch "
              f"{result['epoch_ms_median'] or float('nan'):.1f} ms")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        if args.png:
            plot(history, f"{args.dataset}, {args.layer} GAT, {world} process(es), "
                 f"{result['mode']}", args.png)
    return result


if __name__ == "__main__":
    main()
