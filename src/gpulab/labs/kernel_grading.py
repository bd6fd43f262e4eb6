"""The tools of the labs that grade a student's kernels ("First kernels", "Tiled matrix multiply", "Fuse it").

A kernel is run on fresh random inputs (:func:`fresh`: never zeros, which hide a wrong index), into an output
poisoned with NaN and followed by a guard zone (:func:`guarded`), through a launch that reports instead of raising
(:func:`launch`); :func:`compare` then tells unwritten elements from wrong ones. The verdicts are
:class:`KernelDiagnosis` values, recorded with :func:`gpulab.labs.grading.grade`.
"""

from __future__ import annotations

import numbers
import sysconfig
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from gpulab.core import kernel_mode
from gpulab.labs.grading import Diagnosis

PROBLEMS = ("ok", "error", "out of bounds", "unwritten", "unwritten tail", "index order", "wrong values",
            "shifted window", "race", "short k loop", "partial k tile", "transposed tile", "edge tiles")
TOLERANCE = 1e-5  # relative to the largest reference value: float32 rounding is far below it
GUARD = 64  # elements of guard zone after a vector's end


@dataclass(frozen=True)
class KernelDiagnosis(Diagnosis):
    """What a kernel's output showed: ``problem`` is one of :data:`PROBLEMS`, ``detail`` says where."""

    problems: ClassVar[tuple[str, ...]] = PROBLEMS


COVERING = "covering"  # diagnose_scale_add_row's default grid: the one that covers the matrix


