"""The fused attention ops whose scores read the feature rows, each against
its float64 reference (tests/gat_reference.py): ``gatv2_attention``
(GATv2's per-channel score; CPU and CUDA, padded head layouts on CUDA) and
``transformer_attention`` (the scaled dot product; CPU and CUDA, the same
padded head layouts on CUDA).
Forward (out and lse), backward (every input's gradient, and through lse),
gradcheck, opcheck, torch.compile, autocast, bad input and determinism, for
each op; then what is particular to each (the CUDA head rule, negative_slope,
scale).
"""
from typing import Callable, NamedTuple, Optional, Tuple

import pytest
import torch
from conftest import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    TOLERANCE,
    check_without_grad_mode,
    poison,
    random_csr,
    rel_error,
)
from gat_reference import reference_gatv2_attention, reference_transformer_attention
from test_gat_attention import CASE_IDS, CASES, assert_lse_close, dtype_id, lse_dtype
from torch import Tensor

import pyg_multihead_agg as pma
from pyg_multihead_agg import csr_to_csc, invert_perm
from pyg_multihead_agg.nn.gatv2_conv import fused_head_supported

ops = torch.ops.pyg_multihead_agg
PHILOX = torch.tensor([0x5EED1234ABCD, 3], dtype=torch.int64)
# Gradients of the scores take a difference (m * dot - delta) and (GATv2) pass
# through the per-channel kink: twice the output tolerance, 4x in half types.
SCORE_GRAD_FACTOR = {torch.float16: 4, torch.bfloat16: 4, torch.float32: 2, torch.float64: 2}
_OP_ONLY = ("csc", "perm_inv")  # arguments of the op the reference does not take


class Inputs(NamedTuple):
    """The three feature tensors a, b, c of an op (its own names in
    ``Op.names``), the edge features and the bias."""
    op: "Op"
    rowptr: Tensor
    col: Tensor
    a: Tensor
    b: Tensor
    c: Tensor
    e_feat: Optional[Tensor]
    bias: Optional[Tensor]

    def floats(self):
        values = (self.a, self.b, self.c, self.e_feat, self.bias)
        names = self.op.names + ("e_feat", "bias")
        return {n: t for n, t in zip(names, values, strict=True) if t is not None}

    def replace(self, **named):
        """_replace by the op's own names (x_l, key, ...)."""
        slots = dict(zip(self.op.names, ("a", "b", "c"), strict=True))
        return self._replace(**{slots.get(n, n): t for n, t in named.items()})


class Op(NamedTuple):
    name: str
    names: Tuple[str, str, str]     # the feature tensors, in the op's argument order
    on_source: Tuple[bool, bool, bool]  # which of them have a row per source (else per
    #                                     destination; GATv2's att has H rows: None)
    wrapper: Callable               # pyg_multihead_agg.<op>(rowptr, col, a, b, c, ...)
    reference: Callable             # its float64 reference, same argument order
    raw: Callable                   # the raw op's argument tuple (a, b, c, e_feat, factor)
    source: str                     # a per-source tensor (for the NaN test, unaligned views)
    factor: float                   # the op's float argument (negative_slope / scale)
    devices: list

    def __repr__(self):
        return self.name


