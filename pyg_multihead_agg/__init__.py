"""Fused multi-head CSR attention aggregation for PyTorch Geometric."""
import torch  # noqa: F401  (loads libtorch before our library)

# _C first: it registers torch.ops.pyg_multihead_agg.*, which ops.py extends.
from . import _C, graph, nn  # noqa: F401
from .graph import check_csc, check_csr, csr_to_csc, invert_perm, prepare_adjacency
from .ops import gat_attention, gatv2_attention, multihead_spmm, transformer_attention

__version__ = "0.1.0"

__all__ = ["multihead_spmm", "gat_attention", "gatv2_attention", "transformer_attention",
           "prepare_adjacency", "check_csr", "check_csc", "csr_to_csc", "invert_perm", "graph",
           "nn", "__version__"]
