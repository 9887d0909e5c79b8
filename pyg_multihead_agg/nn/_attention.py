"""What the fused attention layers share: one fused forward (the skeleton:
projections and score inputs, graph preparation, PyG's propagate, the
layer's message_and_aggregate, the fused op, the output), when it serves a
call and when PyG's own path runs, the input errors PyG leaves bare, the
index-range check of PyG's path, the self-loop count, the edge-feature rows,
the bias the op adds, whether the op needs the CSC, and PyG's return
structure for the attention weights."""
import os
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor
from torch.nn.modules import module as torch_module
from torch_geometric import is_compiling
from torch_geometric.nn import MessagePassing
from torch_geometric.nn.dense.linear import Linear as PyGLinear
from torch_geometric.typing import Adj, OptPairTensor, OptTensor, Size, SparseTensor, torch_sparse
from torch_geometric.utils import add_self_loops, is_torch_sparse_tensor, remove_self_loops
from torch_geometric.utils.sparse import set_sparse_value

from .. import graph as graphs

# PyG's MessagePassing hook dictionaries but message_and_aggregate's (which
# fire on the fused path, around the op): with any of these registered, the
# layer takes PyG's path, where the hooks see the messages they expect.
HOOKS = tuple(f"_{name}_hooks" for name in (
    "propagate_forward_pre", "propagate_forward", "message_forward_pre", "message_forward",
    "aggregate_forward_pre", "aggregate_forward", "edge_update_forward_pre",
    "edge_update_forward"))
# Hooks that must see PyG's messages: on PyG's path, propagate then skips
# message_and_aggregate.
MESSAGE_HOOKS = tuple(f"_{name}_hooks" for name in (
    "message_forward_pre", "message_forward", "aggregate_forward_pre", "aggregate_forward"))

# logits(src, dst, edge_values) -> [E, H]: a layer's attention logits of the
# edges (src[e] -> dst[e]), edge_values per edge or None.
Logits = Callable[[Tensor, Tensor, OptTensor], Tensor]


# The projections whose call autocast casts for (F.linear).
_LINEAR_MAPS = (PyGLinear, torch.nn.Linear)

# Module hooks that would see a projection's call (torch.nn's global ones).
_GLOBAL_MODULE_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks",
                        "_global_backward_hooks", "_global_backward_pre_hooks")


def _observed(module: torch.nn.Module) -> bool:
    # Whether calling the module runs a hook: its own or a global one.
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks
                or any(getattr(torch_module, name, None) for name in _GLOBAL_MODULE_HOOKS))


def autocast_features(x: OptTensor, *projections: Optional[torch.nn.Module]) -> OptTensor:
    """Node features ``x`` in the autocast dtype, cast once for all the
    layer's ``projections`` of it (and the fold of GATConv's scores), where
    autocast would cast them again in each: a [N, F] pass per projection
    (TransformerConv projects x four times, GATv2Conv twice). The same values
    as autocast's casts. Only for features that need no gradient (a model's
    input): with one, each projection keeps autocast's own cast, so that the
    projections' gradients add up in float32 as in PyG's layer. Unchanged
    where no autocast is on, for float64 (autocast leaves it), where a
    projection is not a linear map (a module a user put in its place, which
    autocast may not cast for) and where a hook would see a projection's
    input."""
    if (x is None or x.requires_grad or not torch.is_autocast_enabled(x.device.type)
            or not x.is_floating_point() or x.dtype == torch.float64):
        return x
    dtype = torch.get_autocast_dtype(x.device.type)
    if x.dtype == dtype or any(p is not None and (type(p) not in _LINEAR_MAPS or _observed(p))
                               for p in projections):
        return x
    return x.to(dtype)


class FusedInputs(NamedTuple):
    """What a layer's projections give the fused forward."""
    src: Tensor  # per-source values [N_src, H, C] (they size the sources)
    dst: OptTensor  # per-destination values (they size the destinations), or None
    propagate_kwargs: Dict[str, Any]  # the layer's arguments of propagate
    grad_inputs: Tuple[OptTensor, ...]  # the op's inputs whose gradients need the CSC
    extra: Any = None  # what the layer's output step needs (residual, root features)


class _Routed:
    # What the fused path attaches to the routing adjacency it hands to
    # propagate, for message_and_aggregate: the prepared graph, the op's
    # per-edge inputs in CSR order (or None), and the op's row
    # log-sum-exp once it ran.
    __slots__ = ("graph", "edge_values", "lse")

    def __init__(self, graph: graphs.Graph, edge_values: OptTensor) -> None:
        self.graph = graph
        self.edge_values = edge_values
        self.lse: OptTensor = None


# Per (class, propagate, message_and_aggregate, update): whether the class
# replaces one of PyG's or the layer's own (see _propagate_observed).
_OBSERVED: Dict[Tuple[Any, ...], bool] = {}
_HERE = os.path.dirname(os.path.abspath(__file__))


