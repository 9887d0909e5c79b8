"""Epoch time of the Cora GAT (examples/train_cora.py's model and settings)
for every adjacency type, timed round-robin in one process so that load on
the machine hits all variants alike. Prints the median epoch and its ratio
to PyG's GATConv with a plain edge_index, and writes them to
benchmarks/reference/cora_epoch_<device>.{json,md,png} (see --out, --tag).

    python benchmarks/bench_cora_epoch.py --root DATA [--device cpu] [--rounds 30]

With --compile (the default on CUDA) PyG's model and ours on the plain
edge_index also run under torch.compile, default mode and
mode="reduce-overhead" (CUDA graphs), each checked for the same loss as its
eager model; a variant that fails to compile is reported, not fatal.
"""
import argparse
import functools
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import torch_geometric

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from train_cora import GAT, build_adj, load_dataset, paper_settings, synchronize  # noqa: E402

from pyg_multihead_agg.nn import GATConv  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# (name, --layer, --adj of examples/train_cora.py). "csr unfused": our layer
# with fused_attention=False (PyG's softmax and dropout, then our aggregation
# operator) on the csr adjacency.
# "no attention": every layer reduced to its projection, bias and head merge,
# the rest of the epoch unchanged: the part of the epoch that no attention
# implementation removes, and so the floor of every other row.
VARIANTS = [("pyg edge_index", "pyg", "edge_index"), ("ours edge_index", "ours", "edge_index"),
            ("ours edge_index_sorted", "ours", "edge_index_sorted"), ("ours csr", "ours", "csr"),
            ("ours sparse_tensor", "ours", "sparse_tensor"), ("ours csr unfused", "ours", "csr"),
            ("no attention", "none", "edge_index")]
# Compiled rows (--compile): (name suffix, torch.compile mode) for the models
# of these variants.
COMPILED = [("compiled", None), ("compiled, reduce-overhead", "reduce-overhead")]
COMPILED_OF = ("pyg edge_index", "ours edge_index")
PEER = "pyg edge_index"
LAYERS = {"pyg": "PyG GATConv", "ours": "pyg_multihead_agg GATConv",
          "none": "projection, bias and head merge only"}


