"""GATConv whose aggregation runs on the fused multi-head CSR operator."""
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric import EdgeIndex, is_compiling
from torch_geometric.index import ptr2index
from torch_geometric.nn import GATConv as PyGGATConv
from torch_geometric.typing import (
    Adj,
    OptPairTensor,
    OptTensor,
    Size,
    SparseTensor,
    torch_sparse,
)
from torch_geometric.utils import add_self_loops, is_torch_sparse_tensor, remove_self_loops
from torch_geometric.utils.sparse import set_sparse_value

from .. import ops
from ..adj import (
    GraphCache,
    compact_indices,
    csr_csc_from_edge_index,
    csr_csc_from_sparse_tensor,
    csr_csc_from_torch_csr,
    invert_perm,
)
from ._compat import fake_safe_edge_index_repr

fake_safe_edge_index_repr()  # for torch.compile with EdgeIndex inputs on torch 2.11

# PyG's MessagePassing hook dictionaries: with any hook registered, the layer
# takes PyG's path, where the hooks see the messages they expect.
_HOOKS = ("propagate_forward_pre", "propagate_forward", "message_forward_pre", "message_forward",
          "aggregate_forward_pre", "aggregate_forward", "message_and_aggregate_forward_pre",
          "message_and_aggregate_forward", "edge_update_forward_pre", "edge_update_forward")


class _FoldedScores(torch.autograd.Function):
    """``x_in @ fold`` ([N, F] @ [F, k]) whose weight gradient ``x_in^T @ grad``
    is summed over the N rows in chunks of 256, then over the chunks (a
    batched GEMM and a reduction), in at least float32, instead of one GEMM
    whose F * k dot products each run over all N rows. Measured on the H200
    (``benchmarks/results/gpu_2026-11-30c``): the parameter gradients' error
    against float64 on products-like went from 1.4e-6 to 9.2e-7; on
    reddit-like it stayed at 7.8e-5, which comes from one logit on the other
    side of leaky_relu's kink (see ``GATConv._scores``), not from this sum."""

    @staticmethod
    def forward(x_in: Tensor, fold: Tensor) -> Tensor:
        return x_in @ fold

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x_in, fold = ctx.saved_tensors
        grad_x = grad_fold = None
        if ctx.needs_input_grad[0]:
            grad_x = (grad @ fold.t().to(grad.dtype)).to(x_in.dtype)
        if ctx.needs_input_grad[1]:
            acc = torch.promote_types(torch.promote_types(x_in.dtype, grad.dtype), torch.float32)
            grad_fold = _chunked_at_b(x_in.to(acc), grad.to(acc)).to(fold.dtype)
        return grad_x, grad_fold


def _chunked_at_b(a: Tensor, b: Tensor, chunk: int = 256) -> Tensor:
    """a^T @ b for a [N, F] and b [N, k], summed over N by chunks of `chunk` rows."""
    full = a.size(0) // chunk * chunk
    out = a[full:].t() @ b[full:]
    if full:
        parts = torch.bmm(a[:full].view(-1, chunk, a.size(1)).transpose(1, 2),
                          b[:full].view(-1, chunk, b.size(1)))
        out = out + parts.sum(dim=0)
    return out


