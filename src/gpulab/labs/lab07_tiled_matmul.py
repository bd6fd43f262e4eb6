"""Grader of the lab "Tiled matrix multiply" (``labs/07_tiled_matmul.ipynb``): a student's shared-memory
matmul kernel run on fresh data, and its wrong values compared with what each usual mistake computes (a K loop
that stops before the last partial tile, stale values in that tile, tiles read transposed, edge tiles skipped,
a race).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from gpulab.ch07_cuda_threads_blocks.threads import blocks_for
from gpulab.core import kernel_mode
from gpulab.core.correctness import poisoned
from gpulab.core.validation import fits_in_memory, positive_int
from gpulab.labs.kernel_grading import (
    COVERING,
    Guarded,
    checked,
    close_to,
    fresh,
    grid_problem,
    guarded,
    launch,
    seeded,
)
from gpulab.labs.kernel_grading import (
    KernelDiagnosis as Diagnosis,
)

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
    bad_grid = grid_problem(grid, (tile, tile), m, n)
    if bad_grid:
        return bad_grid
    grid = (int(grid[0]), int(grid[1]))
    # past any index that a block and thread, or a step along K, can form, and past every matrix
    reach = max(*grid, *(blocks_for(size, tile) for size in (m, k, n))) * tile + tile
    device = kernel_mode.device()
    # A, B and C with their guards, a second C, and float64 copies for the reference and the mistakes' products
    fits_in_memory("m, k and n", 12 * 8 * reach * reach, device)
    generator = seeded(seed)
    a = guarded(fresh((m, k), generator), (reach - m, reach - k), generator)
    b = guarded(fresh((k, n), generator), (reach - k, reach - n), generator)

    def run() -> tuple[Diagnosis | None, Guarded]:
        c = guarded(poisoned((m, n), torch.float32, a.view.device), (reach - m, reach - n), generator)
        arguments = [kernel_mode.device_array(t) for t in (a.view, b.view, c.view)]
        return launch(lambda: kernel[grid, (tile, tile)](*arguments)), c

    failure, c = run()
    if failure:
        return failure
    reference = a.view.double() @ b.view.double()
    diagnosis = checked(c, reference)
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
            wrong = int((~close_to(written, reference.cpu())).sum())
            return Diagnosis("race", f"{wrong} of {m * n} elements are wrong, and a second run on the same A and B "
                                     f"gave different values for {changed}: threads read the tiles while others were "
                                     "still writing them, or overwrote them while others were still reading")
    return diagnosis


def _explain_wrong_matmul(written: torch.Tensor, reference: torch.Tensor, a: Guarded, b: Guarded,
                          tile: int) -> tuple[str, str] | None:
    """(problem, detail to add) if the wrong values of a tiled matmul are what a usual mistake computes."""
    m, k = a.view.shape
    n = b.view.shape[1]
    if kernel_mode.on_gpu():  # loads with no bounds check read the guard zones that follow A's rows and B's columns
        k_reach = blocks_for(k, tile) * tile
        unchecked = a.buffer[:m, :k_reach].double() @ b.buffer[:k_reach, :n].double()
        if bool(close_to(written, unchecked.cpu()).all()):
            return "out of bounds", (": they include values loaded from past the end of A's rows and B's columns, "
                                     "where the last tile along K reaches")
    for problem, product, what in _matmul_mistakes(a.view.double(), b.view.double(), tile):
        if bool(close_to(written, product.cpu()).all()):
            return problem, f"; {what}"
    where = _edge_tiles(~close_to(written, reference.cpu()), tile)
    return ("edge tiles", f"; {where}") if where else None
