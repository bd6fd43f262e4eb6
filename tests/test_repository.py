"""The repository's own rules: clean notebooks, current generated copies, every notebook in the book."""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest
import yaml

from conftest import ROOT

NOTEBOOKS = sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("labs/*.ipynb"), *ROOT.glob("labs/solutions/*.ipynb")])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_notebook_is_committed_without_outputs_and_has_parameters(path):
    nb = nbformat.read(path, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"cells {dirty} carry outputs: clear them before committing"
    parameters = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(parameters) == 1 and "SMOKE = False" in parameters[0].source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_prose_is_commented_out_in_a_code_cell(path):
    # a heading or a "What it shows" paragraph turned into comments vanishes from the rendered page
    nb = nbformat.read(path, as_version=4)
    hidden = [(i, line) for i, c in enumerate(nb.cells) if c.cell_type == "code" for line in c.source.splitlines()
              if line.startswith(("# # ", "# ## ", "# ### ", "# **What it shows", "# **What to look"))]
    assert not hidden, f"prose in code cells, as comments: {hidden}; move it to a markdown cell"


@pytest.mark.parametrize("tool", ["notebook_cells.py", "make_labs.py"])
def test_generated_cells_and_student_labs_are_current(tool):
    result = subprocess.run([sys.executable, str(ROOT / "tools" / tool), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, f"run `python tools/{tool}` (or `make cells` / `make labs`):\n{result.stdout}"


def test_every_chapter_and_student_lab_is_in_the_table_of_contents():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = set()

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.add(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc)
    expected = {p.relative_to(ROOT).with_suffix("").as_posix() for p in [*ROOT.glob("notebooks/*.ipynb"),
                                                                          *ROOT.glob("labs/*.ipynb")]}
    assert expected <= files, f"missing from _toc.yml: {sorted(expected - files)}"
    assert not any(f.startswith("labs/solutions") for f in files), "solutions must stay out of the book"