class GATConv(PyGGATConv):
    r"""Drop-in replacement for :class:`torch_geometric.nn.GATConv` whose
    neighbourhood aggregation runs on
    :func:`pyg_multihead_agg.multihead_spmm` (one fused kernel over all
    heads, deterministic atomic-free backward over a cached CSC) whenever the
    adjacency is a :class:`torch_sparse.SparseTensor`, a
    :obj:`torch.sparse_csr` tensor or an :class:`~torch_geometric.EdgeIndex`
    sorted by column. A plain :obj:`edge_index` tensor (and a
    :obj:`torch.sparse_coo` tensor) takes PyG's own message/aggregate path.

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
    return types and the self-loop, :obj:`edge_dim`, bipartite, dropout and
    :obj:`residual` behaviour are PyG's. One difference: with
    :obj:`add_self_loops=True` and a column-sorted :class:`EdgeIndex`, the
    graph with self-loops is re-sorted by column (so the fused path still
    applies) and :obj:`return_attention_weights` reports edges in that order.

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
          adjacency's edge order: CSR order for sparse :obj:`adj_t`)*
        - **output:** node features :math:`(|\mathcal{V}|, H * F_{out})` or
          :math:`(|\mathcal{V}_t|, H * F_{out})` if bipartite
          (:math:`F_{out}` instead of :math:`H * F_{out}` if
          :obj:`concat=False`).
          If :obj:`return_attention_weights=True`, additionally
          :math:`((2, |\mathcal{E}|), (|\mathcal{E}|, H))` for edge indices,
          a :class:`SparseTensor` holding the weights for a
          :class:`SparseTensor`, or :math:`(\text{sparse}, (|\mathcal{E}|, H))`
          for a :obj:`torch.sparse` tensor.
    """
    SUPPORTS_FUSED_EDGE_INDEX = True

    def __init__(self, *args, fused_attention: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fused_attention = fused_attention
        # Fused path: attention scores as x @ (W folded with att), one thin
        # GEMM (True), or PyG's (W x * att).sum(-1) (False); see _scores.
        self.fold_scores = True

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
        if (self.add_self_loops and edge_attr is not None
                and is_torch_sparse_tensor(edge_index)):
            # PyG's own message for SparseTensor; for torch.sparse PyG fails
            # with a bare AssertionError deep inside remove_self_loops.
            raise NotImplementedError(
                "The usage of 'edge_attr' and 'add_self_loops' simultaneously is not supported "
                "for 'edge_index' as a torch.sparse tensor: add the self-loops to the graph "
                "beforehand and set 'add_self_loops=False'")
        self._check_index_range(x, edge_index, size)
        loops_added = False
        if self.add_self_loops and self._adds_own_self_loops(edge_index, edge_attr):
            num_nodes = self._num_loop_nodes(x, size)
            if isinstance(edge_index, EdgeIndex):
                edge_index, edge_attr = self._self_loops_sorted(edge_index, edge_attr, num_nodes)
            else:
                edge_index = _sparse_self_loops(self._loops_cache, edge_index, num_nodes)
            loops_added = True
        if ((loops_added or not self.add_self_loops)
                and self._uses_fused_attention(x, edge_index, return_attention_weights)):
            return self._fused_forward(x, edge_index, edge_attr, size, return_attention_weights)
        if not loops_added:
            return super().forward(x, edge_index, edge_attr, size, return_attention_weights)
        # The parent must not add them a second time.
        self.add_self_loops = False
        try:
            return super().forward(x, edge_index, edge_attr, size, return_attention_weights)
        finally:
            self.add_self_loops = True

    def _uses_fused_attention(self, x: Union[Tensor, OptPairTensor], edge_index: Adj,
                              return_attention_weights: Optional[bool]) -> bool:
        # The fused attention op (softmax + dropout + aggregation in one
        # kernel) needs compressed rows, no PyG hooks or explainer that would
        # observe the per-edge messages, and, on CUDA, a head width its
        # backward kernel handles. Attention weights after dropout are PyG's
        # unfused path (the mask is not materialised by the fused op).
        if not getattr(self, "fused_attention", True) or self.decomposed_layers > 1:
            return False
        if getattr(self, "_explain", None) or any(
                len(getattr(self, f"_{name}_hooks")) > 0 for name in _HOOKS):
            return False
        if return_attention_weights and self.training and self.dropout > 0:
            return False
        if isinstance(edge_index, EdgeIndex):
            if not edge_index.is_sorted_by_col:
                return False
        elif not (isinstance(edge_index, SparseTensor) or (
                is_torch_sparse_tensor(edge_index) and edge_index.layout == torch.sparse_csr)):
            return False
        x_src = x if isinstance(x, Tensor) else x[0]
        if x_src.is_cuda:
            # A head of D channels must fit one chunk of the CUDA backward:
            # 128 16-byte vectors, or 128 elements when D is not a multiple
            # of the vector width.
            vec = 16 // self._fused_dtype(x_src).itemsize
            limit = 128 * vec if self.out_channels % vec == 0 else 128
            return self.out_channels <= limit
        return True

    @staticmethod
    def _fused_dtype(x_src: Tensor) -> torch.dtype:
        if torch.is_autocast_enabled(x_src.device.type):
            return torch.get_autocast_dtype(x_src.device.type)
        return x_src.dtype if x_src.is_floating_point() else torch.get_default_dtype()

    def _scores(self, lin: torch.nn.Module, x_in: Tensor, x_proj: Tensor,
                *atts: Tensor) -> Tuple[Tensor, ...]:
        # The attention scores (x_proj * att).sum(-1) of PyG, [N, H] each. With
        # x_proj = lin(x_in) and no bias, they equal x_in @ fold, where fold
        # [F_in, H] is lin's weight summed against att per head: one thin GEMM
        # over x_in for all the atts, instead of an [N, H, C] product and a
        # reduction per att (and, in the backward, their [N, H, C] gradients).
        # H200, one layer step: 64.3 -> 53.9 ms on products-like, 32.4 ->
        # 31.2 ms on reddit-like. Against float64, the attention parameters'
        # gradients are off by 9.2e-7 with the fold and 8.6e-4 (as PyG's own
        # layer) without on products-like, but 7.8e-5 with and 1.2e-6
        # without on reddit-like. Each large error is one edge whose logit
        # is within float32 rounding of leaky_relu's kink and lands on the
        # other side of it (benchmarks/score_kink_flips.py): att_dst's
        # gradient is nonzero only through the kink, so one such edge moves
        # it by a whole term. Which edges flip depends on the order of the
        # arithmetic, not its precision. fold_scores = False restores PyG's
        # products.
        w = getattr(lin, "weight", None)
        if (not getattr(self, "fold_scores", True)
                or getattr(lin, "bias", None) is not None or not isinstance(w, Tensor)
                or isinstance(w, torch.nn.parameter.UninitializedParameter)
                or w.dim() != 2 or x_in.dim() != 2 or not x_in.is_floating_point()):
            return tuple((x_proj * att).sum(dim=-1) for att in atts)
        H, C = x_proj.size(1), x_proj.size(2)
        with torch.autocast(x_in.device.type, enabled=False):  # fold in the weights' dtype
            a = torch.stack([att.reshape(H, C) for att in atts])  # [k, H, C]
            fold = torch.einsum("hcf,khc->fkh", w.view(H, C, -1), a).reshape(w.size(1), -1)
        if not torch.is_autocast_enabled(x_in.device.type):
            fold = fold.to(x_in.dtype)
        scores = _FoldedScores.apply(x_in, fold).view(-1, len(atts), H)
        return scores.unbind(dim=1)

    def _fused_forward(self, x: Union[Tensor, OptPairTensor], edge_index: Adj,
                       edge_attr: OptTensor, size: Size,
                       return_attention_weights: Optional[bool]):
        # PyG's GATConv.forward with edge_updater + propagate replaced by one
        # call of the fused attention op (which adds the bias too); the
        # projections, residual and the size checks are PyG's own.
        H, C = self.heads, self.out_channels
        res: Optional[Tensor] = None
        if isinstance(x, Tensor):
            assert x.dim() == 2, "Static graphs not supported in 'GATConv'"
            if self.res is not None:
                res = self.res(x)
            if self.lin is not None:
                x_src = x_dst = self.lin(x).view(-1, H, C)
                alpha_src, alpha_dst = self._scores(self.lin, x, x_src, self.att_src,
                                                    self.att_dst)
            else:
                x_src = self.lin_src(x).view(-1, H, C)
                x_dst = self.lin_dst(x).view(-1, H, C)
                alpha_src, = self._scores(self.lin_src, x, x_src, self.att_src)
                alpha_dst, = self._scores(self.lin_dst, x, x_dst, self.att_dst)
        else:
            x_src_in, x_dst_in = x
            assert x_src_in.dim() == 2, "Static graphs not supported in 'GATConv'"
            if x_dst_in is not None and self.res is not None:
                res = self.res(x_dst_in)
            lin_src = self.lin if self.lin is not None else self.lin_src
            lin_dst = self.lin if self.lin is not None else self.lin_dst
            x_src = lin_src(x_src_in).view(-1, H, C)
            alpha_src, = self._scores(lin_src, x_src_in, x_src, self.att_src)
            x_dst = alpha_dst = None
            if x_dst_in is not None:
                x_dst = lin_dst(x_dst_in).view(-1, H, C)
                alpha_dst, = self._scores(lin_dst, x_dst_in, x_dst, self.att_dst)

        # PyG's size checks of propagate: the adjacency's sparse sizes against
        # the node features.
        sizes = self._check_input(edge_index, size)
        self._set_size(sizes, 0, x_src)
        if x_dst is not None:
            self._set_size(sizes, 1, x_dst)
        num_src = sizes[0] if sizes[0] is not None else x_src.size(0)
        num_dst = sizes[1] if sizes[1] is not None else (
            x_dst.size(0) if x_dst is not None else num_src)

        alpha_edge: OptTensor = None
        if edge_attr is not None and self.lin_edge is not None:
            if edge_attr.dim() == 1:
                edge_attr = edge_attr.view(-1, 1)
            num_edges = _num_edges(edge_index)
            if edge_attr.size(0) != num_edges:
                raise RuntimeError(
                    f"edge_attr must have one row per edge: its size ({edge_attr.size(0)}) "
                    f"must match the size of the edge dimension ({num_edges})")
            edge_feat = self.lin_edge(edge_attr).view(-1, H, C)
            alpha_edge = (edge_feat * self.att_edge).sum(dim=-1)
        if alpha_dst is None:
            alpha_dst = alpha_src.new_zeros(num_dst, H)

        # The bias goes into the op, which returns attention + bias and keeps
        # that one [N, H * C] tensor for its backward (instead of the
        # attention output and, here, a biased copy). Per head [H, C]: with
        # concat=False every head gets the whole bias, and the mean over the
        # heads of (out_h + bias) is mean(out_h) + bias. The residual is added
        # after, as PyG adds it before the bias: the same sum in another
        # order. Under autocast the bias is added here instead, in float32,
        # so that the output is float32 as PyG's.
        bias: OptTensor = None
        fold_bias = self.bias is not None and not torch.is_autocast_enabled(
            x_src.device.type)
        if fold_bias:
            bias = self.bias.view(H, C) if self.concat else self.bias.expand(H, C)
            bias = bias.to(x_src.dtype)

        # (The bias's gradient alone needs no CSC: the op's backward is a sum.)
        need_csc = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x_src, alpha_src, alpha_dst, alpha_edge))
        rowptr, col, csc, perm_inv = self._csr_csc(edge_index, num_src, num_dst, need_csc)
        out, lse = ops.gat_attention(
            rowptr, col, alpha_src, alpha_dst, x_src, s_edge=alpha_edge,
            negative_slope=self.negative_slope,
            dropout=self.dropout if self.training else 0.0, csc=csc, bias=bias,
            perm_inv=perm_inv)

        out = out.view(-1, H * C) if self.concat else out.mean(dim=1)
        if res is not None:
            out = out + res
        if self.bias is not None and not fold_bias:
            out = out + self.bias
        if not return_attention_weights:
            return out
        # alpha from lse, in the adjacency's edge order (= CSR order).
        dst = ptr2index(rowptr.long(), output_size=col.numel())
        logit = alpha_src.to(lse.dtype)[col.long()] + alpha_dst.to(lse.dtype)[dst]
        if alpha_edge is not None:
            logit = logit + alpha_edge.to(lse.dtype)
        alpha = torch.exp(F.leaky_relu(logit, self.negative_slope) - lse[dst])
        alpha = alpha.to(alpha_src.dtype)
        if isinstance(edge_index, SparseTensor):
            return out, edge_index.set_value(alpha, layout="coo")
        if is_torch_sparse_tensor(edge_index):
            return out, (set_sparse_value(edge_index, alpha), alpha)
        return out, (edge_index, alpha)

    def _check_index_range(self, x: Union[Tensor, OptPairTensor], edge_index: Adj,
                           size: Size) -> None:
        # On the CPU, PyG's gathers turn an out-of-range edge_index into an
        # IndexError; on CUDA they fail with a device-side assert that leaves
        # the CUDA context unusable, and the fused path gathers nothing before
        # its kernel. Check the range once per graph instead (one host sync,
        # cached like the CSC; skipped inside compiled graphs).
        if (not isinstance(edge_index, Tensor)
                or is_torch_sparse_tensor(edge_index) or is_compiling()
                or edge_index.dim() != 2 or edge_index.numel() == 0):
            return
        x_src, x_dst = (x, x) if isinstance(x, Tensor) else x
        x_dst = x_src if x_dst is None else x_dst
        bounds = (size[0], size[1]) if size is not None else (x_src.size(0), x_dst.size(0))
        if self._range_cache.get(edge_index, bounds) is not None:
            return
        index = edge_index.as_tensor() if isinstance(edge_index, EdgeIndex) else edge_index
        lo, hi = torch.stack([index.amin(dim=1), index.amax(dim=1)]).tolist()
        for dim, name in ((0, "source"), (1, "destination")):
            if lo[dim] < 0 or hi[dim] >= bounds[dim]:
                raise IndexError(
                    f"Found indices in 'edge_index' that are larger than {bounds[dim] - 1} "
                    f"(got {hi[dim]}) or negative (got {lo[dim]}) in its {name} row. Please "
                    f"ensure that all indices in 'edge_index' point to valid indices in the "
                    f"interval [0, {bounds[dim]}) in your node feature matrix and try again.")
        self._range_cache.put(edge_index, bounds, True)

    # Created on first use (not in __init__, which is PyG's) and kept out of
    # the module's state: see GraphCache.
    @property
    def _loops_cache(self) -> GraphCache:
        return self.__dict__.setdefault("_loops_cache_", GraphCache())

    @property
    def _range_cache(self) -> GraphCache:
        return self.__dict__.setdefault("_range_cache_", GraphCache())

    @property
    def _csc_cache(self) -> GraphCache:
        return self.__dict__.setdefault("_csc_cache_", GraphCache())

    def _adds_own_self_loops(self, edge_index: Adj, edge_attr: OptTensor) -> bool:
        # Column-sorted EdgeIndex: PyG's concatenation would lose the sort
        # order and with it the fused path. SparseTensor / torch.sparse: PyG's
        # self-loop code cannot be traced by torch.compile, so it runs outside
        # the graph. The cases PyG rejects (edge features with sparse inputs)
        # are left to PyG and its error.
        if isinstance(edge_index, EdgeIndex):
            return edge_index.is_sorted_by_col
        if isinstance(edge_index, SparseTensor):
            return self.edge_dim is None
        return is_torch_sparse_tensor(edge_index)

    @staticmethod
    def _num_loop_nodes(x: Union[Tensor, OptPairTensor], size: Size) -> int:
        # As PyG: loops only for nodes that are both sources and destinations.
        x_src, x_dst = (x, None) if isinstance(x, Tensor) else x
        num_nodes = x_src.size(0)
        if x_dst is not None:
            num_nodes = min(num_nodes, x_dst.size(0))
        return min(size) if size is not None else num_nodes

    def _self_loops_sorted(self, edge_index: EdgeIndex, edge_attr: OptTensor,
                           num_nodes: int) -> Tuple[EdgeIndex, OptTensor]:
        # Eager calls on the same graph reuse the result (and so its CSR/CSC
        # caches); with edge features the permutation would have to be kept
        # too, so those are rebuilt.
        use_cache = edge_attr is None and not is_compiling()
        if use_cache:
            cached = self._loops_cache.get(edge_index, num_nodes)
            if cached is not None:
                return cached, None
        looped, edge_attr = remove_self_loops(edge_index, edge_attr)
        looped, edge_attr = add_self_loops(looped, edge_attr, fill_value=self.fill_value,
                                           num_nodes=num_nodes)
        # Stable: within a destination, the original edges keep their order
        # and the self-loop comes last.
        looped, perm = looped.sort_by("col", stable=True)
        if edge_attr is not None and perm is not None:
            edge_attr = edge_attr[perm]
        if use_cache:
            self._loops_cache.put(edge_index, num_nodes, looped)
        return looped, edge_attr

    def message_and_aggregate(self, edge_index: Adj, x: OptPairTensor, alpha: Tensor) -> Tensor:
        # Called by PyG's propagate for sparse adjacencies and column-sorted
        # EdgeIndex; alpha [E, H] arrives in the adjacency's edge order, which
        # is the CSR-over-destinations order in all fused cases.
        x_src, x_dst = x
        if isinstance(edge_index, (SparseTensor, EdgeIndex)) or (
                is_torch_sparse_tensor(edge_index) and edge_index.layout == torch.sparse_csr):
            # x_dst fixes the output size (PyG checked it against any declared
            # sparse size); an EdgeIndex's inferred size may miss trailing
            # isolated nodes.
            num_dst = x_src.size(0) if x_dst is None else x_dst.size(0)
            if isinstance(edge_index, EdgeIndex) and x_dst is None \
                    and edge_index.num_cols is not None:
                num_dst = edge_index.num_cols
            need_csc = torch.is_grad_enabled() and (alpha.requires_grad or x_src.requires_grad)
            rowptr, col, csc, perm_inv = self._csr_csc(edge_index, x_src.size(0), num_dst,
                                                      need_csc)
        else:
            # torch.sparse_coo: no compressed rows to fuse over, so do what
            # PyG's unfused path does.
            row, col = edge_index.indices()
            msg = self.message(x_src.index_select(0, col), alpha)
            return self.aggregate(msg, row, dim_size=edge_index.size(0))
        return ops.multihead_spmm(rowptr, col, alpha, x_src, csc=csc, perm_inv=perm_inv)

    def _csr_csc(self, edge_index: Adj, num_src: int, num_dst: int, need_csc: bool):
        """(rowptr, col, csc, perm_inv) of a fused adjacency, rows =
        destinations; the extraction is cached per adjacency object for eager
        calls, with the inverse of the CSC's perm on CUDA (see _with_perm_inv;
        None under torch.compile, which does not cache)."""
        if is_torch_sparse_tensor(edge_index):
            # The forward does not read the CSC: build it only for a backward.
            return _torch_csr_with_csc(self._csc_cache, edge_index, need_csc)
        sizes = (num_src, num_dst)
        cached = None if is_compiling() else self._csc_cache.get(edge_index, sizes)
        if cached is None:
            if isinstance(edge_index, SparseTensor):
                cached = csr_csc_from_sparse_tensor(edge_index)
            else:
                # Eager calls cache the CSC with the CSR for any later
                # backward; a compiled graph builds only what it needs.
                cached = csr_csc_from_edge_index(edge_index, *sizes,
                                                 need_csc=need_csc or not is_compiling())
            cached = compact_indices(*cached, num_src)
            if is_compiling():
                return (*cached, None)
            cached = _with_perm_inv(*cached)
            self._csc_cache.put(edge_index, sizes, cached)
        return cached