def _cuda(*marks):
    return pytest.param("cuda", id="cuda", marks=[*marks, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU")])


GATV2 = Op("gatv2", ("x_l", "x_r", "att"), (True, False, None), pma.gatv2_attention,
           reference_gatv2_attention, lambda a, b, c, e, f: (a, b, e, c, f), "x_l", 0.2,
           ["cpu", _cuda()])
TRANSFORMER = Op("transformer", ("query", "key", "value"), (False, True, True),
                 pma.transformer_attention, reference_transformer_attention,
                 lambda a, b, c, e, f: (a, b, c, e, f), "key", 0.3, ["cpu", _cuda()])
OPS = [GATV2, TRANSFORMER]
# (op, device) pairs: the devices each op has kernels on.
OP_DEVICES = [pytest.param(op, d.values[0] if hasattr(d, "values") else d,
                           id=f"{op.name}-{d.id if hasattr(d, 'id') else d}",
                           marks=d.marks if hasattr(d, "marks") else ())
              for op in OPS for d in op.devices]


def make_inputs(op: Op, case, dtype=torch.float32, index_dtype=torch.int64, device="cpu", seed=0,
                with_edge=True, with_bias=False):
    num_dst, num_src, num_edges, heads, channels, hub = case
    gen = torch.Generator().manual_seed(seed)
    rowptr, col = random_csr(num_dst, num_src, num_edges, index_dtype=index_dtype,
                             device=device, hub=hub, generator=gen)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device, dtype)

    feats = [rand(heads, channels) if s is None else
             rand(num_src if s else num_dst, heads, channels) for s in op.on_source]
    e_feat = rand(col.numel(), heads, channels) if with_edge else None
    bias = rand(heads, channels) if with_bias else None
    return Inputs(op, rowptr, col, *feats, e_feat, bias)


def run_op(inp: Inputs, **kw):
    return inp.op.wrapper(inp.rowptr, inp.col, inp.a, inp.b, inp.c, e_feat=inp.e_feat,
                          bias=inp.bias, **kw)


def reference(inp: Inputs, leaves=None, **kw):
    f = leaves if leaves is not None else inp.floats()
    a, b, c = (f[n] for n in inp.op.names)
    kw = {k: v for k, v in kw.items() if k not in _OP_ONLY}
    return inp.op.reference(inp.rowptr, inp.col, a, b, c, f.get("e_feat"), bias=f.get("bias"),
                            **kw)


def refused_on_cuda(inp: Inputs, dtype) -> bool:
    """On CUDA: whether the kernels refuse this head shape (more than 32
    vectors a head, or rows over 128 vectors: the padded layout both ops
    share); then a clear error, and True."""
    heads, channels = inp.a.shape[1:]
    if inp.a.device.type != "cuda" or fused_head_supported(heads, channels, dtype):
        return False
    with pytest.raises(RuntimeError, match="the CUDA kernel supports heads of at most"):
        run_op(inp)
    return True


def check_forward(inp: Inputs, dtype, **kw):
    if refused_on_cuda(inp, dtype):
        return
    out, lse = run_op(inp, **kw)
    ref_out, ref_lse = reference(inp, **kw)
    assert out.dtype == dtype and lse.dtype == lse_dtype(dtype)
    assert rel_error(out, ref_out) <= TOLERANCE[dtype]
    assert_lse_close(lse, ref_lse, dtype)


def _grads(outs_and_grads, inputs):
    outs = [o for o, _ in outs_and_grads]
    grads = [g for _, g in outs_and_grads]
    return torch.autograd.grad(outs, inputs, grads, allow_unused=True)


def check_backward(inp: Inputs, dtype, through=("out", "lse"), **kw):
    """Every gradient of <g, out> + <g_lse, lse> against the reference's."""
    if refused_on_cuda(inp, dtype):
        return
    floats = {n: t.detach().requires_grad_() for n, t in inp.floats().items()}
    inp = inp.replace(**floats)
    out, lse = run_op(inp, **kw)
    gen = torch.Generator().manual_seed(1)
    g_out = torch.randn(out.shape, generator=gen).to(out.device, out.dtype)
    g_lse = torch.randn(lse.shape, generator=gen).to(lse.device, lse.dtype)
    g_lse = torch.where(torch.isfinite(lse), g_lse, torch.zeros_like(g_lse))
    pairs = {"out": (out, g_out), "lse": (lse, g_lse)}
    got = _grads([pairs[t] for t in through], list(floats.values()))

    leaves = {n: t.detach().cpu().double().requires_grad_() for n, t in floats.items()}
    ref_out, ref_lse = reference(inp, leaves, **kw)
    ref_lse = torch.where(torch.isfinite(ref_lse), ref_lse, torch.zeros_like(ref_lse))
    ref_pairs = {"out": (ref_out, g_out.cpu().double()), "lse": (ref_lse, g_lse.cpu().double())}
    want = _grads([ref_pairs[t] for t in through], list(leaves.values()))
    for name, g, r, t in zip(floats, got, want, leaves.values(), strict=True):
        g = torch.zeros_like(floats[name]) if g is None else g
        r = torch.zeros_like(t) if r is None else r
        assert g.dtype == dtype and g.shape == floats[name].shape, name
        # bias and the transformer's value: sums of grad_out, an output's tolerance
        factor = 1 if name in ("bias", "value") else SCORE_GRAD_FACTOR[dtype]
        if name == "att" and dtype in (torch.float16, torch.bfloat16):
            factor *= 4  # a sum over every edge of rounded inputs
        tol = factor * TOLERANCE[dtype]
        err = rel_error(g, r)
        assert err <= tol, f"grad {name}: relative error {err:.3g} > {tol:.3g}"


@pytest.mark.sweep(by=("op",))
@pytest.mark.parametrize("op,device", OP_DEVICES)
@pytest.mark.parametrize("dropout", [0.0, 0.5], ids=["p0", "p0.5"])
@pytest.mark.parametrize("with_edge", [False, True], ids=["no_edge", "e_feat"])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_forward_matches_reference(case, dtype, index_dtype, with_edge, dropout, op, device):
    num_dst, _, _, heads, channels, _ = case
    poison((num_dst, heads, channels), dtype, device)
    poison((num_dst, heads), lse_dtype(dtype), device)
    inp = make_inputs(op, case, dtype, index_dtype, device, with_edge=with_edge)
    check_forward(inp, dtype, dropout=dropout, philox=PHILOX)


@pytest.mark.sweep(by=("op",))
@pytest.mark.parametrize("op,device", OP_DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_forward_with_bias_matches_reference(case, dtype, op, device):
    inp = make_inputs(op, case, dtype, device=device, with_bias=True)
    check_forward(inp, dtype, dropout=0.3, philox=PHILOX)


@pytest.mark.sweep(by=("op",))
@pytest.mark.parametrize("op,device", OP_DEVICES)
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
                                    with_csc, perm_inv, op, device):
    num_dst, num_src, _, heads, channels, _ = case
    inp = make_inputs(op, case, dtype, index_dtype, device, with_edge=with_edge,
                      with_bias=with_bias)
    csc = csr_to_csc(inp.rowptr, inp.col, num_src) if with_csc else None
    inv = invert_perm(csc[2]) if perm_inv else None
    poison((num_src, heads, channels), dtype, device)  # for the per-source gradients
    poison((num_dst, heads, channels), dtype, device)  # for the per-destination ones
    check_backward(inp, dtype, dropout=dropout, philox=PHILOX, csc=csc, perm_inv=inv)


@pytest.mark.parametrize("op,device", OP_DEVICES)
@pytest.mark.parametrize("through", [("out",), ("lse",)], ids=["out", "lse"])
def test_backward_through_one_output(through, op, device):
    inp = make_inputs(op, CASES[4], torch.float64, device=device)
    check_backward(inp, torch.float64, through=through)


@pytest.mark.sweep(by=("op",))
@pytest.mark.parametrize("op,device", OP_DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64], ids=dtype_id)
@pytest.mark.parametrize("heads,channels", [(1, 7), (8, 8), (4, 32), (3, 48), (2, 100), (1, 1),
                                            (4, 64), (16, 8), (1, 256)])
