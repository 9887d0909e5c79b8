"""The fused graph-transformer attention op (docs/gat_attention.md,
transformer_attention) against the float64 reference of
tests/gat_reference.py: forward (out and lse), backward (the gradients of
query, key, value, e_feat and bias, and through lse), gradcheck, opcheck,
torch.compile, autocast, bad input and determinism. The operator has CPU
kernels only so far.
"""
from typing import NamedTuple, Optional

import pytest
import torch
from conftest import FLOAT_DTYPES, INDEX_DTYPES, TOLERANCE, random_csr, rel_error
from gat_reference import reference_transformer_attention
from test_gat_attention import CASE_IDS, CASES, assert_lse_close, dtype_id, lse_dtype
from torch import Tensor

import pyg_multihead_agg as pma
from pyg_multihead_agg import csr_to_csc, invert_perm

ops = torch.ops.pyg_multihead_agg
PHILOX = torch.tensor([0x5EED1234ABCD, 3], dtype=torch.int64)
# CPU kernels only so far.
DEVICES = ["cpu"]
# Gradients of the scores take a difference (m * dot - delta) and pass
# through the per-channel kink: twice the output tolerance, 4x in half types.
SCORE_GRAD_FACTOR = {torch.float16: 4, torch.bfloat16: 4, torch.float32: 2, torch.float64: 2}
_OP_ONLY = ("csc", "perm_inv")  # arguments of the op the reference does not take
NAMES = ("query", "key", "value", "e_feat", "bias")


class Inputs(NamedTuple):
    rowptr: Tensor
    col: Tensor
    query: Tensor
    key: Tensor
    value: Tensor
    e_feat: Optional[Tensor]
    bias: Optional[Tensor]

    def floats(self):
        values = (self.query, self.key, self.value, self.e_feat, self.bias)
        return {n: t for n, t in zip(NAMES, values, strict=True) if t is not None}


def make_inputs(case, dtype=torch.float32, index_dtype=torch.int64, device="cpu", seed=0,
                with_edge=True, with_bias=False, requires_grad=False):
    num_dst, num_src, num_edges, heads, channels, hub = case
    gen = torch.Generator().manual_seed(seed)
    rowptr, col = random_csr(num_dst, num_src, num_edges, index_dtype=index_dtype,
                             device=device, hub=hub, generator=gen)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device, dtype).requires_grad_(requires_grad)

    query = rand(num_dst, heads, channels)
    key, value = rand(num_src, heads, channels), rand(num_src, heads, channels)
    e_feat = rand(col.numel(), heads, channels) if with_edge else None
    bias = rand(heads, channels) if with_bias else None
    return Inputs(rowptr, col, query, key, value, e_feat, bias)


def run_op(inp: Inputs, **kw):
    return pma.transformer_attention(inp.rowptr, inp.col, inp.query, inp.key, inp.value,
                                     e_feat=inp.e_feat, bias=inp.bias, **kw)


def reference(inp: Inputs, leaves=None, **kw):
    f = leaves if leaves is not None else inp.floats()
    return reference_transformer_attention(inp.rowptr, inp.col, f["query"], f["key"], f["value"],
                                           f.get("e_feat"), bias=f.get("bias"), **kw)


def check_forward(inp, dtype, **kw):
    out, lse = run_op(inp, **kw)
    ref_out, ref_lse = reference(inp, **{k: v for k, v in kw.items() if k not in _OP_ONLY})
    assert out.dtype == dtype and lse.dtype == lse_dtype(dtype)
    assert rel_error(out, ref_out) <= TOLERANCE[dtype]
    assert_lse_close(lse, ref_lse, dtype)


