"""Plain-PyTorch references for the fused attention ops (docs/gat_attention.md).

* ``philox4x32_10`` / ``dropout_keep``: Philox4x32-10 exactly as csrc/philox.h,
  vectorised over int64 tensors that hold uint32 values (every result is masked
  with ``& 0xFFFFFFFF``), so the tests can check the kernels' dropout masks bit
  for bit.
* ``reference_gat_attention`` / ``reference_gatv2_attention`` /
  ``reference_transformer_attention``: the float64 forwards from
  differentiable torch ops, so that ``torch.autograd`` gives reference
  gradients (including the gradient through ``lse`` and that of the optional
  bias).
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

MASK32 = 0xFFFFFFFF
# Philox4x32 multipliers and Weyl key increments (Random123), as in philox.h.
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85


def _mulhilo(m: int, c: Tensor) -> Tuple[Tensor, Tensor]:
    """(lo32, hi32) of the 64-bit product of the uint32 constant ``m`` and the
    uint32 values in ``c`` (int64 tensor), without overflowing int64: ``m`` is
    split into 16-bit halves, so every partial product stays below 2**48."""
    m_lo, m_hi = m & 0xFFFF, m >> 16
    p_lo = c * m_lo  # < 2**48
    p_hi = c * m_hi  # < 2**48; the product is p_hi * 2**16 + p_lo
    low = p_lo + ((p_hi & 0xFFFF) << 16)  # < 2**49
    return low & MASK32, (p_hi >> 16) + (low >> 32)


def philox4x32_10(c0, c1, c2, c3, k0: int, k1: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Philox4x32 with 10 rounds, the key bumped between rounds. Counters are
    int64 tensors (or ints) of uint32 values, broadcast together; the key two
    Python ints in [0, 2**32). Returns the four uint32 output words."""
    c0, c1, c2, c3 = (torch.as_tensor(c, dtype=torch.int64) for c in (c0, c1, c2, c3))
    c0, c1, c2, c3 = torch.broadcast_tensors(c0, c1, c2, c3)
    for round_ in range(10):
        if round_ > 0:
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
        lo0, hi0 = _mulhilo(PHILOX_M0, c0)
        lo1, hi1 = _mulhilo(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def dropout_threshold(p: float) -> int:
    """floor(p * 2**32): an element is kept when its uint32 draw is >= this
    (0: keep everything; 2**32 for p >= 1: keep nothing)."""
    if not p > 0.0:
        return 0
    if p >= 1.0:
        return 1 << 32
    return int(p * 4294967296.0)


def dropout_uniform(seed: int, offset: int, num_edges: int, heads: int) -> Tensor:
    """The uint32 draw r[e, h] (int64 tensor [E, H]) of every attention
    element: counter (lo32(e), hi32(e), lo32(offset + h // 4),
    hi32(offset + h // 4)), key (lo32(seed), hi32(seed)), word h % 4."""
    seed, offset = int(seed) & (2**64 - 1), int(offset) & (2**64 - 1)
    k0, k1 = seed & MASK32, seed >> 32
    e = torch.arange(num_edges, dtype=torch.int64).unsqueeze(1)  # [E, 1]
    blocks = (heads + 3) // 4
    # offset + h // 4 as a uint64 (wraps like the C++), one per block of 4 heads.
    counter = [(offset + g) & (2**64 - 1) for g in range(blocks)]
    c2 = torch.tensor([c & MASK32 for c in counter], dtype=torch.int64)  # [G]
    c3 = torch.tensor([c >> 32 for c in counter], dtype=torch.int64)
    words = philox4x32_10(e & MASK32, e >> 32, c2, c3, k0, k1)  # 4 x [E, G]
    # Head h = 4 g + w reads word w of block g.
    r = torch.stack(words, dim=-1).reshape(num_edges, 4 * blocks)
    return r[:, :heads]


def dropout_keep(seed: int, offset: int, num_edges: int, heads: int, p: float) -> Tensor:
    """bool [E, H]: which attention elements survive dropout with probability
    ``p`` under ``philox = [seed, offset]``."""
    threshold = dropout_threshold(p)
    if threshold == 0:
        return torch.ones(num_edges, heads, dtype=torch.bool)
    return dropout_uniform(seed, offset, num_edges, heads) >= threshold


def dropout_scale(seed: int, offset: int, num_edges: int, heads: int, p: float) -> Tensor:
    """float64 [E, H] multiplier m = keep / (1 - p) (1 for p = 0, 0 for p >= 1)."""
    keep = dropout_keep(seed, offset, num_edges, heads, p).double()
    return keep * (1.0 / (1.0 - p)) if p < 1.0 else torch.zeros_like(keep)


def edge_rows(rowptr: Tensor) -> Tensor:
    """The destination row of each CSR edge (int64, CPU)."""
    rowptr = rowptr.long().cpu()
    return torch.repeat_interleave(torch.arange(rowptr.numel() - 1), rowptr.diff())


def reference_gat_attention(rowptr: Tensor, col: Tensor, s_src: Tensor, s_dst: Tensor, x: Tensor,
                            s_edge: Optional[Tensor] = None, negative_slope: float = 0.2,
                            dropout: float = 0.0, philox: Optional[Tensor] = None,
                            bias: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """float64 CPU (out [N_dst, H, D], lse [N_dst, H]) of the fused GAT
    attention, from differentiable torch ops.

    Floating inputs are used as given when they are float64 CPU tensors (so
    that gradients reach them), and converted otherwise. Rows without edges
    give out = 0 (+ bias) and lse = -inf (with zero gradient). ``bias``
    ([H, D]) is added to every row of out.
    """
    s_src, s_dst, x = _f64(s_src), _f64(s_dst), _f64(x)
    rows, col = edge_rows(rowptr), col.long().cpu()
    z = s_src[col] + s_dst[rows]
    if s_edge is not None:
        z = z + _f64(s_edge)
    logits = torch.nn.functional.leaky_relu(z, negative_slope)  # [E, H]
    return _softmax_aggregate(rowptr, col, logits, x, dropout, philox, bias)


def reference_gatv2_attention(rowptr: Tensor, col: Tensor, x_l: Tensor, x_r: Tensor, att: Tensor,
                              e_feat: Optional[Tensor] = None, negative_slope: float = 0.2,
                              dropout: float = 0.0, philox: Optional[Tensor] = None,
                              bias: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """float64 CPU (out [N_dst, H, C], lse [N_dst, H]) of the fused GATv2
    attention: logits sum_c att[h, c] * leaky_relu(x_l[j] + x_r[i] (+ e_feat[e])),
    then the softmax, dropout and aggregation of ``reference_gat_attention``.
    """
    x_l, x_r, att = _f64(x_l), _f64(x_r), _f64(att)
    rows, col = edge_rows(rowptr), col.long().cpu()
    z = x_l[col] + x_r[rows]
    if e_feat is not None:
        z = z + _f64(e_feat)
    logits = (torch.nn.functional.leaky_relu(z, negative_slope) * att).sum(-1)  # [E, H]
    return _softmax_aggregate(rowptr, col, logits, x_l, dropout, philox, bias)


def reference_transformer_attention(rowptr: Tensor, col: Tensor, query: Tensor, key: Tensor,
                                    value: Tensor, e_feat: Optional[Tensor] = None,
                                    scale: Optional[float] = None, dropout: float = 0.0,
                                    philox: Optional[Tensor] = None,
                                    bias: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """float64 CPU (out [N_dst, H, C], lse [N_dst, H]) of the fused
    graph-transformer attention: logits scale * <query[i], key[j] (+ e_feat[e])>
    (scale 1 / sqrt(C) by default), then the softmax and dropout of
    ``reference_gat_attention``, aggregating value[j] (+ e_feat[e])."""
    query, key, value = _f64(query), _f64(key), _f64(value)
    rows, col = edge_rows(rowptr), col.long().cpu()
    if scale is None:
        scale = key.size(-1) ** -0.5 if key.size(-1) > 0 else 1.0
    k, v = key[col], value[col]
    if e_feat is not None:
        k, v = k + _f64(e_feat), v + _f64(e_feat)
    logits = (query[rows] * k).sum(-1) * scale  # [E, H]
    return _softmax_aggregate(rowptr, None, logits, v, dropout, philox, bias)


def _f64(t: Tensor) -> Tensor:
    # float64 CPU tensors as given (so that gradients reach them), others converted.
    if t.dtype == torch.float64 and t.device.type == "cpu":
        return t
    return t.detach().cpu().double()


def _softmax_aggregate(rowptr: Tensor, col: Tensor, logits: Tensor, x: Tensor, dropout: float,
                       philox: Optional[Tensor], bias: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """out = sum over each row of softmax(logits) * mask * x[col] (+ bias), and lse.
    Rows without edges give out = 0 (+ bias) and lse = -inf (zero gradient)."""
    num_dst, heads = rowptr.numel() - 1, x.size(1)
    rows = edge_rows(rowptr)
    num_edges = rows.numel()
    # Row-wise logsumexp with the exact row maximum (a constant shift, so it
    # is detached). Empty rows: the maximum stays -inf; shift them by 0.
    index = rows.unsqueeze(1).expand(-1, heads)
    row_max = torch.full((num_dst, heads), float("-inf"), dtype=torch.float64)
    row_max = row_max.scatter_reduce(0, index, logits.detach(), "amax")
    nonempty = (rowptr.long().cpu().diff() > 0).unsqueeze(1).expand(-1, heads)
    shift = torch.where(nonempty, row_max, torch.zeros_like(row_max))
    total = torch.zeros(num_dst, heads, dtype=torch.float64).index_add(
        0, rows, torch.exp(logits - shift[rows]))
    # clamp: log(0) would send inf into the (unselected) branch's gradient.
    lse = torch.where(nonempty, torch.log(total.clamp_min(1e-300)) + shift,
                      torch.full_like(shift, float("-inf")))

    alpha = torch.exp(logits - lse[rows])  # the edge softmax
    if dropout > 0:
        if philox is None:
            raise ValueError("the reference attention: dropout > 0 needs philox")
        seed, offset = (int(v) for v in philox.tolist())
        alpha = alpha * dropout_scale(seed, offset, num_edges, heads, dropout)
    per_edge = x if col is None else x[col]  # (col None: x holds one row per edge)
    out = torch.zeros(num_dst, heads, x.size(2), dtype=torch.float64).index_add(
        0, rows, alpha.unsqueeze(-1) * per_edge)
    if bias is not None:
        out = out + _f64(bias)
    return out, lse