def test_heads_and_channels(heads, channels, dtype, op, device):
    """Heads of every width: for GATv2's CUDA kernels whole vectors, padded
    lanes (48: 12 vectors on 16 lanes), channels off the vector width (padded
    copies), one and several vectors per lane, and heads too wide for one
    group (256 float32 channels: a clear error)."""
    case = (40, 30, 300, heads, channels, True)
    inp = make_inputs(op, case, dtype, device=device, with_bias=True)
    check_forward(inp, dtype, dropout=0.2, philox=PHILOX)
    check_backward(inp, dtype, dropout=0.2, philox=PHILOX,
                   csc=csr_to_csc(inp.rowptr, inp.col, case[1]))


@pytest.mark.parametrize("op,device", OP_DEVICES)
def test_non_contiguous_and_unaligned_inputs(op, device):
    """Views: a per-source tensor sliced from a wider one (unaligned rows), the
    third tensor a permuted view."""
    inp = make_inputs(op, CASES[0], torch.float32, device=device)
    src = getattr(inp, "abc"[op.names.index(op.source)])
    wide = torch.randn(src.size(0), src.size(1), src.size(2) + 1, device=device)
    c = torch.randn(*reversed(inp.c.shape), device=device).permute(*reversed(range(inp.c.dim())))
    inp = inp.replace(**{op.source: wide[..., 1:], op.names[2]: c})
    check_forward(inp, torch.float32)
    check_backward(inp, torch.float32)


@pytest.mark.parametrize("op,device", OP_DEVICES)
def test_contiguous_inputs_at_odd_offsets(op, device):
    """Contiguous tensors that start one element into their storage (rows
    not 16-byte aligned): the CUDA kernels' vector loads get aligned copies."""
    inp = make_inputs(op, CASES[0], torch.float32, device=device)

    def shifted(t):
        flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
        view = flat[1:].view(t.shape)
        view.copy_(t)
        assert view.is_contiguous() and view.data_ptr() % 16 != 0
        return view

    inp = inp.replace(**{name: shifted(t) for name, t in zip(
        op.names, (inp.a, inp.b, inp.c), strict=True) if t.dim() == 3})
    check_forward(inp, torch.float32)
    check_backward(inp, torch.float32)


@pytest.mark.parametrize("op,device", OP_DEVICES)
def test_forward_without_grad_mode(op, device):
    """Without grad mode the op runs below the autograd keys at once (no
    autograd Function, csrc/autograd.cpp): the same bits as with grad mode,
    every input in its place (edge features, bias, dropout), and no graph."""
    inp = make_inputs(op, CASES[4], torch.float32, device=device, with_bias=True)
    inp = inp.replace(**{n: t.detach().requires_grad_() for n, t in inp.floats().items()})
    check_without_grad_mode(lambda: run_op(inp, dropout=0.3, philox=PHILOX))


