"""Shared benchmark machinery: timing, memory, errors, bandwidth, and the
reports (metadata block, JSON + Markdown + PNG writer) of every script.

Rules: CUDA events after warm-up (time.perf_counter on the CPU), the median of
at least 10 repeats, every result checked against a float64 reference before
it is timed, out-of-memory reported, not fatal. Results go to
``benchmarks/reference/<benchmark>_<device>.{json,md,png}``, replaced by each
run.
"""
import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

import torch
from torch import Tensor

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64}

# Norm-wise relative error allowed against the float64 reference. Half types
# are compared with references computed from the same rounded inputs, so only
# the rounding of outputs and intermediates counts.
TOLERANCE = {torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float32: 1e-4,
             torch.float64: 1e-10}

# Where every benchmark writes by default: the latest results only.
REFERENCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference")

_START = time.perf_counter()

T = TypeVar("T")


def log(msg: str) -> None:
    """Progress line with the time since start, flushed at once."""
    print(f"[{time.perf_counter() - _START:7.1f} s] {msg}", flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    msg = str(exc)
    return ("out of memory" in msg or "can't allocate memory" in msg
            or "CUSPARSE_STATUS_ALLOC_FAILED" in msg)


# Timing

def time_fn(fn: Callable[[], Any], device: torch.device, *, repeats: int = 10,
            warmup: int = 1, budget_s: float = 0.5, max_repeats: int = 200) -> List[float]:
    """Milliseconds of ``fn()`` per repeat, after ``warmup`` untimed calls.

    ``repeats`` timed calls, then more (up to ``max_repeats`` in all) while
    they fit in ``budget_s``, so that short kernels get a stable median.
    """
    for _ in range(warmup):
        fn()
    sync(device)
    times = _timed(fn, device, repeats)
    more = min(max_repeats - repeats, int((budget_s * 1e3 - sum(times)) / max(min(times), 1e-6)))
    if more > 0:
        times += _timed(fn, device, more)
    return times


def _timed(fn: Callable[[], Any], device: torch.device, n: int) -> List[float]:
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(n)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) for start, end in events]
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return times


def peak_extra_memory(fn: Callable[[], Any], device: torch.device) -> Optional[int]:
    """Bytes allocated by one ``fn()`` call beyond what was live before it (the
    inputs), including its outputs. None on the CPU (not measured, no call)."""
    if device.type != "cuda":
        return None
    sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    return torch.cuda.max_memory_allocated(device) - base


def copy_bandwidth(device: torch.device, nbytes: int = 0) -> float:
    """Bytes per second of a large device-to-device copy, counting the bytes read
    and the bytes written (the ceiling for a gather-bound kernel)."""
    if nbytes <= 0:
        nbytes = (1 << 30) if device.type == "cuda" else (256 << 20)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = statistics.median(time_fn(lambda: dst.copy_(src), device, repeats=10, budget_s=0.3))
    return 2 * nbytes / (ms * 1e-3)


def gather_bytes(num_edges: int, num_dst: int, heads: int, channels: int,
                 elem_size: int, index_size: int = 4) -> int:
    """Bytes that an aggregation must move at least: the column indices, the
    weights, one gathered source row per edge and the output
    ((E*4 + E*H*s + E*H*D*s + N*H*D*s) with int32 indices)."""
    return (num_edges * index_size + num_edges * heads * elem_size
            + num_edges * heads * channels * elem_size + num_dst * heads * channels * elem_size)


# Checking

def rel_error(out: Tensor, ref: Tensor) -> float:
    """Norm-wise relative error ``||out - ref|| / ||ref||`` in float64; inf when
    ``out`` has NaN / inf or the wrong shape."""
    if out.shape != ref.shape:
        return float("inf")
    out = out.detach()
    if not bool(torch.isfinite(out).all()):
        return float("inf")
    diff = (out.double() - ref.double()).norm()
    return float(diff / ref.double().norm().clamp_min(1e-300))


def check_subset(num: int, limit: int, device: torch.device, *, seed: int = 1,
                 always: Optional[Tensor] = None) -> Optional[Tensor]:
    """Sorted ids to compare on: None (all ``num``) if ``num <= limit``, else a
    seeded random ``limit`` plus ``always`` (e.g. the longest rows)."""
    if num <= limit:
        return None
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randperm(num, generator=gen)[:limit].to(device)
    if always is not None:
        ids = torch.cat([ids, always.to(device)])
    return torch.unique(ids)