class NoAttention(torch.nn.Module):
    """A GAT layer without its attention: the projection, the head merge and
    the bias (the epoch's floor; the adjacency is ignored)."""

    def __init__(self, in_channels: int, out_channels: int, heads: int = 1,
                 concat: bool = True, dropout: float = 0.0):
        super().__init__()
        self.heads, self.out_channels, self.concat = heads, out_channels, concat
        self.lin = torch.nn.Linear(in_channels, heads * out_channels, bias=False)
        self.bias = torch.nn.Parameter(torch.zeros(heads * out_channels if concat
                                                   else out_channels))

    def forward(self, x, adj):
        h = self.lin(x).view(-1, self.heads, self.out_channels)
        return (h.flatten(1) if self.concat else h.mean(dim=1)) + self.bias


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="~/.cache/pyg_multihead_agg/data")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--epochs-per-round", type=int, default=3)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="also the compiled rows (default: on CUDA only)")
    common.add_output_args(parser)
    args = parser.parse_args()
    device = torch.device(args.device)
    compile_rows = device.type == "cuda" if args.compile is None else args.compile
    dataset = load_dataset(args.root, "Cora")
    data = dataset[0].to(device)
    settings = paper_settings("Cora")
    chosen = [v for v in VARIANTS
              if v[2] != "sparse_tensor" or torch_geometric.typing.WITH_TORCH_SPARSE]
    if compile_rows:
        chosen += [(f"{kind} {suffix}", layer, adj_kind) for suffix, _ in COMPILED
                   for kind, layer, adj_kind in VARIANTS if kind in COMPILED_OF]
    modes = {f"{kind} {suffix}": mode for suffix, mode in COMPILED for kind in COMPILED_OF}
    variants = {}
    for kind, layer, adj_kind in chosen:
        conv = {"pyg": torch_geometric.nn.GATConv, "ours": GATConv, "none": NoAttention}[layer]
        if kind.endswith("unfused"):
            conv = functools.partial(GATConv, fused_attention=False)
        torch.manual_seed(0)
        model = GAT(conv, dataset.num_features, settings["hidden_channels"],
                    dataset.num_classes, settings["heads"], settings["out_heads"],
                    settings["dropout"]).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=settings["lr"],
                                     weight_decay=settings["weight_decay"])
        step_model = (torch.compile(model, mode=modes[kind]) if kind in modes else model)
        variants[kind] = (model, step_model, optimizer, build_adj(data, adj_kind, device))

    def epoch(kind: str) -> float:
        model, step_model, optimizer, adj = variants[kind]
        synchronize(device)
        start = time.perf_counter()
        if modes.get(kind) == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # a new step: frees the last one's outputs
        model.train()
        optimizer.zero_grad()
        out = step_model(data.x, adj)
        F.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
        optimizer.step()
        model.eval()
        with torch.no_grad():
            step_model(data.x, adj).argmax(dim=-1)
        synchronize(device)
        return (time.perf_counter() - start) * 1e3

    def loss_of(kind: str) -> float:
        """The training loss of the variant's model on its current parameters
        with dropout off (the same for a compiled model and its eager one)."""
        model, step_model, _, adj = variants[kind]
        model.eval()
        with torch.no_grad():
            out = step_model(data.x, adj)
            return float(F.cross_entropy(out[data.train_mask], data.y[data.train_mask]))

    rows = {kind: common.Row("cora", "float32", kind, "epoch") for kind, _, _ in chosen}

    def warm_up(row: common.Row) -> None:
        first = time.perf_counter()
        epoch(row.method)  # compiles a compiled variant: its training and evaluation graphs
        row.extra["first_epoch_s"] = round(time.perf_counter() - first, 2)
        base = row.method.split(" compiled")[0]
        if row.method in modes:  # same parameters as its eager model: the same loss
            variants[row.method][0].load_state_dict(variants[base][0].state_dict())
            got, want = loss_of(row.method), loss_of(base)
            row.rel_err = abs(got - want) / abs(want)
            row.check = "ok" if row.rel_err < 1e-4 else "FAIL"
            if row.check != "ok":
                raise AssertionError(f"compiled loss {got} against eager {want}")

    for kind in rows:
        common.run_guarded(rows[kind], warm_up, device)
    common.take_turns([(rows[kind], kind) for kind in rows], args.rounds,
                      lambda row, kind, _: row.times_ms.extend(
                          epoch(kind) for _ in range(args.epochs_per_round)), device)
    times = {kind: rows[kind].times_ms for kind in rows}
    base = statistics.median(times[PEER])
    meta = common.environment(device, sys.argv)
    meta["rounds"] = f"{args.rounds} rounds x {args.epochs_per_round} epochs"
    cells = []
    for kind, layer, _ in chosen:
        row = rows[kind]
        layer = LAYERS[layer] + (" (fused_attention=False)" if kind.endswith("unfused") else "")
        row.extra["layer"] = layer
        if row.status == "ok":
            row.ms = statistics.median(times[kind])
            cells.append([kind, layer, f"{row.ms:.2f} ms", f"{base / row.ms:.2f}x"])
        else:
            cells.append([kind, layer, row.status[:60], "-"])
    rows = list(rows.values())
    common.add_speedups(rows, [PEER])
    text = common.markdown_table(["variant", "layer", "median epoch", "vs PyG"], cells)
    notes = (f"One epoch: a training step (forward, loss, backward, Adam) and an evaluation "
             f"forward of examples/train_cora.py's model, median over {meta['rounds']}, the "
             f"variants interleaved round-robin. vs PyG: PyG's GATConv on a plain edge_index "
             f"over this row. 'no attention': the same epoch with each layer cut to its "
             f"projection, bias and head merge, the floor of every row (PyG over it bounds "
             f"the speed-up any attention implementation can reach)."
             + (" 'compiled': the model under torch.compile (default mode, or "
                "mode='reduce-overhead': CUDA graphs), its loss checked against the eager "
                "model's on the same parameters (rel err); first_epoch_s in the JSON is its "
                "compile." if compile_rows else ""))
    failures = common.failure_notes(rows)
    if failures:
        notes += "\n\nRows that did not run:\n" + failures
    paths = common.write_results(args.out, common.result_stem("cora_epoch", device, args.tag),
                                 "Cora GAT epoch", meta, rows, text, notes, chart_peers=[PEER])
    print(f"{common.summary_line(meta)}, {meta['rounds']}")
    print(text)
    print("written: " + ", ".join(paths))


if __name__ == "__main__":
    main()
