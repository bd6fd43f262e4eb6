"""Every chapter and lab runs top to bottom under papermill with SMOKE=True, on the CPU.

The lab solutions must pass every check; the generated student versions must run to the end and
print a hint for each exercise. `make test` runs these in parallel (pytest -n 2), twice: in the main
environment, and in .venv-colab with Google Colab's widget and plotting versions.
"""

from __future__ import annotations

import os
import re
from importlib.metadata import version

import nbformat
import papermill
import pytest
from nbclient import NotebookClient

from conftest import ROOT

OUT = ROOT / "_build" / "papermill"
# Two notebooks run at once on two cores: one thread each, or their BLAS threads fight and the
# labs' timing checks see the contention instead of the code.
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = "1"
CHAPTERS = sorted(ROOT.glob("notebooks/*.ipynb"))
SOLUTIONS = sorted(ROOT.glob("labs/solutions/*.ipynb"))
STUDENT_LABS = sorted(ROOT.glob("labs/*.ipynb"))
# No cell of a SMOKE run takes more than seconds. A limit turns a stuck execution into a failure
# that names the cell, where none would leave CI waiting until its own time runs out.
CELL_TIMEOUT_S = 300


def execute(path):
    OUT.mkdir(parents=True, exist_ok=True)
    target = OUT / f"{path.parent.name}__{path.name}"
    papermill.execute_notebook(str(path), str(target), parameters={"SMOKE": True}, cwd=str(path.parent),
                               progress_bar=False, kernel_name="python3", execution_timeout=CELL_TIMEOUT_S)
    nb = nbformat.read(target, as_version=4)
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_runs(path):
    execute(path)


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_lab_solution_passes_every_check(path):
    text = execute(path)
    assert "NOT YET" not in text
    assert "checks pass" in text and text.count("PASS ") >= 2


@pytest.mark.parametrize("path", STUDENT_LABS, ids=lambda p: p.name)
def test_student_lab_runs_to_the_end_with_hints(path):
    text = execute(path)
    assert "NOT YET" in text and "hint:" in text
    assert "0 of" in text  # the summary at the very end ran


@pytest.mark.skipif(os.environ.get("GPULAB_COLAB_VERSIONS") != "1", reason="only in the colab stage")
def test_the_colab_stage_runs_colab_versions():
    pins = dict(re.findall(r"^([\w-]+)==(\S+)$", (ROOT / "requirements-colab.txt").read_text(), re.MULTILINE))
    for package in ("ipywidgets", "plotly", "ipython", "ipykernel"):
        assert version(package) == pins[package], package


# The setup cell on Colab: it fetches the book with git, and must say in one sentence what failed if it cannot.
SETUP_TAG = "setup"


def run_setup_cell(tmp_path, monkeypatch, repository: str) -> list[dict]:
    """Run chapter 01's setup cell as Colab would (a stand-in ``google.colab`` module), fetching the book from
    ``repository`` into a folder of ``tmp_path``, then ask where gpulab came from; return the outputs of both."""
    fake = tmp_path / "fake_colab" / "google" / "colab"  # google stays a namespace package: protobuf lives there too
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "output.py").write_text("def enable_custom_widget_manager():\n    pass\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake_colab"))
    monkeypatch.setenv("GPULAB_REPOSITORY", repository)
    monkeypatch.setenv("GPULAB_BOOK_DIR", str(tmp_path / "book"))
    chapter = nbformat.read(CHAPTERS[0], as_version=4)
    [setup] = [c for c in chapter.cells if SETUP_TAG in c.metadata.get("tags", [])]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(setup.source), nbformat.v4.new_code_cell(
        "import sys\nprint('gpulab from', sys.modules['gpulab'].__file__ if 'gpulab' in sys.modules else None)")])
    NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    return [output for cell in nb.cells for output in cell.outputs]


def test_the_setup_cell_fetches_the_book_without_its_solutions(tmp_path, monkeypatch):
    outputs = run_setup_cell(tmp_path, monkeypatch, f"file://{ROOT}")
    assert not [o for o in outputs if o["output_type"] == "error"], outputs
    assert any("gpulab-banner" in o.get("data", {}).get("text/html", "") for o in outputs), outputs  # it ran
    assert f"gpulab from {tmp_path / 'book'}" in outputs[-1]["text"]  # the fetched copy, not an installed one
    assert (tmp_path / "book" / "labs").is_dir() and not (tmp_path / "book" / "labs" / "solutions").exists()


def test_the_setup_cell_says_what_failed_when_the_book_cannot_be_fetched(tmp_path, monkeypatch):
    outputs = run_setup_cell(tmp_path, monkeypatch, "http://127.0.0.1:9/book.git")  # nothing listens on port 9
    setup_outputs = outputs[:-1]
    assert [o["output_type"] for o in setup_outputs] == ["stream"], setup_outputs  # one line, no traceback
    line = setup_outputs[0]["text"].strip()
    assert line.startswith("Could not fetch the book's code from http://127.0.0.1:9/book.git (") and "\n" not in line
    assert "set GPULAB_REPOSITORY" in line and "Traceback" not in line
