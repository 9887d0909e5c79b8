"""torch.compile(fullgraph=True) over the op, forward and backward."""
import pytest
import torch
from conftest import DEVICES, random_csr

import pyg_multihead_agg as pma


def make(device, num_dst, num_src, num_edges, seed, index_dtype=torch.int64):
    gen = torch.Generator().manual_seed(seed)
    rowptr, col = random_csr(num_dst, num_src, num_edges, index_dtype=index_dtype,
                             device=device, generator=gen)
    weight = torch.randn(num_edges, 4, generator=gen).to(device).requires_grad_()
    x = torch.randn(num_src, 4, 8, generator=gen).to(device).requires_grad_()
    return rowptr, col, weight, x


def model(rowptr, col, weight, x, use_csc: bool):
    # Softmax-like weights and a non-linearity around the op, so the graph has
    # ops before and after it (as in a GAT layer).
    csc = pma.csr_to_csc(rowptr, col, x.size(0)) if use_csc else None
    out = pma.multihead_spmm(rowptr, col, weight.sigmoid(), x * 2, csc=csc)
    return torch.nn.functional.elu(out).square().sum()


# aot_eager traces what inductor traces (dynamo, the fake implementations, the
# autograd formula) without generating code; inductor's compiles take seconds
# on a 2-core CPU, so they run with --full (the layers' tests compile with
# inductor by default).
@pytest.mark.sweep(cover=[("dynamic",), ("use_csc",)])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor",
                                                               marks=pytest.mark.slow)])
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("use_csc", [False, True])
def test_compile_fullgraph_matches_eager(device, backend, dynamic, use_csc):
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=dynamic, backend=backend)
    # Two graph sizes: with dynamic=True the second reuses the graph.
    for seed, (num_dst, num_src, num_edges) in enumerate([(30, 25, 150), (41, 33, 260)]):
        rowptr, col, weight, x = make(device, num_dst, num_src, num_edges, seed)
        eager = model(rowptr, col, weight, x, use_csc)
        eager_grads = torch.autograd.grad(eager, (weight, x))
        out = compiled(rowptr, col, weight, x, use_csc)
        grads = torch.autograd.grad(out, (weight, x))
        torch.testing.assert_close(out, eager)
        for g, e in zip(grads, eager_grads, strict=True):
            torch.testing.assert_close(g, e)


def test_compile_has_no_graph_breaks():
    torch._dynamo.reset()
    rowptr, col, weight, x = make("cpu", 20, 20, 90, 0)
    explanation = torch._dynamo.explain(model)(rowptr, col, weight, x, True)
    assert explanation.graph_break_count == 0
    assert explanation.graph_count == 1