@pytest.mark.parametrize("case", [CASES[4], CASES[12]], ids=[CASE_IDS[4], CASE_IDS[12]])
@pytest.mark.parametrize("op,device", OP_DEVICES)
def test_deterministic(op, device, case):
    """Two runs: bitwise the same outputs and gradients (no atomics), on a
    hub row and on a graph whose every CSC column is sliced (the slices'
    sums, and GATv2's grad_att summed per fetch range)."""
    inp = make_inputs(op, case, torch.float32, device=device, with_bias=True)
    csc = csr_to_csc(inp.rowptr, inp.col, case[1])
    results = []
    for _ in range(2):
        floats = {n: t.detach().requires_grad_() for n, t in inp.floats().items()}
        out, lse = run_op(inp.replace(**floats), dropout=0.3, philox=PHILOX, csc=csc)
        grads = torch.autograd.grad((out * out).sum() + lse.nan_to_num(0, 0, 0).sum(),
                                    list(floats.values()))
        results.append((out, lse) + grads)
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("op,device", OP_DEVICES)
def test_dropout_extremes(op, device):
    inp = make_inputs(op, CASES[0], torch.float64, device=device, with_bias=True)
    out, _ = run_op(inp, dropout=1.0, philox=PHILOX)
    assert torch.equal(out, inp.bias.expand_as(out))  # nothing kept: only the bias
    check_forward(inp, torch.float64, dropout=1e-12, philox=PHILOX)


@pytest.mark.parametrize("op", OPS, ids=repr)
def test_dropout_draws_a_fresh_key(op):
    inp = make_inputs(op, CASES[0], torch.float64)
    torch.manual_seed(0)
    a, _ = run_op(inp, dropout=0.5)
    b, _ = run_op(inp, dropout=0.5)
    torch.manual_seed(0)
    c, _ = run_op(inp, dropout=0.5)
    assert not torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.parametrize("op,device", OP_DEVICES)
def test_nonfinite_inputs_propagate(op, device):
    """A NaN in one source row: NaN in the rows that read it, nothing else."""
    case = (20, 20, 80, 2, 8, False)
    inp = make_inputs(op, case, torch.float32, device=device)
    src = inp.floats()[op.source].clone()
    src[3, 0, 0] = float("nan")
    out, lse = run_op(inp.replace(**{op.source: src}))
    rows = torch.repeat_interleave(torch.arange(case[0], device=device),
                                   inp.rowptr.long().diff())
    hit = torch.zeros(case[0], dtype=torch.bool, device=device)
    hit[rows[inp.col.long() == 3]] = True
    assert torch.isnan(lse[hit, 0]).all() and torch.isnan(out[hit, 0]).all()
    assert not torch.isnan(out[~hit]).any() and not torch.isnan(lse[~hit]).any()


# ---------------------------------------------------------------------------
# gradcheck, opcheck, torch.compile, autocast
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("op,device", OP_DEVICES)
@pytest.mark.parametrize("with_csc", [True, False], ids=["csc", "no_csc"])
@pytest.mark.parametrize("dropout", [0.0, 0.3], ids=["p0", "p0.3"])
def test_gradcheck(dropout, with_csc, op, device):
    case = (6, 5, 16, 2, 3, False)
    inp = make_inputs(op, case, torch.float64, device=device, with_bias=True)
    csc = csr_to_csc(inp.rowptr, inp.col, case[1]) if with_csc else None
    leaves = [t.detach().requires_grad_() for t in inp.floats().values()]

    def f(a, b, c, e_feat, bias):
        out, lse = op.wrapper(inp.rowptr, inp.col, a, b, c, e_feat=e_feat, bias=bias,
                              dropout=dropout, philox=PHILOX, csc=csc)
        return out, torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))

    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("op,device", OP_DEVICES)
@pytest.mark.parametrize("dtype,index_dtype", [(torch.float32, torch.int32),
                                               (torch.float64, torch.int64)],
                         ids=["f32-i32", "f64-i64"])
def test_opcheck(dtype, index_dtype, op, device):
    inp = make_inputs(op, CASES[0], dtype, index_dtype, device, with_bias=True)
    colptr, row, perm = csr_to_csc(inp.rowptr, inp.col, CASES[0][1])
    inv = invert_perm(perm)
    forward = getattr(ops, f"{op.name}_attention")
    backward = getattr(ops, f"{op.name}_attention_backward")
    feats = op.raw(inp.a, inp.b, inp.c, inp.e_feat, op.factor)
    fwd = (inp.rowptr, inp.col, *feats, 0.3, PHILOX, colptr, row, perm, inp.bias, inv)
    out, lse = forward(*fwd)
    bwd = (inp.rowptr, inp.col, colptr, row, perm, *feats[:4], out, lse, torch.randn_like(out),
           torch.randn_like(lse), op.factor, 0.3, PHILOX, inp.bias, inv)
    grad_fwd = tuple(t.detach().requires_grad_() if isinstance(t, Tensor) and t.is_floating_point()
                     else t for t in fwd)
    torch.library.opcheck(forward, fwd)
    torch.library.opcheck(forward, grad_fwd)
    torch.library.opcheck(backward, bwd)


