"""The documentation runs: every Python block of README.md as pasted, and the
Examples block of every public function and class (doctest), on the CPU."""
import doctest
import re
from pathlib import Path

import pytest

import pyg_multihead_agg
import pyg_multihead_agg.graph
import pyg_multihead_agg.nn.gat_conv
import pyg_multihead_agg.ops

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index):
    # Each block on its own, in a fresh namespace: as pasted into a new session.
    exec(compile(BLOCKS[index], f"README.md python block {index + 1}", "exec"), {})


PUBLIC = [pyg_multihead_agg.multihead_spmm, pyg_multihead_agg.gat_attention,
          pyg_multihead_agg.gatv2_attention,
          pyg_multihead_agg.prepare_adjacency, pyg_multihead_agg.check_csr,
          pyg_multihead_agg.check_csc, pyg_multihead_agg.csr_to_csc,
          pyg_multihead_agg.invert_perm, pyg_multihead_agg.graph.prepare,
          pyg_multihead_agg.graph.set_index_check, pyg_multihead_agg.nn.GATConv,
          pyg_multihead_agg.nn.GATv2Conv, pyg_multihead_agg.transformer_attention,
          pyg_multihead_agg.nn.TransformerConv]


@pytest.mark.parametrize("obj", PUBLIC, ids=lambda o: o.__qualname__)
def test_docstring_example_runs(obj):
    assert "Example" in obj.__doc__ and ">>>" in obj.__doc__, obj
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(obj, obj.__qualname__, globs={}):
        runner.run(test)
    assert runner.failures == 0 and runner.tries > 0
