"""Layers built on the fused multi-head aggregation operator."""
from .gat_conv import GATConv

__all__ = ["GATConv"]