# Metadata: what every result file records about its run

def git_commit() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, check=True,
                                capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=here, check=True, capture_output=True, text=True).stdout
        return commit + ("+dirty" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_name() -> str:
    """CPU model and the number of cores this process may use."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {cores} cores"


def device_name(device: torch.device) -> str:
    """The machine that ran the benchmark: the GPU's name, or the CPU model with
    its core count and torch's thread count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_name()}, {torch.get_num_threads()} threads"


def environment(device: torch.device, argv: Sequence[str]) -> Dict[str, Any]:
    """The metadata block of a result: date, machine, versions, git commit, command."""
    import torch_geometric

    import pyg_multihead_agg

    try:
        import torch_sparse
        sparse_version = torch_sparse.__version__
    except ImportError:
        sparse_version = None
    now = datetime.datetime.now(datetime.timezone.utc)
    meta = {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "device": device.type,
        "machine": device_name(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "torch_geometric": torch_geometric.__version__,
        "torch_sparse": sparse_version,
        "pyg_multihead_agg": pyg_multihead_agg.__version__,
        "python": platform.python_version(),
        "git_commit": git_commit(),
        "command": " ".join(["python"] + list(argv)),
    }
    if device.type == "cuda":
        meta["host_cpu"] = cpu_name()
    if device.type == "cpu":
        # Other processes on the cores slow down every multi-threaded kernel.
        meta["load_average_1min"] = round(os.getloadavg()[0], 2)
    return meta


@dataclass
class Row:
    """One measured configuration. ``status`` is "ok", "out of memory",
    "unsupported: ..." or "error: ..."; ``check`` is "ok" or "FAIL"."""
    shape: str
    dtype: str
    method: str
    pass_: str = "forward"
    ms: Optional[float] = None
    times_ms: List[float] = field(default_factory=list)
    peak_extra_bytes: Optional[int] = None
    rel_err: Optional[float] = None
    rel_errs: Dict[str, float] = field(default_factory=dict)
    check: Optional[str] = None
    gbps: Optional[float] = None
    pct_copy: Optional[float] = None
    speedup: Dict[str, float] = field(default_factory=dict)
    status: str = "ok"
    extra: Dict[str, Any] = field(default_factory=dict)


def describe_failure(exc: BaseException) -> str:
    if is_oom(exc):
        return "out of memory"
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    kind = "unsupported" if isinstance(exc, NotImplementedError) else "error"
    return f"{kind}: {type(exc).__name__}: {first[:160]}"


def run_guarded(row: Row, body: Callable[[Row], None], device: torch.device) -> Row:
    """Runs ``body(row)``; an exception becomes ``row.status`` instead of ending
    the benchmark (traceback to stderr for anything but out-of-memory)."""
    try:
        body(row)
    except Exception as exc:  # noqa: BLE001  (every row must be reported)
        row.status = describe_failure(exc)
        row.extra["error"] = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        row.ms = None
        if row.status.startswith("error"):
            traceback.print_exc(file=sys.stderr)
    free_memory(device)
    return row


def rotated(items: Sequence[T], k: int) -> List[T]:
    """``items`` rotated left by ``k``: round ``k``'s order when the
    configurations of a benchmark take turns, so that a drift of the
    machine's speed reaches each of them alike."""
    k = k % len(items) if items else 0
    return list(items[k:]) + list(items[:k])


def take_turns(entries: Sequence[Tuple[Row, T]], rounds: int,
               run: Callable[[Row, T, int], None], device: torch.device) -> None:
    """``rounds`` rounds in which every entry whose row is still "ok" runs
    once, ``run(row, item, round)`` under ``run_guarded``, in the order
    rotated every round: a row that fails leaves the rounds with its error."""
    for k in range(rounds):
        for row, item in rotated(entries, k):
            if row.status == "ok":
                run_guarded(row, lambda r, item=item, k=k: run(r, item, k), device)


def add_speedups(rows: List[Row], peers: Sequence[str],
                 group: Callable[[Row], Tuple] = lambda r: (r.shape, r.dtype, r.pass_)) -> None:
    """``row.speedup[peer] = peer ms / row ms`` within each (shape, dtype, pass)."""
    peer_ms = {(group(r), r.method): r.ms for r in rows if r.method in peers and r.ms}
    for r in rows:
        if r.ms:
            for p in peers:
                t = peer_ms.get((group(r), p))
                if t and p != r.method:
                    r.speedup[p] = t / r.ms


def fmt_bytes(n: Optional[int]) -> str:
    if n is None:
        return "-"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / (1 << 20):.1f} MiB"


def fmt_ms(r: Row) -> str:
    if r.ms is None:
        return r.status.split(":")[0]  # the full message is in the notes and the JSON
    return f"{r.ms:.3f}" if r.ms < 10 else f"{r.ms:.1f}"


def fmt_err(r: Row) -> str:
    if r.rel_err is None:
        return "-"
    flag = "" if r.check == "ok" else " FAIL"
    return f"{r.rel_err:.1e}{flag}"


def fmt_speedup(r: Row, peer: str) -> str:
    s = r.speedup.get(peer)
    return "-" if s is None else f"{s:.2f}x"


def markdown_table(headers: Sequence[str], cells: List[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h)
              for i, h in enumerate(headers)]

    def line(values):
        return "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)) + " |"

    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(c) for c in cells]
    return "\n".join(out)