@pytest.mark.parametrize("op,device", OP_DEVICES)
def test_compile_fullgraph(op, device):
    """The op traces without graph breaks, and the compiled forward and
    backward equal eager's."""
    inp = make_inputs(op, CASES[0], torch.float32, device=device, with_bias=True)
    csc = csr_to_csc(inp.rowptr, inp.col, CASES[0][1])

    def step(a, b, c, e_feat, bias):
        out, lse = op.wrapper(inp.rowptr, inp.col, a, b, c, e_feat=e_feat, bias=bias, csc=csc)
        return (out * out).sum() + lse.sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    results = []
    for fn in (step, compiled):
        leaves = [t.detach().requires_grad_() for t in inp.floats().values()]
        loss = fn(*leaves)
        results.append([loss] + list(torch.autograd.grad(loss, leaves)))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("op,device", OP_DEVICES)
def test_autocast_casts_every_input(op, device):
    dtype = torch.bfloat16
    inp = make_inputs(op, CASES[0], torch.float32, device=device, with_bias=True)
    # as from a Linear under autocast; the others float32
    low = inp.replace(**{op.source: inp.floats()[op.source].to(dtype)})
    with torch.autocast(device, dtype=dtype):
        out, lse = run_op(low)
    assert out.dtype == dtype and lse.dtype == torch.float32
    ref, _ = run_op(inp.replace(**{n: t.to(dtype) for n, t in inp.floats().items()}))
    assert torch.equal(out, ref)


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------

BAD = [
    (GATV2, "x_r", lambda i: i.replace(x_r=i.b[:-1]), "x_r must have shape"),
    (GATV2, "att", lambda i: i.replace(att=i.c[:, :-1]), "att must have shape"),
    (GATV2, "x_l_dim", lambda i: i.replace(x_l=i.a[0]), "x_l must have 3 dimensions"),
    (TRANSFORMER, "query", lambda i: i.replace(query=i.a[:-1]), "query must have shape"),
    (TRANSFORMER, "value", lambda i: i.replace(value=i.c[:, :, :-1]),
     "value must have the shape of key"),
    (TRANSFORMER, "key_dim", lambda i: i.replace(key=i.b[0]), "key must have 3 dimensions"),
] + [(op, name, mutate, match) for op in OPS for name, mutate, match in (
    ("e_feat", lambda i: i._replace(e_feat=i.e_feat[:-1]), "e_feat must have shape"),
    ("dtype", lambda i: i._replace(b=i.b.double()), "must have the same dtype"),
    ("bias", lambda i: i._replace(bias=i.e_feat[0, :, :-1]), "bias must have shape"),
)]


@pytest.mark.parametrize("op,device,mutate,match", [
    pytest.param(op, device.values[0], mutate, match, id=f"{op.name}-{name}-{device.id}",
                 marks=device.marks) if hasattr(device, "values") else
    pytest.param(op, device, mutate, match, id=f"{op.name}-{name}-{device}")
    for op, name, mutate, match in BAD for device in op.devices])
def test_bad_input_raises(op, device, mutate, match):
    inp = mutate(make_inputs(op, CASES[0], torch.float32, device=device, with_bias=True))
    with pytest.raises(RuntimeError, match=match):
        run_op(inp)


@pytest.mark.parametrize("op,device", OP_DEVICES)
def test_out_of_range_col_raises_with_validate(op, device):
    inp = make_inputs(op, CASES[0], torch.float32, device=device)
    col = inp.col.clone()
    col[5] = inp.floats()[op.source].size(0)
    with pytest.raises(ValueError, match="col"):
        run_op(inp._replace(col=col), validate=True)
    if device == "cpu":  # the CPU kernel checks every index itself
        with pytest.raises((IndexError, RuntimeError), match="col"):
            run_op(inp._replace(col=col))


@pytest.mark.parametrize("op", OPS, ids=repr)
def test_dropout_needs_philox_in_the_raw_op(op):
    inp = make_inputs(op, CASES[0], torch.float32)
    forward = getattr(ops, f"{op.name}_attention")
    feats = op.raw(inp.a, inp.b, inp.c, None, op.factor)
    with pytest.raises(RuntimeError, match="philox"):
        forward(inp.rowptr, inp.col, *feats, 0.5, None)


@pytest.mark.parametrize("op", OPS, ids=repr)
def test_autograd_is_one_cpp_node(op):
    # C++ autograd (csrc/autograd.cpp): one node per call, no Python formula.
    inp = make_inputs(op, CASES[0], torch.float64, with_bias=True)
    floats = {n: t.requires_grad_() for n, t in inp.floats().items()}
    out, lse = run_op(inp.replace(**floats))
    assert out.grad_fn is lse.grad_fn
    assert out.grad_fn.name().startswith("torch::autograd::CppNode<")
    assert "ChannelAttention" in out.grad_fn.name()


# ---------------------------------------------------------------------------
# Each op's own argument
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", GATV2.devices)
@pytest.mark.parametrize("negative_slope", [0.0, 0.2, 1.0, 3.0])
def test_gatv2_negative_slope(negative_slope, device):
    inp = make_inputs(GATV2, CASES[0], torch.float64, device=device)
    check_forward(inp, torch.float64, negative_slope=negative_slope)
    check_backward(inp, torch.float64, negative_slope=negative_slope)


