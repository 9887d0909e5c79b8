"""What the fused attention layers share: when the fused operator serves a
call and when PyG's own path runs, the adjacency errors PyG leaves bare,
the index-range check of PyG's path, the self-loop count, and PyG's return
structure for the attention weights."""
from typing import Callable, Optional, Union

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

    # MessagePassing keeps the class's propagate (and edge_updater) before
    # it installs the generated one, and runs the kept one for the explainer
    # and decomposed layers. Inherited, it would be the PyG parent's
    # generated propagate once a PyG layer of the parent class was built,
    # which applies no explainer mask: state MessagePassing's own.
    propagate = MessagePassing.propagate
    edge_updater = MessagePassing.edge_updater

    def _check_adjacency(self, edge_index: Adj, edge_attr: OptTensor) -> None:
        # The combinations PyG refuses, on every path, with a message.
        if (self.add_self_loops and edge_attr is not None
                and is_torch_sparse_tensor(edge_index)):
            # PyG fails here with a bare AssertionError inside remove_self_loops.
            raise NotImplementedError(
                "The usage of 'edge_attr' and 'add_self_loops' simultaneously is not supported "
                "for 'edge_index' as a torch.sparse tensor: add the self-loops to the graph "
                "beforehand and set 'add_self_loops=False'")
        if (self.add_self_loops and self.edge_dim is not None
                and isinstance(edge_index, SparseTensor)):
            raise NotImplementedError(
                "The usage of 'edge_attr' and 'add_self_loops' simultaneously is currently not "
                "yet supported for 'edge_index' in a 'SparseTensor' form")

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
        if return_attention_weights and self.training and self.dropout > 0:
            return False
        x_src = x if isinstance(x, Tensor) else x[0]
        if x_src.is_cuda:
            return self._fused_head_supported(self.heads, self.out_channels,
                                              self._fused_dtype(x_src))
        return True

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
    def _num_loop_nodes(x: Union[Tensor, OptPairTensor], size: Size) -> int:
        # As PyG: loops only for nodes that are both sources and destinations.
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
        if is_torch_sparse_tensor(looped):
            return set_sparse_value(looped, alpha), alpha
        return looped, alpha
