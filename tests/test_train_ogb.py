"""examples/train_ogb.py and its synthetic stand-ins (examples/ogb_synthetic.py),
offline: the generator's structure (seeded, homophilous, power-law degrees,
balanced classes, noisy class features), the written files read alike by
ogb's PygNodePropPredDataset and by the reader without ogb, training runs of
every layer family on one process and on two (torchrun, DDP over gloo on the
CPU), DDP's all-reduced gradients against one process's over the same nodes,
the command line (defaults in --help, the offline error, no sampler), and the
summary of several runs."""
import gzip
import json
import os
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch_geometric.typing import WITH_PYG_LIB, WITH_TORCH_SPARSE
from torch_geometric.utils import scatter, to_torch_csr_tensor

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
sys.path.insert(0, EXAMPLES)

import ogb_synthetic  # noqa: E402
import train_ogb  # noqa: E402

SCRIPT = os.path.join(EXAMPLES, "train_ogb.py")
NEEDS_SAMPLER = pytest.mark.skipif(not (WITH_PYG_LIB or WITH_TORCH_SPARSE),
                                   reason="NeighborLoader needs pyg-lib or torch-sparse")
NODES = 240
SMALL = ["--layers", "2", "--hidden", "8", "--heads", "2", "--quiet", "--device", "cpu"]
TRAIN = round(NODES * 90_941 / 169_343)  # ogbn-arxiv's share of training nodes


def has_ogb():
    try:
        import ogb  # noqa: F401
    except ImportError:
        return False
    return True