@pytest.mark.parametrize("device", TRANSFORMER.devices)
@pytest.mark.parametrize("scale", [None, 0.0, 1.0, 3.0])
def test_transformer_scale(scale, device):
    inp = make_inputs(TRANSFORMER, CASES[0], torch.float64, device=device)
    check_forward(inp, torch.float64, scale=scale)
    check_backward(inp, torch.float64, scale=scale)


# (heads, channels, dtype): the CUDA head layouts of the transformer that
# take the transposed CSC pass (heads of 8 lanes in
# 4-byte types, 4 lanes in any: float32 D = 32 and 16, a padded float32 head
# of 6 vectors in 8 lanes, bf16 and fp16 D = 32, float64 D = 8) and two that
# do not (2 lanes; float64 D = 16, 8 lanes).
TRANSPOSED_LAYOUTS = [(4, 32, torch.float32), (2, 16, torch.float32), (3, 24, torch.float32),
                      (4, 32, torch.bfloat16), (2, 32, torch.float16), (2, 8, torch.float64),
                      (4, 8, torch.float32), (4, 16, torch.float64)]


def transposed_layout_cases(test):
    """The cases of both layout tests: every layout of TRANSPOSED_LAYOUTS,
    index dtype, GATv2 and the transformer, with and without edge features
    (applied as the decorators would be, bottom first: the same test ids)."""
    for mark in (
            pytest.mark.parametrize(
                "heads,channels,dtype", TRANSPOSED_LAYOUTS,
                ids=[f"H{h}-D{c}-{dtype_id(d)}" for h, c, d in TRANSPOSED_LAYOUTS]),
            pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=dtype_id),
            pytest.mark.parametrize("op", [GATV2, TRANSFORMER], ids=repr),
            pytest.mark.parametrize("with_edge", [True, False], ids=["edge", "no_edge"]),
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")):
        test = mark(test)
    return test


@transposed_layout_cases
def test_backward_both_layouts(heads, channels, dtype, index_dtype, op, with_edge):
    """The CSC pass with an entry's scalar work in one lane of its head (the
    default for heads of 4 or 8 lanes) or in every lane
    (force_kernel_path(transposed=0)): with and without edge features, with
    dropout, bias and lse gradients, on a graph with a hub and long CSC
    columns (sliced), with the caller's CSC and perm_inv and without, both
    match the float64 reference and agree bit for bit (GATv2's over the
    forward's record)."""
    from pyg_multihead_agg._testing import force_kernel_path
    case = (40, 12, 900, heads, channels, True)
    inp = make_inputs(op, case, dtype, index_dtype, "cuda", seed=heads * 100 + channels,
                      with_edge=with_edge, with_bias=True)
    colptr, row, perm = csr_to_csc(inp.rowptr, inp.col, case[1])
    for csc, perm_inv in (((colptr, row, perm), invert_perm(perm)), (None, None)):
        kw = dict(dropout=0.3, philox=PHILOX.clone(), csc=csc, perm_inv=perm_inv)
        got = []
        for layout in (0, 1):
            with force_kernel_path(transposed=layout):
                check_backward(inp, dtype, **kw)  # against the reference
                floats = {n: t.detach().requires_grad_() for n, t in inp.floats().items()}
                out, lse = run_op(inp.replace(**floats), **kw)
                gen = torch.Generator().manual_seed(2)
                g_out = torch.randn(out.shape, generator=gen).to(out.device, out.dtype)
                g_lse = torch.randn(lse.shape, generator=gen).to(lse.device, lse.dtype)
                g_lse = torch.where(torch.isfinite(lse), g_lse, torch.zeros_like(g_lse))
                poison(out.shape, dtype, "cuda")
                got.append(torch.autograd.grad((out, lse), list(floats.values()),
                                               (g_out, g_lse)))
        for name, a, b in zip(inp.floats(), *got, strict=True):
            assert torch.equal(a, b), f"grad {name} differs between the layouts"


@transposed_layout_cases
def test_forward_both_layouts(heads, channels, dtype, index_dtype, op, with_edge):
    """The online forward with an entry's scalar work in one lane of its head
    (the default for heads of 4 or 8 lanes at one vector per lane: one
    transposing butterfly sums a step's logits; without edge features a copy
    of that pass that loads none) or in every lane
    (force_kernel_path(transposed=0)): with and without edge features, with
    dropout and bias, on a graph with a hub (block-wide rows), both match the
    float64 reference and agree bit for bit, GATv2's record included."""
    from pyg_multihead_agg._testing import force_kernel_path
    case = (40, 12, 900, heads, channels, True)
    inp = make_inputs(op, case, dtype, index_dtype, "cuda", seed=heads * 100 + channels,
                      with_edge=with_edge, with_bias=True)
    kw = dict(dropout=0.3, philox=PHILOX.clone())
    got = []
    for layout in (0, 1):
        with force_kernel_path(transposed=layout):
            check_forward(inp, dtype, **kw)
            results = list(run_op(inp, **kw))
            if op is GATV2:
                fwd, _ = _gatv2_calls(inp, dropout=0.3)
                results += list(ops._gatv2_attention_record(*fwd))
            got.append(results)
    for k, (a, b) in enumerate(zip(*got, strict=True)):
        assert torch.equal(a, b), f"output {k} differs between the layouts"


