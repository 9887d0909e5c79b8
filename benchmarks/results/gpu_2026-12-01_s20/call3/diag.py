import sys, traceback, torch, torch._dynamo
import pyg_multihead_agg.nn.gat_conv as G
from torch_geometric import EdgeIndex
from pyg_multihead_agg.nn import GATConv
torch._dynamo.config.verbose = True
dev = "cuda"
orig_compact = G.compact_indices

def case(backend, compact, grad):
    torch._dynamo.reset()
    G.compact_indices = orig_compact if compact else (lambda r, c, csc, n: (r, c, csc))
    torch.manual_seed(0)
    n, e = 50, 300
    ei = torch.randint(0, n, (2, e))
    ei = torch.cat([ei, torch.arange(n).repeat(2, 1)], 1)
    ei = ei[:, torch.argsort(ei[1] * n + ei[0])]
    adj = EdgeIndex(ei.to(dev), sparse_size=(n, n), sort_order="col").fill_cache_()
    conv = GATConv(16, 8, heads=4, add_self_loops=False).to(dev)
    x = torch.randn(n, 16, device=dev)
    c = torch.compile(conv, fullgraph=True, backend=backend)
    try:
        with torch.set_grad_enabled(grad):
            out = c(x, adj)
            if grad:
                out.sum().backward()
        print(f"== {backend} compact={compact} grad={grad}: ok", flush=True)
    except Exception:
        print(f"== {backend} compact={compact} grad={grad}: FAILED", flush=True)
        traceback.print_exc(limit=-25)

for backend in ("inductor", "aot_eager"):
    for compact in (True, False):
        for grad in (False, True):
            case(backend, compact, grad)
