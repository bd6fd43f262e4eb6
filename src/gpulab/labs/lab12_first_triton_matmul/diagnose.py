"""Graders of the lab's Triton kernels, their grids and the grouped numbering of the tiles.

A kernel is launched on fresh random matrices whose sizes are multiples of no tile (:data:`BLOCKED_CASES`,
:data:`GROUPED_CASES`), each matrix followed in memory by a guard zone of random numbers, into a C poisoned with NaN
(an element no program stores stays NaN). Its output is compared with the product in float64, with the
tolerance of :func:`gpulab.kernels.triton_gemm.common.tolerance`. When it is wrong, the lab's reference kernel is
launched on the same inputs once with each usual mistake switched on (:data:`.reference.KERNEL_MISTAKES`): if the
student's C, and the guard zone after it, are what one of them leaves, the diagnosis names that mistake. Without a
GPU every kernel runs in Triton's interpreter, one program after the other; on a GPU they are compiled.

:func:`diagnose_grid` checks a grid function against the tiles it must cover, and launches the reference kernel on a
grid that is too small to show which part of C stays NaN. :func:`diagnose_numbering` reads a grouped numbering back
through :func:`.reference.probe_kernel` and says which tile is visited twice, skipped, or lies outside C.
"""

from __future__ import annotations

import ast
import inspect
import math
import numbers
import textwrap
import traceback
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from gpulab.core import kernel_mode
from gpulab.core.correctness import relative_error
from gpulab.core.validation import positive_int
from gpulab.kernels.triton_gemm.common import tolerance
from gpulab.labs import grading
from gpulab.labs.lab12_first_triton_matmul import reference

PROBLEMS = ("ok", "error", "not answered", "input written", "out of bounds", "unwritten", "wrong values",
            *(m.problem for m in reference.KERNEL_MISTAKES),
            "not a grid", "grid axes swapped", "grid not 1-D", "grid too small", "grid too large",
            "outside C", "not one program per tile", "row-major order", "grid order", "not grouped order",
            *(m.problem for m in reference.NUMBERING_MISTAKES),
            # the pipelining exercise (gpulab.labs.lab12_first_triton_matmul.questions)
            "not a config", "bad setting", "one stage", "small tiles", "too much shared memory", "not a number",
            "stages not counted", "one tile only", "bits, not bytes", "kibibytes", "element size not counted",
            "C tile counted", "wrong count", "not an instruction", "not the new instruction", "not compiled")
LONG_K = 1000  # from this K on, sums kept in 16 bits drift past the tolerance (about 0.3 sqrt(K / BLOCK_K) ulps)
ROUNDING = 20  # an error within this many tolerances, every element a little off, is rounding, not a wrong index


@dataclass(frozen=True)
class Diagnosis(grading.Diagnosis):
    """What a student's answer showed: ``problem`` is one of :data:`PROBLEMS`, ``detail`` says what came back."""

    problems: ClassVar[tuple[str, ...]] = PROBLEMS


NOT_ANSWERED = Diagnosis("not answered", grading.NOT_ANSWERED)


@dataclass(frozen=True)
class Case:
    """The shapes of one check, ``A (m x k) @ B (k x n)``, with the tiles the kernel is launched with (``group_m``:
    the grouped kernel's groups; 0 for the blocked kernel's 2-D grid)."""

    name: str
    m: int
    n: int
    k: int
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 0

    @property
    def config(self) -> dict[str, int]:
        blocks = {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "BLOCK_K": self.block_k}
        return {**blocks, "GROUP_M": self.group_m} if self.group_m else blocks


BLOCKED_CASES = (Case("sizes that are multiples of no tile", 45, 37, 50, 32, 16, 16),
                 Case("C smaller than one tile", 5, 7, 9, 16, 16, 16),
                 Case("a long K", 20, 24, 1990, 32, 32, 16))
