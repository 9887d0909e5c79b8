"""The CPU kernels' skeleton (csrc/cpu/loops.h): rows split across threads by
work, and the AVX2 and baseline instruction sets.

Each op's result is bitwise the same whatever the thread count (a row's sum
never depends on how the rows were split), and the baseline build of the row
loops (forced through the private hook) agrees with the float64 reference as
the default one does. The graph is power-law with a hub row and a hub source,
the case that splitting by row count served badly.
"""
import pytest
import torch
from conftest import TOLERANCE, reference_spmm, rel_error

import pyg_multihead_agg as pma
from pyg_multihead_agg._testing import force_kernel_path

ops = torch.ops.pyg_multihead_agg


def power_law_graph(num_nodes=3000, seed=0, index_dtype=torch.int64):
    gen = torch.Generator().manual_seed(seed)
    deg = (torch.rand(num_nodes, generator=gen).clamp_min(1e-3) ** -0.7).long()
    deg[7] = 5000  # a hub row
    row = torch.repeat_interleave(torch.arange(num_nodes), deg)
    col = (torch.rand(row.numel(), generator=gen) ** 3 * num_nodes).long()
    col[::5] = 11  # a hub source (a long CSC column)
    rowptr = torch.cat([torch.zeros(1, dtype=torch.long), deg.cumsum(0)])
    return rowptr.to(index_dtype), col.to(index_dtype)


def run_all(rowptr, col, dtype, heads=4, channels=32, seed=1):
    """Every CPU op (spmm forward, CSC backward, SDDMM, fused attention
    forward and backward) on the same inputs; a dict of outputs."""
    gen = torch.Generator().manual_seed(seed)
    n, e = rowptr.numel() - 1, col.numel()
    x = torch.randn(n, heads, channels, generator=gen).to(dtype)
    w = torch.rand(e, heads, generator=gen).to(dtype)
    g = torch.randn(n, heads, channels, generator=gen).to(dtype)
    s_src, s_dst = (torch.randn(n, heads, generator=gen).to(dtype) for _ in range(2))
    s_edge = torch.randn(e, heads, generator=gen).to(dtype)
    bias = torch.randn(heads, channels, generator=gen).to(dtype)
    colptr, row, perm = pma.csr_to_csc(rowptr, col, n)
    philox = torch.tensor([1234, 0])
    out = {"spmm": ops.multihead_spmm(rowptr, col, w, x, None, None, None, None)}
    out["grad_x"], out["grad_w"] = ops.multihead_spmm_backward_csc(colptr, row, perm, w, x, g,
                                                                  None)
    out["sddmm"] = ops.multihead_sddmm(rowptr, col, g, x)
    att, lse = ops.gat_attention(rowptr, col, s_src, s_dst, s_edge, x, 0.2, 0.3, philox, None,
                                 None, None, bias, None)
    out["att"], out["lse"] = att, lse
    grads = ops.gat_attention_backward(rowptr, col, colptr, row, perm, s_src, s_dst, s_edge, x,
                                       att, lse, g, None, 0.2, 0.3, philox, bias, None)
    out.update(zip(("att_grad_x", "att_grad_src", "att_grad_dst", "att_grad_edge"), grads,
                   strict=True))
    return out, (x, w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
def test_results_do_not_depend_on_the_thread_count(dtype, index_dtype):
    rowptr, col = power_law_graph(index_dtype=index_dtype)
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2, 3, 8):
            torch.set_num_threads(count)
            results.append(run_all(rowptr, col, dtype)[0])
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        for name, value in results[0].items():
            assert torch.equal(value, other[name]), name


@pytest.mark.parametrize("isa", [0, 1], ids=["baseline", "avx2"])
def test_both_instruction_sets_match_the_reference(isa):
    rowptr, col = power_law_graph(num_nodes=1500, seed=2)
    with force_kernel_path(cpu_avx2=isa):
        out, (x, w) = run_all(rowptr, col, torch.float32)
    assert rel_error(out["spmm"], reference_spmm(rowptr, col, w, x)) <= TOLERANCE[torch.float32]
    with force_kernel_path(cpu_avx2=1 - isa):
        other, _ = run_all(rowptr, col, torch.float32)
    for name, value in out.items():  # the two builds round differently, no more
        assert rel_error(value, other[name]) <= TOLERANCE[torch.float32], name
