"""PyG's own tests of GATConv, GATv2Conv and TransformerConv, run with this
package's layers swapped in for PyG's.

    python tools/pyg_upstream.py --pyg PATH [--files gat gatv2 transformer]

PATH is a PyG source tree (a clone of pyg-team/pytorch_geometric, any
commit or release tag): its `test/nn/conv/test_<layer>_conv.py` files run
under its own pytest settings, against the installed `torch_geometric`, with
`torch_geometric.nn.GATConv` (and the other two) replaced by
`pyg_multihead_agg.nn`'s before the test files import them. Every test
reports how many times our fused operators ran in it; a test in which they
never ran is listed with the reason, where one is known. Exit code 0 when
every test passed (or was skipped by PyG's own conditions) and the fused
operators ran in each file.

The same module is the pytest plugin that swaps the classes (`-p
pyg_upstream`, with this folder on PYTHONPATH).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

FILES = {"gat": "test_gat_conv.py", "gatv2": "test_gatv2_conv.py",
         "transformer": "test_transformer_conv.py"}
SWAPPED = ("GATConv", "GATv2Conv", "TransformerConv")

# Tests of PyG's files that cannot show our fused operator run, by name,
# with the reason (none today: every test of the three files runs it).
NOT_FUSED: dict = {}


# ---------------------------------------------------------------------------
# The plugin
# ---------------------------------------------------------------------------

def pytest_configure(config):
    import torch_geometric.nn as pyg_nn
    import torch_geometric.nn.conv as pyg_conv

    import pyg_multihead_agg.nn as ours
    for name in SWAPPED:
        setattr(pyg_nn, name, getattr(ours, name))
        setattr(pyg_conv, name, getattr(ours, name))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    # Counts the calls of our forward operators while the test runs.
    from torch.utils._python_dispatch import TorchDispatchMode

    class FusedCalls(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "pyg_multihead_agg" and "backward" not in func.__name__:
                FusedCalls.calls += 1
            return func(*args, **(kwargs or {}))

    with FusedCalls():
        yield
    item.user_properties.append(("fused_calls", FusedCalls.calls))


# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------

def run_file(pyg: Path, name: str, extra) -> dict:
    path = pyg / "test" / "nn" / "conv" / FILES[name]
    if not path.is_file():
        raise SystemExit(f"--pyg {pyg}: no {path.relative_to(pyg)} (is it a PyG source tree?)")
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        config = pyg / "pyproject.toml"
        cmd = [sys.executable, "-m", "pytest", str(path), "-p", "pyg_upstream",
               "-p", "no:cacheprovider", "--rootdir", str(pyg), "--junitxml", str(junit),
               "-q", "--color=no", *(["-c", str(config)] if config.is_file() else []), *extra]
        env = dict(os.environ)
        here = str(Path(__file__).resolve().parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        tests = []
        if junit.is_file():
            for case in ET.parse(junit).getroot().iter("testcase"):
                status = "passed"
                for tag in ("failure", "error", "skipped"):
                    node = case.find(tag)
                    if node is not None:
                        status = {"failure": "failed", "error": "error"}.get(tag, tag)
                        message = node.get("message", "")
                        break
                else:
                    message = ""
                props = {p.get("name"): p.get("value") for p in case.iter("property")}
                tests.append(dict(name=case.get("name"), status=status, message=message,
                                  fused_calls=int(props.get("fused_calls", 0))))
    return dict(file=FILES[name], returncode=proc.returncode, tests=tests,
                output=proc.stdout[-4000:] + proc.stderr[-2000:])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--pyg", required=True, type=Path,
                        help="a PyG source tree (holding test/nn/conv)")
    parser.add_argument("--files", nargs="+", choices=list(FILES), default=list(FILES),
                        help="which layers' test files")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    pyg = args.pyg.resolve()

    import torch
    import torch_geometric
    print(f"PyG tests from {pyg}"
          f"{_describe(pyg)}; installed torch_geometric {torch_geometric.__version__}, "
          f"torch {torch.__version__}")
    ok = True
    print("| file | passed | failed | skipped | tests with our fused op |")
    print("|---|---|---|---|---|")
    notes = []
    for name in args.files:
        result = run_file(pyg, name, args.pytest_args)
        tests = result["tests"]
        count = {s: sum(t["status"] == s for t in tests) for s in
                 ("passed", "failed", "error", "skipped")}
        fused = sum(t["fused_calls"] > 0 for t in tests if t["status"] == "passed")
        print(f"| {result['file']} | {count['passed']} | {count['failed'] + count['error']} | "
              f"{count['skipped']} | {fused} of {count['passed']} |")
        if not tests or count["failed"] or count["error"] or fused == 0:
            ok = False
            if not tests:
                notes.append(f"{result['file']}: pytest ran nothing (exit code "
                             f"{result['returncode']}):\n{result['output']}")
        for t in tests:
            base = t["name"].split("[")[0]
            if t["status"] in ("failed", "error"):
                notes.append(f"{result['file']}::{t['name']} {t['status']}: {t['message']}")
            elif t["status"] == "skipped":
                notes.append(f"{result['file']}::{t['name']} skipped by PyG: {t['message']}")
            elif t["fused_calls"] == 0:
                why = NOT_FUSED.get(base)
                notes.append(f"{result['file']}::{t['name']} passed without our fused op: "
                             f"{why or 'no known reason'}")
                ok = ok and why is not None
    for note in notes:
        print("- " + note)
    print("all passed, the fused operators ran" if ok else "FAILED")
    return 0 if ok else 1


def _describe(pyg: Path) -> str:
    # The commit of a PyG clone (not of a repository the tree sits in).
    if not (pyg / ".git").exists():
        return ""
    try:
        rev = subprocess.run(["git", "-C", str(pyg), "describe", "--tags", "--always"],
                             capture_output=True, text=True, check=True).stdout.strip()
        return f" ({rev})"
    except (OSError, subprocess.CalledProcessError):
        return ""


if __name__ == "__main__":
    sys.exit(main())
