"""Graders for the kernels a student writes: run the kernel on fresh data and say what went wrong.

They grade the labs "First kernels" (SAXPY, a 2D grid over a matrix and the shared-memory stencil:
:func:`diagnose_saxpy`, :func:`diagnose_scale_add_row`, :func:`diagnose_stencil`) and "Tiled matrix
multiply" (:func:`diagnose_matmul`). A kernel that is wrong in the usual ways leaves tell-tale traces
in its output, and these functions look for them, so that a lab can give a hint about the mistake
instead of a bare "wrong answer":

- the output buffer is *poisoned* with NaN before the launch, so an element no thread wrote stays
  NaN (for SAXPY, whose output ``y`` is also an input, an unwritten element keeps its old value);
  if the unwritten elements are the last ones, or exactly those a grid's reach leaves out, the grid
  was too small;
- a *guard zone* of known random values follows the output in memory and must come back untouched:
  on a GPU, numba does not check array bounds, so a missing bounds check silently writes past the end
  (into the guard). Under numba's CUDA simulator the same mistake raises an ``IndexError`` that names
  the thread and the line; both come back as ``"out of bounds"``;
- for a 2D kernel, a square matrix that the grid covers exactly shows whether rows and columns were
  swapped (``cuda.grid(2)`` returns ``(x, y)``, and x runs along a row: x is the *column*);
- for the shared-memory stencil, values that match no window of the input point at a race: a thread
  read a shared slot before its neighbour had written it (a missing ``cuda.syncthreads()``);
- for a tiled matrix multiply, wrong values are compared with what each usual mistake computes (a
  loop over K that stops before the last, partial tile; slots of that tile past K that keep the
  previous tile's values instead of zeros; tiles read transposed), located (wrong only in the tiles
  along C's bottom and right edges: threads outside C skipped their loads), and checked for a race
  (a second run on the same data gives different values).

Every input is fresh random data (never zeros, which hide a wrong index), compared with a PyTorch
reference. The functions never raise: an exception in the student's code becomes a :class:`Diagnosis`
too, so a lab's check shows a hint, never a stack trace. They run where the kernels run: on CUDA
tensors when :func:`gpulab.kernels.on_gpu`, on CPU tensors under the simulator.
"""

from __future__ import annotations

import math
import numbers
import sysconfig
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from gpulab import checks, kernels
from gpulab.correctness import poisoned
from gpulab.memory import stencil_reference
from gpulab.threads import blocks_for
from gpulab.validation import fits_in_memory, positive_int

PROBLEMS = ("ok", "error", "out of bounds", "unwritten", "unwritten tail", "index order", "wrong values",
            "shifted window", "race", "short k loop", "partial k tile", "transposed tile", "edge tiles")
TOLERANCE = 1e-5  # relative to the largest reference value: float32 rounding is far below it
GUARD = 64  # elements of guard zone after a vector's end


@dataclass(frozen=True)
class Diagnosis:
    """What a kernel's output showed: ``problem`` is one of :data:`PROBLEMS`, ``detail`` says where.

    A lab's grader module makes its own kind by subclassing with its own ``problems``; :func:`grade`
    records any of them as a lab check.
    """

    problem: str
    detail: str
    problems: ClassVar[tuple[str, ...]] = PROBLEMS

    def __post_init__(self) -> None:
        if self.problem not in self.problems:
            raise ValueError(f"problem: one of {self.problems}, got {self.problem!r}")

    @property
    def ok(self) -> bool:
        return self.problem == "ok"

    def hint(self, hints: Mapping[str, str], default: str = "") -> str:
        """The detail, then the lab's advice for this kind of problem (``hints[problem]``, else ``default``)."""
        advice = hints.get(self.problem, default)
        return f"{self.detail}. {advice}".strip() if advice else self.detail


def safely(diagnose: Callable[[], Diagnosis]) -> Diagnosis:
    """``diagnose()``, or an "error" Diagnosis if it raised (say, in the student's code it called first)."""
    try:
        return diagnose()
    except Exception as error:  # a grader reports, never raises
        return Diagnosis("error", f"{type(error).__name__}: {error}")


def first_failure(diagnoses: Iterable[Callable[[], Diagnosis]]) -> Diagnosis:
    """Run the diagnoses in turn (each :func:`safely`); the first that is not ok, else the last one."""
    diagnosis = Diagnosis("error", "nothing was checked")
    for diagnose in diagnoses:
        diagnosis = safely(diagnose)
        if not diagnosis.ok:
            break
    return diagnosis


