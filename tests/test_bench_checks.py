"""tools/bench_kernels.py checks every call against float64 before timing it: the
spmm checks find a wrong forward, grad_x or grad_weight, and a wrong result
stops the run unless --no-check (CPU kernels, cora-like). benchmarks/bench_layer.py
runs its GATConv and GATv2Conv rows on the CPU, checks them against PyG's layer,
reports a wrong layer and records an out-of-memory row without stopping."""
import json
import os
import statistics
import sys

import pytest
import torch

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [os.path.join(REPO, "tools"), os.path.join(REPO, "benchmarks")]
import bench_kernels as bk  # noqa: E402
import bench_layer  # noqa: E402
from graphs import make_graph  # noqa: E402

import pyg_multihead_agg as pma  # noqa: E402


@pytest.fixture(scope="module")
def spmm_case():
    g = make_graph("cora-like", index_dtype=torch.int32, device=torch.device("cpu"))
    csc = pma.csr_to_csc(g.rowptr, g.col, g.num_nodes)
    x, _, _, grad = bk.fused_inputs(g, torch.float32, torch.device("cpu"))
    w = torch.rand(g.num_edges, g.heads, generator=torch.Generator().manual_seed(1))
    out = bk._ops.multihead_spmm(g.rowptr, g.col, w, x)
    gx, gw = bk._ops.multihead_spmm_backward_csc(*csc, w, x, grad)
    return g, csc, w, x, grad, out, gx, gw


def test_spmm_check_passes_the_kernels(spmm_case):
    g, csc, w, x, grad, out, gx, gw = spmm_case
    errs = bk.check_spmm(g, csc, w, x, grad, out, (gx, gw))
    assert set(errs) == {"out", "grad_x", "grad_weight"}
    assert all(v <= bk.TOLERANCE[torch.float32] for v in errs.values()), errs
    bk.enforce(errs, torch.float32, "cora-like spmm", True)


@pytest.mark.parametrize("wrong", ["out", "grad_x", "grad_weight"])
def test_spmm_check_stops_a_wrong_result(spmm_case, wrong):
    g, csc, w, x, grad, out, gx, gw = spmm_case
    got = {"out": out, "grad_x": gx, "grad_weight": gw}
    got[wrong] = got[wrong].roll(1, 0)  # right values, wrong rows
    errs = bk.check_spmm(g, csc, w, x, grad, got["out"], (got["grad_x"], got["grad_weight"]))
    assert errs[wrong] > 0.1, errs
    with pytest.raises(SystemExit, match=wrong):
        bk.enforce(errs, torch.float32, "cora-like spmm", True)
    bk.enforce(errs, torch.float32, "cora-like spmm", False)  # --no-check: reported, timed anyway


def test_nan_is_never_within_tolerance():
    with pytest.raises(SystemExit):
        bk.enforce({"out": float("nan")}, torch.bfloat16, "x", True)


# bench_layer on cora-like, eager, float32: PyG's rows and our fused layer on edge_index.
LAYER_ARGS = ["--device", "cpu", "--shapes", "cora-like", "--dtypes", "float32", "--no-compile",
              "--methods", "PyG|ours edge_index eager$"]


def _layer_run(tmp_path, *args):
    rc = bench_layer.main(LAYER_ARGS + ["--out", str(tmp_path)] + list(args))
    conv = args[args.index("--conv") + 1] if "--conv" in args else "gat"
    stem = "layer_cpu" if conv in ("gat", "all") else f"layer_{conv}_cpu"
    rows = json.loads((tmp_path / f"{stem}.json").read_text())["rows"]
    return rc, {(r["method"], r["pass"]): r for r in rows}, (tmp_path / f"{stem}.md").read_text()