def check_backward(inp, dtype, through=("out", "lse"), **kw):
    """Every gradient of <g, out> + <g_lse, lse> against the reference's."""
    floats = {n: t.detach().requires_grad_() for n, t in inp.floats().items()}
    inp = inp._replace(**floats)
    out, lse = run_op(inp, **kw)
    gen = torch.Generator().manual_seed(1)
    g_out = torch.randn(out.shape, generator=gen).to(out.device, out.dtype)
    g_lse = torch.randn(lse.shape, generator=gen).to(lse.device, lse.dtype)
    finite = torch.isfinite(lse)
    g_lse = torch.where(finite, g_lse, torch.zeros_like(g_lse))
    outs, grads = [], []
    if "out" in through:
        outs, grads = outs + [out], grads + [g_out]
    if "lse" in through:
        outs, grads = outs + [lse], grads + [g_lse]
    got = torch.autograd.grad(outs, list(floats.values()), grads, allow_unused=True)

    leaves = {n: t.detach().cpu().double().requires_grad_() for n, t in floats.items()}
    ref_out, ref_lse = reference(inp, leaves, **{k: v for k, v in kw.items() if k not in _OP_ONLY})
    ref_lse = torch.where(torch.isfinite(ref_lse), ref_lse, torch.zeros_like(ref_lse))
    r_outs, r_grads = [], []
    if "out" in through:
        r_outs, r_grads = r_outs + [ref_out], r_grads + [g_out.cpu().double()]
    if "lse" in through:
        r_outs, r_grads = r_outs + [ref_lse], r_grads + [g_lse.cpu().double()]
    want = torch.autograd.grad(r_outs, list(leaves.values()), r_grads, allow_unused=True)
    for name, g, r, t in zip(floats, got, want, leaves.values(), strict=True):
        g = torch.zeros_like(floats[name]) if g is None else g
        r = torch.zeros_like(t) if r is None else r
        assert g.dtype == dtype and g.shape == floats[name].shape, name
        factor = 1 if name in ("bias",) else SCORE_GRAD_FACTOR[dtype]
        if name == "value":
            factor = 1  # an aggregation, like grad_x of gat_attention
        tol = factor * TOLERANCE[dtype]
        err = rel_error(g, r)
        assert err <= tol, f"grad {name}: relative error {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dropout", [0.0, 0.5], ids=["p0", "p0.5"])
@pytest.mark.parametrize("with_edge", [False, True], ids=["no_edge", "e_feat"])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_forward_matches_reference(case, dtype, index_dtype, with_edge, dropout, device):
    inp = make_inputs(case, dtype, index_dtype, device, with_edge=with_edge)
    check_forward(inp, dtype, dropout=dropout, philox=PHILOX)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_forward_with_bias_matches_reference(case, dtype, device):
    inp = make_inputs(case, dtype, device=device, with_bias=True)
    check_forward(inp, dtype, dropout=0.3, philox=PHILOX)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_csc,perm_inv", [(True, True), (True, False), (False, False)],
                         ids=["csc_perm_inv", "csc", "no_csc"])
@pytest.mark.parametrize("with_edge,with_bias,dropout", [(True, True, 0.0), (False, False, 0.5),
                                                         (True, False, 0.5)],
                         ids=["edge_bias", "dropout", "edge_dropout"])
@pytest.mark.parametrize("dtype,index_dtype", [(torch.float64, torch.int64),
                                               (torch.float32, torch.int32),
                                               (torch.bfloat16, torch.int64),
                                               (torch.float16, torch.int32)],
                         ids=["f64-i64", "f32-i32", "bf16-i64", "f16-i32"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_backward_matches_reference(case, dtype, index_dtype, with_edge, with_bias, dropout,
                                    with_csc, perm_inv, device):
    num_dst, num_src, _, heads, channels, _ = case
    inp = make_inputs(case, dtype, index_dtype, device, with_edge=with_edge, with_bias=with_bias)
    csc = csr_to_csc(inp.rowptr, inp.col, num_src) if with_csc else None
    inv = invert_perm(csc[2]) if perm_inv else None
    check_backward(inp, dtype, dropout=dropout, philox=PHILOX, csc=csc, perm_inv=inv)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("through", [("out",), ("lse",)], ids=["out", "lse"])
def test_backward_through_one_output(through, device):
    inp = make_inputs(CASES[4], torch.float64, device=device)
    check_backward(inp, torch.float64, through=through)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64], ids=dtype_id)
