"""Seeded synthetic stand-ins for ogbn-arxiv and ogbn-products that a GAT can
learn from, written in ogb's own binary on-disk layout.

The graph (a degree-corrected stochastic block model):

- communities: node ``i`` belongs to community ``perm(N)[i] mod C`` (balanced:
  sizes differ by at most one), one per class;
- degrees: a Pareto weight ``w = (1 - u) ** (-1 / degree_tail)``, ``u ~ U(0, 1)``
  (tail index 2: about ``deg ** -3``, as ``benchmarks/graphs.py``), gives each
  node ``k = max(1, round(w / mean(w) * pairs_per_node))`` edge ends of its own
  (rounded up or down at random, so that the mean stays ``pairs_per_node``);
- edges: each of those ends is paired with a partner drawn in proportion to
  ``k``: from the node's own community with probability ``homophily``, from
  the others otherwise. So a node's degree is about ``2 k``, and the fraction
  of edges inside a community is ``homophily``. Self-loops and repeated pairs
  are dropped, the rest is one undirected edge each (``lower id, higher id``),
  sorted;
- features: ``x = (mu[c] + feature_noise * eps) / sqrt(1 + feature_noise ** 2)``
  with community centroids ``mu ~ N(0, I)`` and ``eps ~ N(0, I)``: unit
  variance, the community buried in noise. With 47 communities, 100 features
  and noise 4.5, the best classifier of a node's own features names its
  community about half the time (an MLP trained on few nodes less often);
  the mean of its neighbours' features, most of them of its community, names
  it almost always: what a GAT can learn;
- labels: the node's community, except for a fraction ``label_noise`` of the
  nodes, whose label is a class drawn at random (their features and edges
  keep their community). This bounds every model's accuracy at about
  ``1 - label_noise``, as ambiguous labels bound it on the real datasets, and
  an MLP's at about ``1 - label_noise`` times the share of communities it
  names (defaults: about 80% and 40%);
- split: a random permutation cut in the real dataset's proportions
  (ogbn-products: 8.0% train, 1.6% valid, 90.4% test; ogbn-arxiv: 53.7%,
  17.6%, 28.7%); ogbn-arxiv's ``node_year`` follows its split (train up to
  2017, valid 2018, test 2019).

Everything is drawn from ``numpy.random.default_rng(seed)`` in one pass of
whole-array operations (no loop over nodes or edges): the same seed and numpy
give the same graph on every machine.

On disk (``<root>/ogbn_products_synthetic/``), ogb's layout for its binary
datasets (as ogbn-papers100M): ``raw/data.npz`` (``edge_index``,
``num_nodes_list``, ``num_edges_list``, ``node_feat``, ``node_year``),
``raw/node-label.npz`` (``node_label``), ``split/<split>/split_dict.pt``,
``RELEASE_v1.txt``, and ``synthetic.json`` (the generator's parameters and the
graph's measured statistics). ogbn-products' edges are stored in both
directions, each pair next to its reverse, as ogb's loader makes them from the
real CSV (``add_inverse_edge``); ogbn-arxiv's once, as the real file has them.

Two readers give the same ``Data`` and split: ogb's
``PygNodePropPredDataset`` through :func:`ogb_meta_dict` (``binary``), and
:func:`read` without the ogb package.
"""
import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

FORMAT = 1  # of synthetic.json and the files beside it


@dataclass(frozen=True)
class Spec:
    """What a real dataset has (ogb's master.csv and its files)."""
    num_classes: int
    num_features: int
    num_nodes: int
    num_pairs: int  # edges in its raw edge list
    split: str
    split_sizes: Tuple[int, int, int]  # train, valid, test
    add_inverse_edge: bool
    node_files: Tuple[str, ...]

    @property
    def pairs_per_node(self) -> float:
        return self.num_pairs / self.num_nodes


SPECS = {
    "ogbn-arxiv": Spec(40, 128, 169_343, 1_166_243, "time", (90_941, 29_799, 48_603), False,
                       ("node_year",)),
    "ogbn-products": Spec(47, 100, 2_449_029, 61_859_140, "sales_ranking",
                          (196_615, 39_323, 2_213_091), True, ()),
}


@dataclass(frozen=True)
class Params:
    """The generator's parameters (module docstring)."""
    num_nodes: int
    num_classes: int
    num_features: int
    pairs_per_node: float
    homophily: float = 0.8
    feature_noise: float = 4.5
    label_noise: float = 0.2
    degree_tail: float = 2.0
    seed: int = 0