def test_layer_bench_every_family_rows(tmp_path):
    rc, rows, md = _layer_run(tmp_path, "--conv", "all")
    assert rc == 0
    passes = ("forward", "forward+backward")
    gat = ("PyG edge_index eager", "ours edge_index eager")
    gatv2 = tuple("GATv2 " + m for m in gat)
    transformer = tuple("Transformer " + m for m in gat)
    assert set(rows) == {(m, p) for m in gat + gatv2 + transformer for p in passes}
    for (_, pass_), r in rows.items():
        assert r["status"] == "ok" and r["check"] == "ok", r
        assert r["ms"] > 0 and "out" in r["rel_errs"]
        assert any(k.startswith("grad") for k in r["rel_errs"]) == (pass_ == "forward+backward")
    for p in passes:
        # Each family against its own PyG layer; GATv2's time over GAT's.
        ours_v2 = rows[("GATv2 ours edge_index eager", p)]
        assert set(ours_v2["speedup"]) == {"GATv2 PyG edge_index eager"}
        assert set(rows[("ours edge_index eager", p)]["speedup"]) == {"PyG edge_index eager"}
        assert ours_v2["extra"]["ms_vs_gat"] == pytest.approx(
            ours_v2["ms"] / rows[("ours edge_index eager", p)]["ms"])
        assert "ms_vs_gat" not in rows[("ours edge_index eager", p)]["extra"]
        assert {k for k in ours_v2["rel_errs"] if k.startswith("grad")} >= (
            {"grad att", "grad lin_l.weight", "grad lin_r.weight", "grad bias"}
            if p == "forward+backward" else set())
        ours_tf = rows[("Transformer ours edge_index eager", p)]
        assert set(ours_tf["speedup"]) == {"Transformer PyG edge_index eager"}
        assert ours_tf["extra"]["ms_vs_gat"] == pytest.approx(
            ours_tf["ms"] / rows[("ours edge_index eager", p)]["ms"])
        assert {k for k in ours_tf["rel_errs"] if k.startswith("grad")} >= (
            {"grad lin_query.weight", "grad lin_key.weight", "grad lin_value.weight",
             "grad lin_skip.weight"} if p == "forward+backward" else set())
    assert "## GATConv" in md and "## GATv2Conv" in md and "## TransformerConv" in md
    assert "| ms / GAT |" in md and "TransformerConv(128, D, heads=H)" in md


@pytest.mark.slow  # compiles the layer twice (about 30 s)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_layer_bench_cuda_graph_rows_count_the_graphs_memory(tmp_path):
    """A CUDA graph replay allocates nothing (its memory is the graph's pool,
    taken while it was recorded): the reduce-overhead row's peak covers the
    warm-up and the recording, so it is not below the plain compiled row's."""
    rc = bench_layer.main(["--device", "cuda", "--shapes", "cora-like", "--dtypes", "float32",
                           "--passes", "forward+backward", "--reduce-overhead",
                           "--methods", "ours edge_index compiled(, reduce-overhead)?$",
                           "--out", str(tmp_path)])
    assert rc == 0
    rows = {r["method"]: r for r in
            json.loads((tmp_path / "layer_cuda.json").read_text())["rows"]}
    compiled = rows["ours edge_index compiled"]
    graphs = rows["ours edge_index compiled, reduce-overhead"]
    assert compiled["check"] == "ok" and graphs["check"] == "ok"
    assert graphs["peak_extra_bytes"] >= 0.9 * compiled["peak_extra_bytes"] > 0


def test_layer_bench_default_is_gat_only(tmp_path):
    rc, rows, md = _layer_run(tmp_path, "--passes", "forward")
    assert rc == 0
    assert set(rows) == {("PyG edge_index eager", "forward"), ("ours edge_index eager", "forward")}
    assert "GATv2" not in md and "ms / GAT" not in md


