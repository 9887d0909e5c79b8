"""GATConv whose aggregation runs on the fused multi-head CSR operator."""
from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch_geometric import EdgeIndex, is_compiling
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

from .. import ops
from ..adj import (
    GraphCache,
    csr_csc_from_edge_index,
    csr_csc_from_sparse_tensor,
    csr_csc_from_torch_csr,
)


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
        if not (self.add_self_loops and self._adds_own_self_loops(edge_index, edge_attr)):
            return super().forward(x, edge_index, edge_attr, size, return_attention_weights)
        num_nodes = self._num_loop_nodes(x, size)
        if isinstance(edge_index, EdgeIndex):
            edge_index, edge_attr = self._self_loops_sorted(edge_index, edge_attr, num_nodes)
        else:
            edge_index = _sparse_self_loops(self._loops_cache, edge_index, num_nodes)
        # The parent must not add them a second time.
        self.add_self_loops = False
        try:
            return super().forward(x, edge_index, edge_attr, size, return_attention_weights)
        finally:
            self.add_self_loops = True

    # Created on first use (not in __init__, which is PyG's) and kept out of
    # the module's state: see GraphCache.
    @property
    def _loops_cache(self) -> GraphCache:
        return self.__dict__.setdefault("_loops_cache_", GraphCache())

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
        if isinstance(edge_index, (SparseTensor, EdgeIndex)):
            # x_dst fixes the output size (PyG checked it against any declared
            # sparse size); an EdgeIndex's inferred size may miss trailing
            # isolated nodes.
            num_dst = x_src.size(0) if x_dst is None else x_dst.size(0)
            if isinstance(edge_index, EdgeIndex) and x_dst is None \
                    and edge_index.num_cols is not None:
                num_dst = edge_index.num_cols
            sizes = (x_src.size(0), num_dst)
            # Eager calls on the same graph reuse the extraction.
            cached = None if is_compiling() else self._csc_cache.get(edge_index, sizes)
            if cached is None:
                if isinstance(edge_index, SparseTensor):
                    cached = csr_csc_from_sparse_tensor(edge_index)
                else:
                    cached = csr_csc_from_edge_index(edge_index, *sizes)
                if not is_compiling():
                    self._csc_cache.put(edge_index, sizes, cached)
            rowptr, col, csc = cached
        elif is_torch_sparse_tensor(edge_index) and edge_index.layout == torch.sparse_csr:
            # The forward does not read the CSC: build it only for a backward.
            need_csc = torch.is_grad_enabled() and (alpha.requires_grad or x_src.requires_grad)
            rowptr, col, csc = _torch_csr_with_csc(self._csc_cache, edge_index, need_csc)
        else:
            # torch.sparse_coo: no compressed rows to fuse over, so do what
            # PyG's unfused path does.
            row, col = edge_index.indices()
            msg = self.message(x_src.index_select(0, col), alpha)
            return self.aggregate(msg, row, dim_size=edge_index.size(0))
        return ops.multihead_spmm(rowptr, col, alpha, x_src, csc=csc)


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
    rowptr, col = adj_t.crow_indices(), adj_t.col_indices()
    if not need_csc:
        return rowptr, col, None
    csc = cache.get(adj_t, None)
    if csc is None:
        csc = csr_csc_from_torch_csr(adj_t)[2]
        cache.put(adj_t, None, csc)
    return rowptr, col, csc
