"""torch.autocast support (csrc/autocast.cpp) and deterministic mode.

Autocast: multihead_spmm casts its floating inputs (weight, x) to the autocast
dtype, so the layer's low-precision x (from a Linear) and float32 attention
weights (from the softmax) meet in one dtype; the output is in that dtype and
gradients flow back to the original (float32) tensors.

Determinism: with torch.use_deterministic_algorithms(True) and no CSC given,
forward and backward are bitwise reproducible on every device (the backward
builds the CSC instead of scattering with atomics on CUDA).
"""
import pytest
import torch
import torch_geometric.nn
from conftest import DEVICES, TOLERANCE, random_csr, reference_spmm, rel_error
from test_gat_conv import CASES as LAYER_CASES
from test_gat_conv import FUSED_OP, KINDS, make_adj, make_graph, op_events

import pyg_multihead_agg as pma
from pyg_multihead_agg.nn import GATConv

ops = torch.ops.pyg_multihead_agg
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
AUTOCAST = [
    pytest.param("cpu", torch.bfloat16, id="cpu-bfloat16"),
    pytest.param("cuda", torch.float16, id="cuda-float16", marks=CUDA),
    pytest.param("cuda", torch.bfloat16, id="cuda-bfloat16", marks=CUDA),
]
# Inputs are rounded to the autocast dtype before the (float32-accumulated)
# product, so allow input rounding as well as output rounding.
AUTOCAST_TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2}


def graph_inputs(device, seed=0, num_dst=40, num_src=30, num_edges=400, heads=4, channels=16):
    gen = torch.Generator().manual_seed(seed)
    rowptr, col = random_csr(num_dst, num_src, num_edges, device=device, hub=True, generator=gen)
    weight = torch.randn(num_edges, heads, generator=gen).to(device)
    x = torch.randn(num_src, heads, channels, generator=gen).to(device)
    grad_out = torch.randn(num_dst, heads, channels, generator=gen).to(device)
    return rowptr, col, weight, x, grad_out


def ref_grads(rowptr, col, weight, x, grad_out):
    """float64 (grad_weight, grad_x) through plain PyTorch autograd."""
    weight = weight.detach().double().cpu().requires_grad_()
    x = x.detach().double().cpu().requires_grad_()
    out = reference_spmm(rowptr, col, weight, x)
    return torch.autograd.grad(out, (weight, x), grad_out.double().cpu())


@pytest.mark.parametrize("device,dtype", AUTOCAST)
@pytest.mark.parametrize("x_dtype", [torch.float32, "autocast"], ids=["x_float32", "x_low"])
def test_op_under_autocast(device, dtype, x_dtype):
    """float32 weight with float32 or low-precision x: both reach the kernel in
    the autocast dtype; gradients come back in each input's own dtype."""
    rowptr, col, weight, x, grad_out = graph_inputs(device)
    x = x.to(dtype if x_dtype == "autocast" else x_dtype)
    weight.requires_grad_()
    x.requires_grad_()
    with torch.autocast(device, dtype=dtype):
        out = pma.multihead_spmm(rowptr, col, weight, x)
    assert out.dtype == dtype
    assert rel_error(out, reference_spmm(rowptr, col, weight, x)) <= AUTOCAST_TOL[dtype]
    grad_weight, grad_x = torch.autograd.grad(out, (weight, x), grad_out.to(dtype))
    assert grad_weight.dtype == weight.dtype and grad_x.dtype == x.dtype
    want_weight, want_x = ref_grads(rowptr, col, weight, x, grad_out.to(dtype))
    assert rel_error(grad_weight, want_weight) <= AUTOCAST_TOL[dtype]
    assert rel_error(grad_x, want_x) <= AUTOCAST_TOL[dtype]


@pytest.mark.parametrize("device,dtype", AUTOCAST)
def test_autocast_leaves_float64_and_errors_alone(device, dtype):
    rowptr, col, weight, x, _ = graph_inputs(device)
    with torch.autocast(device, dtype=dtype):
        out = pma.multihead_spmm(rowptr, col, weight.double(), x.double())
        # Only the dtype is autocast's business: shape errors still name the argument.
        with pytest.raises(RuntimeError, match="weight must have one row per edge"):
            pma.multihead_spmm(rowptr, col, weight[:-1], x)
    assert out.dtype == torch.float64
    assert rel_error(out, reference_spmm(rowptr, col, weight, x)) <= TOLERANCE[torch.float64]
    # Outside autocast, mixed dtypes are still an error.
    with pytest.raises(RuntimeError, match="same dtype"):
        pma.multihead_spmm(rowptr, col, weight, x.to(dtype))