def test_layer_bench_fails_a_wrong_gatv2(tmp_path, monkeypatch):
    real = bench_layer.our_layer

    def skewed(name):
        cls, why = real(name)
        if name != "GATv2Conv" or cls is None:
            return cls, why

        def make(*args, **kwargs):  # the real layer, its output off by 1%
            layer = cls(*args, **kwargs)
            layer.register_forward_hook(lambda module, inputs, out: out * 1.01)
            return layer
        return make, None

    monkeypatch.setattr(bench_layer, "our_layer", skewed)
    rc, rows, _ = _layer_run(tmp_path, "--conv", "gatv2", "--passes", "forward")
    assert rc == 1
    assert rows[("GATv2 PyG edge_index eager", "forward")]["check"] == "ok"
    wrong = rows[("GATv2 ours edge_index eager", "forward")]
    assert wrong["check"] == "FAIL" and wrong["rel_errs"]["out"] > 5e-3, wrong


def test_layer_bench_records_out_of_memory(tmp_path, monkeypatch):
    make_pyg = bench_layer.make_pyg_layer

    def oom_pyg(family, *args):
        layer = make_pyg(family, *args)

        def oom(module, inputs):  # the float64 reference still runs
            if inputs[0].dtype != torch.float64:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 93.00 GiB")
        layer.register_forward_pre_hook(oom)
        return layer

    monkeypatch.setattr(bench_layer, "make_pyg_layer", oom_pyg)
    rc, rows, md = _layer_run(tmp_path, "--conv", "gatv2")
    assert rc == 0  # ours ran and passed its checks
    for p in ("forward", "forward+backward"):
        assert rows[("GATv2 PyG edge_index eager", p)]["status"] == "out of memory"
        assert rows[("GATv2 PyG edge_index eager", p)]["ms"] is None
        ours = rows[("GATv2 ours edge_index eager", p)]
        assert ours["status"] == "ok" and ours["check"] == "ok" and not ours["speedup"]
    assert "out of memory" in md


def test_layer_bench_scales_checks_by_pyg_compiled_without_pyg_eager(tmp_path, monkeypatch):
    """Without a PyG eager row (left out, or out of memory) PyG compiled's
    errors scale the checks: with a zero tolerance, PyG compiled's own row
    passes (its errors are the scale) and ours passes within twice them or
    fails, never for want of a scale."""
    monkeypatch.setitem(bench_layer.TOLERANCE, torch.float32, 0.0)
    args = ["--device", "cpu", "--shapes", "cora-like", "--dtypes", "float32", "--conv", "gatv2",
            "--passes", "forward", "--methods", "PyG edge_index compiled|ours edge_index eager$",
            "--out", str(tmp_path)]
    bench_layer.main(args)
    rows = {r["method"]: r for r in json.loads(
        (tmp_path / "layer_gatv2_cpu.json").read_text())["rows"]}
    assert set(rows) == {"GATv2 PyG edge_index compiled", "GATv2 ours edge_index eager"}
    pyg = rows["GATv2 PyG edge_index compiled"]
    assert pyg["check"] == "ok" and pyg["rel_errs"]["out"] > 0
    ours = rows["GATv2 ours edge_index eager"]
    within = all(e <= 2 * pyg["rel_errs"][k] for k, e in ours["rel_errs"].items())
    assert ours["check"] == ("ok" if within else "FAIL")


def _minibatch_run(tmp_path, monkeypatch, fail_in_round=None):
    """bench_minibatch.py on the CPU (cora-like, 3 models, 2 rounds of 2
    batches); returns its rows and the methods in the order of their passes.
    ``fail_in_round``: ours' pass raises in that round."""
    import bench_minibatch
    real, order = bench_minibatch.prepare_method, []

    def logged(row, *args):
        timed_pass = real(row, *args)

        def run():
            if row.method == "ours" and fail_in_round == sum(m == "ours" for m in order):
                order.append(row.method)
                raise RuntimeError("injected failure")
            order.append(row.method)
            return timed_pass()
        return run

    monkeypatch.setattr(bench_minibatch, "prepare_method", logged)
    rows = bench_minibatch.main([
        "--device", "cpu", "--shape", "cora-like", "--batch-size", "32", "--batches", "2",
        "--warmup", "1", "--rounds", "2", "--methods", "pyg,ours,ours_no_index_check",
        "--edge-orders", "loader", "--out", str(tmp_path)])
    return {r.method: r for r in rows}, order


