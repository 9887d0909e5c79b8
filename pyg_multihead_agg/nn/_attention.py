"""What the fused attention layers share: when the fused operator serves a
call and when PyG's own path runs, the input errors PyG leaves bare, the
index-range check of PyG's path, the self-loop count, the edge-feature rows,
the bias the op adds, whether the op needs the CSC, and PyG's return
structure for the attention weights."""
from typing import Callable, Optional, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.nn import MessagePassing
from torch_geometric.typing import Adj, OptPairTensor, OptTensor, Size, SparseTensor, torch_sparse
from torch_geometric.utils import add_self_loops, is_torch_sparse_tensor, remove_self_loops
from torch_geometric.utils.sparse import set_sparse_value

from .. import graph as graphs

# PyG's MessagePassing hook dictionaries: with any hook registered, the layer
# takes PyG's path, where the hooks see the messages they expect.
HOOKS = ("propagate_forward_pre", "propagate_forward", "message_forward_pre", "message_forward",
         "aggregate_forward_pre", "aggregate_forward", "message_and_aggregate_forward_pre",
         "message_and_aggregate_forward", "edge_update_forward_pre", "edge_update_forward")

# logits(src, dst, edge_values) -> [E, H]: a layer's attention logits of the
# edges (src[e] -> dst[e]), edge_values per edge or None.
Logits = Callable[[Tensor, Tensor, OptTensor], Tensor]


