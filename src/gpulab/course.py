"""The book as a course: how long each chapter's experiments take on each GPU, in each profile, for the
instructors' page (``book/chapter_times.ipynb``); and every chapter's claims (:mod:`gpulab.core.claims`), which the
tests check against every recorded GPU.

Each chapter's plan (``gpulab.chNN_topic.plan.CHAPTER``, a :class:`gpulab.core.budget.Chapter`) predicts its time;
``make gpu-run`` measures it (``results/<gpu>/gpu_run/<profile>.json``, each notebook's seconds). This module puts
the two side by side. It is the one module above the chapters: it reads every chapter's plan, and nothing in the
library imports it.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from functools import cache
from pathlib import Path

import gpulab
from gpulab.core import budget, claims, recordings, specs
from gpulab.core.budget import PREDICTED
from gpulab.core.tables import Column, Table, table


def chapters() -> list[str]:
    """The chapter packages, in the book's order: 'ch01_cpus_to_gpus', ..."""
    return sorted(m.name for m in pkgutil.iter_modules(gpulab.__path__) if re.fullmatch(r"ch\d\d_\w+", m.name))


@cache
def plan(chapter: str) -> budget.Chapter:
    return importlib.import_module(f"gpulab.{chapter}.plan").CHAPTER


def chapter_claims(chapter: str) -> list[claims.Claim]:
    """The claims ``gpulab.<chapter>.claims`` states, in the order the module defines them (none without one)."""
    try:
        module = importlib.import_module(f"gpulab.{chapter}.claims")
    except ModuleNotFoundError as error:
        if error.name != f"gpulab.{chapter}.claims":
            raise
        return []
    return [value for value in vars(module).values() if isinstance(value, claims.Claim)]


def all_claims() -> list[tuple[str, claims.Claim]]:
    """(chapter, claim) for every chapter's claims, in the book's order."""
    return [(chapter, claim) for chapter in chapters() for claim in chapter_claims(chapter)]


def title(chapter: str) -> str:
    """'03 BLAS levels' from 'ch03_blas_levels' (the package's name, for a table's row)."""
    number, _, words = chapter[2:].partition("_")
    return f"{number} {words.replace('_', ' ')}"


def predicted_rows(profile: str, gpus: tuple[str, ...] = PREDICTED) -> list[dict]:
    """Per chapter: the predicted minutes of ``profile`` on each of ``gpus`` (a column per GPU)."""
    budget.check_profile(profile)
    rows = []
    for chapter in chapters():
        row = {"chapter": title(chapter)}
        for name in gpus:
            gpu = specs.gpu(name)
            row[name] = plan(chapter).plan(profile, gpu).seconds_on(gpu) / 60
        rows.append(row)
    return rows


def predicted_table(profile: str, gpus: tuple[str, ...] = PREDICTED) -> Table:
    rows = predicted_rows(profile, gpus)
    rows.append({"chapter": "the whole book", **{g: sum(r[g] for r in rows) for g in gpus}})
    return table(rows, [Column("chapter"), *(Column(g, g, "min", ",.1f", align="right") for g in gpus)],
                 caption=f"the {profile} profile's compute time per chapter, predicted from each chapter's plan and "
                         "the GPU's datasheet rates (gpulab.core.budget)")


def measured_runs(root: Path | None = None) -> list[dict]:
    """Every ``make gpu-run`` time recording: {'gpu', 'device', 'profile', 'date', 'notebooks': [...]}."""
    root = root or recordings.results_dir()
    found = []
    for path in sorted(root.glob("*/gpu_run/*.json")) if root else []:
        data = json.loads(path.read_text())
        found.append({"gpu": data["device"]["name"], "profile": data["profile"], "date": data["date"][:10],
                      "notebooks": data["notebooks"]})
    return found


def measured_rows(root: Path | None = None) -> list[dict]:
    """Per chapter and per GPU with a ``make gpu-run`` time recording: predicted and measured minutes of each
    profile run there (a GPU the datasheet table lacks gets no prediction)."""
    rows = []
    for run in measured_runs(root):
        row = specs.find(run["gpu"])
        for entry in run["notebooks"]:
            stem = Path(entry["notebook"]).stem
            chapter = f"ch{stem}"
            if not entry["notebook"].startswith("notebooks/") or chapter not in chapters():
                continue
            predicted = plan(chapter).plan(run["profile"], row).seconds_on(row) / 60 if row else None
            rows.append({"chapter": title(chapter), "gpu": run["gpu"], "profile": run["profile"],
                         "predicted": predicted, "measured": entry["seconds"] / 60,
                         "ratio": entry["seconds"] / 60 / predicted if predicted else None,
                         "status": entry["status"], "date": entry.get("date", run["date"])[:10]})
    return rows


def measured_table(root: Path | None = None) -> Table:
    return table(measured_rows(root), [
        Column("chapter"), Column("gpu", "GPU"), Column("profile"),
        Column("predicted", "predicted", "min", ",.1f"), Column("measured", "measured", "min", ",.1f"),
        Column("ratio", "measured / predicted", "", ".2f"), Column("date", "run on")],
        caption="each chapter's time in `make gpu-run` against its plan's prediction, on the GPUs it ran on")


def lab_rows(root: Path | None = None) -> list[dict]:
    """Per lab and GPU: the measured minutes of its solution in a ``make gpu-run`` (the labs have one size)."""
    return [{"lab": Path(entry["notebook"]).stem.replace("_", " "), "gpu": run["gpu"],
             "measured": entry["seconds"] / 60, "date": entry.get("date", run["date"])[:10]}
            for run in measured_runs(root) for entry in run["notebooks"] if entry["notebook"].startswith("labs/")]


def lab_table(root: Path | None = None) -> Table:
    return table(lab_rows(root), [Column("lab"), Column("gpu", "GPU"), Column("measured", "measured", "min", ",.1f"),
                                  Column("date", "run on")],
                 caption="each lab's solution run top to bottom in `make gpu-run`")

