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