class FusedAttention:
    """Mixed into a subclass of a PyG attention layer (listed before it), which
    provides ``fused_attention`` and ``_fused_head_supported(heads, channels, dtype)``:
    whether the CUDA kernels serve heads of ``channels`` in ``dtype``."""

    # PyG's GATConv and GATv2Conv return the attention weights after
    # dropout: in training with dropout the fused op, which keeps no mask,
    # cannot give them, and PyG's path runs. TransformerConv returns them
    # before dropout (False).
    _weights_after_dropout = True
    # For a torch.sparse adjacency PyG's GATConv and GATv2Conv return the
    # adjacency with the weights as its values (True); TransformerConv
    # returns the adjacency as given (False). Both pair it with the weights.
    _weights_as_sparse_values = True

    # MessagePassing keeps the class's propagate (and edge_updater) before
    # it installs the generated one, and runs the kept one for the explainer
    # and decomposed layers. Inherited, it would be the PyG parent's
    # generated propagate once a PyG layer of the parent class was built,
    # which applies no explainer mask: state MessagePassing's own.
    propagate = MessagePassing.propagate
    edge_updater = MessagePassing.edge_updater

    def _check_adjacency(self, edge_index: Adj, edge_attr: OptTensor) -> None:
        # The combinations PyG refuses, on every path, with a message.
        add_self_loops = getattr(self, "add_self_loops", False)
        if (add_self_loops and edge_attr is not None
                and is_torch_sparse_tensor(edge_index)):
            # PyG fails here with a bare AssertionError inside remove_self_loops.
            raise NotImplementedError(
                "The usage of 'edge_attr' and 'add_self_loops' simultaneously is not supported "
                "for 'edge_index' as a torch.sparse tensor: add the self-loops to the graph "
                "beforehand and set 'add_self_loops=False'")
        if (add_self_loops and self.edge_dim is not None
                and isinstance(edge_index, SparseTensor)):
            raise NotImplementedError(
                "The usage of 'edge_attr' and 'add_self_loops' simultaneously is currently not "
                "yet supported for 'edge_index' in a 'SparseTensor' form")

    def _adjacency_edge_attr(self, edge_index: Adj, edge_attr: OptTensor) -> Tuple[OptTensor, bool]:
        # edge_attr, or where none is given the edge features PyG's propagate
        # reads from a sparse adjacency: a SparseTensor's values, a
        # torch.sparse tensor's when they have more than one dimension. And
        # whether only PyG's path serves them: a torch.sparse adjacency's
        # values with self-loops, which PyG's add_self_loops fills and sums
        # over duplicate entries as it coalesces.
        if edge_attr is not None:
            return edge_attr, False
        if isinstance(edge_index, SparseTensor):
            return edge_index.storage.value(), False
        if is_torch_sparse_tensor(edge_index):
            values = edge_index._values() if edge_index.is_sparse else edge_index.values()
            if values.dim() > 1:
                return values, bool(getattr(self, "add_self_loops", False))
        return None, False

    def _uses_fused_attention(self, x: Union[Tensor, OptPairTensor], edge_index: Adj,
                              return_attention_weights: Optional[bool]) -> bool:
        # The fused attention op (softmax + dropout + aggregation in one
        # kernel) is taken unless PyG hooks or the explainer must observe the
        # per-edge messages, or the attention weights after dropout are asked
        # for (the fused op does not materialise the mask).
        if not getattr(self, "fused_attention", True) or self.decomposed_layers > 1:
            return False
        if getattr(self, "_explain", None) or any(
                len(getattr(self, f"_{name}_hooks")) > 0 for name in HOOKS):
            return False
        if (return_attention_weights and self._weights_after_dropout and self.training
                and self.dropout > 0):
            return False
        x_src = x if isinstance(x, Tensor) else x[0]
        if x_src.is_cuda:
            return self._fused_head_supported(self.heads, self.out_channels,
                                              self._fused_dtype(x_src))
        return True

    def _check_destination_features(self, x: Union[Tensor, OptPairTensor]) -> None:
        # Layers that project the destinations: PyG fails on a missing one
        # with a bare AssertionError or a TypeError deep inside.
        if not isinstance(x, Tensor) and x[1] is None:
            raise ValueError(f"{type(self).__name__} needs the destination node features: "
                             "the attention scores read them; pass x = (x_src, x_dst) with "
                             "x_dst not None")

    @staticmethod
    def _edge_rows(edge_index: Adj, edge_attr: Tensor) -> Tensor:
        # Edge features [E, D] ([E] as [E, 1]), one row per edge of the
        # adjacency (PyG's gathers would fail further in, or not at all).
        if edge_attr.dim() == 1:
            edge_attr = edge_attr.view(-1, 1)
        num_edges = graphs.num_edges(edge_index)
        if edge_attr.size(0) != num_edges:
            raise RuntimeError(
                f"edge_attr must have one row per edge: its size ({edge_attr.size(0)}) "
                f"must match the size of the edge dimension ({num_edges})")
        return edge_attr

    def _op_bias(self, like: Tensor) -> OptTensor:
        # The layer's bias as the op adds it, [H, C], or None where the layer
        # adds it after the op. In the op it costs nothing and the op keeps
        # one [N, H * C] output for its backward (instead of the attention
        # output and a biased copy); with concat=False every head gets the
        # whole bias (the mean over the heads of out_h + bias is mean(out_h)
        # + bias). Under autocast it is added after the op, in float32, so
        # that the output is float32 as PyG's.
        if self.bias is None or torch.is_autocast_enabled(like.device.type):
            return None
        H, C = self.heads, self.out_channels
        bias = self.bias.view(H, C) if self.concat else self.bias.expand(H, C)
        return bias.to(like.dtype)

    @staticmethod
    def _need_csc(*inputs: OptTensor) -> bool:
        # The op's backward walks the CSC for the gradients of its per-node
        # and per-edge inputs (a bias's gradient alone is a sum: no CSC).
        return torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in inputs)

    @staticmethod
    def _fused_dtype(x_src: Tensor) -> torch.dtype:
        if torch.is_autocast_enabled(x_src.device.type):
            return torch.get_autocast_dtype(x_src.device.type)
        return x_src.dtype if x_src.is_floating_point() else torch.get_default_dtype()

    def _check_index_range(self, x: Union[Tensor, OptPairTensor], edge_index: Adj,
                           size: Size) -> None:
        # PyG's own path: on the CPU its gathers turn an out-of-range index
        # into an IndexError, on CUDA into a device-side assert that leaves
        # the CUDA context unusable. Check once per graph instead.
        if (not isinstance(edge_index, Tensor) or is_torch_sparse_tensor(edge_index)
                or edge_index.dim() != 2):
            return
        x_src, x_dst = (x, x) if isinstance(x, Tensor) else x
        x_dst = x_src if x_dst is None else x_dst
        bounds = (size[0], size[1]) if size is not None else (x_src.size(0), x_dst.size(0))
        graphs.check_index(edge_index, *bounds)

    @staticmethod
    def _num_loop_nodes(x: Union[Tensor, OptPairTensor], size: Size, edge_index: Adj) -> int:
        # As PyG: loops only for nodes that are both sources and destinations;
        # a sparse adjacency gets them on its own diagonal (set_diag,
        # add_self_loops of a torch.sparse tensor), whatever the features.
        if isinstance(edge_index, SparseTensor):
            return min(edge_index.sparse_sizes())
        if is_torch_sparse_tensor(edge_index):
            return min(edge_index.size(0), edge_index.size(1))
        x_src, x_dst = (x, None) if isinstance(x, Tensor) else x
        num_nodes = x_src.size(0)
        if x_dst is not None:
            num_nodes = min(num_nodes, x_dst.size(0))
        return min(size) if size is not None else num_nodes

    def _attention_weights(self, edge_index: Adj, loops: Optional[int], lse: Tensor,
                           logits: Logits, edge_values: OptTensor, loop_edge_values: OptTensor,
                           dtype: torch.dtype):
        # PyG's returned graph (with self-loops where PyG puts them), and the
        # attention weights of its edges recomputed from the row log-sum-exp
        # as exp(logit - lse[dst]), in `dtype`; at most 1, as a softmax (the
        # kernel's lse and the logit recomputed here round differently: a
        # row of one edge would get 1 + eps). edge_values: per edge in the
        # caller's order, loop_edge_values: those of the added self-loops;
        # logits gets them in the returned graph's edge order.
        looped = edge_index
        if loops is not None:
            if isinstance(edge_index, SparseTensor):
                looped = torch_sparse.set_diag(edge_index)
            else:
                src, dst = graphs.edge_coordinates(edge_index)
                if edge_values is not None:
                    edge_values = torch.cat([edge_values[src != dst], loop_edge_values])
                looped, _ = remove_self_loops(edge_index)
                looped, _ = add_self_loops(looped, num_nodes=loops)
        src, dst = graphs.edge_coordinates(looped)
        src, dst = src.long(), dst.long()
        log_alpha = logits(src, dst, edge_values) - lse[dst]
        alpha = torch.exp(log_alpha.clamp(max=0.0)).to(dtype)
        if isinstance(looped, SparseTensor):
            return looped.set_value(alpha, layout="coo")
        if is_torch_sparse_tensor(looped) and self._weights_as_sparse_values:
            return set_sparse_value(looped, alpha), alpha
        return looped, alpha
