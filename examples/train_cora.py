r"""Train the GAT of Veličković et al. (ICLR 2018), or its GATv2 variant (Brody
et al., ICLR 2022), on Cora, CiteSeer or PubMed.

The model and settings are the paper's: two GAT layers, 8 heads x 8 hidden
channels with ELU, dropout 0.6 on the inputs of both layers and on the
attention coefficients, an output layer of 1 head (8 heads, averaged, on
PubMed), Adam with lr 0.005 and weight decay 5e-4 (0.01 and 0.001 on PubMed),
up to 1000 epochs with early stopping on the validation loss (patience 100).
The reported test accuracy is the one at the epoch of lowest validation loss.

``--conv`` picks the layer family: ``gat`` (``GATConv``, the default),
``gatv2`` (``GATv2Conv``) or ``transformer`` (``TransformerConv``): the same
model and settings, with each layer's attention.
``--layer`` picks whose layer: ``ours`` (:mod:`pyg_multihead_agg.nn`, the
default) or ``pyg`` (:mod:`torch_geometric.nn`, the baseline).
``--adj`` picks the adjacency, built once before training:

- ``edge_index``: the dataset's plain ``edge_index`` (the default),
- ``edge_index_sorted``: a PyG ``EdgeIndex`` sorted by column,
- ``sparse_tensor``: a torch_sparse ``SparseTensor`` adj_t,
- ``csr``: a ``torch.sparse_csr`` adj_t.

With ``--compile`` our layer is given the adjacency prepared once by
:func:`pyg_multihead_agg.prepare_adjacency`, so that the compiled model does
not convert the graph every step.

Example::

    python examples/train_cora.py --runs 10 --json cora.json --plot cora.png
    python examples/train_cora.py --layer pyg --runs 10   # the baseline
    python examples/train_cora.py --conv gatv2 --runs 10
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
import torch_geometric
import torch_geometric.transforms as T
from torch import Tensor
from torch_geometric import EdgeIndex, seed_everything
from torch_geometric.datasets import Planetoid

import pyg_multihead_agg
from pyg_multihead_agg.nn import GATConv, GATv2Conv, TransformerConv

ADJ_CHOICES = ("edge_index", "edge_index_sorted", "sparse_tensor", "csr")
# The layer class of each --conv (layer family) and --layer (ours, or PyG's baseline).
CONVS = {"gat": {"ours": GATConv, "pyg": torch_geometric.nn.GATConv},
         "gatv2": {"ours": GATv2Conv, "pyg": torch_geometric.nn.GATv2Conv},
         "transformer": {"ours": TransformerConv, "pyg": torch_geometric.nn.TransformerConv}}
LAYERS = ("ours", "pyg")
DATASETS = ("Cora", "CiteSeer", "PubMed")
DEFAULT_ROOT = os.path.join("~", ".cache", "pyg_multihead_agg", "data")
# Epochs of each run left out of the timing median (allocator warm-up, torch.compile).
WARMUP_EPOCHS = 3


def paper_settings(dataset: str) -> Dict[str, Any]:
    """Hyper-parameters of the GAT paper (section 3.3) for a Planetoid dataset."""
    settings = dict(hidden_channels=8, heads=8, out_heads=1, dropout=0.6, lr=0.005,
                    weight_decay=5e-4)
    if dataset == "PubMed":
        settings.update(out_heads=8, lr=0.01, weight_decay=0.001)
    return settings


class GAT(torch.nn.Module):
    def __init__(self, conv: type, in_channels: int, hidden_channels: int, out_channels: int,
                 heads: int, out_heads: int, dropout: float):
        super().__init__()
        self.dropout = dropout
        self.conv1 = conv(in_channels, hidden_channels, heads=heads, dropout=dropout)
        self.conv2 = conv(hidden_channels * heads, out_channels, heads=out_heads, concat=False,
                          dropout=dropout)

    def forward(self, x: Tensor, adj: Any) -> Tensor:
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = F.elu(self.conv1(x, adj))
        x = F.dropout(x, p=self.dropout, training=self.training)
        return self.conv2(x, adj)


def load_dataset(root: str, name: str) -> Planetoid:
    root = os.path.expanduser(root)
    try:
        return Planetoid(root, name, transform=T.NormalizeFeatures())
    except Exception as err:  # the download's error type depends on the PyG version
        raise RuntimeError(
            f"could not load {name} from --root {root!r}: {err}. Offline, point --root at a "
            f"folder that holds {name}/raw/ (the Planetoid files ind.{name.lower()}.*)") from err


def build_adj(data, kind: str, device: torch.device) -> Any:
    """The adjacency of :obj:`data` as :obj:`kind`, with its caches filled, on :obj:`device`."""
    data = data.to(device)
    num_nodes = data.num_nodes
    if kind == "edge_index":
        return data.edge_index
    if kind == "edge_index_sorted":
        adj = EdgeIndex(data.edge_index, sparse_size=(num_nodes, num_nodes))
        adj = adj.sort_by("col").values
        adj.fill_cache_()  # the CSC and CSR of the graph, built here once
        return adj
    layout = torch.sparse_csr if kind == "csr" else None
    # ToSparseTensor builds adj_t (rows = destinations) and fills torch_sparse's caches.
    return T.ToSparseTensor(layout=layout)(data.clone()).adj_t


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return platform.processor() or platform.machine() or device.type


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_run(data, adj: Any, conv: type, num_classes: int, settings: Dict[str, Any],
              seed: int, device: torch.device, compile: bool, epochs: int, patience: int,
              progress: bool, desc: str, log_every: int = 0) -> Dict[str, Any]:
    """One training run. ``progress`` shows a tqdm bar; ``log_every`` N > 0
    prints a line every N epochs instead (for logs that are not a terminal)."""
    from tqdm.auto import tqdm

    seed_everything(seed)
    model = GAT(conv, data.num_features, settings["hidden_channels"], num_classes,
                settings["heads"], settings["out_heads"], settings["dropout"]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings["lr"],
                                 weight_decay=settings["weight_decay"])
    step_model = torch.compile(model) if compile else model
    masks = (data.train_mask, data.val_mask, data.test_mask)

    history: Dict[str, List[float]] = {k: [] for k in (
        "train_loss", "val_loss", "train_acc", "val_acc", "test_acc", "epoch_ms")}
    best_val_loss, best_epoch, test_acc, bad_epochs = float("inf"), 0, 0.0, 0
    bar = tqdm(range(1, epochs + 1), desc=desc, disable=not progress, leave=False)
    for epoch in bar:
        synchronize(device)
        start = time.perf_counter()

        model.train()
        optimizer.zero_grad()
        out = step_model(data.x, adj)
        loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        loss.backward()
        optimizer.step()

        model.eval()
        with torch.no_grad():
            out = step_model(data.x, adj)
            val_loss = F.cross_entropy(out[data.val_mask], data.y[data.val_mask])
            pred = out.argmax(dim=-1)
            accs = [(pred[m] == data.y[m]).float().mean() for m in masks]

        synchronize(device)
        history["epoch_ms"].append((time.perf_counter() - start) * 1e3)
        # .item() after the timer: the host syncs are part of the logging, not the epoch.
        for key, value in zip(("train_loss", "val_loss", "train_acc", "val_acc", "test_acc"),
                              (loss, val_loss, *accs), strict=True):
            history[key].append(value.item())

        if history["val_loss"][-1] < best_val_loss:
            best_val_loss, best_epoch, bad_epochs = history["val_loss"][-1], epoch, 0
            test_acc = history["test_acc"][-1]
        else:
            bad_epochs += 1
        bar.set_postfix(loss=f"{history['train_loss'][-1]:.3f}",
                        val_loss=f"{history['val_loss'][-1]:.3f}",
                        test_acc=f"{test_acc:.3f}", refresh=False)
        if log_every > 0 and epoch % log_every == 0:
            recent = history["epoch_ms"][-log_every:]
            print(f"{desc} epoch {epoch}: loss {history['train_loss'][-1]:.3f}, "
                  f"val loss {history['val_loss'][-1]:.3f}, "
                  f"val acc {100 * history['val_acc'][-1]:.1f}%, "
                  f"test acc at best val loss {100 * test_acc:.1f}%, "
                  f"{statistics.median(recent):.2f} ms/epoch", flush=True)
        if bad_epochs >= patience:
            break
    bar.close()

    times = history["epoch_ms"]
    timed = times[WARMUP_EPOCHS:] if len(times) > WARMUP_EPOCHS else times
    return dict(seed=seed, test_acc=test_acc, best_epoch=best_epoch,
                best_val_loss=best_val_loss, epochs=len(times),
                epoch_ms_median=statistics.median(timed), history=history)


def plot_history(history: Dict[str, List[float]], best_epoch: int, title: str,
                 path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = range(1, len(history["train_loss"]) + 1)
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    ax_loss.plot(epochs, history["train_loss"], label="train (with dropout)")
    ax_loss.plot(epochs, history["val_loss"], label="validation")
    ax_loss.set_ylabel("cross-entropy loss")
    ax_acc.plot(epochs, history["train_acc"], label="train")
    ax_acc.plot(epochs, history["val_acc"], label="validation")
    ax_acc.set_ylabel("accuracy")
    for ax in (ax_loss, ax_acc):
        ax.axvline(best_epoch, color="grey", linestyle="--", linewidth=1,
                   label=f"lowest validation loss (epoch {best_epoch})")
    save_epoch_figure(fig, (ax_loss, ax_acc), title, path)


def save_epoch_figure(fig, axes, title: str, path: str) -> None:
    """Labels, grids and legends of per-epoch curves; writes the figure."""
    import matplotlib.pyplot as plt
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--dataset", default="Cora", choices=DATASETS)
    parser.add_argument("--root", default=DEFAULT_ROOT,
                        help="data folder; Planetoid reads (or downloads) <root>/<dataset>/raw")
    parser.add_argument("--conv", default="gat", choices=tuple(CONVS),
                        help="layer family: gat (GATConv), gatv2 (GATv2Conv) or transformer "
                        "(TransformerConv)")
    parser.add_argument("--layer", default="ours", choices=LAYERS,
                        help="ours: pyg_multihead_agg.nn's layer; pyg: PyG's (baseline)")
    parser.add_argument("--adj", default="edge_index", choices=ADJ_CHOICES,
                        help="adjacency type")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=1, help="runs with seeds seed..seed+runs-1")
    parser.add_argument("--epochs", type=int, default=1000, help="most epochs per run")
    parser.add_argument("--patience", type=int, default=100,
                        help="stop after this many epochs without a lower validation loss")
    parser.add_argument("--lr", type=float, default=None, help="default: the paper's")
    parser.add_argument("--weight-decay", type=float, default=None, help="default: the paper's")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the results here")
    parser.add_argument("--plot", default=None, metavar="PATH",
                        help="PNG of the first run's loss and accuracy curves")
    parser.add_argument("--quiet", action="store_true", help="print the summary line only")
    parser.add_argument("--log-every", type=int, default=50, metavar="N",
                        help="where stderr is not a terminal (no progress bar), print a line "
                             "every N epochs; 0: none")
    args = parser.parse_args(argv)
    for name in ("runs", "epochs", "patience"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.log_every < 0:
        parser.error(f"--log-every must be at least 0, got {args.log_every}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Runs the example; returns what ``--json`` writes plus each run's ``history``."""
    args = parse_args(argv)
    # PyG builds torch.sparse_csr adjacencies through torch's beta API, which says so on use.
    for message in ("Sparse CSR tensor support is in beta", "Sparse invariant checks"):
        warnings.filterwarnings("ignore", message=f".*{message}.*", category=UserWarning)
    device = torch.device(args.device)
    settings = paper_settings(args.dataset)
    if args.lr is not None:
        settings["lr"] = args.lr
    if args.weight_decay is not None:
        settings["weight_decay"] = args.weight_decay
    conv = CONVS[args.conv][args.layer]

    dataset = load_dataset(args.root, args.dataset)
    data = dataset[0].to(device)
    adj = build_adj(data, args.adj, device)
    if args.compile and args.layer == "ours":
        adj = pyg_multihead_agg.prepare_adjacency(adj, num_nodes=data.num_nodes)
    progress = not args.quiet and sys.stderr.isatty()
    log_every = 0 if args.quiet or progress else args.log_every

    runs = []
    for i, seed in enumerate(range(args.seed, args.seed + args.runs)):
        run = train_run(data, adj, conv, dataset.num_classes, settings, seed, device,
                        args.compile, args.epochs, args.patience, progress,
                        desc=f"run {i + 1}/{args.runs} (seed {seed})", log_every=log_every)
        runs.append(run)
        if not args.quiet:
            print(f"run {i + 1}/{args.runs} seed {seed}: test acc {100 * run['test_acc']:.2f}% "
                  f"at epoch {run['best_epoch']} ({run['epochs']} epochs), "
                  f"{run['epoch_ms_median']:.2f} ms/epoch", flush=True)

    accs = [run["test_acc"] for run in runs]
    all_times = [t for run in runs
                 for t in (run["history"]["epoch_ms"][WARMUP_EPOCHS:]
                           if run["epochs"] > WARMUP_EPOCHS else run["history"]["epoch_ms"])]
    result = dict(
        test_acc_mean=statistics.fmean(accs),
        test_acc_std=statistics.stdev(accs) if len(accs) > 1 else 0.0,
        epoch_ms_median=statistics.median(all_times),
        runs=[{k: v for k, v in run.items() if k != "history"} for run in runs],
        settings=dict(dataset=args.dataset, layer=args.layer, adj=args.adj,
                      conv=f"{conv.__module__}.{conv.__name__}", conv_family=args.conv,
                      device=str(device), compile=args.compile, seed=args.seed,
                      num_runs=args.runs, max_epochs=args.epochs, patience=args.patience,
                      warmup_epochs_untimed=WARMUP_EPOCHS, **settings),
        versions=dict(torch=torch.__version__, torch_geometric=torch_geometric.__version__,
                      pyg_multihead_agg=pyg_multihead_agg.__version__,
                      python=platform.python_version(), device=device_name(device)),
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.plot:
        model = "GAT" if args.conv == "gat" else "GATv2"
        title = (f"{model} on {args.dataset}, --layer {args.layer} --adj {args.adj}, "
                 f"seed {args.seed}")
        plot_history(runs[0]["history"], runs[0]["best_epoch"], title, args.plot)
    print(f"{args.dataset} --conv {args.conv} --layer {args.layer} --adj {args.adj}"
          f"{' --compile' if args.compile else ''} on "
          f"{result['versions']['device']}: test accuracy {100 * result['test_acc_mean']:.2f} "
          f"± {100 * result['test_acc_std']:.2f}% over {args.runs} run(s), "
          f"median epoch {result['epoch_ms_median']:.2f} ms", flush=True)
    result["runs"] = runs
    return result


if __name__ == "__main__":
    main()