# Reports: JSON (metadata + every row), Markdown (metadata + table), PNG chart

def result_stem(kind: str, device: torch.device, tag: Optional[str] = None) -> str:
    """Fixed file name per benchmark and device (``layer_cuda``), so that each
    run replaces the last; ``tag`` adds a suffix (for side-by-side runs)."""
    return f"{kind}_{device.type}" + (f"_{tag}" if tag else "")


def failure_notes(rows: List[Row]) -> str:
    """One line per distinct failure message, for the notes under a table."""
    seen = dict.fromkeys(r.status for r in rows if r.status not in ("ok", "out of memory"))
    return "\n".join(f"- {msg}" for msg in seen)


def write_results(out_dir: str, stem: str, title: str, meta: Dict[str, Any], rows: List[Row],
                  table: str, notes: str = "", chart_peers: Sequence[str] = (),
                  chart_methods: Optional[Sequence[str]] = None) -> List[str]:
    """Writes ``stem.json`` (meta + every row), ``stem.md`` (meta + table) and
    ``stem.png`` (speed-ups over each peer), replacing earlier ones; returns
    the paths."""
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, stem)
    with open(base + ".json", "w") as f:
        json.dump({"meta": meta, "rows": [_row_dict(r) for r in rows]}, f, indent=1)
    header = "\n".join(f"- {k}: {v}" for k, v in meta.items())
    with open(base + ".md", "w") as f:
        f.write(f"# {title}\n\n{header}\n\n{table}\n")
        if notes:
            f.write(f"\n{notes}\n")
    paths = [base + ".json", base + ".md"]
    if chart_peers and _bar_chart(base + ".png", title, meta, rows, chart_peers, chart_methods):
        paths.append(base + ".png")
    elif os.path.exists(base + ".png"):
        os.remove(base + ".png")  # an older run's chart would not match the new tables
    return paths


def _row_dict(r: Row) -> Dict[str, Any]:
    d = asdict(r)
    d["pass"] = d.pop("pass_")
    return d