GROUPED_CASES = (Case("5 x 3 tiles in groups of 3 rows of tiles", 70, 40, 50, 16, 16, 16, 3),
                 Case("2 x 3 tiles in groups of 2 rows of tiles", 45, 37, 50, 32, 16, 16, 2))
GRID_CASES = ((45, 37, 32, 16), (64, 48, 32, 16), (5, 200, 16, 64))  # (M, N, BLOCK_M, BLOCK_N)
NUMBERING_CASES = ((70, 40, 16, 16, 3), (70, 50, 16, 16, 2), (40, 90, 16, 16, 8))  # ... and GROUP_M


def python_function(kernel: object) -> Callable | None:
    """The Python function behind a ``@triton.jit`` function (compiled or interpreted), or None."""
    function = getattr(kernel, "fn", None)
    return function if callable(function) and hasattr(kernel, "__getitem__") else None


def is_stub(kernel: object) -> bool:
    """True if the ``@triton.jit`` function's body is only ``pass`` (a docstring and comments aside): untouched."""
    function = python_function(kernel)
    if function is None:
        return False
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return False
    body = [s for s in tree.body[0].body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return all(isinstance(s, ast.Pass) for s in body)


def _line(error: BaseException, function: Callable | None) -> str:
    """' in the line `...`': the innermost line of the student's function in the error's traceback, if any."""
    if function is None:
        return ""
    filename = function.__code__.co_filename
    for cause in (error.__cause__, error.__context__, error):
        if cause is None:
            continue
        for frame in reversed(traceback.extract_tb(cause.__traceback__)):
            if frame.filename == filename and frame.line:
                return f" in the line `{frame.line}`"
    return ""


def launch_failed(error: Exception, kernel: object) -> Diagnosis:
    """The diagnosis of a launch that raised: what the error says, and in which line of the student's code."""
    first = (str(error).strip().splitlines() or [""])[0][:200]
    where = _line(error, python_function(kernel))
    return Diagnosis("error", f"the launch failed: {type(error).__name__}: {first}{where}")


@dataclass
class Operands:
    """A case's A, B and C, each at the start of a buffer that continues with a guard zone of random numbers."""

    m: int
    n: int
    k: int
    a_buffer: torch.Tensor
    b_buffer: torch.Tensor
    c_buffer: torch.Tensor  # C's m * n elements are NaN

    def views(self, a_buffer: torch.Tensor, b_buffer: torch.Tensor, c_buffer: torch.Tensor):
        m, n, k = self.m, self.n, self.k
        return a_buffer[:m * k].view(m, k), b_buffer[:k * n].view(k, n), c_buffer[:m * n].view(m, n)

    def product(self) -> torch.Tensor:
        a, b, _ = self.views(self.a_buffer, self.b_buffer, self.c_buffer)
        return a.double().cpu() @ b.double().cpu()


def operands(m: int, n: int, k: int, blocks: int, dtype: torch.dtype = torch.float16, seed: int = 0) -> Operands:
    """Fresh standard-normal A (m x k) and B (k x n) and a NaN C, each followed by a guard zone large enough for any
    address a kernel with tiles of at most ``blocks`` forms, its strides swapped or its masks missing."""
    reach = (max(m, n, k) + 2 * blocks) ** 2
    generator = torch.Generator().manual_seed(seed)
    a, b, c = (torch.randn(size + reach, generator=generator).to(dtype) for size in (m * k, k * n, m * n))
    c[:m * n] = float("nan")
    device = kernel_mode.device()
    return Operands(m, n, k, a.to(device), b.to(device), c.to(device))


@dataclass
class Output:
    """What a launch left: all of C's buffer (on the host) and whether A and B are as they were."""

    c_buffer: torch.Tensor
    inputs_intact: bool


def run(kernel, ops: Operands, grid, config: Mapping) -> Output | Diagnosis:
    """Launch ``kernel`` on copies of ``ops``; what it left, or the diagnosis of a launch that failed."""
    a_buffer, b_buffer, c_buffer = ops.a_buffer.clone(), ops.b_buffer.clone(), ops.c_buffer.clone()
    a, b, c = ops.views(a_buffer, b_buffer, c_buffer)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=RuntimeWarning)  # NumPy's overflow in a wrong kernel
            reference.launch(kernel, a, b, c, grid, config)
            kernel_mode.synchronize()
    except Exception as error:  # a student's kernel may fail in any way; the grader reports, never raises
        return launch_failed(error, kernel)
    intact = torch.equal(a_buffer, ops.a_buffer) and torch.equal(b_buffer, ops.b_buffer)
    return Output(c_buffer.cpu(), intact)