def test_minibatch_bench_takes_turns(tmp_path, monkeypatch):
    rows, order = _minibatch_run(tmp_path, monkeypatch)
    # every model one pass a round, the order rotated each round
    assert order == ["pyg", "ours", "ours_no_index_check", "ours", "ours_no_index_check", "pyg"]
    for row in rows.values():
        assert row.status == "ok" and row.check == "ok", row
        assert len(row.times_ms) == 4 and row.ms == sorted(row.times_ms)[1] / 2 + \
            sorted(row.times_ms)[2] / 2
    assert set(rows["ours"].speedup) == {"pyg"}
    md = (tmp_path / "minibatch_cpu.md").read_text()
    assert "rounds: 2" in md


def test_minibatch_bench_reports_a_failing_model(tmp_path, monkeypatch):
    rows, order = _minibatch_run(tmp_path, monkeypatch, fail_in_round=1)
    # ours fails in its second pass, leaves the rounds, and the others finish theirs
    assert order == ["pyg", "ours", "ours_no_index_check", "ours", "ours_no_index_check", "pyg"]
    assert rows["ours"].ms is None and rows["ours"].status.startswith("error")
    assert "injected failure" in rows["ours"].extra["error"]
    for name in ("pyg", "ours_no_index_check"):
        assert rows[name].status == "ok" and len(rows[name].times_ms) == 4


def test_layer_bench_times_rows_in_turns():
    """bench_layer.time_in_turns: every row once a round, the order rotated
    each round, the median over all of a row's repeats; a row whose step
    fails leaves the rounds with its error, and the others finish."""
    import argparse
    import itertools

    from common import Row
    args = argparse.Namespace(rounds=2, repeats=4, warmup=0)
    for failing in (None, "b"):
        calls = []

        def step_of(name, calls=calls, failing=failing):
            def step():
                if name == failing and "c" in calls:  # b's second round (after c's first)
                    raise RuntimeError(f"injected failure of {name}")
                calls.append(name)
            return step

        rows = [Row("g", "float32", name, "forward") for name in "abc"]
        bench_layer.time_in_turns([(r, step_of(r.method)) for r in rows], torch.device("cpu"),
                                  args)
        runs = [name for name, _ in itertools.groupby(calls)]
        # (b failing at the start of the second round, c runs on after c)
        assert runs == (["a", "b", "c", "b", "c", "a"] if failing is None
                        else ["a", "b", "c", "a"])
        for r in rows:
            if r.method == failing:
                assert r.ms is None and "injected failure" in r.extra["error"]
                continue
            assert r.status == "ok" and len(r.times_ms) >= 6  # 3 repeats a round at least
            assert r.ms == statistics.median(r.times_ms)


@pytest.mark.slow  # compiles the model (about 10 s on a CPU)
def test_cora_bench_checks_its_compiled_rows(data_root, tmp_path, monkeypatch):
    """bench_cora_epoch.py --compile: a compiled model's loss is checked
    against its eager model's on the same parameters; a compiled model with a
    wrong output fails that check and is reported as its row's error while
    the other rows are timed (here "reduce-overhead" stands for it: our model
    with its output doubled; PyG's compiled rows left out for time)."""
    import bench_cora_epoch

    real_compile = torch.compile

    def compile_(model, mode=None, **kwargs):
        if mode == "reduce-overhead":
            return lambda *args: 2 * model(*args)
        return real_compile(model, mode=mode, **kwargs)

    monkeypatch.setattr(bench_cora_epoch, "COMPILED_OF", ("ours edge_index",))
    monkeypatch.setattr(torch, "compile", compile_)
    monkeypatch.setattr(sys, "argv", [
        "bench_cora_epoch.py", "--device", "cpu", "--root", str(data_root), "--rounds", "2",
        "--epochs-per-round", "1", "--compile", "--out", str(tmp_path)])
    bench_cora_epoch.main()
    rows = {r["method"]: r for r in
            json.loads((tmp_path / "cora_epoch_cpu.json").read_text())["rows"]}
    compiled = rows["ours edge_index compiled"]
    assert compiled["status"] == "ok" and compiled["check"] == "ok", compiled
    assert compiled["rel_err"] < 1e-4 and len(compiled["times_ms"]) == 2 and compiled["ms"] > 0
    wrong = rows["ours edge_index compiled, reduce-overhead"]
    assert wrong["status"].startswith("error") and wrong["check"] == "FAIL", wrong
    assert "compiled loss" in wrong["extra"]["error"] and wrong["ms"] is None
    assert "pyg edge_index compiled" not in rows
    for name in ("pyg edge_index", "ours edge_index", "no attention"):
        assert rows[name]["status"] == "ok" and len(rows[name]["times_ms"]) == 2
    md = (tmp_path / "cora_epoch_cpu.md").read_text()
    assert "Rows that did not run" in md and "compiled loss" in md