def test_autocast_under_compile():
    rowptr, col, weight, x, _ = graph_inputs("cpu")
    fn = torch.compile(pma.multihead_spmm, fullgraph=True, backend="aot_eager")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fn(rowptr, col, weight, x.bfloat16())
    assert out.dtype == torch.bfloat16
    assert rel_error(out, reference_spmm(rowptr, col, weight, x)) <= AUTOCAST_TOL[torch.bfloat16]


@pytest.mark.parametrize("device,dtype", AUTOCAST)
def test_gat_attention_bias_under_autocast(device, dtype):
    """gat_attention's autocast kernel casts the bias with x and the scores:
    float32 inputs give an output in the autocast dtype, and the bias's
    gradient comes back in float32."""
    from gat_reference import reference_gat_attention
    gen = torch.Generator().manual_seed(3)
    rowptr, col = random_csr(40, 30, 300, device=device, generator=gen)
    s_src, s_dst = torch.randn(30, 4, generator=gen), torch.randn(40, 4, generator=gen)
    x, bias = torch.randn(30, 4, 16, generator=gen), torch.randn(4, 16, generator=gen)
    leaves = [t.to(device).requires_grad_() for t in (s_src, s_dst, x, bias)]
    s_src, s_dst, x, bias = leaves
    with torch.autocast(device, dtype=dtype):
        out, lse = pma.gat_attention(rowptr, col, s_src, s_dst, x, bias=bias)
    assert out.dtype == dtype and lse.dtype == torch.float32
    ref_out, _ = reference_gat_attention(rowptr, col, s_src, s_dst, x, bias=bias)
    assert rel_error(out, ref_out) <= AUTOCAST_TOL[dtype]
    grad_out = torch.randn(out.shape, generator=gen).to(device, dtype)
    grads = torch.autograd.grad(out, leaves, grad_out)
    assert [g.dtype for g in grads] == [torch.float32] * 4
    # grad_out summed over the rows in float32, rounded to the autocast dtype
    # (the op's bias dtype), then cast back to the bias's float32.
    want = grad_out.double().sum(0).to(dtype).float()
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(grads[3], want, rtol=eps, atol=eps)


@pytest.mark.sweep
@pytest.mark.parametrize("device,dtype", AUTOCAST)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("kind", KINDS)
def test_layer_under_autocast(kind, bias, device, dtype):
    """The layer runs under autocast on every adjacency type, close to PyG's
    float64 result; the fused op ran (not PyG's fallback)."""
    case = LAYER_CASES[0]._replace(kwargs=dict(heads=3, bias=bias))
    edge_index, x_src, _, _ = make_graph(case, 7)
    torch.manual_seed(7)
    ref = torch_geometric.nn.GATConv(7, 6, heads=3, bias=bias).double()
    if bias:  # PyG initialises the bias to zero: make it count
        torch.nn.init.normal_(ref.bias)
    ours = GATConv(7, 6, heads=3, bias=bias)
    ours.load_state_dict(ref.state_dict())
    ours = ours.float().to(device)
    want = ref(x_src, edge_index)
    adj, _ = make_adj(kind, edge_index.to(device), case.num_src, case.num_dst)
    x = x_src.float().to(device).requires_grad_()

    def run():
        with torch.autocast(device, dtype=dtype):
            out = ours(x, adj)
        out.float().square().sum().backward()
        return out

    events = op_events(lambda: run())
    out = run()
    # The fused op's output is in the autocast dtype; the layer adds the
    # float32 bias after it under autocast (it folds it into the op
    # otherwise), which promotes to float32 as in PyG.
    assert out.dtype == (torch.float32 if bias else dtype)
    assert rel_error(out, want) <= 5e-2
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert FUSED_OP in events


# Layers whose projections all take x: name -> (constructor, the uses of x
# that autocast casts it for: projections, and GATConv's score fold).
CAST_ONCE_LAYERS = {
    "gat-fold": (lambda: _with(GATConv(12, 5, heads=2), fold_scores=True), 2),
    "gat-products": (lambda: _with(GATConv(12, 5, heads=2), fold_scores=False), 1),
    "gat-residual": (lambda: _with(GATConv(12, 5, heads=2, residual=True),
                                   fold_scores=True), 3),
    "gatv2": (lambda: pma.nn.GATv2Conv(12, 5, heads=2), 2),
    "gatv2-residual": (lambda: pma.nn.GATv2Conv(12, 5, heads=2, residual=True), 3),
    "transformer": (lambda: pma.nn.TransformerConv(12, 5, heads=2), 4),
    "transformer-beta": (lambda: pma.nn.TransformerConv(12, 5, heads=2, beta=True), 4),
    # A projection replaced by a module of the user's (not a plain linear
    # map, which autocast might not cast for): x goes to each as given.
    "transformer-own-skip": (lambda: _with(pma.nn.TransformerConv(12, 5, heads=2),
                                           lin_skip=torch.nn.Sequential(torch.nn.Linear(12, 10))),
                             4),
}


