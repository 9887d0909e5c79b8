"""GATConv on the fused GAT attention operator."""
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric import is_compiling
from torch_geometric.nn import GATConv as PyGGATConv
from torch_geometric.nn.dense.linear import Linear as PyGLinear
from torch_geometric.typing import Adj, OptPairTensor, OptTensor, Size, SparseTensor

from .. import graph as graphs
from .. import ops
from ._attention import FusedAttention, FusedInputs, _observed, autocast_features
from ._compat import fake_safe_edge_index_repr

fake_safe_edge_index_repr()  # for torch.compile with EdgeIndex inputs on torch 2.11


def fused_head_supported(heads: int, channels: int, dtype: torch.dtype) -> bool:
    """Whether the CUDA kernels of :func:`~pyg_multihead_agg.gat_attention`
    serve heads of ``channels`` in ``dtype`` (any number of heads): a head must fit one chunk of
    the CUDA backward, 128 16-byte vectors, or 128 elements when
    ``channels`` is not a multiple of the vector width."""
    vec = 16 // dtype.itemsize
    limit = 128 * vec if channels % vec == 0 else 128
    return channels <= limit


class _FoldedScores(torch.autograd.Function):
    """PyG's attention scores ``(lin(x_in).view(N, H, C) * att).sum(-1)`` for
    every ``att`` (``[1, H, C]`` each) of one linear map ``lin`` without
    bias, as one thin GEMM ``x_in @ fold`` ([N, F] @ [F, k * H]), where
    ``fold[f, a, h] = sum_c weight[h * C + c, f] * atts[a][h, c]``: no
    ``[N, H, C]`` product or its gradient. One autograd node for the fold,
    the GEMM and their backward (the same arithmetic as autograd's, in at
    least float32 for the sums over nodes), not one per view, einsum and
    stack: each node costs host time in every step of a small graph. One or
    two atts (a fixed signature, which torch.compile traces). ``x_cast``:
    ``x_in`` already cast to the autocast dtype (``autocast_features``) for
    the forward GEMM, which then casts nothing; the backward reads ``x_in``."""

    @staticmethod
    def forward(x_in: Tensor, weight: Tensor, att: Tensor, att_2: Optional[Tensor] = None,
                x_cast: Optional[Tensor] = None) -> Tensor:
        atts = (att,) if att_2 is None else (att, att_2)
        H, C = att.size(-2), att.size(-1)
        with torch.autocast(x_in.device.type, enabled=False):  # fold in the weights' dtype
            fold = _fold(weight.view(H, C, -1), atts)
        if not torch.is_autocast_enabled(x_in.device.type):
            fold = fold.to(x_in.dtype)
        return (x_in if x_cast is None else x_cast) @ fold

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(*(t for t in inputs[:4] if t is not None))

    @staticmethod
    def backward(ctx, grad: Tensor):
        x_in, weight, *atts = ctx.saved_tensors
        H, C = atts[0].size(-2), atts[0].size(-1)
        w = weight.view(H, C, -1)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = (grad @ _fold(w, atts).t().to(grad.dtype)).to(x_in.dtype)
        if not any(ctx.needs_input_grad[1:]):
            return grad_x, None, None, None, None
        acc = torch.promote_types(torch.promote_types(x_in.dtype, grad.dtype), torch.float32)
        # [H, k, F]: the gradient of fold, head-major.
        grad_fold = (x_in.t().to(acc) @ grad.to(acc)).view(-1, len(atts), H).permute(2, 1, 0)
        grad_w = grad_atts = None
        if ctx.needs_input_grad[1]:  # [H, C, F] = sum over a of att[a, h, c] * grad_fold[h, a, f]
            a = torch.stack([att.reshape(H, C) for att in atts], dim=1).to(acc)  # [H, k, C]
            grad_w = torch.bmm(a.transpose(1, 2), grad_fold).view_as(weight).to(weight.dtype)
        if any(ctx.needs_input_grad[2:]):  # [H, k, C] = grad_fold @ w^T per head
            grad_a = torch.bmm(grad_fold, w.transpose(1, 2).to(acc))
            grad_atts = tuple(grad_a[:, i].reshape(att.shape).to(att.dtype)
                              if ctx.needs_input_grad[2 + i] else None
                              for i, att in enumerate(atts))
        grad_atts = grad_atts or (None,) * len(atts)
        return (grad_x, grad_w) + grad_atts + (None,) * (3 - len(atts))


