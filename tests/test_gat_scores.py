"""``_gat_scores``, GATConv's per-node attention scores of one or two atts in
one op (csrc/ops.cpp), against PyG's products ``(x * att).sum(-1)`` in
float64: forward and backward in every dtype on the CPU and CUDA, one or two
atts, either score's gradient alone, autocast's mixed dtypes, empty rows and
row counts over several chunks of the deterministic sum; gradcheck, opcheck,
torch.compile, determinism, no grad mode and bad input."""
import pytest
import torch
from conftest import DEVICES, FLOAT_DTYPES, TOLERANCE, check_without_grad_mode, poison, rel_error

import pyg_multihead_agg  # noqa: F401  (registers the ops)

ops = torch.ops.pyg_multihead_agg
# (N, H, C): no rows, one element, odd heads and channels, Cora's first layer,
# several chunks of 32 rows, and chunks of more than 32 rows (N > 4096 * 32).
SHAPES = [(0, 2, 4), (1, 1, 1), (37, 3, 7), (2708, 8, 8), (5000, 4, 32), (140000, 1, 3)]


def make(N, H, C, dtype, device, two, seed=0, att_dtype=None):
    gen = torch.Generator().manual_seed(seed + N + 7 * H + C)
    x = torch.randn(N, H, C, generator=gen).to(device, dtype).requires_grad_()
    atts = [torch.randn(1, H, C, generator=gen).to(device, att_dtype or dtype).requires_grad_()
            for _ in range(1 + two)]
    return x, atts


def products(x, atts):
    """PyG's scores in float64, and the leaves they differentiate."""
    leaves = [t.detach().cpu().double().requires_grad_() for t in [x, *atts]]
    return leaves, [(leaves[0] * a).sum(-1) for a in leaves[1:]]


def check(x, atts, used, dtype, out_dtype=None, seed=1):
    """Scores and the gradients of sum_k <g_k, s_k> over the used scores,
    against the float64 products."""
    N, H, C = x.shape
    poison((N, H), out_dtype or dtype, x.device)
    scores = ops._gat_scores(x, *atts)
    assert len(scores) == 2
    if len(atts) == 1:
        assert scores[1].numel() == 0
    leaves, ref = products(x, atts)
    tol = TOLERANCE[dtype]
    for s, r in zip(scores, ref, strict=False):  # (s_dst is empty with one att)
        assert s.dtype == (out_dtype or dtype) and s.shape == (N, H)
        assert rel_error(s, r) <= tol
    gen = torch.Generator().manual_seed(seed)
    grads = [torch.randn(N, H, generator=gen, dtype=torch.float64) for _ in ref]
    outs = [(scores[k], grads[k]) for k in used]
    got = torch.autograd.grad([o for o, _ in outs], [x, *atts],
                              [g.to(o.device, o.dtype) for o, g in outs], allow_unused=True)
    want = torch.autograd.grad([ref[k] for k in used], leaves, [grads[k] for k in used],
                               allow_unused=True)
    for name, a, w, leaf in zip(["x", "att_src", "att_dst"], got, want, [x, *atts],
                                strict=False):
        if w is None:  # an att whose score was not used
            assert a is None or not a.any(), name
            continue
        assert a.dtype == leaf.dtype and a.shape == leaf.shape, name
        # grad_x rounds once; an att's gradient sums N products in float32
        assert rel_error(a, w) <= 2 * tol, name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("two", [True, False], ids=["src_dst", "src"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("N,H,C", SHAPES, ids=[f"N{n}-H{h}-C{c}" for n, h, c in SHAPES])
def test_matches_products(N, H, C, dtype, two, device):
    x, atts = make(N, H, C, dtype, device, two)
    check(x, atts, range(len(atts)), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("used", [(0,), (1,)], ids=["src_only", "dst_only"])
def test_one_score_used(used, device):
    """The gradient of only one of the two scores (the other's is None: zero)."""
    x, atts = make(300, 4, 8, torch.float32, device, True)
    check(x, atts, used, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_x_float32_atts(dtype, device):
    """Autocast's layer: x from a half-precision projection, the atts float32
    parameters. The scores are float32, as PyG's product promotes them; each
    input's gradient comes in its own dtype."""
    x, atts = make(500, 4, 16, dtype, device, True, att_dtype=torch.float32)
    check(x, atts, (0, 1), dtype, out_dtype=torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(device):
    x, atts = make(9, 3, 5, torch.float64, device, True)
    assert torch.autograd.gradcheck(lambda *t: ops._gat_scores(*t), (x, *atts))
    assert torch.autograd.gradcheck(lambda *t: ops._gat_scores(*t)[0], (x, atts[0]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("two", [True, False], ids=["src_dst", "src"])
def test_opcheck(two, device):
    x, atts = make(40, 3, 8, torch.float32, device, two)
    torch.library.opcheck(ops._gat_scores, (x, *atts))
    g = torch.randn(40, 3, device=device)
    torch.library.opcheck(ops._gat_scores_backward,
                          (g, g if two else None, x.detach(), *[a.detach() for a in atts],
                           *([] if two else [None]), True, True))


@pytest.mark.parametrize("device", DEVICES)
def test_compile(device):
    x, atts = make(200, 4, 8, torch.float32, device, True)

    def step(x, a, b):
        s_src, s_dst = ops._gat_scores(x, a, b)
        return (s_src * s_dst).sum()

    results = []
    for fn in (step, torch.compile(step, fullgraph=True, dynamic=True)):
        loss = fn(x, *atts)
        results.append((loss, *torch.autograd.grad(loss, [x, *atts])))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic(device):
    """The atts' gradients are summed per fixed chunk of rows, then over the
    chunks in a fixed order: the same bits on every run (and on the CPU for
    any number of threads)."""
    x, atts = make(5000, 4, 32, torch.float32, device, True)
    threads = torch.get_num_threads()
    results = []
    for run in range(3):
        if device == "cpu":
            torch.set_num_threads(1 if run == 0 else max(2, threads))
        try:
            s_src, s_dst = ops._gat_scores(x, *atts)
            results.append((s_src, s_dst, *torch.autograd.grad((s_src * s_dst).sum(),
                                                               [x, *atts])))
        finally:
            torch.set_num_threads(threads)
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_without_grad_mode(device):
    x, atts = make(50, 2, 8, torch.float32, device, True)
    check_without_grad_mode(lambda: ops._gat_scores(x, *atts))


def test_double_backward_is_refused():
    x, atts = make(5, 2, 3, torch.float64, "cpu", True)
    s_src, _ = ops._gat_scores(x, *atts)
    (g,) = torch.autograd.grad(s_src.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        g.sum().backward()


@pytest.mark.parametrize("args,match", [
    (lambda x, a: (x.view(5, -1), a), "x must be \\[N, H, C\\], got 2 dimensions"),
    (lambda x, a: (x.long(), a), "x must be a floating-point tensor"),
    (lambda x, a: (x, a[..., :2]), "att_src must hold heads \\* channels = 12"),
    (lambda x, a: (x, a.long()), "att_src must be a floating-point tensor"),
    (lambda x, a: (x, a, a.double()), "att_dst must have the dtype of att_src"),
    (lambda x, a: (x, a, a[..., :3]), "att_dst must hold heads \\* channels"),
], ids=["x_2d", "x_int", "att_size", "att_int", "att_dst_dtype", "att_dst_size"])
def test_bad_input(args, match):
    x = torch.randn(5, 3, 4)
    a = torch.randn(1, 3, 4)
    with pytest.raises(ValueError, match=match):
        ops._gat_scores(*args(x, a))