def _num_edges(adj: Adj) -> int:
    if isinstance(adj, SparseTensor):
        return adj.nnz()
    if is_torch_sparse_tensor(adj):
        return adj._nnz()
    return adj.size(1)


@torch.compiler.disable
def _sparse_self_loops(cache: GraphCache, adj_t, num_nodes: int):
    """PyG's self-loop step for sparse adjacencies, once per graph, kept out
    of compiled graphs: torch_sparse's ops and torch.sparse tensors cannot be
    traced."""
    looped = cache.get(adj_t, num_nodes)
    if looped is not None:
        return looped
    if isinstance(adj_t, SparseTensor):
        # The CSR/CSC caches are built here too: torch_sparse's ind2ptr
        # cannot be traced either.
        looped = torch_sparse.set_diag(adj_t).fill_cache_()
    else:
        looped, _ = remove_self_loops(adj_t)
        looped, _ = add_self_loops(looped, num_nodes=num_nodes)
    cache.put(adj_t, num_nodes, looped)
    return looped


@torch.compiler.disable
def _torch_csr_with_csc(cache: GraphCache, adj_t: Tensor, need_csc: bool):
    # Once a backward has needed the CSC, the CSR and CSC are cached together
    # (compacted to int32 where they fit); before that, the forward reads the
    # tensor's own indices.
    cached = cache.get(adj_t, None)
    if cached is None and need_csc:
        cached = _with_perm_inv(*compact_indices(*csr_csc_from_torch_csr(adj_t), adj_t.size(1)))
        cache.put(adj_t, None, cached)
    if cached is None:
        return adj_t.crow_indices(), adj_t.col_indices(), None, None
    return cached if need_csc else (*cached[:2], None, None)


def _with_perm_inv(rowptr: Tensor, col: Tensor, csc):
    # A cached graph's CSC with the inverse of its perm, on CUDA: the fused
    # backward (and, without fused attention, the spmm backward) then keeps
    # its per-edge gradients in CSC order (written as it walks the CSC, not
    # at random edge ids; see gat_attention, multihead_spmm). One scatter per
    # graph. The CPU kernels do not use it.
    perm_inv = None
    if csc is not None and csc[2].is_cuda:
        perm_inv = invert_perm(csc[2])
    return rowptr, col, csc, perm_inv