# The fold's heuristic: the node count times heads times channels from which
# the fold pays, per device type (see _fold_pays).
_FOLD_MIN_ELEMENTS = {"cuda": 1 << 25, "cpu": 1 << 17}


def _fold_pays(x_in: Tensor, x_proj: Tensor) -> bool:
    """Whether the scores take the fold (``_FoldedScores``) or the score op
    (``_gat_scores``). The fold reads ``x_in`` [N, F] about three times
    (forward GEMM, the two backward GEMMs) where the score op reads
    ``x_proj`` [N, H, C] three times, but it costs a fixed host time per
    call: a Python autograd node and about ten bmm, GEMM and view calls. So
    it pays only where the device, not the host, bounds the step: wide
    enough inputs ``F <= 4 H C`` on graphs large enough. On CUDA from
    ``N H C`` of 2^25. H200, F_in 128, 4 x 32, without and with the fold:
    a products-like layer step (2^28) 29.7 and 28.1 ms, an arxiv-like one
    (2^24.4) 1.69 and 1.62 ms, but the NeighborLoader mini-batch step of
    benchmarks/bench_minibatch.py (about 2^24 in its first layer) 2.8-2.9
    and 3.9 ms: the threshold gives up 4% on a lone arxiv-sized layer for
    the host-bound steps of that size. On the CPU, where a pass over
    ``x_proj`` costs far more next to a call, from 2^17."""
    return _fold_pays_for(x_in, x_proj.size(0), x_proj.size(1) * x_proj.size(2))


def _fold_pays_for(x_in: Tensor, n: int, hc: int) -> bool:
    # _fold_pays for a projection of n rows of hc = H * C elements.
    minimum = _FOLD_MIN_ELEMENTS.get(x_in.device.type, _FOLD_MIN_ELEMENTS["cuda"])
    return x_in.dim() == 2 and x_in.size(1) <= 4 * hc and n * hc >= minimum


def _plain_weight(lin) -> Optional[Tensor]:
    # The weight [H * C, F] of a projection lin(x) = x @ weight^T: a linear
    # map without bias whose weight is initialised; else None.
    w = getattr(lin, "weight", None)
    if (getattr(lin, "bias", None) is not None or not isinstance(w, Tensor)
            or isinstance(w, torch.nn.parameter.UninitializedParameter) or w.dim() != 2):
        return None
    return w


def _gat_scores(x_proj: Tensor, att: Tensor, att_2: Optional[Tensor] = None
                ) -> Tuple[Tensor, ...]:
    """PyG's attention scores ``(x_proj * att).sum(-1)`` ([N, H]) of one or
    two atts in one kernel and one autograd node (``_gat_scores``,
    csrc/ops.cpp), not a product, a sum and their backward per att."""
    s_src, s_dst = torch.ops.pyg_multihead_agg._gat_scores(x_proj, att, att_2)
    return (s_src,) if att_2 is None else (s_src, s_dst)


def _fold(w: Tensor, atts: Tuple[Tensor, ...]) -> Tensor:
    """[F, k * H]: w [H, C, F] summed against each att [.., H, C] per head."""
    H, C = w.size(0), w.size(1)
    a = torch.stack([att.reshape(H, C) for att in atts], dim=1)  # [H, k, C]
    return torch.bmm(a, w).permute(2, 1, 0).reshape(w.size(2), -1)  # [H, k, F] -> [F, k*H]