def grade(grader: checks.Grader, name: str, diagnosis: Diagnosis, hints: Mapping[str, str], default: str = "") -> bool:
    """Record ``diagnosis`` as the check ``name``: PASS, or NOT YET with its detail and the matching hint."""
    grader.check(name, lambda: diagnosis.ok, diagnosis.hint(hints, default))
    return diagnosis.ok


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def fresh(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Standard-normal float32 data on the kernels' device, drawn on the CPU (a seed gives the same data anywhere)."""
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(kernels.device())


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
    if values.dim() == 2 and not kernels.on_gpu():
        guards = (0, 0)  # the simulator needs a contiguous array; it catches out-of-bounds indices itself
    shape = tuple(n + g for n, g in zip(values.shape, guards, strict=True))
    buffer = fresh(shape, generator) + 1000.0  # far from any value a kernel of this module's labs writes
    view = buffer[tuple(slice(0, n) for n in values.shape)]
    view.copy_(values)
    result = Guarded(buffer, view, torch.empty(0))
    result.guard_copy = result._guard().clone()
    return result


_LIBRARIES = tuple(str(Path(p)) for p in {sysconfig.get_paths()[key] for key in ("stdlib", "purelib", "platlib")})


def _kernel_line(error: BaseException) -> str:
    """' in the line `C[row, col] = total`': the innermost line of the traceback outside the libraries and
    this module, which under the simulator is the kernel's own line; '' if there is none."""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if frame.filename != __file__ and not frame.filename.startswith(_LIBRARIES) and frame.line:
            return f" in the line `{frame.line}`"
    return ""


def launch(run: Callable[[], object]) -> Diagnosis | None:
    """Call ``run()`` (which launches a kernel) and wait for it; a Diagnosis if it failed, None if it ran."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*under-utilization.*")  # small test grids, on purpose
            warnings.filterwarnings("ignore", category=RuntimeWarning)  # the simulator's overflow in a wrong kernel
            run()
            kernels.synchronize()
    except IndexError as error:  # the simulator's message names the thread and the index, its traceback the line
        return Diagnosis("out of bounds", f"a thread indexed past the end of an array{_kernel_line(error)} ({error})")
    except Exception as error:  # the student's code may fail in any way; the grader reports, never raises
        return Diagnosis("error", f"the launch failed: {type(error).__name__}: {error}")
    return None


def _close(actual: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
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


def compare(actual: torch.Tensor, reference: torch.Tensor, unchanged: torch.Tensor | None = None) -> Diagnosis:
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
    wrong = ~unwritten & ~_close(actual, reference)
    if unwritten.any():
        problem, detail = _unwritten_detail(unwritten)
        if wrong.any():
            detail += f", and {int(wrong.sum())} more are wrong"
        return Diagnosis(problem, detail)
    if wrong.any():
        index = wrong.flatten().nonzero().flatten()
        first = int(index[0])
        got, expected = float(actual.flatten()[first]), float(reference.flatten()[first])
        return Diagnosis("wrong values", f"{len(index)} of {actual.numel()} elements are wrong, the first at "
                                         f"{_where(index, tuple(actual.shape))}: {got:.6g} instead of {expected:.6g}")
    return Diagnosis("ok", "every element is right")


def _checked(output: Guarded, reference: torch.Tensor, unchanged: torch.Tensor | None = None) -> Diagnosis:
    if not output.guard_intact():
        return Diagnosis("out of bounds", "the kernel wrote past the end of its output (into the guard zone "
                                          "that follows it in memory)")
    return compare(output.view, reference, unchanged)


def diagnose_saxpy(call: Callable[[float, object, object], object], n: int, seed: int = 0) -> Diagnosis:
    """Run ``call(a, x, y)`` on fresh x and y of ``n`` float32 elements; it must leave a * x + y in y.

    ``call`` gets kernel arguments (:func:`gpulab.kernels.device_array`): either it launches the
    student's kernel with a block count the grader chose, or it is the student's own launcher.
    Both x and y are followed by a guard zone. An element of y that kept its value was never written.
    """
    if n < 1:
        raise ValueError(f"n: at least 1, got {n}")
    generator = _generator(seed)
    a = 0.5 + float(torch.rand((), generator=generator))  # never 0 or 1: both would hide a missing term
    # |a x| >= 1/8, so that a * x + y always differs from y in float32: an element that kept its value
    # was not written (with x near 0, a written y could round back to its old value)
    x_values = fresh((n,), generator)
    x_values = x_values.sign() * (x_values.abs() + 0.25)
    x, y = guarded(x_values, GUARD, generator), guarded(fresh((n,), generator), GUARD, generator)
    y_before = y.view.clone()
    reference = a * x.view.double() + y_before.double()
    failure = launch(lambda: call(a, kernels.device_array(x.view), kernels.device_array(y.view)))
    return failure or _checked(y, reference, unchanged=y_before)


def scale_add_row_reference(inp: torch.Tensor, scale: float, *, swapped: bool = False) -> torch.Tensor:
    """``out[row, col] = scale * inp[row, col] + row`` (with ``swapped``: ``+ col``), in float64."""
    rows, cols = inp.shape
    index = (torch.arange(cols, device=inp.device).expand(rows, cols) if swapped
             else torch.arange(rows, device=inp.device)[:, None].expand(rows, cols))
    return scale * inp.double() + index.double()


def _grid_problem(blocks: object, threads: tuple[int, int], rows: int, cols: int) -> Diagnosis | None:
    """A Diagnosis if ``blocks`` is no grid of (x, y) blocks, or one absurdly larger than the matrix."""
    if (not isinstance(blocks, tuple | list) or len(blocks) != 2
            or not all(isinstance(b, numbers.Integral) and b >= 1 for b in blocks)):
        return Diagnosis("error", f"the grid must be two whole numbers of blocks (x, y), got {blocks!r}")
    if max(blocks[0] * threads[0], blocks[1] * threads[1]) > 2 * max(rows, cols, *threads):
        return Diagnosis("error", f"a grid of {tuple(blocks)} blocks of {tuple(threads)} threads reaches far past "
                                  f"a {rows} x {cols} matrix")
    return None


def _run_matrix(kernel, rows: int, cols: int, threads: tuple[int, int], blocks: tuple[int, int],
                seed: int) -> tuple[Diagnosis, torch.Tensor | None, torch.Tensor]:
    extent = max(blocks[0] * threads[0], blocks[1] * threads[1])
    generator = _generator(seed)
    scale = 0.5 + float(torch.rand((), generator=generator))
    # The guard leaves room for any (row, col) the grid reaches, in either order: on a GPU a kernel that
    # swaps them, or checks no bounds, writes into the guard instead of into someone else's memory.
    inp = guarded(fresh((rows, cols), generator), (extent, extent), generator).view
    out = guarded(poisoned((rows, cols), torch.float32, inp.device), (extent, extent), generator)
    failure = launch(lambda: kernel[blocks, threads](kernels.device_array(inp), kernels.device_array(out.view),
                                                     scale))
    if failure:
        return failure, None, inp
    diagnosis = _checked(out, scale_add_row_reference(inp, scale))
    if diagnosis.problem == "wrong values":
        written = out.view.detach().cpu().double()
        for alternative in (scale_add_row_reference(inp, scale, swapped=True),
                            scale_add_row_reference(inp.T, scale), scale_add_row_reference(inp.T, scale, swapped=True)):
            if alternative.shape == written.shape and bool(_close(written, alternative.cpu()).all()):
                return Diagnosis("index order", "each element got the value meant for its mirror image: rows and "
                                                "columns are swapped somewhere"), out.view, inp
    return diagnosis, out.view, inp


COVERING = "covering"  # diagnose_scale_add_row's default grid: the one that covers the matrix


def diagnose_scale_add_row(kernel, rows: int, cols: int, threads: tuple[int, int],
                           blocks: tuple[int, int] | str = COVERING, seed: int = 0) -> Diagnosis:
    """Launch ``kernel[blocks, threads](inp, out, scale)``, which must write ``out[r, c] = scale * inp[r, c] + r``.

    ``threads`` is (x, y), x along a row; ``blocks`` (a student's grid, say) defaults to the grid that
    covers the matrix, (ceil(cols / x), ceil(rows / y)); anything but a pair of whole numbers is diagnosed
    as an error, None included. A failure is examined further: a square matrix that the grid
    covers exactly (so no bounds check can matter) tells a swap of rows and columns from a missing bounds
    check, and unwritten elements exactly where a swapped kernel would leave them point at the swap.
    """
    if min(rows, cols) < 1 or len(threads) != 2 or min(threads) < 1:
        raise ValueError(f"rows, cols and threads: positive, got {rows}, {cols}, {threads}")
    grid = (blocks_for(cols, threads[0]), blocks_for(rows, threads[1])) if blocks is COVERING else blocks
    bad_grid = _grid_problem(grid, threads, rows, cols)
    if bad_grid:
        return bad_grid
    grid = (int(grid[0]), int(grid[1]))
    diagnosis, written, _ = _run_matrix(kernel, rows, cols, threads, grid, seed)
    if diagnosis.ok or diagnosis.problem == "index order":
        return diagnosis
    if diagnosis.problem == "unwritten" and written is not None:
        extent_x, extent_y = grid[0] * threads[0], grid[1] * threads[1]
        swapped_cover = torch.zeros(rows, cols, dtype=torch.bool)
        swapped_cover[:min(rows, extent_x), :min(cols, extent_y)] = True
        correct_cover = torch.zeros(rows, cols, dtype=torch.bool)
        correct_cover[:min(rows, extent_y), :min(cols, extent_x)] = True
        unwritten = torch.isnan(written.detach().cpu())
        if torch.equal(~unwritten, swapped_cover) and not torch.equal(swapped_cover, correct_cover):
            return Diagnosis("index order", diagnosis.detail + f": exactly the elements a kernel misses that takes "
                                                              f"x (which reaches {extent_x}) as the row and y "
                                                              f"(which reaches {extent_y}) as the column")
        if torch.equal(~unwritten, correct_cover):
            return Diagnosis("unwritten", diagnosis.detail + f": the grid reaches {extent_y} rows and {extent_x} "
                                                             "columns, too few")
        return diagnosis
    if diagnosis.problem in ("out of bounds", "error", "wrong values"):
        side = math.lcm(*threads) * 2
        probe_grid = (side // threads[0], side // threads[1])
        probe, _, _ = _run_matrix(kernel, side, side, threads, probe_grid, seed + 1)
        if probe.problem == "index order":
            return Diagnosis("index order", f"{diagnosis.detail}; and on a {side} x {side} matrix that the grid "
                                            f"covers exactly, {probe.detail}")
    return diagnosis


def diagnose_stencil(kernel, n: int, block_size: int, radius: int = 3, seed: int = 0) -> Diagnosis:
    """Launch ``kernel[ceil(n / block_size), block_size](inp, out, n)`` with ``inp`` of n + 2 radius elements.

    ``out[i]`` must be the sum of ``inp[i .. i + 2 radius]``. Wrong values are examined: if they equal
    a window shifted by a few elements, the offsets are off; if they match no window, threads read
    shared memory before it was written (or read slots nobody writes: the halo).
    """
    if n < 1 or block_size < 1 or radius < 0:
        raise ValueError(f"n, block_size, radius: n, block_size >= 1 and radius >= 0, got {n}, {block_size}, {radius}")
    generator = _generator(seed)
    inp = guarded(fresh((n + 2 * radius,), generator), GUARD, generator)
    out = guarded(poisoned((n,), torch.float32, inp.view.device), GUARD, generator)
    failure = launch(lambda: kernel[blocks_for(n, block_size), block_size](
        kernels.device_array(inp.view), kernels.device_array(out.view), n))
    if failure:
        return failure
    reference = stencil_reference(inp.view, radius)
    diagnosis = _checked(out, reference)
    if diagnosis.problem != "wrong values":
        return diagnosis
    actual = out.view.detach().cpu().double()
    wrong = ~_close(actual, reference.cpu())
    padded = torch.cat([torch.full((3 * radius,), math.nan, dtype=torch.float64), inp.view.detach().cpu().double(),
                        torch.full((3 * radius,), math.nan, dtype=torch.float64)])
    for shift in range(-2 * radius, 2 * radius + 1):  # a window starting `shift` elements off
        if shift == 0:
            continue
        shifted = stencil_reference(padded[3 * radius + shift:3 * radius + shift + n + 2 * radius], radius)
        if bool(_close(actual, shifted).double().mean() > 0.9):
            return Diagnosis("shifted window", diagnosis.detail + f": they are sums of the 7 inputs starting at "
                                                                  f"i {shift:+d} instead of at i")
    positions = wrong.nonzero().flatten()
    in_block = positions % block_size
    if bool((in_block >= block_size - 2 * radius).all()):
        return Diagnosis("race", diagnosis.detail + f", all among the last {2 * radius} outputs of a block: "
                                                    "those read the halo, the slots past the block's own elements")
    return Diagnosis("race", diagnosis.detail + ", and they match no window of the input")


# --- C = A @ B in shared-memory tiles (the lab "Tiled matrix multiply") ---------------------------------

MAX_THREADS_PER_BLOCK = 1024  # CUDA's limit, so a block of tile x tile threads has tile <= 32


def _padded(matrix: torch.Tensor, tile: int) -> torch.Tensor:
    """``matrix`` with rows and columns of zeros appended up to whole tiles."""
    rows, cols = (blocks_for(size, tile) * tile for size in matrix.shape)
    padded = matrix.new_zeros(rows, cols)
    padded[:matrix.shape[0], :matrix.shape[1]] = matrix
    return padded


def _tiles_transposed(matrix: torch.Tensor, tile: int) -> torch.Tensor:
    """``matrix`` padded to whole tiles, with every tile x tile tile transposed where it stands."""
    padded = _padded(matrix, tile)
    rows, cols = padded.shape
    return padded.view(rows // tile, tile, cols // tile, tile).permute(0, 3, 2, 1).reshape(rows, cols)


def _matmul_mistakes(a: torch.Tensor, b: torch.Tensor, tile: int) -> Iterator[tuple[str, torch.Tensor, str]]:
    """What a tiled kernel computes for C = A @ B (float64) under each usual mistake: (problem, C, what it did)."""
    m, k = a.shape
    whole = k // tile * tile  # the part of K that fills whole tiles
    if whole < k:
        yield ("short k loop", a[:, :whole] @ b[:whole],
               f"each is the sum of the first {whole} of the K = {k} products: the loop over K stopped after "
               f"{k // tile} tile{'s' if k // tile > 1 else ''}, before the last, partial one")
        if whole >= tile:  # in the partial tile, the slots past K still hold the previous tile's values
            kept = slice(whole - tile + (k - whole), whole)
            yield ("partial k tile", a @ b + a[:, kept] @ b[kept],
                   f"each has {tile - (k - whole)} products too many: the last tile along K holds {k - whole} "
                   "columns of A and rows of B, and its other slots kept the previous tile's values")
    a_tiles, b_tiles = _tiles_transposed(a, tile), _tiles_transposed(b, tile)
    a_whole, b_whole = _padded(a, tile), _padded(b, tile)
    for which, left, right in (("A", a_tiles, b_whole), ("B", a_whole, b_tiles), ("both A and B", a_tiles, b_tiles)):
        yield ("transposed tile", (left @ right)[:m, :b.shape[1]],
               f"they are what the tiles of {which} give when each is read transposed")


def _edge_tiles(wrong: torch.Tensor, tile: int) -> str | None:
    """Where the wrong elements are, if all of them lie in the tiles that hang over C's bottom or right edge."""
    m, n = wrong.shape
    rows, cols = m // tile * tile, n // tile * tile  # the rows and columns of C in whole tiles
    if (rows, cols) == (m, n) or min(rows, cols) == 0 or bool(wrong[:rows, :cols].any()):
        return None
    edges = ([f"rows {rows} to {m - 1}"] if rows < m else []) + ([f"columns {cols} to {n - 1}"] if cols < n else [])
    return (f"all in the tiles along C's edge ({' and '.join(edges)}), which reach past the matrix; every element "
            "of the whole tiles is right")


def _grid_reach(unwritten: torch.Tensor, grid: tuple[int, int], tile: int, m: int, n: int) -> str | None:
    """Why the elements are unwritten, if they are exactly those that the grid does not reach."""
    reach_cols, reach_rows = grid[0] * tile, grid[1] * tile  # x runs along a row: over the columns
    reached = torch.zeros(m, n, dtype=torch.bool)
    reached[:reach_rows, :reach_cols] = True
    if not torch.equal(~unwritten, reached):
        return None
    why = (f"the grid of {grid[0]} x {grid[1]} blocks of {tile} x {tile} threads reaches {reach_rows} rows and "
           f"{reach_cols} columns, and C has {m} rows and {n} columns")
    if grid == (blocks_for(m, tile), blocks_for(n, tile)):
        why += "; it would cover C's transpose: its x counts blocks down the rows, not along them"
    return why


def diagnose_matmul(kernel, m: int, k: int, n: int, tile: int, blocks: tuple[int, int] | str = COVERING,
                    seed: int = 0) -> Diagnosis:
    """Launch ``kernel[blocks, (tile, tile)](A, B, C)`` with fresh A (m x k) and B (k x n); C must be A @ B.

    ``blocks`` (a student's grid, say) defaults to the grid of tile x tile blocks that covers C,
    (ceil(n / tile), ceil(m / tile)): x runs along a row of C. C is poisoned; on a GPU, A, B and C are
    followed by guard zones wide enough for any index the grid can form, so a load past the edge of
    A or B reads known values and a store past the edge of C is seen. Wrong values are examined: they
    are compared with what each usual mistake of a tiled kernel computes, located (only in the tiles
    along C's edges?), and finally the kernel runs again on the same data: values that change point
    at a race. Use sizes that are multiples of nothing, K above the tile, and a grid of a few blocks
    under the simulator.
    """
    for name, value in (("m", m), ("k", k), ("n", n), ("tile", tile)):
        positive_int(name, value)
    if tile * tile > MAX_THREADS_PER_BLOCK:
        raise ValueError(f"tile: a block of tile x tile threads has at most {MAX_THREADS_PER_BLOCK} threads, so tile "
                         f"<= 32; got {tile}")
    grid = (blocks_for(n, tile), blocks_for(m, tile)) if blocks is COVERING else blocks
    bad_grid = _grid_problem(grid, (tile, tile), m, n)
    if bad_grid:
        return bad_grid
    grid = (int(grid[0]), int(grid[1]))
    # past any index that a block and thread, or a step along K, can form, and past every matrix
    reach = max(*grid, *(blocks_for(size, tile) for size in (m, k, n))) * tile + tile
    device = kernels.device()
    # A, B and C with their guards, a second C, and float64 copies for the reference and the mistakes' products
    fits_in_memory("m, k and n", 12 * 8 * reach * reach, device)
    generator = _generator(seed)
    a = guarded(fresh((m, k), generator), (reach - m, reach - k), generator)
    b = guarded(fresh((k, n), generator), (reach - k, reach - n), generator)

    def run() -> tuple[Diagnosis | None, Guarded]:
        c = guarded(poisoned((m, n), torch.float32, a.view.device), (reach - m, reach - n), generator)
        arguments = [kernels.device_array(t) for t in (a.view, b.view, c.view)]
        return launch(lambda: kernel[grid, (tile, tile)](*arguments)), c

    failure, c = run()
    if failure:
        return failure
    reference = a.view.double() @ b.view.double()
    diagnosis = _checked(c, reference)
    written = c.view.detach().cpu().double()
    unwritten = torch.isnan(written)
    if diagnosis.problem == "unwritten":
        why = _grid_reach(unwritten, grid, tile, m, n)
        if why:
            return Diagnosis("unwritten", f"{diagnosis.detail}: {why}")
        if bool(unwritten.all()):
            return diagnosis  # nothing at all was written: no race explains that
    elif diagnosis.problem == "wrong values":
        explained = _explain_wrong_matmul(written, reference, a, b, tile)
        if explained:
            return Diagnosis(explained[0], f"{diagnosis.detail}{explained[1]}")
    else:
        return diagnosis
    # What is left may be a race: a thread that reads a tile before the others have written it reads whatever
    # the slot held (even NaN, which looks unwritten), and a second run on the same data reads something else.
    failure, again = run()
    if not failure:
        second = again.view.detach().cpu().double()
        changed = int((~((second == written) | (torch.isnan(second) & unwritten))).sum())
        if changed:
            wrong = int((~_close(written, reference.cpu())).sum())
            return Diagnosis("race", f"{wrong} of {m * n} elements are wrong, and a second run on the same A and B "
                                     f"gave different values for {changed}: threads read the tiles while others were "
                                     "still writing them, or overwrote them while others were still reading")
    return diagnosis


def _explain_wrong_matmul(written: torch.Tensor, reference: torch.Tensor, a: Guarded, b: Guarded,
                          tile: int) -> tuple[str, str] | None:
    """(problem, detail to add) if the wrong values of a tiled matmul are what a usual mistake computes."""
    m, k = a.view.shape
    n = b.view.shape[1]
    if kernels.on_gpu():  # loads with no bounds check read the guard zones that follow A's rows and B's columns
        k_reach = blocks_for(k, tile) * tile
        unchecked = a.buffer[:m, :k_reach].double() @ b.buffer[:k_reach, :n].double()
        if bool(_close(written, unchecked.cpu()).all()):
            return "out of bounds", (": they include values loaded from past the end of A's rows and B's columns, "
                                     "where the last tile along K reaches")
    for problem, product, what in _matmul_mistakes(a.view.double(), b.view.double(), tile):
        if bool(_close(written, product.cpu()).all()):
            return problem, f"; {what}"
    where = _edge_tiles(~_close(written, reference.cpu()), tile)
    return ("edge tiles", f"; {where}") if where else None