def _class_observes_propagate(cls: type, propagate: Callable, message_and_aggregate: Callable,
                              update: Callable) -> bool:
    # PyG's propagate is MessagePassing's, or the one PyG generates for a
    # class of the hierarchy (from a file named after that class); the fused
    # path's message_and_aggregate is one of this package's layers'. (By
    # their code: a wrapper made with functools.wraps takes the names.)
    generated = tuple(f"{c.__module__}_{c.__name__}_propagate" for c in cls.__mro__)
    code = getattr(propagate, "__code__", None)
    pygs = propagate is MessagePassing.propagate or (
        code is not None and os.path.basename(code.co_filename).startswith(generated))
    code = getattr(message_and_aggregate, "__code__", None)
    ours = code is not None and os.path.dirname(os.path.abspath(code.co_filename)) == _HERE
    return not (pygs and ours and update is MessagePassing.update)


class FusedAttention:
    """Mixed into a subclass of a PyG attention layer (listed before it), which
    provides ``fused_attention``, ``_fused_head_supported(heads, channels, dtype)``
    (whether the CUDA kernels serve heads of ``channels`` in ``dtype``) and
    the score policy of the fused forward:

    - ``_fused_inputs(x) -> FusedInputs``: projections and score inputs;
    - ``_fused_edge_values(edge_attr)``: the op's per-edge inputs from edge
      features (projections);
    - ``_fused_op(graph, edge_values, **propagate_kwargs) -> (out, lse)``:
      the fused operator, called from its ``message_and_aggregate``;
    - ``_fused_logits(inputs, src, dst, edge, dtype)``: the attention logits
      of the given edges, for the returned attention weights;
    - ``_fused_output(out, inputs)``, if not the default: the output step;
    - ``_fused_layer(x, edge_index, size)``, if the layer has one: the whole
      call as one operator where it applies (no edge features, no attention
      weights), else None.
    """

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

    # PyG's propagate routes a column-sorted EdgeIndex (the fused path's
    # prepared graph among them) to message_and_aggregate.
    SUPPORTS_FUSED_EDGE_INDEX = True
    # Whether PyG's own path may call message_and_aggregate for a sparse
    # adjacency (GATConv with fused_attention=False aggregates PyG's
    # attention weights there), or must run message and aggregate
    # (GATv2Conv, TransformerConv: PyG's layer as it is).
    _aggregates_pyg_weights = True

    @property
    def fuse(self) -> bool:
        # PyG's propagate calls message_and_aggregate for a sparse adjacency
        # when this holds: always on the fused path (its routing adjacency),
        # on PyG's own path only where the layer aggregates PyG's weights
        # itself and no message or aggregate hook must see the messages.
        # (The flag PyG sets stays in __dict__ under its own name, which
        # PyG's __setstate__ reads; this property takes precedence over it.)
        if not self.__dict__.get("fuse", False):
            return False
        if not self.__dict__.get("_on_pyg_path", False):
            return True
        return self._aggregates_pyg_weights and not any(map(self.__dict__.get, MESSAGE_HOOKS))

    @fuse.setter
    def fuse(self, value: bool) -> None:
        self.__dict__["fuse"] = value

    def _pyg_forward(self, *args):
        # PyG's own forward, with propagate told that it is PyG's path.
        self.__dict__["_on_pyg_path"] = True
        try:
            return super().forward(*args)
        finally:
            self.__dict__["_on_pyg_path"] = False

    def _fused_forward(self, x: Union[Tensor, OptPairTensor], edge_index: Adj,
                       edge_attr: OptTensor, size: Size,
                       return_attention_weights: Optional[bool]):
        # The layer's projections, PyG's size checks and self-loop count,
        # the edge inputs, the prepared graph, then PyG's propagate on it: its
        # message_and_aggregate (and that method's hooks) run the fused op.
        if edge_attr is None and not self._wants_weights(return_attention_weights):
            out = self._fused_layer(x, edge_index, size)
            if out is not None:
                return out
        inputs = self._fused_inputs(x)
        sizes = self._check_input(edge_index, size)
        self._set_size(sizes, 0, inputs.src)
        if inputs.dst is not None:
            self._set_size(sizes, 1, inputs.dst)
        num_src = sizes[0] if sizes[0] is not None else inputs.src.size(0)
        num_dst = sizes[1] if sizes[1] is not None else (
            inputs.dst.size(0) if inputs.dst is not None else num_src)
        loops = (self._num_loop_nodes(x, size, edge_index)
                 if getattr(self, "add_self_loops", False) else None)

        # The op's edge inputs in the caller's edge order, and those of the
        # self-loops (PyG fills the raw features, then projects them).
        edge: OptTensor = None
        loop_edge: OptTensor = None
        if edge_attr is not None and self.lin_edge is not None:
            edge_attr = self._edge_rows(edge_index, edge_attr)
            edge = self._fused_edge_values(edge_attr)
            if loops is not None:
                loop_edge = self._fused_edge_values(
                    graphs.loop_attr(edge_index, edge_attr, loops, self.fill_value))

        graph = graphs.prepare(edge_index, num_src, num_dst, self_loops=loops,
                               need_csc=self._need_csc(*inputs.grad_inputs, edge))
        edge_values = None if edge is None else graph.to_csr_order(edge, loop_edge)
        if is_compiling() or not self._propagate_observed():
            # The op that message_and_aggregate runs, called here where
            # nothing can observe PyG's propagate (which, with the routing
            # adjacency, costs about 10 us of host time a call), and under
            # torch.compile, where PyG's generated propagate runs no hook.
            # No _Routed: a graph break before this point would hand it to
            # a resumed frame as an input, which Dynamo cannot wrap.
            out, lse = self._fused_op(graph, edge_values, **inputs.propagate_kwargs)
            out = graph.crop_rows(out)
        else:
            routed = _Routed(graph, edge_values)
            routing = graphs.routing_adjacency(edge_index, graph, num_src)
            routing._pma_routed = routed
            try:
                out = self.propagate(routing, **inputs.propagate_kwargs)
            finally:
                routing._pma_routed = None
            lse = routed.lse
        out = self._fused_output(out, inputs)
        if not self._wants_weights(return_attention_weights):
            return out
        lse = graph.crop_rows(lse)

        def logits(src: Tensor, dst: Tensor, edge_values: OptTensor) -> Tensor:
            return self._fused_logits(inputs, src, dst, edge_values, lse.dtype)

        return out, self._attention_weights(edge_index, loops, lse, logits, edge, loop_edge,
                                            inputs.src.dtype)

    def _fused_layer(self, x: Union[Tensor, OptPairTensor], edge_index: Adj,
                     size: Size) -> OptTensor:
        # The whole call (projections, scores, the op, the output step) as one
        # operator and one autograd node, where the layer has one and nothing
        # observes its pieces (GATConv: _gat_conv); None: the steps below.
        return None

    def _propagate_observed(self) -> bool:
        # Whether the fused op must run inside PyG's propagate: a
        # message_and_aggregate hook is registered, or the instance or a
        # subclass replaces propagate, message_and_aggregate or update.
        if (self._message_and_aggregate_forward_pre_hooks
                or self._message_and_aggregate_forward_hooks):
            return True
        own = self.__dict__
        if "message_and_aggregate" in own or "update" in own:
            return True
        cls = type(self)
        bound = own.get("propagate")  # set by PyG's explain setter, or by a user
        if bound is not None and getattr(bound, "__func__", None) is not cls.propagate:
            return True
        key = (cls, cls.propagate, cls.message_and_aggregate, cls.update)
        observed = _OBSERVED.get(key)
        if observed is None:
            observed = _OBSERVED[key] = _class_observes_propagate(*key)
        return observed

    def _fused_aggregate(self, edge_index: Adj, **inputs: Any) -> OptTensor:
        # message_and_aggregate on the fused path's routing adjacency: the
        # op; None for any other adjacency, which only PyG's path of a layer
        # that aggregates PyG's weights itself passes.
        routed = getattr(edge_index, "_pma_routed", None)
        if routed is None:
            if not self._aggregates_pyg_weights:
                raise RuntimeError(f"{type(self).__name__}.message_and_aggregate serves the "
                                   "fused path's prepared graph only")
            return None
        return self._run_routed(routed, **inputs)

    def _run_routed(self, routed: _Routed, **inputs: Any) -> Tensor:
        # The op on the routed graph, its lse kept for the attention weights.
        out, routed.lse = self._fused_op(routed.graph, routed.edge_values, **inputs)
        return routed.graph.crop_rows(out)

    def _fused_edge_values(self, edge_attr: Tensor) -> Tensor:
        # GATv2Conv, TransformerConv: the projected edge features per head.
        return self.lin_edge(edge_attr).view(-1, self.heads, self.out_channels)

    @staticmethod
    def _wants_weights(return_attention_weights: Optional[bool]) -> bool:
        return bool(return_attention_weights)

    def _fused_output(self, out: Tensor, inputs: FusedInputs) -> Tensor:
        # GATConv and GATv2Conv: heads concatenated or averaged, then PyG's
        # residual (inputs.extra) and the bias where the op did not add it.
        H, C = self.heads, self.out_channels
        out = out.reshape(-1, H * C) if self.concat else out.mean(dim=1)
        if inputs.extra is not None:
            out = out + inputs.extra
        if self.bias is not None and torch.is_autocast_enabled(out.device.type):
            out = out + self.bias  # (not added by the op, see _op_bias)
        return out

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
        if getattr(self, "_explain", None) or any(map(self.__dict__.get, HOOKS)):
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
        bias = self.bias
        if bias is None or torch.is_autocast_enabled(like.device.type):
            return None
        H, C = self.heads, self.out_channels
        bias = bias.view(H, C) if self.concat else bias.expand(H, C)
        return bias if bias.dtype == like.dtype else bias.to(like.dtype)

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
                    edge_values = graphs.cat_rows(edge_values[src != dst], loop_edge_values)
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
