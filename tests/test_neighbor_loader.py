"""Mini-batch training on NeighborLoader subgraphs through the fused layer."""
import pytest
import torch
import torch.nn.functional as F
import torch_geometric.transforms as T
from torch_geometric import EdgeIndex
from torch_geometric.data import Data
from torch_geometric.typing import WITH_PYG_LIB, WITH_TORCH_SPARSE

from pyg_multihead_agg.nn import GATConv

pytestmark = pytest.mark.skipif(not (WITH_PYG_LIB or WITH_TORCH_SPARSE),
                                reason="NeighborLoader needs pyg-lib or torch-sparse to sample")


class GAT(torch.nn.Module):
    def __init__(self, in_channels, hidden, out_channels, heads=4):
        super().__init__()
        self.conv1 = GATConv(in_channels, hidden, heads=heads)
        self.conv2 = GATConv(hidden * heads, out_channels, heads=1)

    def forward(self, x, adj):
        return self.conv2(F.elu(self.conv1(x, adj)), adj)


def random_data(num_nodes=200, num_edges=1600, num_features=16, num_classes=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_nodes, num_features, generator=gen)
    # Labels a linear function of the features (and so learnable).
    y = (x @ torch.randn(num_features, num_classes, generator=gen)).argmax(-1)
    # Mostly same-label edges, so that neighbourhoods carry the signal too.
    dst = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    src = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    by_label = y.argsort()
    counts = torch.bincount(y, minlength=num_classes)
    start = torch.cumsum(counts, 0) - counts
    offset = torch.randint(0, 1 << 30, (num_edges,), generator=gen) % counts[y[dst]]
    same = by_label[start[y[dst]] + offset]
    src = torch.where(torch.rand(num_edges, generator=gen) < 0.8, same, src)
    edge_index = torch.stack([src, dst])
    return Data(x=x, y=y, edge_index=edge_index)


def to_adj(batch, kind):
    if kind == "sparse_tensor":
        return batch.adj_t
    if kind == "edge_index":  # as the loader gives it: the layer sorts it
        return batch.edge_index
    # Or sorted by destination by the caller.
    n = batch.num_nodes
    return EdgeIndex(batch.edge_index, sparse_size=(n, n)).sort_by("col").values


@pytest.mark.parametrize("kind", [
    pytest.param("sparse_tensor", marks=pytest.mark.skipif(
        not WITH_TORCH_SPARSE, reason="T.ToSparseTensor needs torch_sparse")),
    "edge_index",
    "edge_index_sorted",
])
def test_neighbor_loader_training(kind):
    from torch_geometric.loader import NeighborLoader

    torch.manual_seed(0)
    data = random_data()
    transform = T.ToSparseTensor() if kind == "sparse_tensor" else None
    loader = NeighborLoader(data, num_neighbors=[5, 5], batch_size=32, shuffle=True,
                            transform=transform)
    model = GAT(16, 8, 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)

    def epoch():
        losses = []
        for batch in loader:
            adj = to_adj(batch, kind)
            # Seeds come first; the rest of the subgraph feeds them.
            out = model(batch.x, adj)[:batch.batch_size]
            loss = F.cross_entropy(out, batch.y[:batch.batch_size])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            assert torch.isfinite(loss)
            losses.append(float(loss))
        return sum(losses) / len(losses)

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        first = epoch()
    names = {e.name for e in prof.events()}
    # The fused attention op (the layer's default), forward and backward.
    assert "pyg_multihead_agg::gat_attention" in names
    assert "pyg_multihead_agg::gat_attention_backward" in names
    for _ in range(4):
        last = epoch()
    assert last < 0.7 * first, (first, last)
