"""Run a measurement over many parameter points without letting one failure end the notebook.

A size too big for the device's memory is the commonest failure of a sweep, whether the size is
refused before anything is allocated (:class:`gpulab.core.validation.DoesNotFit`) or the allocator runs
out part-way (CUDA out of memory): the row says "out of memory", the allocator's cache is emptied
and the sweep goes on. Plots draw such rows as "out of memory at N" instead of a point.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Mapping

import torch

from gpulab.core.validation import DoesNotFit

OUT_OF_MEMORY = "out of memory"


def _is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, torch.cuda.OutOfMemoryError | MemoryError | DoesNotFit):
        return True
    message = str(error).lower()
    return "out of memory" in message or "can't allocate memory" in message


def run_sweep(measure: Callable[..., dict], points: Iterable[Mapping]) -> list[dict]:
    """Call ``measure(**point)`` for every point; a row per point, with ``status`` 'ok' or 'out of memory'."""
    rows = []
    for point in points:
        try:
            row = {**point, **measure(**point), "status": "ok"}
        except (RuntimeError, MemoryError, DoesNotFit) as error:
            if not _is_out_of_memory(error):
                raise
            row = {**point, "status": OUT_OF_MEMORY}
            del error
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        rows.append(row)
    return rows


def ok_rows(rows: Iterable[dict]) -> list[dict]:
    return [row for row in rows if row.get("status", "ok") == "ok"]
