"""Edges whose attention logit changes leaky_relu branch between float32 and
float64, in the rows that ``bench_layer.py`` checks.

The gradient of ``att_dst`` is a sum over each destination row of
``alpha * (dot - delta) * leaky_relu'(z)``; without the kink it would be 0
exactly (a softmax does not change when every logit of a row shifts). Its
true value thus comes only from the edges on the negative side of the kink,
and one edge whose float32 ``z`` lands on the other side of 0 than the
float64 reference moves it by a whole term. This script counts such edges
for the two ways the layer computes the scores: folded (``x_in @ fold``, the
default of ``pyg_multihead_agg.nn.GATConv``) and PyG's products
(``(x_proj * att).sum(-1)``, ``fold_scores = False``), on the graph, layer,
inputs and checked rows of ``bench_layer.py`` (same seeds).

    python tools/score_kink_flips.py --shape reddit-like
"""
import argparse
import os
import sys

import torch
from torch_geometric.nn import GATConv as PyGGATConv

# common.py, graphs.py and bench_layer.py live in benchmarks/.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import common  # noqa: E402
from bench_layer import IN_CHANNELS  # noqa: E402
from graphs import make_graph  # noqa: E402


def scores(x, weight, atts, heads, channels, dtype, fold):
    """(s_src, s_dst), [N, H] each, in ``dtype``, folded or as PyG's products."""
    x, weight = x.to(dtype), weight.to(dtype)
    atts = [a.view(heads, channels).to(dtype) for a in atts]
    if fold:
        w = weight.view(heads, channels, -1)
        return tuple(x @ torch.einsum("hcf,hc->fh", w, a) for a in atts)
    proj = (x @ weight.t()).view(-1, heads, channels)
    return tuple((proj * a).sum(-1) for a in atts)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="reddit-like")
    parser.add_argument("--check-limit", type=int, default=1 << 20,
                        help="bench_layer.py's --check-limit (edges checked)")
    args = parser.parse_args()

    g = make_graph(args.shape, self_loops=True)
    n, heads, channels = g.num_nodes, g.heads, g.channels
    # bench_layer.bench_dtype's layer and inputs, and reference()'s rows
    torch.manual_seed(0)
    pyg = PyGGATConv(IN_CHANNELS, channels, heads=heads, add_self_loops=False)
    x = torch.randn(n, IN_CHANNELS, generator=torch.Generator().manual_seed(0))
    in_deg = g.rowptr.diff().long()
    sample = n if g.num_edges <= args.check_limit else max(1, n * args.check_limit // g.num_edges)
    rows = common.check_subset(n, sample, x.device, seed=1, always=in_deg.topk(min(64, n)).indices)
    src, dst = g.edge_index()
    checked = torch.ones_like(dst, dtype=torch.bool)
    if rows is not None:
        keep = torch.zeros(n, dtype=torch.bool)
        keep[rows] = True
        checked = keep[dst]

    weight, atts = pyg.lin.weight.detach(), (pyg.att_src.detach(), pyg.att_dst.detach())
    s64, d64 = scores(x, weight, atts, heads, channels, torch.float64, fold=False)
    z64 = s64[src[checked]] + d64[dst[checked]]
    print(f"{g}; {int(checked.sum()):,} checked edges x {heads} heads")
    for fold in (True, False):
        s32, d32 = scores(x, weight, atts, heads, channels, torch.float32, fold)
        z32 = s32[src[checked]] + d32[dst[checked]]
        flips = (z32 > 0) != (z64 > 0)
        at = ", ".join(f"{v:.1e}" for v in z64[flips].abs().tolist()[:8])
        print(f"{'folded' if fold else 'products':9s} scores: {int(flips.sum())} edge-heads on "
              f"the other side of the kink" + (f" (|z| in float64: {at})" if at else ""))


if __name__ == "__main__":
    main()
