"""Seeded synthetic graphs for the benchmarks (the recipe of ../shared/benchmarks.md).

Power-law destination degrees and skewed, popular sources, as real graphs have:

- destination degrees: ``u ~ U(0,1)``, ``w = u ** -0.5`` (Pareto, a = 2),
  ``deg = max(1, round(w / mean(w) * avg_deg))``, then shuffled over the rows;
- each edge's source: ``perm[floor(N * v**3)]`` with ``v ~ U(0,1)`` and
  ``perm`` a random permutation of the node ids (hubs spread over the ids).

Every random number comes from one ``torch.Generator().manual_seed(seed)`` on
the CPU, drawn in this order: ``u``, the row shuffle, ``perm``, ``v``. So a
graph is the same on every machine and device; only the (deterministic) sort
of the columns within each row runs on the target device, where it is fast.

The result is the CSR of PyG's ``adj_t``: rows are destinations, ``col`` holds
sources, columns sorted within each row (as a coalesced ``SparseTensor`` or
ogb's CSR would be). Duplicate edges are kept (a multigraph), self-loops are
kept unless ``self_loops`` asks for exactly one per node (for GAT layers).
"""
import argparse
import time
from dataclasses import dataclass
from typing import Dict, Optional, Union

import torch
from torch import Tensor
from torch_geometric.index import index2ptr, ptr2index


@dataclass(frozen=True)
class Shape:
    name: str
    num_nodes: int
    avg_deg: int
    heads: int
    channels: int


SHAPES: Dict[str, Shape] = {s.name: s for s in (
    Shape("cora-like", 2_708, 5, 8, 8),
    Shape("arxiv-like", 169_343, 14, 4, 32),
    Shape("products-like", 2_449_029, 25, 4, 32),
    Shape("reddit-like", 232_965, 200, 4, 32),
)}


@dataclass
class Graph:
    """A square CSR graph by destination row, plus the head layout to bench it with."""
    name: str
    rowptr: Tensor  # [N + 1]
    col: Tensor  # [E], source of each edge, same dtype as rowptr
    num_nodes: int
    heads: int
    channels: int

    @property
    def num_edges(self) -> int:
        return self.col.numel()

    def row(self) -> Tensor:
        """The destination of every edge, int64 (the COO row of the CSR)."""
        return ptr2index(self.rowptr.long(), output_size=self.num_edges)

    def edge_index(self) -> Tensor:
        """PyG's ``[2, E]`` ``edge_index`` (sources first), int64, sorted by destination."""
        return torch.stack([self.col.long(), self.row()])

    def to(self, device: Union[str, torch.device]) -> "Graph":
        return Graph(self.name, self.rowptr.to(device), self.col.to(device), self.num_nodes,
                     self.heads, self.channels)

    def __repr__(self) -> str:
        deg = self.rowptr.diff()
        return (f"{self.name}: N={self.num_nodes:,} E={self.num_edges:,} H={self.heads} "
                f"D={self.channels} max in-degree={int(deg.max()):,} "
                f"index={str(self.col.dtype).replace('torch.', '')} on {self.col.device}")