NEEDS_OGB = pytest.mark.skipif(not has_ogb(), reason="needs the ogb package")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A 240-node ogbn-arxiv stand-in, as `--synthetic 240` writes it (and
    then reuses), read once (ogb processes it here, where it is installed)."""
    path = str(tmp_path_factory.mktemp("ogb"))
    train_ogb.main(["--root", path, "--synthetic", str(NODES), "--write-only", "--quiet"])
    train_ogb.load("ogbn-arxiv", path, synthetic=True)
    return path


# The generator ----------------------------------------------------------------

@pytest.fixture(scope="module")
def products_like():
    """A 200,000-node ogbn-products stand-in (about 1.5 s on one core)."""
    params = ogb_synthetic.params_for("ogbn-products", 200_000)
    return params, ogb_synthetic.generate(params)


def test_generator_is_seeded():
    params = ogb_synthetic.params_for("ogbn-arxiv", 2_000, seed=3)
    first, again = ogb_synthetic.generate(params), ogb_synthetic.generate(params)
    other = ogb_synthetic.generate(ogb_synthetic.params_for("ogbn-arxiv", 2_000, seed=4))
    for key in ("pairs", "x", "y"):
        assert np.array_equal(first[key], again[key]), key
        assert not np.array_equal(first[key], other[key]), key


def test_generator_structure(products_like):
    params, graph = products_like
    pairs, x, y = graph["pairs"], graph["x"], graph["y"]
    n = params.num_nodes
    # A simple undirected graph: lower id first, sorted, no self-loop, no repeat.
    assert pairs.dtype == np.int64 and (pairs[0] < pairs[1]).all()
    key = pairs[0] * n + pairs[1]
    assert (np.diff(key) > 0).all()
    stats = ogb_synthetic.stats(graph)
    assert abs(stats["homophily"] - params.homophily) < 0.01, stats
    # Balanced communities, and classes (a fifth of the labels drawn at
    # random); the real dataset's edges per node, within 3%.
    sizes = np.bincount(graph["community"])
    assert sizes.max() - sizes.min() <= 1
    assert stats["class_size_max"] < 1.1 * n / params.num_classes, stats
    assert stats["class_size_min"] > 0.9 * n / params.num_classes, stats
    assert abs((y != graph["community"]).mean() - params.label_noise * 46 / 47) < 0.01
    assert abs(stats["mean_degree"] / (2 * params.pairs_per_node) - 1) < 0.03, stats
    assert stats["isolated_nodes"] == 0
    # Power-law degrees (tail index 2): P(deg > 2d) / P(deg > d) about 1/4
    # in the tail, hubs far above the median.
    deg = np.bincount(pairs.ravel(), minlength=n)
    mean = deg.mean()
    tail = [(deg > f * mean).mean() for f in (2, 4, 8)]
    assert 0.15 < tail[1] / tail[0] < 0.35 and 0.15 < tail[2] / tail[1] < 0.35, tail
    assert stats["max_degree"] > 50 * stats["median_degree"], stats
    # Unit-variance features
    assert x.dtype == np.float32 and x.shape == (n, params.num_features)
    assert abs(float(x.var()) - 1) < 0.05


def _nearest_centroid_accuracy(x, y, num_classes):
    centroids = scatter(x, y, dim=0, dim_size=num_classes, reduce="mean")
    return float((torch.cdist(x, centroids).argmin(1) == y).double().mean())


@pytest.mark.filterwarnings("ignore:Sparse:UserWarning")  # torch's beta CSR, its checks
def test_the_graph_carries_the_class(products_like):
    """A node's own features name its community half the time; the mean of
    its neighbours' features (what a GAT's aggregation sees) almost always."""
    params, graph = products_like
    x, y = torch.from_numpy(graph["x"]), torch.from_numpy(graph["community"])
    pairs = torch.from_numpy(graph["pairs"])
    adj = to_torch_csr_tensor(torch.cat([pairs, pairs.flip(0)], 1), size=params.num_nodes)
    neighbours = adj @ x  # (a sum: the mean's direction)
    own = _nearest_centroid_accuracy(x, y, params.num_classes)
    aggregated = _nearest_centroid_accuracy(neighbours, y, params.num_classes)
    assert 0.35 < own < 0.6, own
    assert aggregated > 0.95, aggregated


def test_split_follows_the_real_proportions():
    parts = ogb_synthetic.split(100_000, ogb_synthetic.SPECS["ogbn-products"].split_sizes, 0)
    assert [p.size for p in parts.values()] == [8_028, 1_606, 90_366]
    whole = np.sort(np.concatenate(list(parts.values())))
    assert np.array_equal(whole, np.arange(100_000))


# The files and their two readers ----------------------------------------------

@NEEDS_OGB
@pytest.mark.parametrize("name", train_ogb.DATASETS)
def test_both_readers_give_the_same_data(name, tmp_path):
    params = ogb_synthetic.params_for(name, 300, num_features=8)
    ogb_synthetic.write(str(tmp_path), name, params, log=lambda *a: None)
    with_ogb = train_ogb.load(name, str(tmp_path), synthetic=True, use_ogb=True)
    without = train_ogb.load(name, str(tmp_path), synthetic=True, use_ogb=False)
    (data, split, classes), (data2, split2, classes2) = with_ogb, without
    assert classes == classes2 == ogb_synthetic.SPECS[name].num_classes
    assert data.num_nodes == data2.num_nodes == 300
    assert set(data.keys()) == set(data2.keys())
    for key in data.keys():
        if isinstance(data[key], torch.Tensor):
            assert torch.equal(data[key], data2[key]), key
            assert data[key].dtype == data2[key].dtype, key
    assert split.keys() == split2.keys()
    assert all(torch.equal(split[k], split2[k]) for k in split)
    # Both directions of every edge, the split a partition of the nodes.
    edges = set(map(tuple, data.edge_index.t().tolist()))
    assert all((j, i) in edges for i, j in edges)
    parts = torch.cat([split["train"], split["valid"], split["test"]])
    assert torch.equal(parts.sort().values, torch.arange(300))
    if name == "ogbn-arxiv":  # the time split's years
        assert int(data.node_year[split["valid"]].min()) == 2018
        assert int(data.node_year[split["train"]].max()) <= 2017


@NEEDS_OGB
def test_products_edges_are_what_ogbs_csv_reader_makes(tmp_path):
    """ogbn-products' binary edge_index is what ogb's reader of the real CSV
    builds from the same pairs (add_inverse_edge)."""
    from ogb.io.read_graph_raw import read_csv_graph_raw

    params = ogb_synthetic.params_for("ogbn-products", 200)
    path = ogb_synthetic.write(str(tmp_path), "ogbn-products", params, log=lambda *a: None)
    pairs = ogb_synthetic.generate(params)["pairs"]
    raw = tmp_path / "csv"
    raw.mkdir()
    for file, rows in (("edge", pairs.T), ("num-node-list", [[200]]),
                       ("num-edge-list", [[pairs.shape[1]]])):
        with gzip.open(raw / f"{file}.csv.gz", "wt") as f:
            f.writelines(",".join(map(str, row)) + "\n" for row in rows)
    expected = read_csv_graph_raw(str(raw), add_inverse_edge=True)[0]["edge_index"]
    with np.load(os.path.join(path, "raw", "data.npz")) as arrays:
        assert np.array_equal(arrays["edge_index"], expected)


def test_a_folder_is_reused_for_the_same_graph_and_rewritten_for_another(tmp_path):
    logged = []
    params = ogb_synthetic.params_for("ogbn-arxiv", 200)
    path = ogb_synthetic.write(str(tmp_path), "ogbn-arxiv", params, log=logged.append)
    processed = os.path.join(path, "processed", "geometric_data_processed.pt")
    os.makedirs(os.path.dirname(processed))
    open(processed, "w").close()  # stands for ogb's processed copy
    ogb_synthetic.write(str(tmp_path), "ogbn-arxiv", params, log=logged.append)
    assert "holds this graph already" in logged[-1] and os.path.exists(processed)
    other = ogb_synthetic.params_for("ogbn-arxiv", 200, homophily=0.5)
    ogb_synthetic.write(str(tmp_path), "ogbn-arxiv", other, log=logged.append)
    assert "written" in logged[-1] and not os.path.exists(processed)
    data, _, _ = train_ogb.load("ogbn-arxiv", str(tmp_path), synthetic=True, use_ogb=False)
    with open(os.path.join(path, "synthetic.json")) as f:
        assert json.load(f)["params"]["homophily"] == 0.5


# Training ----------------------------------------------------------------------

def run(argv):
    return train_ogb.main([*SMALL, *argv])


def test_full_batch_learns_and_writes_its_outputs(root, tmp_path):
    out = tmp_path / "run.json"
    result = run(["--root", root, "--synthetic", str(NODES), "--epochs", "25", "--lr", "0.01",
                  "--dropout", "0", "--json", str(out), "--png", str(tmp_path / "run.png")])
    loss = result["history"]["train_loss"]
    assert loss[-1] < 0.8 * loss[0]
    saved = json.loads(out.read_text())
    assert saved["world_size"] == 1 and saved["epochs"] == 25 and saved["status"] == "ok"
    assert saved["synthetic"]["params"]["num_nodes"] == NODES
    assert 0.0 <= saved["best"]["test_acc"] <= 1.0
    assert saved["machine"] and saved["torch"] == torch.__version__
    assert len(saved["history"]["wait_ms"]) == 25
    assert os.path.getsize(tmp_path / "run.png") > 0


@pytest.mark.parametrize("conv,layer", [("gat", "ours"), ("gat", "pyg"), ("gatv2", "ours"),
                                        ("transformer", "ours"), ("mlp", "ours")])
def test_every_layer_family_trains(root, conv, layer):
    result = run(["--root", root, "--synthetic", str(NODES), "--epochs", "2", "--conv", conv,
                  "--layer", layer])
    assert result["conv"] == conv and result["epochs"] == 2
    assert all(np.isfinite(result["history"]["train_loss"]))
    model_classes = {"gat": "GATConv", "gatv2": "GATv2Conv", "transformer": "TransformerConv"}
    if conv in model_classes:
        expected = train_ogb.CONVS[conv][layer]
        assert expected.__name__ == model_classes[conv]
        assert expected.__module__.startswith(
            "pyg_multihead_agg" if layer == "ours" else "torch_geometric")


def test_runs_without_the_ogb_package(root, monkeypatch):
    """As on a machine without ogb: the synthetic graph through the reader of
    its files, accuracy without ogb's Evaluator."""
    for module in [m for m in sys.modules if m == "ogb" or m.startswith("ogb.")] + ["ogb"]:
        monkeypatch.setitem(sys.modules, module, None)  # import ogb raises ImportError
    result = run(["--root", root, "--synthetic", str(NODES), "--epochs", "2"])
    assert result["epochs"] == 2 and 0 <= result["best"]["test_acc"] <= 1
    with pytest.raises(SystemExit, match="needs the ogb package"):
        run(["--root", root, "--epochs", "1"])


