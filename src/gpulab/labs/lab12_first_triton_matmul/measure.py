"""The student's kernels timed against cuBLAS on a GPU, and the book's recorded ladder for a page without one.

:func:`compare_with_cublas` checks each kernel against float64 before it is timed (a fast wrong answer is worth
nothing), then times it in rounds that take turns with cuBLAS (``torch.mm``) on the same operands, so that its share
of cuBLAS compares two times measured minutes, not hours, apart. :func:`recorded_ladder` tables the recordings of
the book's own ladder (:func:`gpulab.kernels.triton_gemm.ladder.ladder_sweep`, experiment ``triton_gemm_ladder``),
whose steps 1 to 3 are this lab's three kernels.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence

import torch

from gpulab.core import flops, kernel_mode, timing
from gpulab.core.tables import Column, Table, stacked, table
from gpulab.core.validation import fits_in_memory, positive_int
from gpulab.kernels.triton_gemm.common import check, random_operands
from gpulab.kernels.triton_gemm.ladder import CHECK_SIZE, evidence

EVIDENCE = ("registers", "spills", "shared_bytes", "num_stages", "num_warps", "tensor_core", "sass_LDG", "sass_LDGSTS")
LADDER_STEPS = ("cuBLAS", "step1_blocked", "step2_pipelined", "step3_grouped")


def _first_line(error: Exception) -> str:
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:160]}"


def _checked(kernels: Mapping[str, Callable], n: int, dtype: torch.dtype, device: torch.device) -> list[dict]:
    """A row per kernel: "ok" with its relative error at n^3, or why it is not timed."""
    rows = []
    for name, launch in kernels.items():
        def run(a, b, out, launch=launch):
            launch(a, b, out)
            return out

        row = {"kernel": name, "n": n, "dtype": str(dtype).removeprefix("torch.")}
        try:
            check(run, *CHECK_SIZE, dtype, device, what=name)
            row.update(status="ok", relative_error=check(run, n, n, n, dtype, device, what=name))
        except Exception as error:  # a student's kernel: report it in its row
            row["status"] = f"not timed, its check fails: {_first_line(error)}"
        rows.append(row)
    return rows


def compare_with_cublas(kernels: Mapping[str, Callable], n: int, dtype: torch.dtype = torch.float16,
                        rounds: int = 5) -> list[dict]:
    """Check, then time, each ``kernels[name](a, b, out)`` (a launch that writes ``a @ b`` into ``out`` and returns
    what Triton's launch returns) at ``n x n x n``, beside cuBLAS. GPU only.

    Each kernel is checked against float64 at :data:`~gpulab.kernels.triton_gemm.ladder.CHECK_SIZE` (a size no tile
    divides) and at ``n^3``; a failed check is a row whose ``status`` says so. Then ``rounds`` rounds each time
    cuBLAS and every kernel in turn (:func:`gpulab.core.timing.measure`, L2 flushed between runs). A row has the
    median ``seconds``, ``tflops``, ``share_of_cublas`` (the median over the rounds of cuBLAS's time over the
    kernel's, in the same round), and the compiled kernel's evidence (registers, shared memory, stages, loads).
    """
    kernel_mode.require_gpu("compare_with_cublas")
    n, rounds = positive_int("n", n), positive_int("rounds", rounds)
    device = kernel_mode.device()
    fits_in_memory("n", n * n * (3 * torch.finfo(dtype).bits // 8 + 3 * 8), device)  # A, B, C; the float64 check
    rows = _checked(kernels, n, dtype, device)
    a, b = random_operands(n, n, n, dtype, device, seed=n)
    c = torch.empty((n, n), dtype=dtype, device=device)
    timed = {row["kernel"]: kernels[row["kernel"]] for row in rows if row["status"] == "ok"}
    for row in rows:
        if row["kernel"] in timed:
            compiled = timed[row["kernel"]](a, b, c)
            if hasattr(compiled, "asm"):
                row.update({key: value for key, value in evidence(compiled).items() if key in EVIDENCE})
    seconds: dict[str, list[float]] = {name: [] for name in ("cuBLAS", *timed)}
    for _ in range(rounds):
        seconds["cuBLAS"].append(timing.measure(lambda: torch.mm(a, b, out=c), device=device, target_s=0.1).median_s)
        for name, launch in timed.items():
            seconds[name].append(timing.measure(lambda launch=launch: launch(a, b, c), device=device,
                                                target_s=0.1).median_s)
    work = flops.gemm(n, n, n).flops
    base = {"kernel": "cuBLAS", "n": n, "dtype": str(dtype).removeprefix("torch."), "status": "ok"}
    for row in [base, *rows]:
        if row["kernel"] in seconds:
            times = seconds[row["kernel"]]
            row.update(seconds=statistics.median(times), tflops=work / statistics.median(times) / 1e12,
                       share_of_cublas=statistics.median(cu / t for cu, t in zip(seconds["cuBLAS"], times,
                                                                                   strict=True)))
    return [base, *rows]


def _kib(value: object) -> str:
    return f"{value / 1024:,.0f}"


def results_table(rows: Sequence[dict], caption: str = "") -> Table:
    """The rows of :func:`compare_with_cublas` as a table."""
    return table(rows, [Column("kernel"), Column("tflops", "TFLOP/s", format=",.0f"),
                        Column("share_of_cublas", "share of cuBLAS", format=".0%"),
                        Column("num_stages", "stages"), Column("sass_LDGSTS", "LDGSTS"),
                        Column("shared_bytes", "shared memory", "KiB", format=_kib), Column("registers"),
                        Column("status")], caption=caption)


def _is_ladder_step(row: dict, n: int, dtype: str) -> bool:
    kernel = str(row.get("kernel", ""))
    return row.get("n") == n and row.get("dtype") == dtype and (
        kernel in LADDER_STEPS or kernel.startswith("step2_pipelined ("))


def recorded_ladder(runs: Sequence, n: int, dtype: str = "float16") -> Table | None:
    """Steps 1 to 3 of the book's recorded ladder and cuBLAS at ``n^3`` in ``dtype``, every recorded GPU's rows one
    under another; None when no recording has such rows."""
    if not any(_is_ladder_step(row, n, dtype) for run in runs for row in run.rows):
        return None
    return stacked(runs, [Column("kernel"), Column("tflops", "TFLOP/s", format=",.0f"),
                          Column("share_of_cublas", "share of cuBLAS", format=".0%"), Column("num_stages", "stages"),
                          Column("sass_LDGSTS", "LDGSTS"), Column("shared_bytes", "shared memory", "KiB", format=_kib)],
                   where=lambda row: _is_ladder_step(row, n, dtype),
                   caption=f"the book's ladder, steps 1 to 3, at {n:,}^3 in {dtype}, each GPU's cuBLAS in the same run")


def _rows_at(run, n: int, dtype: str) -> dict[str, dict]:
    return {row["kernel"]: row for row in run.rows if _is_ladder_step(row, n, dtype) and row.get("tflops")}


def recorded_ladder_statements(runs: Sequence, n: int, dtype: str = "float16") -> list[str]:
    """Per recorded GPU, in a sentence: what each of this lab's three kernels reached in the book's recorded ladder at
    ``n^3`` in ``dtype`` (share of cuBLAS), and what each step gained over the one before; the larger tile alone
    (step 2 at one stage) where the recording has it. Nothing for a GPU without those rows."""
    said = []
    for run in runs:
        rows = _rows_at(run, n, dtype)
        blocked, pipelined, grouped = (rows.get(k) for k in LADDER_STEPS[1:])
        if not (blocked and pipelined and grouped):
            continue
        one = rows.get("step2_pipelined (num_stages=1)")
        tile = (f"; with one stage, its larger tile alone ran at {one['tflops'] / blocked['tflops']:.2f}x the blocked "
                "kernel" if one else "")
        said.append(f"{run.label}, {dtype} at {n:,}^3: the blocked kernel (step 1) ran at "
                    f"{blocked['share_of_cublas']:.0%} of cuBLAS; the pipelined one (step 2, {pipelined['num_stages']} "
                    f"stages) at {pipelined['share_of_cublas']:.0%}, {pipelined['tflops'] / blocked['tflops']:.2f}x "
                    f"the blocked kernel{tile}; the grouped one (step 3) at {grouped['share_of_cublas']:.0%}, "
                    f"{grouped['tflops'] / pipelined['tflops'] - 1:+.1%} on the pipelined one.")
    return said