# ---------------------------------------------------------------------------
# GATv2's record: the training forward's logits and signs, which the CUDA
# backward reads instead of rebuilding z from x_r[i]
# ---------------------------------------------------------------------------

class _OpNames(torch.utils._python_dispatch.TorchDispatchMode):
    """The names of this package's ops a call runs (below autograd)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "pyg_multihead_agg":
            self.names.append(func.name().split("::")[1])
        return func(*args, **(kwargs or {}))


def _gatv2_calls(inp: Inputs, dropout=0.0):
    """The raw forward's arguments, then the backward's (with the CSC and a
    fresh output gradient) once the forward's out and lse are known."""
    philox = PHILOX if dropout else None
    fwd = (inp.rowptr, inp.col, inp.a, inp.b, inp.e_feat, inp.c, 0.2, dropout, philox)
    colptr, row, perm = csr_to_csc(inp.rowptr, inp.col, inp.a.size(0))

    def bwd(out, lse):
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
        return (inp.rowptr, inp.col, colptr, row, perm, inp.a, inp.b, inp.e_feat, inp.c, out,
                lse, grad.to(out.device, out.dtype), None, 0.2, dropout, philox)
    return fwd, bwd


@pytest.mark.parametrize("device", GATV2.devices)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64], ids=dtype_id)
@pytest.mark.parametrize("heads,channels", [(4, 32), (3, 48), (2, 100), (1, 7)])
def test_gatv2_record_matches_reference(heads, channels, dtype, device):
    """_gatv2_attention_record: out and lse bitwise gatv2_attention's; on CUDA
    each entry's logit against float64 and each sign bit that of z (where z
    is clear of rounding at 0), unused bits 0; on the CPU an empty record."""
    inp = make_inputs(GATV2, (30, 25, 200, heads, channels, True), dtype=dtype, device=device)
    if refused_on_cuda(inp, dtype):
        return
    fwd, _ = _gatv2_calls(inp)
    num_edges, words = inp.col.numel(), (channels + 31) // 32
    if device == "cuda":  # NaN blocks of the record's sizes, for the allocator to hand out
        blocks = [torch.full((num_edges, heads * w), float("nan"), device=device)
                  for w in (1, words)]
        del blocks
    out, lse, logits, signs = ops._gatv2_attention_record(*fwd)
    want_out, want_lse = ops.gatv2_attention(*fwd)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    if device == "cpu":
        assert logits.shape == (0, heads) and signs.shape == (0, heads, words)
        return
    assert logits.shape == (num_edges, heads) and logits.dtype == lse.dtype
    assert signs.shape == (num_edges, heads, words) and signs.dtype == torch.int32
    rowptr, col = inp.rowptr.cpu(), inp.col.cpu().long()
    row = torch.repeat_interleave(torch.arange(rowptr.numel() - 1), rowptr.diff())
    x_l, x_r, att, e = (t.cpu().double() for t in (inp.a, inp.b, inp.c, inp.e_feat))
    terms = (x_l[col], x_r[row], e)
    z = terms[0] + terms[1] + terms[2]
    ref = (att * torch.nn.functional.leaky_relu(z, 0.2)).sum(-1)
    assert rel_error(logits.cpu().double(), ref) <= TOLERANCE[torch.float32]
    raw = signs.cpu().long() & 0xFFFFFFFF
    bits = (raw.unsqueeze(-1) >> torch.arange(32)) & 1  # [E, H, W, 32]
    bits = bits.reshape(num_edges, heads, words * 32).bool()
    assert not bits[..., channels:].any()
    clear = z.abs() > 1e-5 * sum(t.abs() for t in terms)
    assert torch.equal(bits[..., :channels][clear], (z > 0)[clear])


@pytest.mark.parametrize("device", GATV2.devices)
@pytest.mark.parametrize("dropout", [0.0, 0.5], ids=["p0", "p0.5"])
@pytest.mark.parametrize("case", [CASES[0], CASES[4], CASES[5]],
                         ids=[CASE_IDS[0], CASE_IDS[4], CASE_IDS[5]])
