"""examples/train_cora.py: a smoke test per layer family (GAT, GATv2), layer and adjacency
type, and the full 10-seed runs (slow)."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "train_cora.py"
ADJS = ("edge_index", "edge_index_sorted", "sparse_tensor", "csr")
JSON_KEYS = {"test_acc_mean", "test_acc_std", "epoch_ms_median", "runs", "settings", "versions"}
VERSION_KEYS = {"torch", "torch_geometric", "pyg_multihead_agg", "device"}
# --conv: the class name and our fused operator of each layer family.
CONVS = {"gat": ("GATConv", "pyg_multihead_agg::gat_attention"),
         "gatv2": ("GATv2Conv", "pyg_multihead_agg::gatv2_attention"),
         "transformer": ("TransformerConv", "pyg_multihead_agg::transformer_attention")}
# The least 10-seed mean test accuracy of GATv2 on Cora with the GAT paper's settings (as GAT's).
GATV2_MIN_ACC = 0.82


def _load_example():
    spec = importlib.util.spec_from_file_location("train_cora", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train_cora = _load_example()


def _needs(adj):
    marks = []
    if adj == "sparse_tensor":
        marks.append(pytest.mark.skipif(
            importlib.util.find_spec("torch_sparse") is None, reason="torch-sparse not installed"))
    return pytest.param(adj, marks=marks)



DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


# Each family, layer and adjacency of the example at least once (every
# combination with --full); the layers have their own sweeps over adjacencies.
@pytest.mark.sweep(cover=[("conv",), ("layer",), ("adj",)])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("adj", [_needs(a) for a in ADJS])
@pytest.mark.parametrize("layer", ["ours", "pyg"])
@pytest.mark.parametrize("conv", list(CONVS))
def test_smoke(conv, layer, adj, device, data_root, tmp_path):
    json_path, plot_path = tmp_path / "result.json", tmp_path / "curves.png"
    args = ["--root", str(data_root), "--conv", conv, "--layer", layer, "--adj", adj,
            "--device", device, "--epochs", "15", "--seed", "1", "--quiet", "--json",
            str(json_path), "--plot", str(plot_path)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        result = train_cora.main(args)
    class_name, op = CONVS[conv]
    ran_ours = op in {e.name for e in prof.events()}
    assert ran_ours == (layer == "ours")
    losses = result["runs"][0]["history"]["train_loss"]
    assert len(losses) == 15
    assert all(torch.isfinite(torch.tensor(losses)))
    # Dropout 0.6 makes single steps noisy: compare the ends, averaged.
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.02, losses

    written = json.loads(json_path.read_text())
    assert JSON_KEYS <= written.keys()
    assert VERSION_KEYS <= written["versions"].keys()
    assert written["settings"]["adj"] == adj and written["settings"]["layer"] == layer
    assert written["settings"]["device"].startswith(device)
    expected = "torch_geometric" if layer == "pyg" else "pyg_multihead_agg"
    assert written["settings"]["conv"].startswith(expected)
    assert written["settings"]["conv"].endswith("." + class_name)
    assert written["settings"]["conv_family"] == conv
    assert len(written["runs"]) == 1 and written["runs"][0]["seed"] == 1
    assert 0.0 <= written["test_acc_mean"] <= 1.0 and written["test_acc_std"] == 0.0
    assert written["epoch_ms_median"] > 0
    assert plot_path.stat().st_size > 0
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# A new process each (imports take seconds): GAT by default, every family with --full.
@pytest.mark.parametrize("conv", ["gat", *(pytest.param(c, marks=pytest.mark.slow)
                                           for c in CONVS if c != "gat")])
def test_script_runs_as_a_command(conv, data_root, tmp_path):
    json_path = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(data_root), "--conv", conv, "--adj", "csr",
         "--device", "cpu", "--epochs", "2", "--runs", "2", "--json", str(json_path)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 3, proc.stdout  # one line per run, then the summary
    assert "test accuracy" in lines[-1] and "over 2 run(s)" in lines[-1]
    assert f"--conv {conv} " in lines[-1]
    written = json.loads(json_path.read_text())
    assert [run["seed"] for run in written["runs"]] == [0, 1]
    accs = [run["test_acc"] for run in written["runs"]]
    assert written["test_acc_mean"] == pytest.approx(sum(accs) / 2)
    assert written["test_acc_std"] == pytest.approx(abs(accs[0] - accs[1]) / 2 ** 0.5)


# The layers' own tests compile each family; the example's --compile path
# (inductor, seconds on a 2-core CPU) runs with --full.
@pytest.mark.slow
@pytest.mark.parametrize("conv", list(CONVS))
def test_compiled_model_on_the_prepared_adjacency(conv, data_root):
    result = train_cora.main(["--root", str(data_root), "--conv", conv, "--compile",
                              "--epochs", "6", "--quiet"])
    assert result["settings"]["compile"] and len(result["runs"][0]["history"]["train_loss"]) == 6


def test_logs_a_line_every_n_epochs_without_a_terminal(data_root):
    # stderr is a pipe here (no progress bar): one line every --log-every epochs.
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(data_root), "--device", "cpu",
         "--epochs", "7", "--patience", "100", "--log-every", "3"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    prefix = "run 1/1 (seed 0) epoch "
    logged = [line for line in lines if line.startswith(prefix)]
    assert [line[len(prefix):].split(":")[0] for line in logged] == ["3", "6"], lines
    assert all("loss" in line and "val acc" in line for line in logged)
    assert "\r" not in proc.stdout + proc.stderr


def test_bad_arguments_are_named():
    with pytest.raises(SystemExit):
        train_cora.main(["--adj", "coo"])
    with pytest.raises(SystemExit):
        train_cora.main(["--layer", "dgl"])
    with pytest.raises(SystemExit):
        train_cora.main(["--conv", "gin"])
    with pytest.raises(SystemExit):
        train_cora.main(["--runs", "0"])
    with pytest.raises(SystemExit):
        train_cora.main(["--log-every", "-1"])


def test_missing_data_names_root(tmp_path, monkeypatch):
    # Offline or not, a root without raw files must fail with a message naming --root;
    # patch the download so this never touches the network.
    from torch_geometric.datasets import Planetoid

    def no_download(self):
        raise OSError("download disabled in this test")

    monkeypatch.setattr(Planetoid, "download", no_download)
    with pytest.raises(RuntimeError, match="--root"):
        train_cora.main(["--root", str(tmp_path), "--epochs", "1", "--quiet"])


@pytest.fixture(scope="module")
def pyg_full_run(data_root):
    return train_cora.main(["--root", str(data_root), "--layer", "pyg", "--runs", "10",
                            "--quiet"])


@pytest.fixture(scope="module")
def pyg_gatv2_full_run(data_root):
    return train_cora.main(["--root", str(data_root), "--conv", "gatv2", "--layer", "pyg",
                            "--runs", "10", "--quiet"])


@pytest.mark.long
@pytest.mark.parametrize("adj", [_needs(a) for a in ADJS])
def test_full_accuracy(adj, data_root, pyg_full_run):
    # The default device: CUDA where there is one.
    result = train_cora.main(["--root", str(data_root), "--adj", adj, "--runs", "10", "--quiet"])
    assert len(result["runs"]) == 10
    assert result["test_acc_mean"] >= 0.82, result["test_acc_mean"]
    assert abs(result["test_acc_mean"] - pyg_full_run["test_acc_mean"]) <= 0.01, (
        result["test_acc_mean"], pyg_full_run["test_acc_mean"])


@pytest.mark.long
@pytest.mark.parametrize("adj", ["edge_index", "csr"])
def test_full_accuracy_gatv2(adj, data_root, pyg_gatv2_full_run):
    result = train_cora.main(["--root", str(data_root), "--conv", "gatv2", "--adj", adj,
                              "--runs", "10", "--quiet"])
    assert len(result["runs"]) == 10
    assert result["test_acc_mean"] >= GATV2_MIN_ACC, result["test_acc_mean"]
    assert abs(result["test_acc_mean"] - pyg_gatv2_full_run["test_acc_mean"]) <= 0.01, (
        result["test_acc_mean"], pyg_gatv2_full_run["test_acc_mean"])