def _span(values: torch.Tensor, noun: str) -> str:
    low, high = int(values.min()), int(values.max())
    return f"{noun} {low}" if low == high else f"{noun}s {low} to {high}"


def unwritten_detail(unwritten: torch.Tensor, block_m: int, block_n: int) -> str:
    """Which elements of C stayed NaN, in words: all of them, whole tiles, or a band of rows and columns."""
    count, total = int(unwritten.sum()), unwritten.numel()
    if count == total:
        return f"none of C's {total:,} elements was written (all are still NaN)"
    rows, cols = unwritten.any(dim=1).nonzero().flatten(), unwritten.any(dim=0).nonzero().flatten()
    said = f"{count:,} of C's {total:,} elements were never written (still NaN), in {_span(rows, 'row')}, " \
           f"{_span(cols, 'column')}"
    m, n = unwritten.shape
    tiles_m, tiles_n = reference.tiles(m, n, block_m, block_n)
    whole = [(i, j) for i in range(tiles_m) for j in range(tiles_n)
             if bool(unwritten[i * block_m:(i + 1) * block_m, j * block_n:(j + 1) * block_n].all())]
    covered = torch.zeros_like(unwritten)
    for i, j in whole:
        covered[i * block_m:(i + 1) * block_m, j * block_n:(j + 1) * block_n] = True
    if whole and torch.equal(covered, unwritten):
        listed = ", ".join(f"({i}, {j})" for i, j in whole[:4]) + (", ..." if len(whole) > 4 else "")
        said += f": whole tiles, {len(whole)} of the {tiles_m * tiles_n} (tile row, tile column): {listed}"
    return said