def power_law_csr(num_nodes: int, avg_deg: float, *, seed: int = 0,
                  index_dtype: torch.dtype = torch.int64,
                  device: Union[str, torch.device] = "cpu", self_loops: bool = False,
                  sort: bool = True) -> "tuple[Tensor, Tensor]":
    """``(rowptr, col)`` of the seeded power-law graph (see the module docstring).

    With ``self_loops``, existing self-loops are dropped and one is added per
    node, as ``GATConv(add_self_loops=True)`` would do, so that the layer can
    run with ``add_self_loops=False`` on every adjacency type alike.
    """
    if index_dtype not in (torch.int32, torch.int64):
        raise ValueError(f"index_dtype must be torch.int32 or torch.int64, got {index_dtype}")
    gen = torch.Generator().manual_seed(seed)
    n = num_nodes
    # float64 so that u ** -0.5 and N * v**3 stay exact enough for N in the millions;
    # u == 0 has probability 2^-53 per draw, but must not give inf.
    u = torch.rand(n, generator=gen, dtype=torch.float64).clamp_min_(1e-300)
    w = u.pow_(-0.5)
    deg = (w / w.mean() * avg_deg).round_().clamp_min_(1).long()
    deg = deg[torch.randperm(n, generator=gen)]
    perm = torch.randperm(n, generator=gen)
    num_edges = int(deg.sum())
    v = torch.rand(num_edges, generator=gen, dtype=torch.float64)

    # The rest is deterministic arithmetic: do it where the graph will live.
    device = torch.device(device)
    deg, perm, v = deg.to(device), perm.to(device), v.to(device)
    pos = v.pow_(3).mul_(n).floor_().long().clamp_max_(n - 1)  # v < 1, clamp only for rounding
    del v
    col = perm.index_select(0, pos)
    del pos
    if not sort and not self_loops:
        rowptr = torch.cat([deg.new_zeros(1), deg.cumsum(0)])
        return rowptr.to(index_dtype), col.to(index_dtype)

    row = torch.repeat_interleave(torch.arange(n, device=device), deg, output_size=num_edges)
    if self_loops:
        keep = row != col
        node = torch.arange(n, device=device)
        row, col = torch.cat([row[keep], node]), torch.cat([col[keep], node])
        del keep
    # One sort of row * N + col orders by row, then by column within the row.
    key = row.mul_(n).add_(col)
    del row, col
    key = key.sort().values
    row = key.div(n, rounding_mode="floor")
    col = key.remainder_(n)
    rowptr = index2ptr(row, n)
    return rowptr.to(index_dtype), col.to(index_dtype)


def make_graph(name: str, *, index_dtype: torch.dtype = torch.int64,
               device: Union[str, torch.device] = "cpu", self_loops: bool = False,
               seed: int = 0, data_root: Optional[str] = None) -> Graph:
    """The named benchmark graph: one of :data:`SHAPES`, or ``"cora"`` (the real
    Planetoid Cora graph, read from ``data_root``, with H = D = 8)."""
    if name == "cora":
        return _load_cora(data_root, index_dtype=index_dtype, device=device,
                          self_loops=self_loops)
    if name not in SHAPES:
        raise ValueError(f"unknown graph {name!r}; choose from {sorted(SHAPES) + ['cora']}")
    s = SHAPES[name]
    rowptr, col = power_law_csr(s.num_nodes, s.avg_deg, seed=seed, index_dtype=index_dtype,
                                device=device, self_loops=self_loops)
    return Graph(name, rowptr, col, s.num_nodes, s.heads, s.channels)


def _load_cora(data_root: Optional[str], *, index_dtype: torch.dtype,
               device: Union[str, torch.device], self_loops: bool) -> Graph:
    import os
    import shutil
    import tempfile

    from torch_geometric.datasets import Planetoid
    from torch_geometric.utils import add_self_loops, remove_self_loops, sort_edge_index

    root = data_root or os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
    raw = os.path.join(root, "Cora", "raw")
    if not os.path.isdir(raw):
        raise FileNotFoundError(f"the real Cora graph needs the Planetoid raw files in {raw} "
                                "(pass --data-root)")
    # Process a copy: the shared data folder stays read-only.
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(raw, os.path.join(tmp, "Cora", "raw"))
        data = Planetoid(tmp, "Cora")[0]
    edge_index = data.edge_index
    if self_loops:
        edge_index, _ = remove_self_loops(edge_index)
        edge_index, _ = add_self_loops(edge_index, num_nodes=data.num_nodes)
    src, dst = sort_edge_index(edge_index, sort_by_row=False, num_nodes=data.num_nodes)
    rowptr = index2ptr(dst, data.num_nodes)
    return Graph("cora", rowptr.to(device, index_dtype), src.to(device, index_dtype),
                 data.num_nodes, 8, 8)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Generate the benchmark graphs and print stats.")
    parser.add_argument("--shapes", default="cora-like,arxiv-like")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--self-loops", action="store_true")
    args = parser.parse_args()
    for shape in args.shapes.split(","):
        t = time.perf_counter()
        g = make_graph(shape, device=args.device, self_loops=args.self_loops)
        print(f"{g}  ({time.perf_counter() - t:.2f} s)", flush=True)