class GATConv(FusedAttention, PyGGATConv):
    r"""Drop-in replacement for :class:`torch_geometric.nn.GATConv` whose
    edge softmax, attention dropout and aggregation run in one fused,
    deterministic kernel (:func:`pyg_multihead_agg.gat_attention`) for every
    adjacency PyG accepts: a plain :obj:`edge_index` in any order, an
    :class:`~torch_geometric.EdgeIndex` of any sort order, a
    :class:`torch_sparse.SparseTensor` and a :obj:`torch.sparse` CSR or COO
    :obj:`adj_t`. The :obj:`E x H` attention matrix and the
    :obj:`E x H x C` messages are never stored: the backward recomputes them
    from the row log-sum-exp. The adjacency goes through
    :func:`pyg_multihead_agg.graph.prepare` (CSR, CSC and self-loops, cached
    per graph in eager mode, traced under :func:`torch.compile`).

    .. math::
        \mathbf{x}^{\prime}_i = \sum_{j \in \mathcal{N}(i) \cup \{ i \}}
        \alpha_{i,j}\mathbf{\Theta}_s\mathbf{x}_{j},

    with attention coefficients

    .. math::
        \alpha_{i,j} = \mathrm{softmax}_{j \in \mathcal{N}(i) \cup \{ i \}}
        \left(\mathrm{LeakyReLU}\left(
        \mathbf{a}^{\top}_{s} \mathbf{\Theta}_{s}\mathbf{x}_j
        + \mathbf{a}^{\top}_{t} \mathbf{\Theta}_{t}\mathbf{x}_i
        \left[ + \mathbf{a}^{\top}_{e} \mathbf{\Theta}_{e} \mathbf{e}_{j,i}
        \right] \right)\right),

    computed per head; heads are concatenated (or averaged if
    :obj:`concat=False`). If the graph is not bipartite,
    :math:`\mathbf{\Theta}_{s} = \mathbf{\Theta}_{t}`.

    Constructor arguments, defaults, parameter names (a PyG
    :class:`~torch_geometric.nn.GATConv` :obj:`state_dict` loads as is),
    return types (:obj:`return_attention_weights` included) and the
    self-loop, :obj:`edge_dim`, :obj:`fill_value`, bipartite, dropout and
    :obj:`residual` behaviour are PyG's. PyG's own unfused path runs only
    where the fused kernel cannot serve: with PyG's message-passing hooks
    or the explainer, with :obj:`decomposed_layers > 1`, for attention
    weights after dropout in training (the fused kernel keeps no mask), with
    :obj:`fused_attention=False`, and on CUDA for heads wider than the
    backward kernel supports (:obj:`out_channels` above 128, or above 512
    in float32 / 1024 in half types when a multiple of 4 / 8). The dropout
    mask is drawn from a Philox stream keyed by :func:`torch.manual_seed`,
    not PyG's, so training runs with dropout differ from PyG's in the mask
    (not in distribution).

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
        residual (bool, optional): If set to :obj:`True`, the layer will add
            a learnable skip-connection. (default: :obj:`False`)
        fused_attention (bool, optional): If set to :obj:`False`, the layer
            runs PyG's edge softmax and aggregates with
            :func:`pyg_multihead_agg.multihead_spmm` for sparse adjacencies
            (:class:`SparseTensor`, :obj:`torch.sparse`, column-sorted
            :class:`EdgeIndex`), PyG's gather/scatter otherwise.
            (default: :obj:`True`)
        **kwargs (optional): Additional arguments of
            :class:`torch_geometric.nn.conv.MessagePassing`.

    Shapes:
        - **input:**
          node features :math:`(|\mathcal{V}|, F_{in})` or
          :math:`((|\mathcal{V_s}|, F_{s}), (|\mathcal{V_t}|, F_{t}))`
          if bipartite,
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
        >>> from pyg_multihead_agg.nn import GATConv
        >>> conv = GATConv(16, 8, heads=4)
        >>> x = torch.randn(5, 16)
        >>> edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
        >>> conv(x, edge_index).shape
        torch.Size([5, 32])
    """
    _fused_head_supported = staticmethod(fused_head_supported)

    def __init__(self, *args, fused_attention: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fused_attention = fused_attention
        # Fused path: attention scores as x @ (W folded with att), one thin
        # GEMM (True), or PyG's (W x * att).sum(-1) (False), or whichever
        # _fold_pays picks for the input (None); see _scores.
        self.fold_scores: Optional[bool] = None

    # PyG's Inspector caches class sources by class name, so it would read
    # this class's source for the parent's "# propagate_type:" comments: state
    # the signatures of the generated propagate/edge_updater explicitly.
    propagate_type = {"x": "OptPairTensor", "alpha": "Tensor"}
    edge_updater_type = {"alpha": "OptPairTensor", "edge_attr": "OptTensor"}

    def forward(
        self,
        x: Union[Tensor, OptPairTensor],
        edge_index: Adj,
        edge_attr: OptTensor = None,
        size: Size = None,
        return_attention_weights: Optional[bool] = None,
    ) -> Union[Tensor, Tuple[Tensor, Tuple[Tensor, Tensor]], Tuple[Tensor, SparseTensor]]:
        r"""Runs the layer.

        Args:
            x (torch.Tensor or (torch.Tensor, torch.Tensor)): The node
                features, or a pair (source, destination) for a bipartite
                graph (the destination may be :obj:`None`).
            edge_index (torch.Tensor or EdgeIndex or SparseTensor): The
                graph: :obj:`[2, E]` (source, destination) in any order, an
                :class:`EdgeIndex`, or a sparse :obj:`adj_t`.
            edge_attr (torch.Tensor, optional): Edge features :obj:`[E, D]`
                in the adjacency's edge order. (default: :obj:`None`)
            size ((int, int), optional): The shape of the adjacency,
                :obj:`(num_src, num_dst)`. (default: :obj:`None`)
            return_attention_weights (bool, optional): If set to
                :obj:`True`, also returns the edges (with self-loops where
                PyG adds them) and their attention weights, as PyG does.
                (default: :obj:`None`)
        """
        self._check_adjacency(edge_index, edge_attr)
        # (PyG's path reads the adjacency's values itself: it gets the caller's edge_attr.)
        given_edge_attr = edge_attr
        edge_attr, pyg_only = self._adjacency_edge_attr(edge_index, edge_attr)
        if not pyg_only and self._uses_fused_attention(x, edge_index, return_attention_weights):
            return self._fused_forward(x, edge_index, edge_attr, size, return_attention_weights)
        self._check_index_range(x, edge_index, size)
        return self._pyg_forward(x, edge_index, given_edge_attr, size, return_attention_weights)

    def _scores(self, lin: torch.nn.Module, x_in: Tensor, x_proj: Tensor,
                *atts: Tensor, x_cast: OptTensor = None) -> Tuple[Tensor, ...]:
        # The attention scores (x_proj * att).sum(-1) of PyG, [N, H] each. With
        # x_proj = lin(x_in) and no bias, they equal x_in @ fold, where fold
        # [F_in, H] is lin's weight summed against att per head: one thin GEMM
        # over x_in for all the atts, instead of an [N, H, C] product and a
        # reduction per att (and, in the backward, their [N, H, C] gradients);
        # _fold_pays says where that pays. Against float64, the attention
        # parameters' gradients are off by 9.2e-7 with the fold and 8.6e-4
        # (as PyG's own layer) without on products-like, but 7.8e-5 with and
        # 1.2e-6 without on reddit-like. Each large error is one edge whose logit
        # is within float32 rounding of leaky_relu's kink and lands on the
        # other side of it (tools/score_kink_flips.py): att_dst's
        # gradient is nonzero only through the kink, so one such edge moves
        # it by a whole term. Which edges flip depends on the order of the
        # arithmetic, not its precision. fold_scores = False restores PyG's
        # products, True forces the fold, None (the default) asks _fold_pays.
        # x_cast: x_in as the projection took it (autocast_features).
        fold = getattr(self, "fold_scores", None)
        if fold is False or (fold is None and not _fold_pays(x_in, x_proj)):
            # PyG's products and sums, of every att in one kernel and autograd node
            return _gat_scores(x_proj, *atts)
        w = _plain_weight(lin)
        if w is None or x_in.dim() != 2 or not x_in.is_floating_point():
            return _gat_scores(x_proj, *atts)  # (no weight to fold)
        # (x_cast only where it is another tensor: Dynamo cannot trace an
        # autograd.Function given one tensor twice.)
        scores = _FoldedScores.apply(x_in, w, atts[0], atts[1] if len(atts) > 1 else None,
                                     None if x_cast is x_in else x_cast)
        scores = scores.view(-1, len(atts), x_proj.size(1))
        return scores.unbind(dim=1)

    def _fused_layer(self, x: Union[Tensor, OptPairTensor], edge_index: Adj,
                     size: Size) -> OptTensor:
        # The whole call as one operator, _gat_conv (projection, scores, the
        # attention op, heads merged and the bias, in one autograd node
        # instead of seven: a small graph's step is bound by the host's cost
        # per operation and node; compiled, the traced graph holds one call
        # for the forward and one for the backward, its halves). Where it
        # serves: one feature matrix and the shared projection, PyG's Linear
        # without bias and with no hook that would see its call, no
        # residual, no autocast, the score products (not the fold), and
        # nothing that observes propagate. Else None.
        lin = self.lin
        if (not isinstance(x, Tensor) or type(lin) is not PyGLinear
                or self.res is not None
                or x.dim() != 2 or not x.is_floating_point()
                or torch.is_autocast_enabled(x.device.type) or _observed(lin)):
            return None
        weight = _plain_weight(lin)
        if weight is None:
            return None
        fold = self.fold_scores
        if fold or (fold is None and _fold_pays_for(x, x.size(0),
                                                    self.heads * self.out_channels)):
            return None
        # (compiled, PyG's generated propagate runs no hook: nothing to observe)
        if not is_compiling() and self._propagate_observed():
            return None
        # PyG's size checks: the adjacency's (and size's) sizes must be x's.
        sizes = self._check_input(edge_index, size)
        self._set_size(sizes, 0, x)
        self._set_size(sizes, 1, x)
        num_nodes = x.size(0)
        loops = (self._num_loop_nodes(x, size, edge_index)
                 if getattr(self, "add_self_loops", False) else None)
        need_csc = self._need_csc(x, weight, self.att_src, self.att_dst)
        dropout = self.dropout if self.training else 0.0
        # The Philox key as gat_attention draws it: the same masks as the
        # steps below for the same seed.
        philox = ops._dropout_key(x) if dropout > 0 else None
        edges = graphs.compiled_edges(edge_index)
        if edges is not None:
            # compiled, an edge list: the graph kept for it, read inside the
            # ops (ops._gat_conv_on_edges), not copied into the step
            return ops._gat_conv_on_edges(
                x, weight, self.att_src, self.att_dst, self.bias, *edges,
                -1 if loops is None else loops, need_csc, self.concat,
                float(self.negative_slope), float(dropout), philox)
        graph = graphs.prepare(edge_index, num_nodes, num_nodes, self_loops=loops,
                               need_csc=need_csc)
        colptr, row, perm = graph.csc if graph.csc is not None else (None, None, None)
        return torch.ops.pyg_multihead_agg._gat_conv(
            x, weight, self.att_src, self.att_dst, self.bias, graph.rowptr, graph.col, colptr,
            row, perm, graph.perm_inv if graph.csc is not None else None, self.concat,
            float(self.negative_slope), float(dropout), philox)

    # The score policy of the fused forward (FusedAttention._fused_forward).

    def _fused_inputs(self, x: Union[Tensor, OptPairTensor]) -> FusedInputs:
        # PyG's projections and per-node scores (and its residual).
        H, C = self.heads, self.out_channels
        res: Optional[Tensor] = None
        # The features as the projections take them: cast once under
        # autocast (autocast_features); the fold's backward reads x itself.
        if isinstance(x, Tensor):
            assert x.dim() == 2, "Static graphs not supported in 'GATConv'"
            x_lin = autocast_features(x, self.res, self.lin, self.lin_src, self.lin_dst)
            if self.res is not None:
                res = self.res(x_lin)
            if self.lin is not None:
                x_src = x_dst = self.lin(x_lin).view(-1, H, C)
                alpha_src, alpha_dst = self._scores(self.lin, x, x_src, self.att_src,
                                                    self.att_dst, x_cast=x_lin)
            else:
                x_src = self.lin_src(x_lin).view(-1, H, C)
                x_dst = self.lin_dst(x_lin).view(-1, H, C)
                alpha_src, = self._scores(self.lin_src, x, x_src, self.att_src, x_cast=x_lin)
                alpha_dst, = self._scores(self.lin_dst, x, x_dst, self.att_dst, x_cast=x_lin)
        else:
            x_src_in, x_dst_in = x
            assert x_src_in.dim() == 2, "Static graphs not supported in 'GATConv'"
            lin_src = self.lin if self.lin is not None else self.lin_src
            lin_dst = self.lin if self.lin is not None else self.lin_dst
            src_lin = autocast_features(x_src_in, lin_src)
            dst_lin = autocast_features(x_dst_in, self.res, lin_dst)
            if x_dst_in is not None and self.res is not None:
                res = self.res(dst_lin)
            x_src = lin_src(src_lin).view(-1, H, C)
            alpha_src, = self._scores(lin_src, x_src_in, x_src, self.att_src, x_cast=src_lin)
            x_dst = alpha_dst = None
            if x_dst_in is not None:
                x_dst = lin_dst(dst_lin).view(-1, H, C)
                alpha_dst, = self._scores(lin_dst, x_dst_in, x_dst, self.att_dst,
                                          x_cast=dst_lin)
        # propagate's arguments as PyG names them; alpha holds the per-node
        # scores (PyG's own alpha before edge_updater).
        return FusedInputs(x_src, x_dst, dict(x=(x_src, x_dst), alpha=(alpha_src, alpha_dst)),
                           (x_src, alpha_src, alpha_dst), res)

    def _fused_edge_values(self, edge_attr: Tensor) -> Tensor:
        # PyG's edge scores: the projected features summed against att_edge.
        return _gat_scores(super()._fused_edge_values(edge_attr), self.att_edge)[0]

    def _fused_op(self, graph: graphs.Graph, s_edge: OptTensor, x: OptPairTensor,
                  alpha: Tuple[Tensor, OptTensor]):
        alpha_src, alpha_dst = alpha
        if alpha_dst is None:  # no destination features: PyG adds no destination score
            alpha_dst = alpha_src.new_zeros(graph.num_dst, self.heads)
        # The bias goes into the op (_op_bias); the residual is added after,
        # as PyG adds it before the bias: the same sum in another order.
        return ops.gat_attention(
            graph.rowptr, graph.col, alpha_src, graph.pad_rows(alpha_dst), x[0], s_edge=s_edge,
            negative_slope=self.negative_slope, dropout=self.dropout if self.training else 0.0,
            csc=graph.csc, bias=self._op_bias(x[0]), perm_inv=graph.perm_inv)

    def _fused_logits(self, inputs: FusedInputs, src: Tensor, dst: Tensor, edge: OptTensor,
                      dtype: torch.dtype) -> Tensor:
        alpha_src, alpha_dst = inputs.propagate_kwargs["alpha"]
        logit = alpha_src.to(dtype)[src]
        if alpha_dst is not None:
            logit = logit + alpha_dst.to(dtype)[dst]
        if edge is not None:
            logit = logit + edge.to(dtype)
        return F.leaky_relu(logit, self.negative_slope)

    def message_and_aggregate(self, edge_index: Adj, x: OptPairTensor,
                              alpha: Union[Tensor, Tuple[Tensor, OptTensor]]) -> Tensor:
        # PyG's propagate calls this for sparse adjacencies. On the fused
        # path (the prepared graph, alpha the per-node scores) it runs the
        # fused attention op; on PyG's path (fused_attention=False: a
        # SparseTensor, torch.sparse or column-sorted EdgeIndex) it
        # aggregates PyG's attention weights alpha [E, H], which arrive in
        # the adjacency's edge order.
        out = self._fused_aggregate(edge_index, x=x, alpha=alpha)
        if out is not None:
            return out
        x_src, x_dst = x
        num_dst = x_src.size(0) if x_dst is None else x_dst.size(0)
        sizes = self._check_input(edge_index, None)
        if sizes[1] is not None and x_dst is None:
            num_dst = sizes[1]
        graph = graphs.prepare(edge_index, x_src.size(0), num_dst,
                               need_csc=self._need_csc(alpha, x_src))
        return ops.multihead_spmm(graph.rowptr, graph.col, graph.to_csr_order(alpha), x_src,
                                  csc=graph.csc, perm_inv=graph.perm_inv)