def _changed(after: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    return (after != before) & ~(torch.isnan(after) & torch.isnan(before))


def verdict(out: Output, ops: Operands, product: torch.Tensor, tol: float, blocks: tuple[int, int]) -> Diagnosis:
    """Whether ``out`` is right: A and B untouched, nothing past C written, every element of C written and, over
    all of C, within ``tol`` (relative, Frobenius) of the float64 ``product``; otherwise what came back."""
    if not out.inputs_intact:
        return Diagnosis("input written", "the kernel changed A or B (or the memory after them): it may store into C "
                                          "only")
    size = ops.m * ops.n
    c = out.c_buffer[:size].view(ops.m, ops.n).double()
    past = int(_changed(out.c_buffer[size:], ops.c_buffer[size:].cpu()).sum())
    problem, parts = "", []
    if past:
        problem = "out of bounds"
        parts.append(f"the kernel wrote past the end of C: {past:,} elements of the memory after C changed")
    unwritten = torch.isnan(c)
    if unwritten.any():
        problem = problem or "unwritten"
        parts.append(unwritten_detail(unwritten, *blocks))
    else:
        error = relative_error(c, product)
        if not error <= tol:
            problem = problem or "wrong values"
            parts.append(_wrong_detail(c, product, error, tol))
    if not problem:
        return Diagnosis("ok", f"C is right (relative error {relative_error(c, product):.2g}, under {tol:.2g})")
    return Diagnosis(problem, "; ".join(parts))


def _wrong_detail(c: torch.Tensor, product: torch.Tensor, error: float, tol: float) -> str:
    scale = max(float(product.abs().max()), float(product.pow(2).mean().sqrt()), 1e-30)
    bad = ((c - product).abs() > 10 * tol * scale) | ~torch.isfinite(c)
    said = f"the relative error over all of C is {error:.3g}, where a correct kernel stays under {tol:.2g}"
    if not bad.any():
        return said + ": no element is far off, every one a little"
    first = int(bad.flatten().nonzero()[0])
    row, col = divmod(first, c.shape[1])
    return (f"{int(bad.sum()):,} of C's {c.numel():,} elements are wrong, the first at row {row}, column {col}: "
            f"{float(c[row, col]):.4g} where float64 gives {float(product[row, col]):.4g}; {said}")


def same_output(x: Output, y: Output, ops: Operands, tol: float) -> bool:
    """True if two launches left the same C (NaN in the same places, the rest within ``tol``) and changed the same
    elements after it, to the same values within ``tol``."""
    size = ops.m * ops.n
    before = ops.c_buffer[size:].cpu()
    for part_x, part_y, changed in ((x.c_buffer[:size], y.c_buffer[:size], None),
                                    (x.c_buffer[size:], y.c_buffer[size:], before)):
        if changed is not None:
            mask = _changed(part_x, changed)
            if not torch.equal(mask, _changed(part_y, changed)):
                return False
            part_x, part_y = part_x[mask], part_y[mask]
        nan = torch.isnan(part_x)
        if not torch.equal(nan, torch.isnan(part_y)):
            return False
        if (~nan).any() and not relative_error(part_x[~nan], part_y[~nan]) <= tol:
            return False
    return x.inputs_intact == y.inputs_intact


def diagnose_kernel(kernel, case: Case, config: Mapping | None = None, dtype: torch.dtype = torch.float16,
                    seed: int = 0) -> Diagnosis:
    """Launch ``kernel`` (the signature of :func:`.reference.matmul_kernel`) on ``case`` with its tiles, or with
    ``config`` (tiles and launch settings: the student's), on the grid that covers C: 2-D, or 1-D when
    ``GROUP_M`` is set. A wrong C is compared with what each of :data:`.reference.KERNEL_MISTAKES` leaves."""
    if is_stub(kernel):
        return NOT_ANSWERED
    if python_function(kernel) is None:
        return Diagnosis("error", f"the kernel is a {type(kernel).__name__}, not a function decorated with "
                                  "@triton.jit")
    config = {**case.config, **(config or {})}
    blocks = (config["BLOCK_M"], config["BLOCK_N"])
    grid_of = reference.grouped_grid if config.get("GROUP_M") else reference.blocked_grid
    grid = grid_of(case.m, case.n, *blocks)
    ops = operands(case.m, case.n, case.k, max(*blocks, config["BLOCK_K"]), dtype, seed)
    product, tol = ops.product(), tolerance(dtype, case.k)
    out = run(kernel, ops, grid, config)
    if isinstance(out, Diagnosis):
        return out
    said = verdict(out, ops, product, tol, blocks)
    if said.ok:
        return said
    shape = f"A {case.m} x {case.k} times B {case.k} x {case.n}, tiles of {blocks[0]} x {blocks[1]} x " \
            f"{config['BLOCK_K']}"
    detail = f"{shape}: {said.detail}"
    settings = {key: value for key, value in config.items() if key.isupper()}  # the reference takes no num_warps
    c = out.c_buffer[:case.m * case.n].view(case.m, case.n).double()
    rounding = said.problem == "wrong values" and relative_error(c, product) <= ROUNDING * tol
    for mistake in reference.KERNEL_MISTAKES:  # a mistake in the indices is far off; 16-bit sums only a little
        if (mistake.code == reference.SIXTEEN_BIT_SUMS.value) != rounding:
            continue
        wrong = run(reference.matmul_kernel, ops, grid, {**settings, "MISTAKE": mistake.code})
        if isinstance(wrong, Output) and not verdict(wrong, ops, product, tol, blocks).ok \
                and same_output(out, wrong, ops, tol):
            return Diagnosis(mistake.problem, f"{detail}; {mistake.shows}")
    if rounding and case.k >= LONG_K:
        return Diagnosis("16-bit sums", f"{detail}; an error this small, which grows with K, is rounding: the sums "
                                        "are rounded to 16 bits along the way")
    return Diagnosis(said.problem, detail)


def _as_grid(value: object) -> tuple[int, ...] | None:
    if not isinstance(value, tuple | list) or not 1 <= len(value) <= 3:
        return None
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 1 for v in value):
        return None
    return tuple(int(v) for v in value)


