"""TransformerConv on the fused graph-transformer attention operator."""
import math
from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.nn import TransformerConv as PyGTransformerConv
from torch_geometric.typing import Adj, OptTensor, PairTensor, SparseTensor

from .. import graph as graphs
from .. import ops
from ._attention import FusedAttention
from ._compat import fake_safe_edge_index_repr

fake_safe_edge_index_repr()  # for torch.compile with EdgeIndex inputs on torch 2.11


def fused_head_supported(heads: int, channels: int, dtype: torch.dtype) -> bool:
    """Whether CUDA kernels of :func:`~pyg_multihead_agg.transformer_attention`
    serve ``heads`` heads of ``channels`` in ``dtype``: none do, the operator
    has CPU kernels only, and :class:`TransformerConv` runs PyG's path on
    CUDA. The CUDA kernel comes with the attention skeleton's third score
    policy (the scaled dot product, design.md section 6); this predicate
    then states its row rule, as :mod:`.gatv2_conv`'s does."""
    return False


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
    the raw features to the values only), and on CUDA (the operator has CPU
    kernels only). The dropout mask is drawn from a Philox stream keyed by
    :func:`torch.manual_seed`, not PyG's, so training runs with dropout
    differ from PyG's in the mask (not in distribution).

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
            return self._fused_forward(x, edge_index, edge_attr, return_attention_weights)
        self._check_index_range(x, edge_index, None)
        return super().forward(x, edge_index, edge_attr, return_attention_weights)

    def _fused_forward(self, x: Union[Tensor, PairTensor], edge_index: Adj,
                       edge_attr: OptTensor, return_attention_weights: Optional[bool]):
        # PyG's TransformerConv.forward with propagate replaced by the
        # graph-preparation step and one call of the fused attention op; the
        # projections, head merge, root weight, beta gate and size checks
        # are PyG's own.
        H, C = self.heads, self.out_channels
        if isinstance(x, Tensor):
            x = (x, x)
        query = self.lin_query(x[1]).view(-1, H, C)
        key = self.lin_key(x[0]).view(-1, H, C)
        value = self.lin_value(x[0]).view(-1, H, C)

        # PyG's size checks of propagate: the adjacency's sparse sizes against
        # the node features.
        sizes = self._check_input(edge_index, None)
        self._set_size(sizes, 0, key)
        self._set_size(sizes, 1, query)
        num_src, num_dst = key.size(0), query.size(0)

        # Projected edge features in the caller's edge order.
        e: OptTensor = None
        if edge_attr is not None and self.lin_edge is not None:
            e = self.lin_edge(self._edge_rows(edge_index, edge_attr)).view(-1, H, C)

        scale = 1.0 / math.sqrt(C) if C > 0 else 1.0
        graph = graphs.prepare(edge_index, num_src, num_dst, self_loops=None,
                               need_csc=self._need_csc(query, key, value, e))
        e_feat = None if e is None else graph.to_csr_order(e, None)
        out, lse = ops.transformer_attention(
            graph.rowptr, graph.col, graph.pad_rows(query), key, value, e_feat=e_feat,
            scale=scale, dropout=self.dropout if self.training else 0.0, csc=graph.csc,
            perm_inv=graph.perm_inv)
        out = graph.crop_rows(out)

        out = out.view(-1, H * C) if self.concat else out.mean(dim=1)
        if self.root_weight:
            x_r = self.lin_skip(x[1])
            if self.lin_beta is not None:
                beta = self.lin_beta(torch.cat([out, x_r, out - x_r], dim=-1))
                beta = beta.sigmoid()
                out = beta * x_r + (1 - beta) * out
            else:
                out = out + x_r
        if not isinstance(return_attention_weights, bool):
            return out
        lse = graph.crop_rows(lse)

        def logits(src: Tensor, dst: Tensor, edge: OptTensor) -> Tensor:
            k = key.to(lse.dtype)[src]
            if edge is not None:
                k = k + edge.to(lse.dtype)
            return (query.to(lse.dtype)[dst] * k).sum(dim=-1) * scale

        return out, self._attention_weights(edge_index, None, lse, logits, e, None,
                                            query.dtype)
