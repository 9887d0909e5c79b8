"""TransformerConv on the fused graph-transformer attention operator."""
import math
from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.nn import TransformerConv as PyGTransformerConv
from torch_geometric.typing import Adj, OptTensor, PairTensor, SparseTensor

from .. import graph as graphs
from .. import ops
from ._attention import FusedAttention, FusedInputs, autocast_features
from ._compat import fake_safe_edge_index_repr
from .gatv2_conv import fused_head_supported as _padded_heads_supported

fake_safe_edge_index_repr()  # for torch.compile with EdgeIndex inputs on torch 2.11


def fused_head_supported(heads: int, channels: int, dtype: torch.dtype) -> bool:
    """Whether the CUDA kernels of :func:`~pyg_multihead_agg.transformer_attention`
    serve ``heads`` heads of ``channels`` in ``dtype``: the rule of
    :func:`~pyg_multihead_agg.nn.gatv2_conv.fused_head_supported`, whose
    padded head layout the scaled dot product shares (at most 32 16-byte
    vectors per head, and a row of ``heads * next_pow2(vectors)`` vectors of
    at most 128; csrc/cuda/attention/heuristics.cuh, gatv2_row_config)."""
    return _padded_heads_supported(heads, channels, dtype)


class TransformerConv(FusedAttention, PyGTransformerConv):
    r"""Drop-in replacement for :class:`torch_geometric.nn.TransformerConv`
    whose scaled dot-product scores, edge softmax, attention dropout and
    aggregation run in one fused, deterministic kernel
    (:func:`pyg_multihead_agg.transformer_attention`) for every adjacency
    PyG accepts: a plain :obj:`edge_index` in any order, an
    :class:`~torch_geometric.EdgeIndex` of any sort order, a
    :class:`torch_sparse.SparseTensor` and a :obj:`torch.sparse` CSR or COO
    :obj:`adj_t`. No :obj:`E x H x C` tensor (PyG's gathered queries, keys
    and values, the keys plus edge features, the messages) and no
    :obj:`E x H` attention matrix is stored: the backward recomputes them
    from the row log-sum-exp. The adjacency goes through
    :func:`pyg_multihead_agg.graph.prepare` (CSR and CSC, cached per graph in
    eager mode, traced under :func:`torch.compile`); as PyG's layer, this
    one adds no self-loops.

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{W}_1 \mathbf{x}_i +
        \sum_{j \in \mathcal{N}(i)} \alpha_{i,j} \left(\mathbf{W}_2
        \mathbf{x}_{j} \left[ + \mathbf{W}_6 \mathbf{e}_{ij} \right]\right),
        \qquad
        \alpha_{i,j} = \textrm{softmax} \left(
        \frac{(\mathbf{W}_3\mathbf{x}_i)^{\top} (\mathbf{W}_4\mathbf{x}_j
        \left[ + \mathbf{W}_6 \mathbf{e}_{ij} \right])}{\sqrt{d}} \right),

    per head; heads are concatenated (or averaged if :obj:`concat=False`).
    :math:`\mathbf{W}_1` is :obj:`lin_skip`, :math:`\mathbf{W}_2`
    :obj:`lin_value`, :math:`\mathbf{W}_3` :obj:`lin_query`,
    :math:`\mathbf{W}_4` :obj:`lin_key`, :math:`\mathbf{W}_6`
    :obj:`lin_edge`; with :obj:`beta=True` the skip and the aggregation are
    mixed by a learned gate (:obj:`lin_beta`), as in PyG.

    Constructor arguments, defaults, parameter names (a PyG
    :class:`~torch_geometric.nn.TransformerConv` :obj:`state_dict` loads as
    is), return types (:obj:`return_attention_weights` included: given as
    any :obj:`bool`, the weights before dropout are returned, as PyG's) and
    the :obj:`beta`, :obj:`root_weight`, :obj:`edge_dim`, bipartite and
    dropout behaviour are PyG's. PyG's own path runs only where the fused
    kernel cannot serve: with PyG's message-passing hooks or the explainer,
    with :obj:`decomposed_layers > 1`, with :obj:`fused_attention=False`, for
    :obj:`edge_attr` given to a layer without :obj:`edge_dim` (PyG then adds
    the raw features to the values only), and on CUDA for heads wider than
    the kernels serve (:func:`fused_head_supported`: more than 128 float32
    channels, 256 in half types, 64 in float64). The dropout mask is drawn
    from a Philox stream keyed by :func:`torch.manual_seed`, not PyG's, so
    training runs with dropout differ from PyG's in the mask (not in
    distribution).

    Args:
        in_channels (int or tuple): Size of each input sample, or :obj:`-1` to
            derive the size from the first input(s) to the forward method.
            A tuple corresponds to the sizes of source and target
            dimensionalities.
        out_channels (int): Size of each output sample.
        heads (int, optional): Number of multi-head-attentions.
            (default: :obj:`1`)
        concat (bool, optional): If set to :obj:`False`, the multi-head
            attentions are averaged instead of concatenated.
            (default: :obj:`True`)
        beta (bool, optional): If set, will combine aggregation and skip
            information through a learned gate, as PyG's layer.
            (default: :obj:`False`)
        dropout (float, optional): Dropout probability of the normalized
            attention coefficients. (default: :obj:`0`)
        edge_dim (int, optional): Edge feature dimensionality (in case
            there are any); projected edge features are added to the keys
            and to the values. (default: :obj:`None`)
        bias (bool, optional): If set to :obj:`False`, the projections will
            not learn an additive bias. (default: :obj:`True`)
        root_weight (bool, optional): If set to :obj:`False`, the layer will
            not add the transformed root node features to the output and the
            option :attr:`beta` is set to :obj:`False`. (default: :obj:`True`)
        fused_attention (bool, optional): If set to :obj:`False`, the layer
            runs PyG's own :class:`~torch_geometric.nn.TransformerConv`.
            (default: :obj:`True`)
        **kwargs (optional): Additional arguments of
            :class:`torch_geometric.nn.conv.MessagePassing`.

    Shapes:
        - **input:**
          node features :math:`(|\mathcal{V}|, F_{in})` or
          :math:`((|\mathcal{V_s}|, F_{s}), (|\mathcal{V_t}|, F_{t}))`
          if bipartite (both needed: the queries are the destinations'),
          edge indices :math:`(2, |\mathcal{E}|)` (:obj:`Tensor` or
          :class:`EdgeIndex`), or a sparse :obj:`adj_t` of shape
          :math:`(|\mathcal{V}_t|, |\mathcal{V}_s|)`,
          edge features :math:`(|\mathcal{E}|, D)` *(optional, in the
          adjacency's edge order)*
        - **output:** node features :math:`(|\mathcal{V}|, H * F_{out})` or
          :math:`(|\mathcal{V}_t|, H * F_{out})` if bipartite
          (:math:`F_{out}` instead of :math:`H * F_{out}` if
          :obj:`concat=False`).
          If :obj:`return_attention_weights` is a :obj:`bool`, additionally
          PyG's :math:`((2, |\mathcal{E}|), (|\mathcal{E}|, H))` for edge
          indices (the adjacency as given, a :obj:`torch.sparse` one
          included, and the weights in its edge order), or a
          :class:`SparseTensor` holding the weights for a
          :class:`SparseTensor`.

    Example:
        >>> import torch
        >>> from pyg_multihead_agg.nn import TransformerConv
        >>> conv = TransformerConv(16, 8, heads=4)
        >>> x = torch.randn(5, 16)
        >>> edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
        >>> conv(x, edge_index).shape
        torch.Size([5, 32])
    """
    _fused_head_supported = staticmethod(fused_head_supported)
    _weights_after_dropout = False
    _weights_as_sparse_values = False
    # fused_attention=False is PyG's layer as it is (message and aggregate).
    _aggregates_pyg_weights = False

    def __init__(
        self,
        in_channels: Union[int, Tuple[int, int]],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        beta: bool = False,
        dropout: float = 0.,
        edge_dim: Optional[int] = None,
        bias: bool = True,
        root_weight: bool = True,
        *,
        fused_attention: bool = True,
        **kwargs,
    ) -> None:
        super().__init__(in_channels, out_channels, heads=heads, concat=concat, beta=beta,
                         dropout=dropout, edge_dim=edge_dim, bias=bias,
                         root_weight=root_weight, **kwargs)
        self.fused_attention = fused_attention

    # PyG's Inspector caches class sources by class name, so it would read
    # this class's source for the parent's "# propagate_type:" comment: state
    # the signature of the generated propagate explicitly.
    propagate_type = {"query": "Tensor", "key": "Tensor", "value": "Tensor",
                      "edge_attr": "OptTensor"}

    def forward(
        self,
        x: Union[Tensor, PairTensor],
        edge_index: Adj,
        edge_attr: OptTensor = None,
        return_attention_weights: Optional[bool] = None,
    ) -> Union[Tensor, Tuple[Tensor, Tuple[Tensor, Tensor]], Tuple[Tensor, SparseTensor]]:
        r"""Runs the layer.

        Args:
            x (torch.Tensor or (torch.Tensor, torch.Tensor)): The node
                features, or a pair (source, destination) for a bipartite
                graph.
            edge_index (torch.Tensor or EdgeIndex or SparseTensor): The
                graph: :obj:`[2, E]` (source, destination) in any order, an
                :class:`EdgeIndex`, or a sparse :obj:`adj_t`.
            edge_attr (torch.Tensor, optional): Edge features :obj:`[E, D]`
                in the adjacency's edge order. (default: :obj:`None`)
            return_attention_weights (bool, optional): If set to a
                :obj:`bool` (:obj:`True` or :obj:`False`, as PyG), also
                returns the edges and their attention weights before
                dropout, as PyG does. (default: :obj:`None`)
        """
        self._check_destination_features(x)
        # (PyG's path reads the adjacency's values itself: it gets the caller's edge_attr.)
        given_edge_attr = edge_attr
        edge_attr, _ = self._adjacency_edge_attr(edge_index, edge_attr)
        if edge_attr is None and self.lin_edge is not None:
            # PyG fails with a bare AssertionError in message.
            raise ValueError("TransformerConv with edge_dim needs edge_attr: pass the edge "
                             "features (or a sparse adjacency holding them as its values), or "
                             "construct it without edge_dim")
        # edge_attr without lin_edge: PyG adds the raw features to the values
        # only (where they broadcast), which the op, adding e_feat to keys
        # and values, does not express. PyG's path runs.
        if ((edge_attr is None or self.lin_edge is not None)
                and self._uses_fused_attention(x, edge_index, return_attention_weights)):
            return self._fused_forward(x, edge_index, edge_attr, None, return_attention_weights)
        self._check_index_range(x, edge_index, None)
        return self._pyg_forward(x, edge_index, given_edge_attr, return_attention_weights)

    # The score policy of the fused forward (FusedAttention._fused_forward).

    def _fused_inputs(self, x: Union[Tensor, PairTensor]) -> FusedInputs:
        # PyG's projections; the root features for the output step.
        H, C = self.heads, self.out_channels
        # The features cast once under autocast (autocast_features): one
        # pass where the four projections of x would take four.
        if isinstance(x, Tensor):
            x = autocast_features(x, self.lin_query, self.lin_key, self.lin_value,
                                  self.lin_skip)
            x = (x, x)
        else:
            x = (autocast_features(x[0], self.lin_key, self.lin_value),
                 autocast_features(x[1], self.lin_query, self.lin_skip))
        query = self.lin_query(x[1]).view(-1, H, C)
        key = self.lin_key(x[0]).view(-1, H, C)
        value = self.lin_value(x[0]).view(-1, H, C)
        # propagate's arguments as PyG names them; the projected edge
        # features ride on the prepared graph (edge_attr: None).
        return FusedInputs(key, query, dict(query=query, key=key, value=value, edge_attr=None),
                           (query, key, value), x[1])

    def _scale(self) -> float:
        return 1.0 / math.sqrt(self.out_channels) if self.out_channels > 0 else 1.0

    def _fused_op(self, graph: graphs.Graph, e_feat: OptTensor, query: Tensor, key: Tensor,
                  value: Tensor, edge_attr: OptTensor):
        return ops.transformer_attention(
            graph.rowptr, graph.col, graph.pad_rows(query), key, value, e_feat=e_feat,
            scale=self._scale(), dropout=self.dropout if self.training else 0.0, csc=graph.csc,
            perm_inv=graph.perm_inv)

    def _fused_output(self, out: Tensor, inputs: FusedInputs) -> Tensor:
        # PyG's head merge, root weight and beta gate.
        H, C = self.heads, self.out_channels
        out = out.reshape(-1, H * C) if self.concat else out.mean(dim=1)
        if self.root_weight:
            x_r = self.lin_skip(inputs.extra)
            if self.lin_beta is not None:
                beta = self.lin_beta(torch.cat([out, x_r, out - x_r], dim=-1))
                beta = beta.sigmoid()
                out = beta * x_r + (1 - beta) * out
            else:
                out = out + x_r
        return out

    @staticmethod
    def _wants_weights(return_attention_weights: Optional[bool]) -> bool:
        # PyG's TransformerConv returns the weights for any bool, False too.
        return isinstance(return_attention_weights, bool)

    def _fused_logits(self, inputs: FusedInputs, src: Tensor, dst: Tensor, edge: OptTensor,
                      dtype: torch.dtype) -> Tensor:
        k = inputs.propagate_kwargs["key"].to(dtype)[src]
        if edge is not None:
            k = k + edge.to(dtype)
        return (inputs.propagate_kwargs["query"].to(dtype)[dst] * k).sum(dim=-1) * self._scale()

    def message_and_aggregate(self, edge_index: Adj, query: Tensor, key: Tensor, value: Tensor,
                              edge_attr: OptTensor) -> Tensor:
        # PyG's propagate calls this for the fused path's prepared graph
        # only (PyG's own path runs PyG's message and aggregate): the fused
        # attention op.
        return self._fused_aggregate(edge_index, query=query, key=key, value=value,
                                     edge_attr=edge_attr)