@pytest.mark.parametrize("heads,channels", [(1, 7), (8, 8), (4, 32), (3, 48), (1, 1), (2, 256)])
def test_heads_and_channels(heads, channels, dtype, device):
    case = (40, 30, 300, heads, channels, True)
    inp = make_inputs(case, dtype, device=device, with_bias=True)
    check_forward(inp, dtype, dropout=0.2, philox=PHILOX)
    check_backward(inp, dtype, dropout=0.2, philox=PHILOX,
                   csc=csr_to_csc(inp.rowptr, inp.col, case[1]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale", [None, 0.0, 1.0, 3.0])
def test_scale(scale, device):
    inp = make_inputs(CASES[0], torch.float64, device=device)
    check_forward(inp, torch.float64, scale=scale)
    check_backward(inp, torch.float64, scale=scale)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_and_unaligned_inputs(device):
    """Views: key a slice of a wider tensor (unaligned rows), value transposed."""
    inp = make_inputs(CASES[0], torch.float32, device=device)
    wide = torch.randn(inp.key.size(0), inp.key.size(1), inp.key.size(2) + 1, device=device)
    key = wide[..., 1:]
    value = torch.randn(inp.value.size(2), inp.value.size(1), inp.value.size(0),
                        device=device).permute(2, 1, 0)
    inp = inp._replace(key=key, value=value)
    check_forward(inp, torch.float32)
    check_backward(inp, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic(device):
    """Two runs: bitwise the same outputs and gradients (no atomics)."""
    inp = make_inputs(CASES[4], torch.float32, device=device, with_bias=True)
    csc = csr_to_csc(inp.rowptr, inp.col, CASES[4][1])
    results = []
    for _ in range(2):
        floats = {n: t.detach().requires_grad_() for n, t in inp.floats().items()}
        out, lse = run_op(inp._replace(**floats), dropout=0.3, philox=PHILOX, csc=csc)
        grads = torch.autograd.grad((out * out).sum() + lse.nan_to_num(0, 0, 0).sum(),
                                    list(floats.values()))
        results.append((out, lse) + grads)
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_extremes(device):
    inp = make_inputs(CASES[0], torch.float64, device=device, with_bias=True)
    out, _ = run_op(inp, dropout=1.0, philox=PHILOX)
    assert torch.equal(out, inp.bias.expand_as(out))  # nothing kept: only the bias
    check_forward(inp, torch.float64, dropout=1e-12, philox=PHILOX)


def test_dropout_draws_a_fresh_key():
    inp = make_inputs(CASES[0], torch.float64)
    torch.manual_seed(0)
    a, _ = run_op(inp, dropout=0.5)
    b, _ = run_op(inp, dropout=0.5)
    torch.manual_seed(0)
    c, _ = run_op(inp, dropout=0.5)
    assert not torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.parametrize("device", DEVICES)
def test_nonfinite_inputs_propagate(device):
    """A NaN in one source row: NaN in the rows that read it, nothing else."""
    case = (20, 20, 80, 2, 8, False)
    inp = make_inputs(case, torch.float32, device=device)
    key = inp.key.clone()
    key[3, 0, 0] = float("nan")
    out, lse = run_op(inp._replace(key=key))
    rows = torch.repeat_interleave(torch.arange(case[0], device=device),
                                   inp.rowptr.long().diff())
    hit = torch.zeros(case[0], dtype=torch.bool, device=device)
    hit[rows[inp.col.long() == 3]] = True
    assert torch.isnan(lse[hit, 0]).all() and torch.isnan(out[hit, 0]).all()
    assert not torch.isnan(out[~hit]).any() and not torch.isnan(lse[~hit]).any()


# ---------------------------------------------------------------------------
# gradcheck, opcheck, torch.compile, autocast
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_csc", [True, False], ids=["csc", "no_csc"])
@pytest.mark.parametrize("dropout", [0.0, 0.3], ids=["p0", "p0.3"])
def test_gradcheck(dropout, with_csc, device):
    case = (6, 5, 16, 2, 3, False)
    inp = make_inputs(case, torch.float64, device=device, with_bias=True)
    csc = csr_to_csc(inp.rowptr, inp.col, case[1]) if with_csc else None
    leaves = [t.detach().requires_grad_() for t in inp.floats().values()]

    def f(query, key, value, e_feat, bias):
        out, lse = pma.transformer_attention(inp.rowptr, inp.col, query, key, value,
                                             e_feat=e_feat, bias=bias, dropout=dropout,
                                             philox=PHILOX, csc=csc)
        return out, torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))

    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-5)


