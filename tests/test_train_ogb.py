"""examples/train_ogb.py, offline: small random graphs written in OGB's own
on-disk format and read by ogb's PygNodePropPredDataset (the real loader),
trained on one process and on two (torchrun, DDP over gloo on the CPU), and
DDP's all-reduced gradients against one process's over the same nodes."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.typing import WITH_PYG_LIB, WITH_TORCH_SPARSE

pytest.importorskip("ogb")

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
sys.path.insert(0, EXAMPLES)

import train_ogb  # noqa: E402

SCRIPT = os.path.join(EXAMPLES, "train_ogb.py")
NEEDS_SAMPLER = pytest.mark.skipif(not (WITH_PYG_LIB or WITH_TORCH_SPARSE),
                                   reason="NeighborLoader needs pyg-lib or torch-sparse")
SMALL = ["--layers", "2", "--hidden", "8", "--heads", "2", "--quiet", "--device", "cpu"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ogb"))
    train_ogb.write_synthetic(path, "ogbn-arxiv", 240, num_features=24, seed=1)
    return path


@pytest.mark.parametrize("name", train_ogb.DATASETS)
def test_synthetic_dataset_reads_through_ogbs_loader(name, tmp_path):
    train_ogb.write_synthetic(str(tmp_path), name, 120, avg_degree=4, num_features=8)
    data, split, num_classes = train_ogb.load(name, str(tmp_path))
    assert data.num_nodes == 120 and data.x.shape == (120, 8)
    assert num_classes == {"ogbn-arxiv": 40, "ogbn-products": 47}[name]
    assert data.y.shape == (120,) and int(data.y.max()) < num_classes
    # ogbn-products stores each edge once and ogb adds the reverse; the
    # example makes ogbn-arxiv undirected itself: both end up symmetric.
    edges = set(map(tuple, data.edge_index.t().tolist()))
    assert all((j, i) in edges for i, j in edges)
    parts = torch.cat([split["train"], split["valid"], split["test"]])
    assert torch.equal(parts.sort().values, torch.arange(120))


def run(argv):
    return train_ogb.main([*SMALL, *argv])


def test_full_batch_learns_and_writes_its_outputs(root, tmp_path):
    out = tmp_path / "run.json"
    result = run(["--root", root, "--epochs", "25", "--lr", "0.01", "--dropout", "0",
                  "--json", str(out), "--png", str(tmp_path / "run.png")])
    loss = result["history"]["train_loss"]
    assert loss[-1] < 0.8 * loss[0]  # labels follow the features: the model learns
    saved = json.loads(out.read_text())
    assert saved["world_size"] == 1 and saved["epochs"] == 25
    assert 0.0 <= saved["best"]["test_acc"] <= 1.0
    assert os.path.getsize(tmp_path / "run.png") > 0


def test_resume_continues_the_same_run(root, tmp_path):
    ckpt = str(tmp_path / "ckpt.pt")
    whole = run(["--root", root, "--epochs", "4"])
    run(["--root", root, "--epochs", "2", "--checkpoint", ckpt])
    resumed = run(["--root", root, "--epochs", "4", "--checkpoint", ckpt, "--resume"])
    assert resumed["epochs"] == 4
    # Seeds per epoch and rank: the resumed run repeats the uninterrupted one.
    assert resumed["history"]["train_loss"] == pytest.approx(whole["history"]["train_loss"],
                                                             rel=1e-6)


@NEEDS_SAMPLER
def test_mini_batch(root):
    result = run(["--root", root, "--epochs", "2", "--fanout", "5,5", "--batch-size", "32"])
    assert result["steps_per_epoch"] == -(-144 // 32)  # 60% of 240 nodes train
    assert result["history"]["train_loss"][-1] > 0


# Full-batch DDP also runs in test_ddp_gradients_equal_one_process: with --full here.
@pytest.mark.parametrize("fanout", [pytest.param(None, marks=pytest.mark.slow),
                                    pytest.param("5,5", marks=NEEDS_SAMPLER)],
                         ids=["full_batch", "mini_batch"])
def test_two_processes_gloo(root, tmp_path, fanout):
    out = tmp_path / "ddp.json"
    argv = [*SMALL, "--root", root, "--epochs", "2", "--json", str(out)]
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
        assert result["steps_per_epoch"] == -(-72 // 32)


# DDP gradients against one process ---------------------------------------------

def _model(num_features: int, num_classes: int):
    torch.manual_seed(0)
    return train_ogb.GAT(train_ogb.LAYERS["ours"], num_features, 8, num_classes, 2, 2,
                         dropout=0.0, attn_dropout=0.0)


def _loss(model, data, nodes):
    return F.cross_entropy(model(data.x, data.edge_index)[nodes], data.y[nodes])


def _ddp_rank(rank, world, init_method, root, out_file):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    data, split, num_classes = train_ogb.load("ogbn-arxiv", root)
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
    data, split, num_classes = train_ogb.load("ogbn-arxiv", root)
    model = _model(data.num_features, num_classes)
    halves = [train_ogb.rank_share(split["train"], 1, 0, rank, 2) for rank in (0, 1)]
    (sum(_loss(model, data, nodes) for nodes in halves) / 2).backward()
    for name, param in model.named_parameters():
        assert torch.equal(first[name], again[name]), name
        torch.testing.assert_close(first[name], param.grad, rtol=1e-5, atol=1e-7, msg=name)