def generate(p: Params) -> Dict[str, np.ndarray]:
    """The graph of the module docstring: ``pairs`` [2, M] int64 (undirected,
    lower id first, sorted), ``x`` [N, F] float32, ``y`` [N] int64 (the labels),
    ``community`` [N] int64."""
    for name in ("homophily", "label_noise"):
        if not 0.0 <= getattr(p, name) <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {getattr(p, name)}")
    if p.num_nodes < 2 * p.num_classes:
        raise ValueError(f"{p.num_nodes} nodes are too few for {p.num_classes} classes")
    rng = np.random.default_rng(p.seed)
    n, c = p.num_nodes, p.num_classes
    y = rng.permutation(n) % c

    w = (1.0 - rng.random(n)) ** (-1.0 / p.degree_tail)
    k = np.floor(w * (p.pairs_per_node / w.mean()) + rng.random(n)).astype(np.int64)
    np.maximum(k, 1, out=k)
    del w
    m = int(k.sum())

    # Every node's own ends, and a pool of all ends grouped by class: a
    # uniform position in a class's block (or outside it) is a partner drawn
    # in proportion to k within that class (or among the others).
    src = np.repeat(np.arange(n), k)
    by_class = np.argsort(y, kind="stable")
    pool = np.repeat(by_class, k[by_class])
    size = np.bincount(y, weights=k, minlength=c).astype(np.int64)
    start = np.cumsum(size) - size
    cls = y[src]
    r = rng.random(m)
    same = rng.random(m) < p.homophily
    pos = np.where(same, start[cls] + r * size[cls], r * (m - size[cls])).astype(np.int64)
    del r
    pos = np.minimum(pos, np.where(same, start[cls] + size[cls], m - size[cls]) - 1)
    # Outside the class: positions past the class's block start skip it.
    pos += np.where(~same & (pos >= start[cls]), size[cls], 0)
    del same, cls
    dst = pool[pos]
    del pos, pool

    lo, hi = np.minimum(src, dst), np.maximum(src, dst)
    del src, dst
    keep = lo != hi
    key = lo[keep] * n + hi[keep]
    del lo, hi, keep
    key.sort()  # (np.unique takes 15 times as long)
    key = key[np.concatenate(([True], key[1:] != key[:-1]))]  # each pair once
    pairs = np.stack(np.divmod(key, n))
    del key

    mu = rng.standard_normal((c, p.num_features), dtype=np.float32)
    x = rng.standard_normal((n, p.num_features), dtype=np.float32)
    x *= p.feature_noise
    x += mu[y]
    x *= 1.0 / np.sqrt(1.0 + p.feature_noise ** 2)
    label = y.copy()
    noisy = rng.random(n) < p.label_noise
    label[noisy] = rng.integers(0, c, size=int(noisy.sum()))
    return dict(pairs=pairs, x=x, y=label, community=y)


def split(num_nodes: int, sizes: Tuple[int, int, int], seed: int) -> Dict[str, np.ndarray]:
    """train / valid / test: a random permutation cut in the proportions of
    `sizes` (each part sorted)."""
    rng = np.random.default_rng([seed, 1])
    total = sum(sizes)
    train = round(num_nodes * sizes[0] / total)
    valid = round(num_nodes * sizes[1] / total)
    order = rng.permutation(num_nodes)
    parts = np.split(order, [train, train + valid])
    return {name: np.sort(part) for name, part in zip(("train", "valid", "test"), parts,
                                                        strict=True)}


def stats(graph: Dict[str, np.ndarray]) -> Dict[str, Any]:
    """Edge homophily (of the communities, and of the labels), degrees and
    class sizes of a generated graph."""
    pairs, y, community = graph["pairs"], graph["y"], graph["community"]
    deg = np.bincount(pairs.ravel(), minlength=y.size)
    sizes = np.bincount(y)
    return dict(num_pairs=int(pairs.shape[1]),
                homophily=float((community[pairs[0]] == community[pairs[1]]).mean()),
                label_homophily=float((y[pairs[0]] == y[pairs[1]]).mean()),
                mean_degree=float(deg.mean()), median_degree=float(np.median(deg)),
                max_degree=int(deg.max()), isolated_nodes=int((deg == 0).sum()),
                class_size_min=int(sizes.min()), class_size_max=int(sizes.max()))


def folder(root: str, name: str) -> str:
    return os.path.join(os.path.expanduser(root), name.replace("-", "_") + "_synthetic")


def params_for(name: str, num_nodes: int, *, num_features: Optional[int] = None,
               pairs_per_node: Optional[float] = None, **kwargs) -> Params:
    """The generator's parameters for a stand-in of `name` with `num_nodes`
    nodes: the real dataset's classes, features and edges per node unless
    given."""
    spec = SPECS[name]
    return Params(num_nodes=num_nodes, num_classes=spec.num_classes,
                  num_features=num_features or spec.num_features,
                  pairs_per_node=pairs_per_node or spec.pairs_per_node, **kwargs)


