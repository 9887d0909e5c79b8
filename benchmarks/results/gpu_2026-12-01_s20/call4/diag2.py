import sys, traceback, torch, torch._dynamo
from torch_geometric import EdgeIndex
from pyg_multihead_agg.nn import GATConv
from pyg_multihead_agg.adj import csr_csc_from_edge_index
dev = "cuda"
torch.manual_seed(0)
n, e = 50, 300
ei = torch.randint(0, n, (2, e))
ei = torch.cat([ei, torch.arange(n).repeat(2, 1)], 1)
ei = ei[:, torch.argsort(ei[1] * n + ei[0])]
adj = EdgeIndex(ei.to(dev), sparse_size=(n, n), sort_order="col").fill_cache_()
x = torch.randn(n, 16, device=dev)

def attempt(name, fn):
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            fn()
        print(f"== {name}: ok", flush=True)
    except Exception as exc:
        print(f"== {name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)

which = sys.argv[1]
if which == "pieces":
    attempt("csr_csc", lambda: torch.compile(lambda a: csr_csc_from_edge_index(a, n, n),
                                             fullgraph=True, backend="aot_eager")(adj))
    attempt("as_tensor", lambda: torch.compile(lambda a: a.as_tensor() + 1, fullgraph=True,
                                               backend="aot_eager")(adj))
    attempt("identity_edgeindex", lambda: torch.compile(lambda a, x: x * 2, fullgraph=True,
                                                        backend="aot_eager")(adj, x))
    conv = GATConv(16, 8, heads=4, add_self_loops=False).to(dev)
    conv.fold_scores = False
    attempt("layer_unfolded", lambda: torch.compile(conv, fullgraph=True, backend="aot_eager")(x, adj))
    conv2 = GATConv(16, 8, heads=4, add_self_loops=False).to(dev)
    attempt("layer_plain_edge_index", lambda: torch.compile(conv2, fullgraph=True, backend="aot_eager")(
        x, adj.as_tensor()))
    xc = x.cpu(); adjc = EdgeIndex(ei, sparse_size=(n, n), sort_order="col").fill_cache_()
    conv3 = GATConv(16, 8, heads=4, add_self_loops=False)
    attempt("layer_cpu", lambda: torch.compile(conv3, fullgraph=True, backend="aot_eager")(xc, adjc))
else:
    conv = GATConv(16, 8, heads=4, add_self_loops=False).to(dev)
    attempt("layer", lambda: torch.compile(conv, fullgraph=True, backend="aot_eager")(x, adj))