def _bar_chart(path: str, title: str, meta: Dict[str, Any], rows: List[Row],
               peers: Sequence[str], methods: Optional[Sequence[str]]) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib import ticker
        from matplotlib.patches import Patch
    except ImportError:
        print("matplotlib is not installed: no chart", file=sys.stderr)
        return False
    groups = list(dict.fromkeys((r.shape, r.dtype, r.pass_) for r in rows))
    if methods is None:
        methods = [m for m in dict.fromkeys(r.method for r in rows) if m not in peers]
    # One panel per peer that ran (a run limited by --methods may lack one).
    peers = [p for p in peers if any(p in r.speedup for r in rows)]
    if not peers:
        return False
    fig, axes = plt.subplots(len(peers), 1, figsize=(max(8.0, 1.1 * len(groups) * 1.6), 4.2 *
                                                    len(peers)), squeeze=False)
    speedups = {(r.shape, r.dtype, r.pass_, r.method): r.speedup for r in rows}
    for ax, peer in zip(axes[:, 0], peers, strict=True):
        values, shown = [], set()
        for g, key in enumerate(groups):
            # Centre the bars of the methods that have a value in this group.
            present = [(k, m) for k, m in enumerate(methods)
                       if peer in speedups.get(key + (m,), {})]
            width = 0.8 / max(len(present), 1)
            for slot, (k, m) in enumerate(present):
                v = speedups[key + (m,)][peer]
                bars = ax.bar([g - 0.4 + width * (slot + 0.5)], [v], width, color=f"C{k % 10}")
                ax.bar_label(bars, fmt="%.1f", fontsize=6, rotation=90, padding=2)
                values.append(v)
                shown.add(k)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_ylim(min([0.5] + [v / 1.5 for v in values]), max([2.0] + [v * 2 for v in values]))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlim(-0.6, len(groups) - 0.4)
        ax.set_ylabel(f"speed-up over\n{peer}")
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(["\n".join(str(x) for x in g) for g in groups], fontsize=7)
        # The methods drawn in this panel (a peer of one layer family has no bars of another).
        ax.legend(handles=[Patch(color=f"C{k % 10}", label=m) for k, m in enumerate(methods)
                           if k in shown], fontsize=7, ncol=2)
    fig.suptitle(f"{title}\n{meta['machine']}, torch {meta['torch']}, "
                 f"PyG {meta['torch_geometric']}, {meta['date']}, commit {meta['git_commit']}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def benchmark_parser(description: str, check_limit: int) -> "argparse.ArgumentParser":
    """The options both benchmark scripts share; each adds its own."""
    from graphs import SHAPES
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", choices=["cpu", "cuda"],
                        default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shapes", default=None,
                        help="comma list of " + ", ".join(list(SHAPES) + ["cora"]) +
                        " (default: cora-like,arxiv-like on cpu, the four synthetic on cuda)")
    parser.add_argument("--dtypes", default="float32,bfloat16",
                        help="comma list of " + ", ".join(DTYPES))
    parser.add_argument("--repeats", type=int, default=10,
                        help="timed repeats at least (more for short runs); median reported")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed calls before timing, besides the check and memory runs "
                        "(default: 1 on cuda, 0 on cpu)")
    parser.add_argument("--check-limit", type=int, default=check_limit,
                        help="check every row, source and edge of graphs with at most this "
                        "many edges, else a seeded sample that holds about this many")
    parser.add_argument("--data-root", default=None,
                        help="folder holding Cora/raw, for --shapes cora (default ../shared/data)")
    parser.add_argument("--threads", default=None,
                        help="CPU: comma list of thread counts to run every shape with (e.g. "
                        "1,2; each shape is labelled with its count; default: torch's)")
    add_output_args(parser)
    return parser


def thread_counts(args, device: torch.device) -> List[Optional[int]]:
    """The CPU thread counts of --threads ([None]: torch's own, and always on CUDA)."""
    if device.type != "cpu" or not args.threads:
        return [None]
    return [int(t) for t in args.threads.split(",")]


def set_threads(count: Optional[int], shape: str) -> str:
    """Sets torch's CPU threads (None: leave them); the label of the shape's rows."""
    if count is None:
        return shape
    torch.set_num_threads(count)
    return f"{shape}, {count} thread{'s' if count > 1 else ''}"


def add_output_args(parser: "argparse.ArgumentParser") -> None:
    """--out and --tag, the same in every script."""
    parser.add_argument("--out", default=REFERENCE_DIR,
                        help="folder for <benchmark>_<device>.{json,md,png}, replaced each run "
                        "(default: benchmarks/reference)")
    parser.add_argument("--tag", default=None,
                        help="suffix of the file names, to keep a run beside the reference")


def summary_line(meta: Dict[str, Any]) -> str:
    """The one line printed above a script's final table."""
    return (f"{meta['machine']}, torch {meta['torch']}, PyG {meta['torch_geometric']}, "
            f"commit {meta['git_commit']}")


def parse_benchmark_args(parser: "argparse.ArgumentParser", argv: Optional[Sequence[str]]):
    """Parses and checks the shared options: (args, device, shapes, dtypes)."""
    from graphs import SHAPES
    args = parser.parse_args(argv)
    if args.repeats < 10:
        parser.error("--repeats must be at least 10 (the median of >= 10 runs is reported)")
    device = torch.device(args.device)
    if args.warmup is None:
        args.warmup = 1 if device.type == "cuda" else 0
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch.cuda.is_available() is False")
    shapes = (args.shapes.split(",") if args.shapes else
              ["cora-like", "arxiv-like"] if device.type == "cpu" else list(SHAPES))
    try:
        dtypes = [DTYPES[d] for d in args.dtypes.split(",")]
    except KeyError as exc:
        parser.error(f"unknown dtype {exc}; choose from {', '.join(DTYPES)}")
    return args, device, shapes, dtypes