def write(root: str, name: str, params: Params, log=print) -> str:
    """Writes the graph of `params` as a stand-in for `name` under `root`
    (module docstring) and returns its folder; a folder that already holds
    the graph of these parameters is kept as it is."""
    path = folder(root, name)
    meta_path = os.path.join(path, "synthetic.json")
    spec = SPECS[name]
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        if meta.get("format") == FORMAT and meta.get("params") == asdict(params):
            log(f"synthetic {name}: {path} holds this graph already")
            return path
    t = time.perf_counter()
    graph = generate(params)
    t_generate = time.perf_counter() - t
    pairs, y = graph["pairs"], graph["y"]
    parts = split(params.num_nodes, spec.split_sizes, params.seed)
    summary = stats(graph)
    if spec.add_inverse_edge:  # each pair, then its reverse (ogb's read_csv_graph_raw)
        edge_index = np.empty((2, 2 * pairs.shape[1]), dtype=np.int64)
        edge_index[:, 0::2] = pairs
        edge_index[:, 1::2] = pairs[::-1]
    else:
        edge_index = pairs
    del graph["pairs"], pairs
    arrays = dict(edge_index=edge_index, num_nodes_list=np.array([params.num_nodes]),
                  num_edges_list=np.array([edge_index.shape[1]]), node_feat=graph["x"])
    if "node_year" in spec.node_files:  # the time split's years
        year = np.empty((params.num_nodes, 1), dtype=np.int64)
        year[parts["train"]] = np.random.default_rng([params.seed, 2]).integers(
            1971, 2018, size=(parts["train"].size, 1))
        year[parts["valid"]], year[parts["test"]] = 2018, 2019
        arrays["node_year"] = year

    # A rewrite replaces everything, ogb's processed copy of an older graph too.
    for stale in (meta_path, os.path.join(path, "processed", "geometric_data_processed.pt")):
        if os.path.exists(stale):
            os.remove(stale)
    os.makedirs(os.path.join(path, "raw"), exist_ok=True)
    os.makedirs(os.path.join(path, "split", spec.split), exist_ok=True)
    np.savez(os.path.join(path, "raw", "data.npz"), **arrays)
    np.savez(os.path.join(path, "raw", "node-label.npz"), node_label=y.reshape(-1, 1))
    torch.save({k: torch.from_numpy(v) for k, v in parts.items()},
               os.path.join(path, "split", spec.split, "split_dict.pt"))
    with open(os.path.join(path, "RELEASE_v1.txt"), "w") as f:
        f.write("synthetic\n")
    seconds = time.perf_counter() - t
    with open(meta_path, "w") as f:  # last: its presence marks a complete folder
        json.dump(dict(format=FORMAT, name=name, params=asdict(params), stats=summary,
                       generate_s=round(t_generate, 2), write_s=round(seconds, 2)), f, indent=1)
    log(f"synthetic {name}: {params.num_nodes:,} nodes, {edge_index.shape[1]:,} edges, "
        f"homophily {summary['homophily']:.3f}, written to {path} in {seconds:.1f} s "
        f"(generated in {t_generate:.1f} s)")
    return path


def ogb_meta_dict(name: str, path: str) -> Dict[str, str]:
    """The `meta_dict` for ogb's ``PygNodePropPredDataset`` to read the
    stand-in at `path`: the real dataset's entry of ogb's master.csv, read
    from the binary files."""
    import ogb.nodeproppred
    import pandas as pd
    master = os.path.join(os.path.dirname(ogb.nodeproppred.__file__), "master.csv")
    meta = pd.read_csv(master, index_col=0, keep_default_na=False)[name].to_dict()
    return dict(meta, dir_path=path, binary="True", add_inverse_edge="False")


def read(path: str) -> Tuple[Any, Dict[str, torch.Tensor], int]:
    """(data, split_idx, num_classes) of the stand-in at `path`, without the
    ogb package: the ``Data`` that ogb's ``PygNodePropPredDataset`` gives."""
    from torch_geometric.data import Data

    with open(os.path.join(path, "synthetic.json")) as f:
        meta = json.load(f)
    spec = SPECS[meta["name"]]
    with np.load(os.path.join(path, "raw", "data.npz")) as arrays:
        data = Data(num_nodes=int(arrays["num_nodes_list"][0]),
                    edge_index=torch.from_numpy(arrays["edge_index"]),
                    x=torch.from_numpy(arrays["node_feat"]),
                    **{key: torch.from_numpy(arrays[key]) for key in spec.node_files})
    with np.load(os.path.join(path, "raw", "node-label.npz")) as labels:
        data.y = torch.from_numpy(labels["node_label"]).long()
    split_idx = torch.load(os.path.join(path, "split", spec.split, "split_dict.pt"))
    return data, split_idx, meta["params"]["num_classes"]
