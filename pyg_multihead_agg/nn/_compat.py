"""Compatibility shims for the PyG / PyTorch versions the layer runs on."""
import functools

from torch import Tensor
from torch._subclasses.fake_tensor import is_fake
from torch_geometric import EdgeIndex


def fake_safe_edge_index_repr() -> None:
    """Makes ``repr`` of an :class:`~torch_geometric.EdgeIndex` that holds a
    fake tensor (as one does inside ``torch.compile``) print its shape instead
    of its values.

    PyG's ``EdgeIndex.__repr__`` formats its data with ``tolist()``. On a fake
    tensor that is one ``item()`` per index, and each ``item()`` makes a new
    unbacked symbol. torch 2.11's AOT autograd formats its forward metadata
    with ``str()`` on every graph, whether or not its debug log is on
    (``_aot_autograd/graph_capture.py``). So every compiled graph with an
    ``EdgeIndex`` input fails with ``PendingUnbackedSymbolNotFound``.
    ``fullgraph=True`` then raises. Without it, the layer ran as 5 graphs
    (H200, torch 2.11 + PyG 2.8).

    Real tensors print as before. Idempotent.
    """
    original = EdgeIndex.__repr__
    if getattr(original, "_fake_safe", False):
        return

    @functools.wraps(original)
    def __repr__(self) -> str:
        data = getattr(self, "_data", None)
        if isinstance(data, Tensor) and is_fake(data):
            return (f"{type(self).__name__}(<fake {list(data.shape)}, {data.dtype}, "
                    f"{data.device}>, sparse_size={self.sparse_size()}, "
                    f"sort_order={self.sort_order})")
        return original(self)

    __repr__._fake_safe = True  # type: ignore[attr-defined]
    EdgeIndex.__repr__ = __repr__