def _gat_and_mlp(tmp_path, epochs):
    """Test accuracy of a small GAT and of the MLP of the same width (--conv
    mlp) on a 3,000-node ogbn-arxiv stand-in."""
    argv = ["--root", str(tmp_path), "--dataset", "ogbn-arxiv", "--synthetic", "3000",
            "--layers", "2", "--hidden", "16", "--heads", "2", "--lr", "0.01", "--dropout", "0.2",
            "--epochs", str(epochs), "--quiet", "--device", "cpu"]
    return {conv: train_ogb.main([*argv, "--conv", conv])["best"]["test_acc"]
            for conv in ("gat", "mlp")}


def test_a_gat_learns_what_an_mlp_cannot(tmp_path):
    acc = _gat_and_mlp(tmp_path, 30)
    assert acc["gat"] > 0.6 and acc["gat"] > acc["mlp"] + 0.3, acc


def test_json_records_out_of_memory_as_a_result(root, tmp_path, monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80 GiB")

    monkeypatch.setattr(train_ogb, "train_epoch", out_of_memory)
    out = tmp_path / "oom.json"
    result = run(["--root", root, "--synthetic", str(NODES), "--epochs", "3", "--json",
                  str(out)])
    assert result["status"] == "out of memory in training" and result["epochs"] == 0
    assert json.loads(out.read_text())["status"] == "out of memory in training"


def test_resume_continues_the_same_run(root, tmp_path):
    ckpt = str(tmp_path / "ckpt.pt")
    base = ["--root", root, "--synthetic", str(NODES)]
    whole = run([*base, "--epochs", "4"])
    run([*base, "--epochs", "2", "--checkpoint", ckpt])
    resumed = run([*base, "--epochs", "4", "--checkpoint", ckpt, "--resume"])
    assert resumed["epochs"] == 4
    # Seeds per epoch and rank: the resumed run repeats the uninterrupted one.
    assert resumed["history"]["train_loss"] == pytest.approx(whole["history"]["train_loss"],
                                                             rel=1e-6)


@NEEDS_SAMPLER
def test_mini_batch_records_the_time_spent_waiting_for_batches(root):
    result = run(["--root", root, "--synthetic", str(NODES), "--epochs", "2", "--fanout", "5,5",
                  "--batch-size", "32", "--num-workers", "1"])
    assert result["steps_per_epoch"] == -(-TRAIN // 32)
    assert result["history"]["train_loss"][-1] > 0
    waits, epochs = result["history"]["wait_ms"], result["history"]["epoch_ms"]
    assert all(0 < w < e for w, e in zip(waits, epochs, strict=True))


def test_mini_batches_without_a_sampler_say_so(monkeypatch, capsys):
    monkeypatch.setattr(train_ogb, "HAS_SAMPLER", False)
    with pytest.raises(SystemExit, match="pyg-lib or torch-sparse"):
        train_ogb.main(["--fanout", "5,5"])


# Full-batch DDP also runs in test_ddp_gradients_equal_one_process: with --full here.
@pytest.mark.parametrize("fanout", [pytest.param(None, marks=pytest.mark.slow),
                                    pytest.param("5,5", marks=NEEDS_SAMPLER)],
                         ids=["full_batch", "mini_batch"])
def test_two_processes_gloo(root, tmp_path, fanout):
    out = tmp_path / "ddp.json"
    argv = [*SMALL, "--root", root, "--synthetic", str(NODES), "--epochs", "2", "--json",
            str(out)]
    if fanout:
        argv += ["--fanout", fanout, "--batch-size", "32"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", SCRIPT, *argv],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and result["epochs"] == 2
    if fanout:  # each rank half the training nodes, the same steps on both
        assert result["steps_per_epoch"] == -(-(TRAIN // 2) // 32)


# The command line --------------------------------------------------------------

def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit) as exit_:
        train_ogb.parse_args(["--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for default in ("--epochs EPOCHS training epochs (default: 100)", "(default: ogbn-arxiv)",
                    "(default: gat)", "within a community (a class) (default: 0.8)"):
        assert default in text, default
    assert "{gat,gatv2,transformer,mlp}" in text


def test_offline_run_names_synthetic_and_root(tmp_path):
    """No network (a proxy that refuses): one line naming --synthetic and
    --root, a non-zero exit, and no half-made dataset folder left behind."""
    proxy = "http://127.0.0.1:9"  # the discard port: nothing listens there
    env = dict(os.environ, http_proxy=proxy, https_proxy=proxy, HTTP_PROXY=proxy,
               HTTPS_PROXY=proxy, no_proxy="", NO_PROXY="")
    proc = subprocess.run([sys.executable, SCRIPT, "--root", str(tmp_path), "--device", "cpu",
                           "--epochs", "1"], capture_output=True, text=True, timeout=120,
                          env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--synthetic" in lines[0] and "--root" in lines[0], lines
    assert not os.path.exists(tmp_path / "ogbn_arxiv")


def test_a_log_line_every_n_epochs_without_a_terminal(root):
    # stderr is a pipe here: no progress bar, a line every --log-every epochs.
    proc = subprocess.run([sys.executable, SCRIPT, *SMALL[:-3], "--device", "cpu", "--root",
                           root, "--synthetic", str(NODES), "--epochs", "4", "--log-every", "2"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    logged = re.findall(r" epoch (\d+): loss .*, val acc ", proc.stdout)
    assert logged == ["2", "4"], proc.stdout
    assert "\r" not in proc.stdout + proc.stderr
    assert "not writable" not in proc.stderr  # ogb's NumPy warning, silenced


def test_summary_of_several_runs(root, tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    train_ogb.main(["--root", root, "--synthetic", str(NODES), "--write-only", "--quiet",
                    "--json", str(results / "0_write.json")])
    run(["--root", root, "--synthetic", str(NODES), "--epochs", "2", "--json",
         str(results / "1_gat.json")])
    (results / "2_pyg.json").write_text(json.dumps({"status": "timed out after 480 s"}))
    # a crashed run's row as scripts/ogb_device.sh writes it: settings from its arguments
    (results / "3_pyg.json").write_text(json.dumps({
        "status": "failed (exit 1): RuntimeError", "args": [
            "--layer", "pyg", "--conv", "gatv2", "--compile", "--fanout", "15,10",
            "--batch-size", "512"]}))
    stem = str(tmp_path / "ogb_cpu")
    summary = train_ogb.main(["--summarise", str(results), stem])
    assert [r["row"] for r in summary["rows"]] == ["0_write", "1_gat", "2_pyg", "3_pyg"]
    assert summary["meta"]["git_commit"] is not None and summary["meta"]["machine"]
    assert "history" not in summary["rows"][1]
    text = open(stem + ".md").read()
    assert "| 1_gat | gat | ours |" in text and "timed out after 480 s" in text
    assert ("| 3_pyg | gatv2 | pyg | yes |  | mini-batch 15,10, batch 512 | failed (exit 1): "
            "RuntimeError |") in text
    assert f"synthetic graph: {NODES} nodes" in text
    assert json.loads(open(stem + ".json").read())["rows"][2]["status"].startswith("timed out")


# DDP gradients against one process ---------------------------------------------

def _model(num_features: int, num_classes: int):
    torch.manual_seed(0)
    return train_ogb.GAT(train_ogb.CONVS["gat"]["ours"], num_features, 8, num_classes, 2, 2,
                         dropout=0.0, attn_dropout=0.0)


def _loss(model, data, nodes):
    return F.cross_entropy(model(data.x, data.edge_index)[nodes], data.y[nodes])


def _ddp_rank(rank, world, init_method, root, out_file):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    data, split, num_classes = train_ogb.load("ogbn-arxiv", root, synthetic=True)
    model = DistributedDataParallel(_model(data.num_features, num_classes))
    nodes = train_ogb.rank_share(split["train"], 1, 0, rank, world)
    _loss(model, data, nodes).backward()
    if rank == 0:
        torch.save({name: p.grad for name, p in model.module.named_parameters()}, out_file)
    del model  # DDP's reducer before its process group: freed after it, it can hang
    dist.destroy_process_group()


def _ddp_gradients(root, tmp_path, tag):
    import torch.multiprocessing as mp
    out = str(tmp_path / f"grads_{tag}.pt")
    with socket.socket() as sock:  # a free port for the ranks' rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = mp.spawn(_ddp_rank, args=(2, f"tcp://127.0.0.1:{port}", root, out), nprocs=2,
                       join=False)
    deadline = time.monotonic() + 180
    while not context.join(timeout=5):  # a hung rank fails the test instead of CI
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the DDP ranks did not finish within 180 s")
    return torch.load(out)


def test_ddp_gradients_equal_one_process(root, tmp_path):
    """Two ranks, each its half of the training nodes: DDP's averaged
    gradients are one process's gradients of the mean of the two halves'
    losses, up to the order of the all-reduce's sum; the kernels are
    deterministic, so repeated DDP runs agree bit for bit."""
    first = _ddp_gradients(root, tmp_path, "a")
    again = _ddp_gradients(root, tmp_path, "b")
    data, split, num_classes = train_ogb.load("ogbn-arxiv", root, synthetic=True)
    model = _model(data.num_features, num_classes)
    halves = [train_ogb.rank_share(split["train"], 1, 0, rank, 2) for rank in (0, 1)]
    (sum(_loss(model, data, nodes) for nodes in halves) / 2).backward()
    for name, param in model.named_parameters():
        assert torch.equal(first[name], again[name]), name
        torch.testing.assert_close(first[name], param.grad, rtol=1e-5, atol=1e-7, msg=name)


# The device script, on the CPU -------------------------------------------------

@pytest.mark.slow
def test_device_script_runs_on_the_cpu(tmp_path):
    """scripts/ogb_device.sh's steps on a small graph (DEVICE=cpu): a row per
    run, a summary of them all."""
    script = os.path.join(EXAMPLES, "..", "scripts", "ogb_device.sh")
    env = dict(os.environ, OUT=str(tmp_path / "out"), PYTHON=sys.executable, DEVICE="cpu",
               NODES="2000", EPOCHS="2", MB_EPOCHS="1", WORKERS="0", STEP_LIMIT="120",
               ROOT=str(tmp_path / "root"), RESULTS=str(tmp_path / "results"),
               SUMMARY=str(tmp_path / "ogb_cpu"))
    proc = subprocess.run(["bash", script, "write,full-gat,minibatch"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "ogb_cpu.json").read_text())
    rows = {r["row"]: r for r in summary["rows"]}
    assert {"00_write", "10_gat_ours", "11_gat_pyg"} <= rows.keys()
    assert all(rows[name]["status"] == "ok" for name in ("10_gat_ours", "11_gat_pyg"))
    assert any(name.startswith("60_minibatch") for name in rows)
    assert {"ogb.log", "ogb_results.tar", "ogb_cpu.md", "ogb_cpu.json"} <= set(
        os.listdir(tmp_path / "out"))
