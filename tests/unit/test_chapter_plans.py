"""Every chapter is ready for a class: sizes from a time budget, and a worked answer to each of its exercises.

A chapter's package holds ``plan.CHAPTER`` (a :class:`gpulab.core.budget.Chapter`: its sizes in every setting and
its work) and ``answers`` (``exercise_1`` ... ``exercise_n``, one per exercise of the notebook's Exercises list).
The class profile must fit :data:`gpulab.core.budget.CLASS_SECONDS` on a T4; the notebook must take its sizes
from the plan (its parameters cell names ``PROFILE``) and show the predicted times.
"""

from __future__ import annotations

import importlib
import re

import nbformat
import pytest

from conftest import ROOT
from gpulab.core import budget, printing, specs

CHAPTERS = sorted(path.stem for path in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
T4 = specs.gpu(budget.CLASS_GPU)


def package(chapter: str, module: str):
    return importlib.import_module(f"gpulab.ch{chapter}.{module}")


def notebook(chapter: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "notebooks" / f"{chapter}.ipynb", as_version=4)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_class_profile_fits_the_budget_on_a_t4_and_the_full_profile_is_larger(chapter):
    plan = package(chapter, "plan").CHAPTER
    chosen = plan.plan("class", T4)
    assert chosen.fits(T4)
    assert chosen.seconds_on(T4) <= budget.CLASS_SECONDS, (chosen.sizes, chosen.seconds_on(T4))
    full = plan.plan("full", T4)
    assert full.seconds_on(T4) >= chosen.seconds_on(T4)
    for gpu in budget.PREDICTED:  # every GPU a class may have gets a plan and a time
        assert plan.plan("class", specs.gpu(gpu)).seconds_on(specs.gpu(gpu)) > 0


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_notebook_takes_its_sizes_from_the_plan_and_shows_the_prediction(chapter):
    cells = notebook(chapter).cells
    parameters = next(c for c in cells if "parameters" in c.metadata.get("tags", []))
    assert re.search(r'^PROFILE = "full"', parameters.source, re.MULTILINE), "PROFILE in the parameters cell"
    code = "\n".join(c.source for c in cells if c.cell_type == "code")
    assert ".choose(PROFILE, smoke=SMOKE)" in code
    assert ".prediction_table(PROFILE)" in code


def exercises(chapter: str) -> list[str]:
    cell = next(c for c in notebook(chapter).cells if c.cell_type == "markdown" and "## Exercises" in c.source)
    section = cell.source.split("## Exercises", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^(\d+)\. ", section, re.MULTILINE)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_each_exercise_has_a_worked_answer_on_the_page(chapter):
    answers = printing.exercise_answers(package(chapter, "answers"))
    assert len(answers) == len(exercises(chapter)) > 0
    for number, answer in enumerate(answers, 1):
        assert answer.title == f"Answer to exercise {number}"
        assert sum(len(line) for line in answer.lines) > 80, f"exercise {number}: a worked answer, not a word"
    code = "\n".join(c.source for c in notebook(chapter).cells if c.cell_type == "code")
    assert "show_answers(answers)" in code