def grid_problem(blocks: object, threads: tuple[int, int], rows: int, cols: int) -> KernelDiagnosis | None:
    """A diagnosis if ``blocks`` is no grid of (x, y) blocks, or one absurdly larger than the matrix."""
    if (not isinstance(blocks, tuple | list) or len(blocks) != 2
            or not all(isinstance(b, numbers.Integral) and b >= 1 for b in blocks)):
        return KernelDiagnosis("error", f"the grid must be two whole numbers of blocks (x, y), got {blocks!r}")
    if max(blocks[0] * threads[0], blocks[1] * threads[1]) > 2 * max(rows, cols, *threads):
        return KernelDiagnosis("error", f"a grid of {tuple(blocks)} blocks of {tuple(threads)} threads reaches far "
                                        f"past a {rows} x {cols} matrix")
    return None


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def fresh(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Standard-normal float32 data on the kernels' device, drawn on the CPU (a seed gives the same data anywhere)."""
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(kernel_mode.device())


@dataclass
class Guarded:
    """A buffer whose first part (``view``) a kernel may write, followed by a guard zone it must not touch.

    For a matrix the guard is a band of columns to the right and of rows below, and ``view`` is a strided
    view of the buffer (on a GPU: numba indexes it with its strides, so ``out[row, col]`` one column
    past the end lands in the guard). The simulator accepts contiguous arrays only, so there a matrix
    gets no guard; it raises ``IndexError`` on any out-of-bounds index anyway.
    """

    buffer: torch.Tensor
    view: torch.Tensor
    guard_copy: torch.Tensor

    def guard_intact(self) -> bool:
        return bool(torch.equal(self._guard(), self.guard_copy))

    def _guard(self) -> torch.Tensor:
        mask = torch.ones_like(self.buffer, dtype=torch.bool)
        mask[tuple(slice(0, n) for n in self.view.shape)] = False
        return self.buffer[mask]


def guarded(values: torch.Tensor, guard: int | tuple[int, int], generator: torch.Generator) -> Guarded:
    """``values`` copied into the front of a buffer followed by ``guard`` elements (rows, columns) of random data."""
    if values.dim() not in (1, 2):
        raise ValueError(f"values: a vector or a matrix, got {values.dim()} dimensions")
    guards = (guard,) if isinstance(guard, int) else tuple(guard)
    if len(guards) != values.dim() or min(guards) < 0:
        raise ValueError(f"guard: one size >= 0 per dimension of values, got {guard!r}")
    if values.dim() == 2 and not kernel_mode.on_gpu():
        guards = (0, 0)  # the simulator needs a contiguous array; it catches out-of-bounds indices itself
    shape = tuple(n + g for n, g in zip(values.shape, guards, strict=True))
    buffer = fresh(shape, generator) + 1000.0  # far from any value a kernel of this module's labs writes
    view = buffer[tuple(slice(0, n) for n in values.shape)]
    view.copy_(values)
    result = Guarded(buffer, view, torch.empty(0))
    result.guard_copy = result._guard().clone()
    return result


_GPULAB = str(Path(__file__).resolve().parents[1])  # the package: its lines are never the kernel's
_LIBRARIES = tuple(str(Path(p)) for p in {sysconfig.get_paths()[key] for key in ("stdlib", "purelib", "platlib")})


def _kernel_line(error: BaseException) -> str:
    """' in the line `C[row, col] = total`': the innermost line of the traceback outside the libraries and
    gpulab, which under the simulator is the kernel's own line; '' if there is none."""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if not frame.filename.startswith((*_LIBRARIES, _GPULAB)) and frame.line:
            return f" in the line `{frame.line}`"
    return ""


def launch(run: Callable[[], object]) -> KernelDiagnosis | None:
    """Call ``run()`` (which launches a kernel) and wait for it; a Diagnosis if it failed, None if it ran."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*under-utilization.*")  # small test grids, on purpose
            warnings.filterwarnings("ignore", category=RuntimeWarning)  # the simulator's overflow in a wrong kernel
            run()
            kernel_mode.synchronize()
    except IndexError as error:  # the simulator's message names the thread and the index, its traceback the line
        return KernelDiagnosis("out of bounds",
                               f"a thread indexed past the end of an array{_kernel_line(error)} ({error})")
    except Exception as error:  # the student's code may fail in any way; the grader reports, never raises
        return KernelDiagnosis("error", f"the launch failed: {type(error).__name__}: {error}")
    return None


def close_to(actual: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    finite = reference[torch.isfinite(reference)]
    scale = max(float(finite.abs().max()), 1.0) if finite.numel() else 1.0
    return (actual - reference).abs() <= TOLERANCE * scale  # NaN compares False


def _where(index: torch.Tensor, shape: tuple[int, ...]) -> str:
    """'index 5' or 'row 3, column 7' for the first flat position in ``index``."""
    position = int(index[0])
    if len(shape) == 1:
        return f"index {position}"
    return f"row {position // shape[1]}, column {position % shape[1]}"


def _span(values: torch.Tensor, noun: str) -> str:
    """'row 3' or 'rows 3 to 7' for the smallest and largest of ``values``."""
    low, high = int(values.min()), int(values.max())
    return f"{noun} {low}" if low == high else f"{noun}s {low} to {high}"


def _unwritten_detail(unwritten: torch.Tensor) -> tuple[str, str]:
    """(problem, detail) for a mask of unwritten elements (1D or 2D)."""
    count, total = int(unwritten.sum()), unwritten.numel()
    if count == total:
        return "unwritten", ("the only element was never written" if total == 1
                             else f"none of the {total} elements was written")
    if unwritten.dim() == 1:
        first = int(unwritten.nonzero()[0])
        if bool(unwritten[first:].all()):
            return "unwritten tail", (f"the last {count} of {total} elements (indices {first} to {total - 1}) "
                                      "were never written")
        return "unwritten", f"{count} of {total} elements were never written, the first at index {first}"
    rows = unwritten.any(dim=1).nonzero().flatten()
    cols = unwritten.any(dim=0).nonzero().flatten()
    return "unwritten", (f"{count} of {total} elements were never written (in {_span(rows, 'row')}, "
                         f"{_span(cols, 'column')})")


def compare(actual: torch.Tensor, reference: torch.Tensor, unchanged: torch.Tensor | None = None) -> KernelDiagnosis:
    """Compare a kernel's output with the reference, element by element.

    An element is *unwritten* if it is still NaN (the poison), or still equal to ``unchanged`` (the
    output's contents before the launch, where it could not be poisoned because it is also an input).
    """
    if actual.shape != reference.shape:
        raise ValueError(f"actual: shape {tuple(actual.shape)} differs from reference {tuple(reference.shape)}")
    actual, reference = actual.detach().cpu().double(), reference.detach().cpu().double()
    unwritten = torch.isnan(actual)
    if unchanged is not None:
        unwritten |= actual == unchanged.detach().cpu().double()
    wrong = ~unwritten & ~close_to(actual, reference)
    if unwritten.any():
        problem, detail = _unwritten_detail(unwritten)
        if wrong.any():
            detail += f", and {int(wrong.sum())} more are wrong"
        return KernelDiagnosis(problem, detail)
    if wrong.any():
        index = wrong.flatten().nonzero().flatten()
        first = int(index[0])
        got, expected = float(actual.flatten()[first]), float(reference.flatten()[first])
        where = _where(index, tuple(actual.shape))
        return KernelDiagnosis("wrong values", f"{len(index)} of {actual.numel()} elements are wrong, the first at "
                                               f"{where}: {got:.6g} instead of {expected:.6g}")
    return KernelDiagnosis("ok", "every element is right")


def checked(output: Guarded, reference: torch.Tensor, unchanged: torch.Tensor | None = None) -> KernelDiagnosis:
    if not output.guard_intact():
        return KernelDiagnosis("out of bounds", "the kernel wrote past the end of its output (into the guard zone "
                                                "that follows it in memory)")
    return compare(output.view, reference, unchanged)