def _with(module, **attrs):
    for name, value in attrs.items():
        setattr(module, name, value)
    return module


class _CastsOf(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the casts of one tensor's values (float32 [N, F] to another
    dtype), by shape: the features x, which nothing else in the layer has."""

    def __init__(self, like):
        super().__init__()
        self.shape, self.count = like.shape, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        src = args[0] if args else None
        if (func is torch.ops.aten._to_copy.default and isinstance(src, torch.Tensor)
                and src.dtype == torch.float32 and src.shape == self.shape):
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device,dtype", AUTOCAST)
@pytest.mark.parametrize("layer", list(CAST_ONCE_LAYERS))
def test_layer_casts_its_features_once_under_autocast(layer, device, dtype, monkeypatch):
    """Under autocast, a layer casts x (a model's input, no gradient) to the
    autocast dtype once for all its projections (and GATConv's score fold,
    whose backward reads the float32 x), where autocast alone casts it in
    each projection: the same values, so the output and every gradient are
    bitwise those of the casts per projection. x with a gradient (a hidden
    layer's) keeps the casts per projection (their gradients add in
    float32)."""
    make, uses = CAST_ONCE_LAYERS[layer]
    torch.manual_seed(0)
    model = make().to(device)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(50, 12, generator=gen).to(device)
    edge_index = torch.randint(0, 50, (2, 300), generator=gen).to(device)
    params = [p for p in model.parameters() if p.requires_grad]

    def run(x):
        counter = _CastsOf(x)
        with counter:
            with torch.autocast(device, dtype=dtype):
                out = model(x, edge_index)
            grads = torch.autograd.grad(out.float().square().sum(), params)
        return out, grads, counter.count

    out, grads, casts = run(x)
    assert casts == (uses if layer.endswith("own-skip") else 1)
    # Each projection casting x itself, as autocast does: the same values.
    for module in ("gat_conv", "gatv2_conv", "transformer_conv"):
        monkeypatch.setattr(f"pyg_multihead_agg.nn.{module}.autocast_features",
                            lambda x, *projections: x)
    want_out, want_grads, want_casts = run(x)
    assert want_casts == uses
    assert torch.equal(out, want_out)
    for grad, want in zip(grads, want_grads, strict=True):
        assert torch.equal(grad, want)
    monkeypatch.undo()
    # (Not a leaf: autocast caches the cast of a leaf that needs a gradient.)
    _, _, casts = run(x.clone().requires_grad_() * 1)
    assert casts == uses


# ---------------------------------------------------------------------------
# Determinism
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("channels", [32, 33], ids=["D32", "D33"])
def test_deterministic_mode_bitwise(device, dtype, channels):
    """No CSC given: deterministic mode makes the backward build one instead
    of scattering with atomics, so three runs agree bit for bit."""
    rowptr, col, weight, x, grad_out = graph_inputs(device, seed=3, num_dst=300, num_src=200,
                                                    num_edges=6000, channels=channels)
    weight, x, grad_out = weight.to(dtype), x.to(dtype), grad_out.to(dtype)
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        def once():
            w = weight.clone().requires_grad_()
            v = x.clone().requires_grad_()
            out = pma.multihead_spmm(rowptr, col, w, v)
            return (out, *torch.autograd.grad(out, (w, v), grad_out))

        events = op_events(once)
        runs = [once() for _ in range(3)]
    finally:
        torch.use_deterministic_algorithms(deterministic)
    assert "pyg_multihead_agg::multihead_spmm_backward_csc" in events
    assert "pyg_multihead_agg::multihead_spmm_backward_x_scatter" not in events
    for again in runs[1:]:
        for name, a, b in zip(("out", "grad_weight", "grad_x"), runs[0], again, strict=True):
            assert torch.equal(a, b), f"{name} differs between runs"
    want_w, want_x = ref_grads(rowptr, col, weight, x, grad_out)
    assert rel_error(runs[0][0], reference_spmm(rowptr, col, weight, x)) <= TOLERANCE[dtype]
    assert rel_error(runs[0][1], want_w) <= TOLERANCE[dtype]
    assert rel_error(runs[0][2], want_x) <= TOLERANCE[dtype]