def diagnose_grid(grid_fn: Callable, grouped: bool = False) -> Diagnosis:
    """``grid_fn(M, N, BLOCK_M, BLOCK_N)`` must be the grid of one program per tile of C: ``(tiles along M, tiles
    along N)`` for the blocked kernel, ``(tiles,)`` for the grouped one (``grouped``), for each of
    :data:`GRID_CASES`. A grid that is too small is launched with the reference kernel to show what stays NaN."""
    name = getattr(grid_fn, "__name__", "the grid function")
    for m, n, block_m, block_n in GRID_CASES:
        call = f"{name}({m}, {n}, {block_m}, {block_n})"
        got, failure = grading.attempt(lambda m=m, n=n, bm=block_m, bn=block_n: grid_fn(m, n, bm, bn))
        if failure or got is None:
            return NOT_ANSWERED if failure in ("", grading.NOT_ANSWERED) else Diagnosis("error", f"{call}: {failure}")
        expected = (reference.grouped_grid if grouped else reference.blocked_grid)(m, n, block_m, block_n)
        grid = _as_grid(got)
        if grid is None:
            return Diagnosis("not a grid", f"{call} returned {got!r}: a grid is a tuple of whole numbers of programs, "
                                           "one per axis")
        if grid == expected:
            continue
        said = f"{call} returned {grid}, where a C of {m} x {n} in tiles of {block_m} x {block_n} needs {expected}"
        if grouped and len(grid) != 1:
            return Diagnosis("grid not 1-D", said)
        if not grouped and grid == expected[::-1] and grid != expected:
            return Diagnosis("grid axes swapped", f"{said}: the same numbers with the axes the other way round")
        if len(grid) != len(expected):
            return Diagnosis("not a grid", f"{said}: a grid of {len(expected)} axes")
        if any(g < e for g, e in zip(grid, expected, strict=True)):
            return Diagnosis("grid too small", said + _left_unwritten(grid, m, n, block_m, block_n, grouped))
        programs, needed = math.prod(grid), math.prod(expected)
        return Diagnosis("grid too large", f"{said}: {programs - needed} of its {programs} programs have no tile of C "
                                           "to compute")
    return Diagnosis("ok", f"one program per tile, for every case of {GRID_CASES}")


def _left_unwritten(grid: tuple[int, ...], m: int, n: int, block_m: int, block_n: int, grouped: bool) -> str:
    """'. Launched on it, ...': what the reference kernel leaves NaN on ``grid`` (the output is poisoned)."""
    config = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": 16, **({"GROUP_M": 2} if grouped else {})}
    ops = operands(m, n, 24, max(block_m, block_n, 16), seed=1)
    out = run(reference.matmul_kernel, ops, grid, config)
    if isinstance(out, Diagnosis):
        return ""
    unwritten = unwritten_detail(torch.isnan(out.c_buffer[:m * n].view(m, n)), block_m, block_n)
    return f". Launched on that grid, the reference kernel gives a C in which {unwritten}"


def numbering(tile_fn, m: int, n: int, block_m: int, block_n: int, group_m: int, code: int = 0,
              count: int | None = None) -> list[tuple[int, int]]:
    """The tile ``tile_fn`` gives each program id (the first ``count`` ids, if given), read through
    :func:`.reference.probe_kernel` (``code``: a mistake of the reference's :func:`.reference.grouped_tile`)."""
    tiles = reference.grouped_grid(m, n, block_m, block_n)[0]
    count = tiles if count is None else min(positive_int("count", count), tiles)
    out = torch.full((count, 2), -1, dtype=torch.int32, device=kernel_mode.device())
    extra = {"NUMBERING": code} if code else {}
    reference.probe_kernel[(count,)](out, m, n, BLOCK_M=block_m, BLOCK_N=block_n, GROUP_M=group_m, TILE_OF=tile_fn,
                                     **extra)
    kernel_mode.synchronize()
    return [tuple(pair) for pair in out.cpu().tolist()]


