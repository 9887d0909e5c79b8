"""Fused multi-head CSR attention aggregation for PyTorch Geometric."""
import torch  # noqa: F401  (loads libtorch before our library)

from . import _C  # noqa: F401  (registers torch.ops.pyg_multihead_agg.*)
from . import nn
from .adj import check_csr, csr_to_csc
from .ops import multihead_spmm

__version__ = "0.1.0"

__all__ = ["multihead_spmm", "check_csr", "csr_to_csc", "nn", "__version__"]
