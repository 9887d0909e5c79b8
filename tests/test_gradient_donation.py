"""Gradient donation of ``transformer_attention``'s and ``gatv2_attention``'s
backwards (csrc/autograd.cpp).

Where nothing but the autograd node reaches the memory of an input the
backward no longer needs and the graph is freed after the backward, the
backward writes a gradient there instead of into a new tensor: the
transformer's grad_query, grad_value and grad_key into the query, the value
and the output (``_transformer_attention_backward_into``), GATv2's grad_x_l
and grad_x_r into the output and x_r (``_gatv2_attention_backward_into``). Checked
here: it happens exactly then (a gradient's data pointer is its input's),
the gradients are bitwise those of a backward that donates nothing, a
caller's tensor is never written, and the buffer op's own contract (results,
bad buffers).
"""
import pytest
import torch
from conftest import DEVICES, random_csr

from pyg_multihead_agg import csr_to_csc, gatv2_attention, transformer_attention
from pyg_multihead_agg.nn import GATv2Conv, TransformerConv

ops = torch.ops.pyg_multihead_agg
N, H, C, F_IN = 40, 2, 8, 12


def make(device, dtype=torch.float32, num_edges=240, seed=0):
    g = torch.Generator().manual_seed(seed)
    rowptr, col = random_csr(N, N, num_edges, device=device, generator=g, hub=True)
    x = torch.randn(N, F_IN, generator=g, dtype=dtype).to(device)
    weights = [(torch.randn(F_IN, H * C, generator=g, dtype=dtype) / F_IN ** 0.5)
               .to(device).requires_grad_() for _ in range(3)]
    grad = torch.randn(N, H, C, generator=g, dtype=dtype).to(device)
    return rowptr, col, x, weights, grad


def layer_inputs(device, seed):
    """A layer's edge_index (random, 300 edges) and input features."""
    torch.manual_seed(seed)
    rowptr, col = random_csr(N, N, 300, device=device)
    edge_index = torch.stack([col.long(), torch.repeat_interleave(
        torch.arange(N, device=device), rowptr.diff().long())])
    return edge_index, torch.randn(N, F_IN, device=device)


def watch(t, seen, name):
    """Records t's data pointer and, in the backward, its gradient's."""
    seen[name] = t.data_ptr()
    t.register_hook(lambda g: seen.__setitem__("grad_" + name, g.data_ptr()))


def step(rowptr, col, x, weights, grad, *, hold=False, retain=False):
    """q, k, v projected from x, the op, a backward to the weights. Returns the
    weights' gradients and which inputs the backward wrote its gradients into
    (query, value, and out for the keys' gradient)."""
    seen = {}
    q, k, v = ((x @ w).view(N, H, C) for w in weights)
    watch(q, seen, "q")
    watch(k, seen, "k")
    watch(v, seen, "v")
    out, _ = transformer_attention(rowptr, col, q, k, v)
    seen["out"] = out.data_ptr()
    held = (q, k, v, out, out.clone(), q.clone(), v.clone()) if hold else None
    loss = (out.reshape(N, H * C) * grad.reshape(N, H * C)).sum()
    del q, k, v, out
    grads = torch.autograd.grad(loss, weights, retain_graph=retain)
    donated = {"query": seen["grad_q"] == seen["q"], "value": seen["grad_v"] == seen["v"],
               "out": seen["grad_k"] == seen["out"]}
    if retain:  # a second backward through the retained graph (this one may donate)
        again = torch.autograd.grad(loss, weights)
        assert all(torch.equal(a, b) for a, b in zip(grads, again, strict=True))
    if hold:  # the caller's tensors are unchanged
        q, k, v, out, out0, q0, v0 = held
        assert torch.equal(out, out0) and torch.equal(q, q0) and torch.equal(v, v0)
    return grads, donated