def _pairs(tiles: list[tuple[int, int]]) -> str:
    return ", ".join(f"({i}, {j})" for i, j in tiles)


def _numbering_problem(got: list[tuple[int, int]], m: int, n: int, block_m: int, block_n: int,
                       group_m: int) -> tuple[str, str]:
    tiles_m, tiles_n = reference.tiles(m, n, block_m, block_n)
    expected = reference.grouped_order(m, n, block_m, block_n, group_m)
    setting = f"with {tiles_m} x {tiles_n} tiles (M = {m}, N = {n}, tiles of {block_m} x {block_n}) and " \
              f"GROUP_M = {group_m}"
    outside = [(t, tile) for t, tile in enumerate(got) if not (0 <= tile[0] < tiles_m and 0 <= tile[1] < tiles_n)]
    if outside:
        t, tile = outside[0]
        return "outside C", (f"{setting}, {len(outside)} program id(s) are given a tile outside C, the first id {t}: "
                             f"({tile[0]}, {tile[1]}), where grouped order gives ({expected[t][0]}, {expected[t][1]})")
    visits: dict[tuple[int, int], list[int]] = {}
    for t, tile in enumerate(got):
        visits.setdefault(tile, []).append(t)
    twice = [(tile, ids) for tile, ids in visits.items() if len(ids) > 1]
    if twice:
        missing = [tile for tile in expected if tile not in visits]
        tile, ids = twice[0]
        return "not one program per tile", (f"{setting}, tile ({tile[0]}, {tile[1]}) is given to the program ids "
                                            f"{', '.join(map(str, ids))}, and {len(missing)} tile(s) to none, the "
                                            f"first ({missing[0][0]}, {missing[0][1]})")
    first = next(t for t, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b)
    last = min(first + 4, len(got)) - 1
    said = (f"{setting}, every tile is computed once, but in another order: the ids {first} to {last} are given "
            f"{_pairs(got[first:last + 1])}, where grouped order gives {_pairs(expected[first:last + 1])}")
    if got == reference.row_major_order(m, n, block_m, block_n):
        return "row-major order", said + ": that is row by row, the order without groups"
    if got == reference.grid_order(m, n, block_m, block_n):
        return "grid order", said + ": that is column by column, the order of exercise 1's 2-D grid"
    return "not grouped order", said


def diagnose_numbering(tile_fn) -> Diagnosis:
    """``tile_fn(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)``, a ``@triton.jit`` function, must give every program id
    its tile in grouped order (:func:`.reference.grouped_order`), for each of :data:`NUMBERING_CASES`."""
    if is_stub(tile_fn):
        return NOT_ANSWERED
    if python_function(tile_fn) is None:
        return Diagnosis("error", f"grouped_tile is a {type(tile_fn).__name__}, not a function decorated with "
                                  "@triton.jit")
    for case in NUMBERING_CASES:
        try:
            got = numbering(tile_fn, *case)
        except Exception as error:  # the student's function may fail in any way
            return launch_failed(error, tile_fn)
        if got == reference.grouped_order(*case):
            continue
        problem, detail = _numbering_problem(got, *case)
        for mistake in reference.NUMBERING_MISTAKES:
            if numbering(reference.grouped_tile, *case, code=mistake.code) == got:
                return Diagnosis(mistake.problem, f"{detail}; {mistake.shows}")
        return Diagnosis(problem, detail)
    return Diagnosis("ok", "every program id gets its tile in grouped order, the last, shorter group too")
