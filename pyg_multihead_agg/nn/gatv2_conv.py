"""GATv2Conv on the fused GATv2 attention operator."""
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import GATv2Conv as PyGGATv2Conv
from torch_geometric.typing import Adj, OptTensor, PairTensor, SparseTensor

from .. import graph as graphs
from .. import ops
from ._attention import FusedAttention, FusedInputs, autocast_features
from ._compat import fake_safe_edge_index_repr

fake_safe_edge_index_repr()  # for torch.compile with EdgeIndex inputs on torch 2.11


def fused_head_supported(heads: int, channels: int, dtype: torch.dtype) -> bool:
    """Whether the CUDA kernels of :func:`~pyg_multihead_agg.gatv2_attention`
    serve ``heads`` heads of ``channels`` in ``dtype``: at most 32 16-byte
    vectors per head (128 channels in float32, 256 in half types, 64 in
    float64), and a row of ``heads * next_pow2(vectors)`` vectors of at most
    128 (csrc/cuda/attention/heuristics.cuh, gatv2_row_config)."""
    vectors = -(-channels // (16 // dtype.itemsize))
    return vectors <= 32 and heads * (1 << max(vectors - 1, 0).bit_length()) <= 128


class GATv2Conv(FusedAttention, PyGGATv2Conv):
    r"""Drop-in replacement for :class:`torch_geometric.nn.GATv2Conv` whose
    per-channel attention scores, edge softmax, attention dropout and
    aggregation run in one fused, deterministic kernel
    (:func:`pyg_multihead_agg.gatv2_attention`) for every adjacency PyG
    accepts: a plain :obj:`edge_index` in any order, an
    :class:`~torch_geometric.EdgeIndex` of any sort order, a
    :class:`torch_sparse.SparseTensor` and a :obj:`torch.sparse` CSR or COO
    :obj:`adj_t`. No :obj:`E x H x C` tensor (PyG's :obj:`x_i + x_j`, its
    LeakyReLU and the messages) and no :obj:`E x H` attention matrix is
    stored: the backward recomputes them from the row log-sum-exp. The
    adjacency goes through :func:`pyg_multihead_agg.graph.prepare` (CSR, CSC
    and self-loops, cached per graph in eager mode, traced under
    :func:`torch.compile`).

    .. math::
        \mathbf{x}^{\prime}_i = \sum_{j \in \mathcal{N}(i) \cup \{ i \}}
        \alpha_{i,j}\mathbf{\Theta}_{s}\mathbf{x}_{j},

    with attention coefficients

    .. math::
        \alpha_{i,j} = \mathrm{softmax}_{j \in \mathcal{N}(i) \cup \{ i \}}
        \left(\mathbf{a}^{\top}\mathrm{LeakyReLU}\left(
        \mathbf{\Theta}_{s} \mathbf{x}_j + \mathbf{\Theta}_{t} \mathbf{x}_i
        \left[ + \mathbf{\Theta}_{e} \mathbf{e}_{j,i} \right]
        \right)\right),

    computed per head; heads are concatenated (or averaged if
    :obj:`concat=False`). :math:`\mathbf{\Theta}_{s}` is :obj:`lin_l`,
    :math:`\mathbf{\Theta}_{t}` is :obj:`lin_r` (the same matrix if
    :obj:`share_weights=True`), both with a bias if :obj:`bias=True`.

    Constructor arguments, defaults, parameter names (a PyG
    :class:`~torch_geometric.nn.GATv2Conv` :obj:`state_dict` loads as is),
    return types (:obj:`return_attention_weights` included) and the
    self-loop, :obj:`edge_dim`, :obj:`fill_value`, :obj:`share_weights`,
    bipartite, dropout and :obj:`residual` behaviour are PyG's. PyG's own
    path runs only where the fused kernel cannot serve: with PyG's
    message-passing hooks or the explainer, with :obj:`decomposed_layers > 1`,
    for attention weights after dropout in training (the fused kernel keeps
    no mask), with :obj:`fused_attention=False`, and on CUDA for heads wider
    than the kernels support (:obj:`out_channels` above 128 in float32, 256
    in half types, 64 in float64). The dropout mask is drawn from a Philox
    stream keyed by :func:`torch.manual_seed`, not PyG's, so training runs
    with dropout differ from PyG's in the mask (not in distribution).

    Args:
        in_channels (int or tuple): Size of each input sample, or :obj:`-1` to
            derive the size from the first input(s) to the forward method.
            A tuple corresponds to the sizes of source and target
            dimensionalities in case of a bipartite graph.
        out_channels (int): Size of each output sample.
        heads (int, optional): Number of multi-head-attentions.
            (default: :obj:`1`)
        concat (bool, optional): If set to :obj:`False`, the multi-head
            attentions are averaged instead of concatenated.
            (default: :obj:`True`)
        negative_slope (float, optional): LeakyReLU angle of the negative
            slope. (default: :obj:`0.2`)
        dropout (float, optional): Dropout probability of the normalized
            attention coefficients. (default: :obj:`0`)
        add_self_loops (bool, optional): If set to :obj:`False`, will not add
            self-loops to the input graph. (default: :obj:`True`)
        edge_dim (int, optional): Edge feature dimensionality (in case
            there are any). (default: :obj:`None`)
        fill_value (float or torch.Tensor or str, optional): The way to
            generate edge features of self-loops (in case
            :obj:`edge_dim != None`), as in
            :func:`torch_geometric.utils.add_self_loops`.
            (default: :obj:`"mean"`)
        bias (bool, optional): If set to :obj:`False`, the layer will not learn
            an additive bias. (default: :obj:`True`)
        share_weights (bool, optional): If set to :obj:`True`, the same matrix
            will be applied to the source and the target node of every edge.
            (default: :obj:`False`)
        residual (bool, optional): If set to :obj:`True`, the layer will add
            a learnable skip-connection. (default: :obj:`False`)
        fused_attention (bool, optional): If set to :obj:`False`, the layer
            runs PyG's own :class:`~torch_geometric.nn.GATv2Conv`.
            (default: :obj:`True`)
        **kwargs (optional): Additional arguments of
            :class:`torch_geometric.nn.conv.MessagePassing`.

    Shapes:
        - **input:**
          node features :math:`(|\mathcal{V}|, F_{in})` or
          :math:`((|\mathcal{V_s}|, F_{s}), (|\mathcal{V_t}|, F_{t}))`
          if bipartite (both needed: the scores read the destinations'),
          edge indices :math:`(2, |\mathcal{E}|)` (:obj:`Tensor` or
          :class:`EdgeIndex`), or a sparse :obj:`adj_t` of shape
          :math:`(|\mathcal{V}_t|, |\mathcal{V}_s|)`,
          edge features :math:`(|\mathcal{E}|, D)` *(optional, in the
          adjacency's edge order)*
        - **output:** node features :math:`(|\mathcal{V}|, H * F_{out})` or
          :math:`(|\mathcal{V}_t|, H * F_{out})` if bipartite
          (:math:`F_{out}` instead of :math:`H * F_{out}` if
          :obj:`concat=False`).
          If :obj:`return_attention_weights=True`, additionally PyG's
          :math:`((2, |\mathcal{E}|), (|\mathcal{E}|, H))` for edge indices,
          a :class:`SparseTensor` holding the weights for a
          :class:`SparseTensor`, or :math:`(\text{sparse}, (|\mathcal{E}|, H))`
          for a :obj:`torch.sparse` tensor, with self-loops where PyG adds them.

    Example:
        >>> import torch
        >>> from pyg_multihead_agg.nn import GATv2Conv
        >>> conv = GATv2Conv(16, 8, heads=4)
        >>> x = torch.randn(5, 16)
        >>> edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
        >>> conv(x, edge_index).shape
        torch.Size([5, 32])
    """
    _fused_head_supported = staticmethod(fused_head_supported)
    # fused_attention=False is PyG's layer as it is (message and aggregate).
    _aggregates_pyg_weights = False

    def __init__(self, *args, fused_attention: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fused_attention = fused_attention

    # PyG's Inspector caches class sources by class name, so it would read
    # this class's source for the parent's "# propagate_type:" comments: state
    # the signatures of the generated propagate/edge_updater explicitly.
    propagate_type = {"x": "PairTensor", "alpha": "Tensor"}
    edge_updater_type = {"x": "PairTensor", "edge_attr": "OptTensor"}

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
                (or :obj:`[E]` for :obj:`edge_dim=1`) in the adjacency's
                edge order. (default: :obj:`None`)
            return_attention_weights (bool, optional): If set to
                :obj:`True`, also returns the edges (with self-loops where
                PyG adds them) and their attention weights, as PyG does.
                (default: :obj:`None`)
        """
        self._check_destination_features(x)
        self._check_adjacency(edge_index, edge_attr)
        # (PyG's path reads the adjacency's values itself: it gets the caller's edge_attr.)
        given_edge_attr = edge_attr
        edge_attr, pyg_only = self._adjacency_edge_attr(edge_index, edge_attr)
        if edge_attr is not None and self.lin_edge is None:
            # PyG fails with a bare AssertionError in edge_update.
            raise ValueError("edge_attr was given to a GATv2Conv without edge features (or the "
                             "sparse adjacency holds values, which PyG reads as edge_attr): "
                             "construct it with edge_dim=edge_attr.size(-1)")
        if not pyg_only and self._uses_fused_attention(x, edge_index, return_attention_weights):
            return self._fused_forward(x, edge_index, edge_attr, None, return_attention_weights)
        self._check_index_range(x, edge_index, None)
        return self._pyg_forward(x, edge_index, given_edge_attr, return_attention_weights)

    # The score policy of the fused forward (FusedAttention._fused_forward).

    def _fused_inputs(self, x: Union[Tensor, PairTensor]) -> FusedInputs:
        # PyG's projections (and its residual).
        H, C = self.heads, self.out_channels
        res: Optional[Tensor] = None
        # The features cast once under autocast (autocast_features).
        if isinstance(x, Tensor):
            assert x.dim() == 2
            x = autocast_features(x, self.res, self.lin_l, self.lin_r)
            if self.res is not None:
                res = self.res(x)
            x_l = self.lin_l(x).view(-1, H, C)
            x_r = x_l if self.share_weights else self.lin_r(x).view(-1, H, C)
        else:
            x_l_in, x_r_in = x
            assert x_l_in.dim() == 2
            x_l_in = autocast_features(x_l_in, self.lin_l)
            x_r_in = autocast_features(x_r_in, self.res, self.lin_r)
            if self.res is not None:
                res = self.res(x_r_in)
            x_l = self.lin_l(x_l_in).view(-1, H, C)
            x_r = self.lin_r(x_r_in).view(-1, H, C)
        # propagate's arguments as PyG names them (alpha: none yet, the op
        # computes the attention).
        return FusedInputs(x_l, x_r, dict(x=(x_l, x_r), alpha=None),
                           (x_l, x_r, self.att), res)

    def _fused_op(self, graph: graphs.Graph, e_feat: OptTensor, x: PairTensor, alpha: None):
        x_l, x_r = x
        # The bias goes into the op (_op_bias); the residual is added after.
        return ops.gatv2_attention(
            graph.rowptr, graph.col, x_l, graph.pad_rows(x_r),
            self.att.view(self.heads, self.out_channels).to(x_l.dtype), e_feat=e_feat,
            negative_slope=self.negative_slope, dropout=self.dropout if self.training else 0.0,
            csc=graph.csc, bias=self._op_bias(x_l), perm_inv=graph.perm_inv)

    def _fused_logits(self, inputs: FusedInputs, src: Tensor, dst: Tensor, edge: OptTensor,
                      dtype: torch.dtype) -> Tensor:
        x_l, x_r = inputs.propagate_kwargs["x"]
        z = x_l.to(dtype)[src] + x_r.to(dtype)[dst]
        if edge is not None:
            z = z + edge.to(dtype)
        att = self.att.view(self.heads, self.out_channels).to(dtype)
        return (F.leaky_relu(z, self.negative_slope) * att).sum(dim=-1)

    def message_and_aggregate(self, edge_index: Adj, x: PairTensor, alpha: OptTensor) -> Tensor:
        # PyG's propagate calls this for the fused path's prepared graph
        # only (PyG's own path runs PyG's message and aggregate): the fused
        # attention op.
        return self._fused_aggregate(edge_index, x=x, alpha=alpha)