def test_gatv2_backward_over_the_record(case, dropout, device):
    """The backward over the forward's record gives, bitwise, the gradients
    of the one that makes its own record (the logits are taken before
    dropout, so a forward with dropout records the same);
    _gatv2_attention_backward_into returns them too, its logit gradients
    written over the record's logits on CUDA (the record used up)."""
    inp = make_inputs(GATV2, case, device=device)
    fwd, bwd = _gatv2_calls(inp, dropout)
    out, lse, logits, signs = ops._gatv2_attention_record(*fwd)
    args = bwd(out, lse)
    plain = ops.gatv2_attention_backward(*args)
    kept = logits.clone()
    over = ops.gatv2_attention_backward(*args, None, None, logits, signs)
    assert torch.equal(logits, kept)  # (read, not written)
    bufs = (torch.full_like(inp.a, float("nan")), torch.full_like(inp.b, float("nan")))
    grad_att, grad_e = ops._gatv2_attention_backward_into(*args, None, None, *bufs, logits, signs)
    for got in (over, (*bufs, grad_att, grad_e)):
        for name, a, b in zip(("x_l", "x_r", "att", "e_feat"), plain, got, strict=True):
            assert torch.equal(a, b), name
    assert (device == "cuda") == (not torch.equal(logits, kept))


@pytest.mark.parametrize("device", GATV2.devices)
def test_gatv2_record_only_for_a_backward(device):
    """A forward whose inputs need no gradient, or under no_grad, runs
    gatv2_attention; one that will run a backward keeps the record on CUDA
    (_gatv2_attention_record), and its backward reads it."""
    inp = make_inputs(GATV2, CASES[4], device=device)
    seen = {}
    for needs in (False, True):
        x_l = inp.a.detach().requires_grad_(needs)
        with _OpNames() as ops_run:
            out, _ = pma.gatv2_attention(inp.rowptr, inp.col, x_l, inp.b, inp.c,
                                         e_feat=inp.e_feat)
            if needs:
                out.sum().backward()
        seen[needs] = ops_run.names
    with torch.no_grad(), _OpNames() as ops_run:
        pma.gatv2_attention(inp.rowptr, inp.col, inp.a.requires_grad_(), inp.b, inp.c)
    assert ops_run.names == ["gatv2_attention"]
    assert seen[False] == ["gatv2_attention"]
    forward = "_gatv2_attention_record" if device == "cuda" else "gatv2_attention"
    assert seen[True] == [forward, "gatv2_attention_backward"]


@pytest.mark.parametrize("device", GATV2.devices)
def test_gatv2_retained_graph_keeps_the_record(device):
    """A graph kept for a second backward keeps its record: both backwards
    give the same gradients (the first may not write over the logits)."""
    inp = make_inputs(GATV2, CASES[4], device=device)
    leaves = {n: t.detach().requires_grad_() for n, t in inp.floats().items()}
    inp = inp.replace(**leaves)
    out, _ = run_op(inp)
    grad = torch.randn_like(out)
    first = torch.autograd.grad(out, list(leaves.values()), grad, retain_graph=True)
    second = torch.autograd.grad(out, list(leaves.values()), grad)
    for name, a, b in zip(leaves, first, second, strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("device", GATV2.devices)
def test_gatv2_record_opcheck(device):
    inp = make_inputs(GATV2, CASES[0], device=device, with_bias=True)
    fwd, bwd = _gatv2_calls(inp, 0.3)
    fwd = (*fwd, inp.bias)
    torch.library.opcheck(ops._gatv2_attention_record, fwd)
    out, lse, logits, signs = ops._gatv2_attention_record(*fwd)
    args = (*bwd(out, lse), inp.bias, None, logits, signs)
    torch.library.opcheck(ops.gatv2_attention_backward, args)


@pytest.mark.parametrize("device", GATV2.devices)
@pytest.mark.parametrize("mutate,match", [
    (lambda lg, s: (lg[:-1], s), "logits must have shape"),
    (lambda lg, s: (lg, s[:, :, :0]), "signs must have shape"),
    (lambda lg, s: (lg, None), "must be given together"),
    (lambda lg, s: (lg.double(), s), "logits must have lse's dtype"),
    (lambda lg, s: (lg, s.float()), "signs must be int32"),
], ids=["logits-shape", "signs-shape", "one-of-two", "logits-dtype", "signs-dtype"])
def test_gatv2_record_bad_input(mutate, match, device):
    """A record that does not fit the backward's graph raises a clear error
    naming it (a CPU record of the right size counts: the CPU backward reads
    none, but it is checked)."""
    inp = make_inputs(GATV2, CASES[0], device=device)
    fwd, bwd = _gatv2_calls(inp)
    out, lse = ops.gatv2_attention(*fwd)
    num_edges, heads, channels = inp.col.numel(), *inp.a.shape[1:]
    logits = torch.zeros(num_edges, heads, dtype=lse.dtype, device=device)
    signs = torch.zeros(num_edges, heads, (channels + 31) // 32, dtype=torch.int32,
                        device=device)
    with pytest.raises(RuntimeError, match=match):
        ops.gatv2_attention_backward(*bwd(out, lse), None, None, *mutate(logits, signs))
