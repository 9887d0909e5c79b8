"""Layers built on the fused multi-head aggregation operator."""
from .gat_conv import GATConv
from .gatv2_conv import GATv2Conv
from .transformer_conv import TransformerConv

__all__ = ["GATConv", "GATv2Conv", "TransformerConv"]