def test_profile_step_times_host_against_wall(monkeypatch):
    """tools/profile_step.py --steps compile: a training step computes the
    parameters' gradients from the given output gradient, and the timing
    runs the warm-up and steps x repeats calls, host time at most wall."""
    import profile_step

    torch.manual_seed(0)
    layer = pma.nn.GATConv(8, 4, heads=2)
    params = list(layer.parameters())
    x = torch.randn(10, 8)
    edge_index = torch.randint(0, 10, (2, 30))
    grad_out = torch.randn(10, 8)
    want = torch.autograd.grad(layer(x, edge_index), params, grad_out)
    grads = []
    real_grad = torch.autograd.grad

    def counted(out, inputs, grad):
        grads.append(real_grad(out, inputs, grad))
        return grads[-1]
    monkeypatch.setattr(torch.autograd, "grad", counted)
    step = profile_step.training_step(layer, x, edge_index, grad_out)
    host, wall = profile_step.host_and_wall(step, torch.device("cpu"), steps=4, repeats=3,
                                            warmup=2)
    assert len(grads) == 2 + 4 * 3
    for got, ref in zip(grads[-1], want, strict=True):
        assert torch.allclose(got, ref)
    assert 0 < host <= wall


def test_profile_step_difference_orders_by_extra_time(capsys):
    """tools/profile_step.py's difference table (the compiled steps' extra
    host time, --compile-profile): keys by a minus b, largest first, the
    two columns named as given, and the total of a minus the total of b."""
    import profile_step

    a = {"_graph_of_edges": 0.05, "gat_attention": 0.20, "CompiledFunction": 0.30}
    b = {"gat_attention": 0.21, "CompiledFunction": 0.10, "mm": 0.02}
    profile_step.print_difference("t", a, b, top=3, names=("compiled", "eager"))
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "t: 0.220 ms per step in all"
    assert lines[2] == "| | compiled (ms per step) | eager | difference |"
    rows = [line.split("|")[1].strip(" `") for line in lines[4:]]
    assert rows == ["CompiledFunction", "_graph_of_edges", "gat_attention"]


def test_profile_step_difference_merges_inductor_hashes(capsys):
    """Two compilations of one step name their graphs and generated modules
    by different content hashes: the difference table compares them as one
    name (summed), not as one row gained and another lost."""
    import profile_step

    h1, h2, h3 = "f" + "a" * 51, "f" + "b" * 51, "f" + "c" * 51
    a = {f"## Call CompiledFxGraph {h1} ##": 0.30, f"## Call CompiledFxGraph {h3} ##": 0.10,
         "_graph_of_edges": 0.05}
    b = {f"## Call CompiledFxGraph {h2} ##": 0.25}
    profile_step.print_difference("t", a, b, top=5)
    rows = {line.split("|")[1].strip(" `"): line.split("|")[4].strip()
            for line in capsys.readouterr().out.strip().splitlines()[4:]}
    assert rows == {"## Call CompiledFxGraph # ##": "+0.150", "_graph_of_edges": "+0.050"}
