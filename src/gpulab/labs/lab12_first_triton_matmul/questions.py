"""Graders of the lab's pipelining exercise: the launch settings of the pipelined kernel, the shared memory its
stages take, and the instruction that the compiled kernel gains when it is pipelined.

The last one is graded against the compiled code itself: the student's kernel compiled for Hopper with one stage
and with several (:func:`.evidence.compile_for_hopper`), and the instruction counts of both
(:func:`gpulab.kernels.triton_gemm.ladder.evidence`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence

from gpulab.ch10_tensor_cores.wmma import MAX_SHARED_BYTES
from gpulab.kernels.triton_gemm.common import settings
from gpulab.kernels.triton_gemm.ladder import SIGNATURE_OPCODES
from gpulab.labs import grading
from gpulab.labs.lab12_first_triton_matmul.diagnose import NOT_ANSWERED, Diagnosis
from gpulab.labs.lab12_first_triton_matmul.reference import pipeline_shared_bytes

LAUNCH_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")
WARPGROUP_ROWS = 64  # Hopper's warpgroup MMA (wgmma, HGMMA in SASS) works on tiles of 64 rows per warpgroup
WARPS = (4, 8)  # one or two warpgroups of 4 warps
GLOBAL_LOADS = ("LDG", "LDGSTS", "UTMALDG")  # the SASS instructions that read a tile from global memory
SHARED_CASES = ((128, 256, 64, 3, 2), (64, 64, 32, 4, 2), (128, 128, 32, 1, 2), (128, 64, 128, 2, 1))


def diagnose_config(config: object) -> Diagnosis:
    """The pipelined kernel's launch settings, ``{BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages}``: two stages or
    more, tiles of at least 64 x 64 (64 rows, so that Triton uses Hopper's warpgroup MMA; 64 columns, for the
    multiply-adds per byte), 4 or 8 warps, and stages that fit the 227 KiB of shared memory a block may have on
    Hopper."""
    if config is None:
        return NOT_ANSWERED
    if not isinstance(config, Mapping) or sorted(config) != sorted(LAUNCH_KEYS):
        return Diagnosis("not a config", f"PIPELINED is {config!r}: a dict with exactly the keys "
                                         f"{', '.join(LAUNCH_KEYS)}")
    try:
        merged = settings(dict.fromkeys(LAUNCH_KEYS, 1), config, "PIPELINED")
    except ValueError as error:
        return Diagnosis("bad setting", str(error))
    block_m, block_n, block_k, warps, stages = (merged[key] for key in LAUNCH_KEYS)
    shared = pipeline_shared_bytes(block_m, block_n, block_k, stages)
    tiles = f"{stages} stage(s) of {block_m} x {block_n} x {block_k} tiles"
    if stages < 2:
        return Diagnosis("one stage", f"num_stages is {stages}: with one stage the K loop loads a tile, waits for it, "
                                      "then multiplies; nothing is in flight while the tensor cores work")
    if block_m < WARPGROUP_ROWS:
        return Diagnosis("small tiles", f"{tiles}: with fewer than {WARPGROUP_ROWS} rows in a tile (BLOCK_M) the "
                                        "compiler falls back to Ampere's per-warp MMA (HMMA)")
    if block_n < WARPGROUP_ROWS:
        return Diagnosis("small tiles", f"{tiles}: a tile of fewer than {WARPGROUP_ROWS} columns (BLOCK_N) does "
                                        "few multiply-adds per byte it loads")
    if warps not in WARPS:
        return Diagnosis("bad setting", f"num_warps is {warps}: 4 or 8 (one or two warpgroups of 4 warps)")
    if shared > MAX_SHARED_BYTES:
        return Diagnosis("too much shared memory", f"{tiles} take {shared:,} bytes ({shared / 1024:,.0f} KiB) of "
                                                   f"shared memory; a block may have {MAX_SHARED_BYTES // 1024} KiB "
                                                   "on an H100 or H200")
    return Diagnosis("ok", f"{tiles}, {shared / 1024:,.0f} KiB of shared memory, {warps} warps")


# The usual wrong counts of the shared memory, each as a function of (BLOCK_M, BLOCK_N, BLOCK_K, stages, bytes)
SHARED_MISTAKES = (
    ("stages not counted", lambda bm, bn, bk, s, e: (bm + bn) * bk * e),
    ("bits, not bytes", lambda bm, bn, bk, s, e: 8 * pipeline_shared_bytes(bm, bn, bk, s, e)),
    ("kibibytes", lambda bm, bn, bk, s, e: pipeline_shared_bytes(bm, bn, bk, s, e) / 1024),
    ("element size not counted", lambda bm, bn, bk, s, e: s * (bm + bn) * bk),
    ("one tile only", lambda bm, bn, bk, s, e: s * bm * bk * e),
    ("one tile only", lambda bm, bn, bk, s, e: s * bn * bk * e),
    ("C tile counted", lambda bm, bn, bk, s, e: pipeline_shared_bytes(bm, bn, bk, s, e) + bm * bn * e),
    ("C tile counted", lambda bm, bn, bk, s, e: pipeline_shared_bytes(bm, bn, bk, s, e) + bm * bn * 4),
)


def diagnose_shared_bytes(fn: Callable) -> Diagnosis:
    """``fn(BLOCK_M, BLOCK_N, BLOCK_K, num_stages, element_bytes)`` must be the bytes of shared memory of the
    pipelined K loop: a tile of A and one of B per stage (:func:`.reference.pipeline_shared_bytes`). A wrong count
    is named by the usual mistake (:data:`SHARED_MISTAKES`) that gives the same answers in every case."""
    answers = []
    for case in SHARED_CASES:
        call = f"{getattr(fn, '__name__', 'the function')}{case}"
        got, failure = grading.attempt(lambda case=case: fn(*case))
        if failure or got is None:
            return NOT_ANSWERED if failure in ("", grading.NOT_ANSWERED) else Diagnosis("error", f"{call}: {failure}")
        if not isinstance(got, numbers.Real) or isinstance(got, bool) or not math.isfinite(got):
            return Diagnosis("not a number", f"{call} returned {got!r}, not a number of bytes")
        answers.append((call, got, pipeline_shared_bytes(*case)))
    wrong = [(call, got, expected) for call, got, expected in answers if not math.isclose(got, expected, rel_tol=1e-9)]
    if not wrong:
        return Diagnosis("ok", f"the shared memory of every case of {SHARED_CASES}")
    call, got, expected = wrong[0]
    said = f"{call} returned {got:,}, expected {expected:,}"
    for problem, count in SHARED_MISTAKES:
        if all(math.isclose(answer, count(*case), rel_tol=1e-9)
               for (_, answer, _), case in zip(answers, SHARED_CASES, strict=True)):
            return Diagnosis(problem, said)
    return Diagnosis("wrong count", said)


def appearing(compiled: Mapping[int, Mapping], among: Sequence[str] = GLOBAL_LOADS) -> list[str]:
    """The SASS mnemonics of ``among`` absent from the kernel compiled with one stage and present in every one
    compiled with more; ``compiled``: {num_stages: evidence}."""
    one, more = compiled[1], [row for stages, row in compiled.items() if stages > 1]
    return [op for op in among if not one[f"sass_{op}"] and more and all(r[f"sass_{op}"] for r in more)]


def diagnose_async_copy(answer: object, compiled: Mapping[int, Mapping] | None) -> Diagnosis:
    """``answer``, a SASS mnemonic, must be the load from global memory that the compiled kernel has only when
    pipelined (see :func:`appearing`). ``compiled`` is None when the kernel could not be compiled here: nothing to
    check against."""
    if answer is None:
        return NOT_ANSWERED
    if not isinstance(answer, str) or not answer.strip():
        return Diagnosis("not an instruction", f"the answer is {answer!r}: the name of a SASS instruction, a string "
                                               "such as \"HGMMA\"")
    if not compiled or 1 not in compiled or len(compiled) < 2:
        return Diagnosis("not compiled", "the kernel was not compiled with one stage and with more, so there is "
                                         "nothing to compare the answer with")
    name = answer.strip().upper().split(".")[0]
    new = appearing(compiled)
    if name in new:
        return Diagnosis("ok", f"{name}: none with one stage, {compiled[max(compiled)][f'sass_{name}']} with "
                               f"{max(compiled)}")
    counts = ", ".join(f"{row[f'sass_{name}']} with {stages} stage(s)" for stages, row in sorted(compiled.items())) \
        if f"sass_{name}" in compiled[1] else ""
    if not counts or not any(row[f"sass_{name}"] for row in compiled.values()):
        return Diagnosis("not an instruction", f"{answer!r} is in none of the compiled kernels (the table above "
                                               f"counts {', '.join(SIGNATURE_OPCODES)})")
    return Diagnosis("not the new instruction", f"{name}: {counts}; the question asks for the load from global "
                                                "memory that only the pipelined kernels have")