def _opcheck_args(device, dtype, index_dtype):
    inp = make_inputs(CASES[0], dtype, index_dtype, device, with_bias=True)
    colptr, row, perm = csr_to_csc(inp.rowptr, inp.col, CASES[0][1])
    fwd = (inp.rowptr, inp.col, inp.query, inp.key, inp.value, inp.e_feat, 0.3, 0.3, PHILOX,
           colptr, row, perm, inp.bias, invert_perm(perm))
    out, lse = ops.transformer_attention(*fwd)
    bwd = (inp.rowptr, inp.col, colptr, row, perm, inp.query, inp.key, inp.value, inp.e_feat, out,
           lse, torch.randn_like(out), torch.randn_like(lse), 0.3, 0.3, PHILOX, inp.bias,
           invert_perm(perm))
    grad_fwd = tuple(t.detach().requires_grad_() if isinstance(t, Tensor) and t.is_floating_point()
                     else t for t in fwd)
    return fwd, grad_fwd, bwd


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,index_dtype", [(torch.float32, torch.int32),
                                               (torch.float64, torch.int64)],
                         ids=["f32-i32", "f64-i64"])
def test_opcheck(dtype, index_dtype, device):
    fwd, grad_fwd, bwd = _opcheck_args(device, dtype, index_dtype)
    torch.library.opcheck(ops.transformer_attention, fwd)
    torch.library.opcheck(ops.transformer_attention, grad_fwd)
    torch.library.opcheck(ops.transformer_attention_backward, bwd)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    """The op traces without graph breaks, and the compiled forward and
    backward equal eager's."""
    inp = make_inputs(CASES[0], torch.float32, device=device, with_bias=True)
    csc = csr_to_csc(inp.rowptr, inp.col, CASES[0][1])

    def step(query, key, value, e_feat, bias):
        out, lse = pma.transformer_attention(inp.rowptr, inp.col, query, key, value,
                                             e_feat=e_feat, bias=bias, csc=csc)
        return (out * out).sum() + lse.sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    results = []
    for fn in (step, compiled):
        leaves = [t.detach().requires_grad_() for t in inp.floats().values()]
        loss = fn(*leaves)
        results.append([loss] + list(torch.autograd.grad(loss, leaves)))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_casts_every_input(device):
    dtype = torch.bfloat16
    inp = make_inputs(CASES[0], torch.float32, device=device, with_bias=True)
    key = inp.key.to(dtype)  # as from a Linear under autocast; the others float32
    with torch.autocast(device, dtype=dtype):
        out, lse = run_op(inp._replace(key=key))
    assert out.dtype == dtype and lse.dtype == torch.float32
    ref, _ = run_op(inp._replace(**{n: t.to(dtype) for n, t in inp.floats().items()}))
    assert torch.equal(out, ref)


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------

BAD = [
    ("query", lambda i: i._replace(query=i.query[:-1]), "query must have shape"),
    ("value", lambda i: i._replace(value=i.value[:, :, :-1]), "value must have the shape of key"),
    ("e_feat", lambda i: i._replace(e_feat=i.e_feat[:-1]), "e_feat must have shape"),
    ("dtype", lambda i: i._replace(query=i.query.double()), "must have the same dtype"),
    ("bias", lambda i: i._replace(bias=i.key[0, :, :-1]), "bias must have shape"),
    ("key_dim", lambda i: i._replace(key=i.key[0]), "key must have 3 dimensions"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,mutate,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises(name, mutate, match, device):
    inp = mutate(make_inputs(CASES[0], torch.float32, device=device, with_bias=True))
    with pytest.raises(RuntimeError, match=match):
        run_op(inp)


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_range_col_raises_with_validate(device):
    inp = make_inputs(CASES[0], torch.float32, device=device)
    col = inp.col.clone()
    col[5] = inp.key.size(0)
    with pytest.raises(ValueError, match="col"):
        run_op(inp._replace(col=col), validate=True)
    if device == "cpu":  # the CPU kernel checks every index itself
        with pytest.raises((IndexError, RuntimeError), match="col"):
            run_op(inp._replace(col=col))


def test_dropout_needs_philox_in_the_raw_op():
    inp = make_inputs(CASES[0], torch.float32)
    with pytest.raises(RuntimeError, match="philox"):
        ops.transformer_attention(inp.rowptr, inp.col, inp.query, inp.key, inp.value, None, 0.3,
                                  0.5, None)