@pytest.mark.parametrize("device", DEVICES)
def test_backward_writes_into_what_only_it_holds(device):
    inputs = make(device)
    grads, donated = step(*inputs)
    assert donated == {"query": True, "value": True, "out": True}
    # bitwise the gradients of a backward that donates nothing
    for kwargs in (dict(hold=True), dict(retain=True)):
        reference, none = step(*inputs, **kwargs)
        assert none == {"query": False, "value": False, "out": False}
        for a, b in zip(grads, reference, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_no_donation_under_create_graph_or_a_dispatch_mode(device):
    rowptr, col, x, weights, grad = make(device)
    q, k, v = ((x @ w).view(N, H, C) for w in weights)
    seen = {}
    watch(q, seen, "q")
    out, _ = transformer_attention(rowptr, col, q, k, v)
    del q, k, v
    with pytest.raises(RuntimeError, match="twice differentiable|double backward"):
        g = torch.autograd.grad((out * grad).sum(), weights, create_graph=True)
        g[0].sum().backward()
    assert seen["grad_q"] != seen["q"]

    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    q, k, v = ((x @ w).view(N, H, C) for w in weights)
    seen = {}
    watch(q, seen, "q")
    out, _ = transformer_attention(rowptr, col, q, k, v)
    del q, k, v
    with Passthrough():
        torch.autograd.grad((out * grad).sum(), weights)
    assert seen["grad_q"] != seen["q"]


@pytest.mark.parametrize("device", DEVICES)
def test_bipartite_keys_gradient_is_new(device):
    """out has N_dst rows, the keys N_src: grad_key cannot take out's memory,
    query's and value's still do."""
    g = torch.Generator().manual_seed(3)
    n_src = N + 7
    rowptr, col = random_csr(N, n_src, 200, device=device, generator=g)
    q = torch.randn(N, H * C, generator=g).to(device).requires_grad_()
    kv = torch.randn(n_src, 2 * H * C, generator=g).to(device).requires_grad_()
    seen = {}
    qv = (q * 2).view(N, H, C)
    k, v = (kv * 2).view(n_src, 2, H, C).unbind(1)
    k, v = k.contiguous(), v.contiguous()
    watch(qv, seen, "q")
    watch(v, seen, "v")
    watch(k, seen, "k")
    out, _ = transformer_attention(rowptr, col, qv, k, v)
    seen["out"] = out.data_ptr()
    del qv, k, v
    gq, gkv = torch.autograd.grad((out * out).sum(), (q, kv))
    assert seen["grad_q"] == seen["q"] and seen["grad_v"] == seen["v"]
    assert seen["grad_k"] != seen["out"]
    # against the op's gradients with nothing donated
    qv = (q * 2).view(N, H, C)
    k, v = (kv * 2).view(n_src, 2, H, C).unbind(1)
    out2, _ = transformer_attention(rowptr, col, qv, k.contiguous(), v.contiguous())
    rq, rkv = torch.autograd.grad((out2 * out2).sum(), (q, kv), retain_graph=True)
    assert torch.equal(gq, rq) and torch.equal(gkv, rkv)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("beta", [False, True])
def test_transformer_conv_step_donates(device, beta):
    """The layer's own q, k, v and attention output: donated (the gate of
    beta=True keeps the attention output for its own backward, so only the
    query's and the value's memory are), gradients bitwise those of a
    retained graph."""
    edge_index, x = layer_inputs(device, seed=5)
    conv = TransformerConv(F_IN, C, heads=H, beta=beta).to(device)
    seen = {}

    def projection_hook(name):
        def hook(module, args, output):
            watch(output, seen, name)
        return hook

    handles = [conv.lin_query.register_forward_hook(projection_hook("q")),
               conv.lin_value.register_forward_hook(projection_hook("v"))]
    params = list(conv.parameters())
    out = conv(x, edge_index)
    grads = torch.autograd.grad(out.square().sum(), params)
    assert seen["grad_q"] == seen["q"] and seen["grad_v"] == seen["v"]
    for h in handles:
        h.remove()
    out = conv(x, edge_index)
    reference = torch.autograd.grad(out.square().sum(), params, retain_graph=True)
    for a, b in zip(grads, reference, strict=True):
        assert torch.equal(a, b)


def _backward_args(device, dtype=torch.float64):
    g = torch.Generator().manual_seed(7)
    rowptr, col = random_csr(N, N, 260, device=device, generator=g, hub=True)
    colptr, row, perm = csr_to_csc(rowptr, col, N)
    q, k, v = (torch.randn(N, H, C, generator=g, dtype=dtype).to(device) for _ in range(3))
    out, lse = transformer_attention(rowptr, col, q, k, v)
    grad_out = torch.randn(N, H, C, generator=g, dtype=dtype).to(device)
    return [rowptr, col, colptr, row, perm, q, k, v, None, out, lse, grad_out, None,
            C ** -0.5, 0.0, None, None, None]


@pytest.mark.parametrize("device", DEVICES)
def test_backward_into_buffers_and_in_place(device):
    args = _backward_args(device)
    expected = ops.transformer_attention_backward(*args)
    # fresh buffers (poisoned first)
    bufs = [torch.full((N, H, C), float("nan"), dtype=torch.float64, device=device)
            for _ in range(3)]
    grad_e = ops._transformer_attention_backward_into(*args, *bufs)
    assert grad_e.shape == (0, H, C)
    for a, b in zip(bufs, expected[:3], strict=True):
        assert torch.equal(a, b)
    # in place of query, out and value
    q, out, v = args[5].clone(), args[9].clone(), args[7].clone()
    args[5], args[9], args[7] = q, out, v
    ops._transformer_attention_backward_into(*args, q, out, v)
    for a, b in zip((q, out, v), expected[:3], strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_into_rejects_bad_buffers(device):
    args = _backward_args(device)
    fresh = [torch.empty(N, H, C, dtype=torch.float64, device=device) for _ in range(3)]
    q, k, v, out = args[5], args[6], args[7], args[9]
    non_contiguous = torch.empty(H, N, C, dtype=torch.float64, device=device).transpose(0, 1)
    bad = {
        "grad_query must not overlap key": [k, fresh[1], fresh[2]],
        "grad_key must not overlap query": [fresh[0], q, fresh[2]],
        "grad_value must not overlap grad_out": [fresh[0], fresh[1], args[11]],
        "grad_query must not overlap grad_key": [fresh[0], fresh[0], fresh[2]],
        "grad_query must have shape": [fresh[0][1:], fresh[1], fresh[2]],
        "grad_key must be contiguous": [fresh[0], non_contiguous, fresh[2]],
        "grad_value and key must have the same dtype": [fresh[0], fresh[1], fresh[2].float()],
    }
    for message, bufs in bad.items():
        with pytest.raises(RuntimeError, match=message):
            ops._transformer_attention_backward_into(*args, *bufs)
    # a buffer that shares part of its own input's memory, not all of it
    wide = torch.cat([v, v[:1]])
    args[7] = wide[:N]
    with pytest.raises(RuntimeError, match="grad_value must not overlap value unless it is"):
        ops._transformer_attention_backward_into(*args, fresh[0], fresh[1], wide[1:])
    assert out.isfinite().all()


@pytest.mark.parametrize("device", DEVICES)
def test_backward_into_opcheck(device):
    args = _backward_args(device)
    bufs = [torch.empty(N, H, C, dtype=torch.float64, device=device) for _ in range(3)]
    torch.library.opcheck(ops._transformer_attention_backward_into, (*args, *bufs))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_transformer_conv_step_memory_cuda():
    """A TransformerConv step's peak memory: donating the query's, value's and
    attention output's memory saves at least two [N, H, C] tensors against a
    retained graph's backward, which allocates the three gradients anew (2.2
    measured on the H200: the step's peak then moves to its forward)."""
    device = torch.device("cuda")
    n, heads, channels = 20000, 4, 32
    rowptr, col = random_csr(n, n, 8 * n, device=device)
    edge_index = torch.stack([col.long(), torch.repeat_interleave(
        torch.arange(n, device=device), rowptr.diff().long())])
    conv = TransformerConv(64, channels, heads=heads).to(device)
    x = torch.randn(n, 64, device=device)
    params = list(conv.parameters())
    conv(x, edge_index)  # builds the cached graph

    def peak(retain):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = conv(x, edge_index)
        grads = torch.autograd.grad(out.square().sum(), params, retain_graph=retain)
        torch.cuda.synchronize()
        del out, grads
        return torch.cuda.max_memory_allocated() - base

    tensor = n * heads * channels * 4
    saved = peak(True) - peak(False)
    assert saved >= 2 * tensor, (saved, tensor)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_into_writes_every_row(device):
    """Empty destination rows and sources without edges: every row of the
    NaN-poisoned buffers is written (zeros where no edge reaches it)."""
    rowptr = torch.tensor([0, 2, 2, 3, 3, 4, 4], device=device)
    col = torch.tensor([0, 0, 2, 0], device=device)  # sources 1, 3, 4, 5: no edges
    n = rowptr.numel() - 1
    colptr, row, perm = csr_to_csc(rowptr, col, n)
    q, k, v, grad_out = (torch.randn(n, H, C, dtype=torch.float64, device=device)
                         for _ in range(4))
    out, lse = transformer_attention(rowptr, col, q, k, v)
    args = [rowptr, col, colptr, row, perm, q, k, v, None, out, lse, grad_out, None,
            C ** -0.5, 0.0, None, None, None]
    expected = ops.transformer_attention_backward(*args)
    bufs = [torch.full((n, H, C), float("nan"), dtype=torch.float64, device=device)
            for _ in range(3)]
    ops._transformer_attention_backward_into(*args, *bufs)
    for a, b in zip(bufs, expected[:3], strict=True):
        assert torch.equal(a, b)
    assert torch.equal(bufs[1][1], torch.zeros(H, C, dtype=torch.float64, device=device))


# GATv2: grad_x_l into the attention output, grad_x_r into x_r.

def gatv2_step(rowptr, col, x, weights, grad, *, hold=False, retain=False):
    """x_l, x_r projected from x, gatv2_attention, a backward to the weights.
    Returns the weights' gradients and which buffers the backward wrote its
    gradients into (out for grad_x_l, x_r for grad_x_r)."""
    seen = {}
    x_l, x_r = ((x @ w).view(N, H, C) for w in weights[:2])
    att = weights[2][0].view(H, C)
    watch(x_l, seen, "l")
    watch(x_r, seen, "r")
    out, _ = gatv2_attention(rowptr, col, x_l, x_r, att)
    seen["out"] = out.data_ptr()
    held = (x_r, out, x_r.clone(), out.clone()) if hold else None
    loss = (out.reshape(N, H * C) * grad.reshape(N, H * C)).sum()
    del x_l, x_r, out
    grads = torch.autograd.grad(loss, weights, retain_graph=retain)
    donated = {"out": seen["grad_l"] == seen["out"], "x_r": seen["grad_r"] == seen["r"]}
    if retain:
        again = torch.autograd.grad(loss, weights)
        assert all(torch.equal(a, b) for a, b in zip(grads, again, strict=True))
    if hold:
        x_r, out, x_r0, out0 = held
        assert torch.equal(x_r, x_r0) and torch.equal(out, out0)
    return grads, donated


@pytest.mark.parametrize("device", DEVICES)
def test_gatv2_backward_writes_into_what_only_it_holds(device):
    inputs = make(device)
    grads, donated = gatv2_step(*inputs)
    assert donated == {"out": True, "x_r": True}
    for kwargs in (dict(hold=True), dict(retain=True)):
        reference, none = gatv2_step(*inputs, **kwargs)
        assert none == {"out": False, "x_r": False}
        for a, b in zip(grads, reference, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("share_weights", [False, True])
def test_gatv2_conv_step_donates(device, share_weights):
    """x_r, the layer's own lin_r output, takes grad_x_r (with share_weights
    x_r is x_l, which the backward still reads: no donation there); the
    gradients are bitwise those of a retained graph."""
    edge_index, x = layer_inputs(device, seed=6)
    conv = GATv2Conv(F_IN, C, heads=H, share_weights=share_weights).to(device)
    seen = {}
    handle = conv.lin_r.register_forward_hook(lambda m, a, out: watch(out, seen, "r"))
    params = list(conv.parameters())
    out = conv(x, edge_index)
    grads = torch.autograd.grad(out.square().sum(), params)
    handle.remove()
    assert (seen["grad_r"] == seen["r"]) is not share_weights
    out = conv(x, edge_index)
    reference = torch.autograd.grad(out.square().sum(), params, retain_graph=True)
    for a, b in zip(grads, reference, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_gatv2_backward_into_buffers(device):
    g = torch.Generator().manual_seed(8)
    rowptr, col = random_csr(N, N, 260, device=device, generator=g, hub=True)
    colptr, row, perm = csr_to_csc(rowptr, col, N)
    x_l, x_r = (torch.randn(N, H, C, generator=g, dtype=torch.float64).to(device)
                for _ in range(2))
    att = torch.randn(H, C, generator=g, dtype=torch.float64).to(device)
    out, lse = gatv2_attention(rowptr, col, x_l, x_r, att)
    grad_out = torch.randn(N, H, C, generator=g, dtype=torch.float64).to(device)
    args = [rowptr, col, colptr, row, perm, x_l, x_r, None, att, out, lse, grad_out, None,
            0.2, 0.0, None, None, None]
    expected = ops.gatv2_attention_backward(*args)
    bufs = [torch.full((N, H, C), float("nan"), dtype=torch.float64, device=device)
            for _ in range(2)]
    grad_att, grad_e = ops._gatv2_attention_backward_into(*args, *bufs)
    for a, b in zip(bufs + [grad_att], expected[:3], strict=True):
        assert torch.equal(a, b)
    assert grad_e.shape == (0, H, C)
    # in place of out and x_r
    out2, x_r2 = out.clone(), x_r.clone()
    args[9], args[6] = out2, x_r2
    ops._gatv2_attention_backward_into(*args, out2, x_r2)
    assert torch.equal(out2, expected[0]) and torch.equal(x_r2, expected[1])
    # x_l is not a buffer its backward may overwrite
    with pytest.raises(RuntimeError, match="grad_x_l must not overlap x_l"):
        ops._gatv2_attention_backward_into(*args, x_l, bufs[1])
    torch.library.opcheck(ops._gatv2_attention_backward_into, (*args, *bufs))
