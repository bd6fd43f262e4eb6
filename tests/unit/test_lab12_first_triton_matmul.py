"""Lab 12's graders (``gpulab.labs.lab12_first_triton_matmul``): the solution's kernels pass every check, each
typical wrong kernel gets the diagnosis (and so the hint) that names its mistake, an untouched exercise is "not
answered yet", and the pipelining questions are graded against the compiled code.

The wrong kernels are the solution with one mistake written in, as a student would: each is the solution's source
with a piece replaced, saved as a module (Triton reads a kernel's source from its file) and imported. Without a GPU
they run in Triton's interpreter, as the lab does.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import needs_gpu
from gpulab.core import kernel_mode
from gpulab.core.recordings import Recording
from gpulab.kernels.triton_gemm.ladder import SIGNATURE_OPCODES
from gpulab.labs import grading
from gpulab.labs.lab12_first_triton_matmul import diagnose, evidence, hints, measure, questions, reference

HEADER = "import triton\nimport triton.language as tl\n\n\n"
BLOCKED = '''
@triton.jit
def blocked_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows = offs_m % M
    cols = offs_n % N
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + cols[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
'''
GROUPED_TILE = '''
@triton.jit
def grouped_tile(tile_id, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles_per_group = GROUP_M * tiles_n
    first_m = (tile_id // tiles_per_group) * GROUP_M
    rows_in_group = min(tiles_m - first_m, GROUP_M)
    within = tile_id % tiles_per_group
    pid_m = first_m + within % rows_in_group
    pid_n = within // rows_in_group
    return pid_m, pid_n
'''
GROUPED_KERNEL = GROUPED_TILE + BLOCKED.replace("def blocked_kernel", "def grouped_kernel").replace(
    "BLOCK_K: tl.constexpr):", "BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):").replace(
    "    pid_m = tl.program_id(0)\n    pid_n = tl.program_id(1)\n",
    "    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)\n")
STUB = '''
@triton.jit
def blocked_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The exercise, untouched."""
    # YOUR CODE HERE
    pass
'''
SOURCES: dict[str, Path] = {}


def kernel(source: str, name: str, *edits: tuple[str, str]):
    """The ``@triton.jit`` function ``name`` of ``source`` with each ``(old, new)`` edit made once."""
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new, 1)
    path = SOURCES.get(source)
    if path is None:
        path = SOURCES[source] = Path(FOLDER) / f"lab12_kernel_{len(SOURCES)}.py"
        path.write_text(HEADER + source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


@pytest.fixture(scope="module", autouse=True)
def folder(tmp_path_factory):
    global FOLDER
    FOLDER = tmp_path_factory.mktemp("lab12")
    yield FOLDER


FIRST, TINY, LONG = diagnose.BLOCKED_CASES


def graded(diagnosis, hints_of) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        grading.grade(grading.Grader(strict=False), "the check", diagnosis, hints_of)
    return " ".join(out.getvalue().split())


# The blocked kernel and its grid.

def test_the_solution_passes_every_case():
    blocked = kernel(BLOCKED, "blocked_kernel")
    for case in diagnose.BLOCKED_CASES:
        assert diagnose.diagnose_kernel(blocked, case).ok, case


KERNEL_MISTAKES = [
    ("no k mask", FIRST, [("mask=offs_k[None, :] < k_left, other=0.0", ""), ("mask=offs_k[:, None] < k_left, other=0.0",
                                                                            "")]),
    ("no k mask", FIRST, [("< k_left, other", "< K, other"), ("< k_left, other", "< K, other")]),  # masks against K
    ("short k loop", FIRST, [("range(0, tl.cdiv(K, BLOCK_K))", "range(0, K // BLOCK_K)")]),
    ("pointers not advanced", FIRST, [("a_ptrs += BLOCK_K * stride_ak", "pass"), ("b_ptrs += BLOCK_K * stride_bk",
                                                                                "pass")]),
    ("a strides swapped", FIRST, [("rows[:, None] * stride_am + offs_k[None, :] * stride_ak",
                                   "rows[:, None] * stride_ak + offs_k[None, :] * stride_am")]),
    ("b strides swapped", FIRST, [("offs_k[:, None] * stride_bk + cols[None, :] * stride_bn",
                                   "offs_k[:, None] * stride_bn + cols[None, :] * stride_bk")]),
    ("c strides swapped", FIRST, [("offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn",
                                   "offs_m[:, None] * stride_cn + offs_n[None, :] * stride_cm")]),
    ("no store mask", FIRST, [(", mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))", ")")]),
    ("store mask rows only", FIRST, [("mask=(offs_m[:, None] < M) & (offs_n[None, :] < N)",
                                      "mask=offs_m[:, None] < M")]),
    ("store mask columns only", FIRST, [("mask=(offs_m[:, None] < M) & (offs_n[None, :] < N)",
                                         "mask=offs_n[None, :] < N")]),
    ("program ids swapped", FIRST, [("pid_m = tl.program_id(0)", "pid_m = tl.program_id(1)"),
                                    ("pid_n = tl.program_id(1)", "pid_n = tl.program_id(0)")]),
    ("16-bit sums", LONG, [("dtype=tl.float32)", "dtype=tl.float16)"),
                           ("acc = tl.dot(a, b, acc)", "acc += tl.dot(a, b).to(tl.float16)")]),
    ("16-bit sums", LONG, [("dtype=tl.float32)", "dtype=tl.float16)"),
                           ("acc = tl.dot(a, b, acc)", "acc = tl.dot(a, b, acc, out_dtype=tl.float16)")]),
]


@pytest.mark.parametrize(("problem", "case", "edits"), KERNEL_MISTAKES,
                         ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(KERNEL_MISTAKES)])
def test_each_typical_wrong_kernel_is_named(problem, case, edits):
    diagnosis = diagnose.diagnose_kernel(kernel(BLOCKED, "blocked_kernel", *edits), case)
    assert diagnosis.problem == problem, diagnosis.detail
    assert f"A {case.m} x {case.k} times B {case.k} x {case.n}" in diagnosis.detail  # what it was run on
    text = graded(diagnosis, hints.KERNEL)
    assert "NOT YET" in text and " ".join(hints.KERNEL[problem].split()) in text


def test_what_came_back_and_what_was_expected():
    diagnosis = diagnose.diagnose_kernel(kernel(BLOCKED, "blocked_kernel", *KERNEL_MISTAKES[2][2]), FIRST)
    assert "where float64 gives" in diagnosis.detail and "a correct kernel stays under" in diagnosis.detail
    assert "K // BLOCK_K steps" in diagnosis.detail  # ... and what the mistaken kernel does


def test_mistakes_of_the_edges_show_only_at_an_edge():
    """Masks along K matter only for a ragged K; 16-bit sums pass a short K; a K loop of one step hides pointers
    that never move."""
    no_mask = kernel(BLOCKED, "blocked_kernel", *KERNEL_MISTAKES[0][2])
    even = diagnose.Case("K a multiple of BLOCK_K", 45, 37, 48, 32, 16, 16)
    assert diagnose.diagnose_kernel(no_mask, even).ok
    sixteen = kernel(BLOCKED, "blocked_kernel", *KERNEL_MISTAKES[-1][2])
    assert diagnose.diagnose_kernel(sixteen, FIRST).ok
    still = kernel(BLOCKED, "blocked_kernel", *KERNEL_MISTAKES[3][2])
    assert diagnose.diagnose_kernel(still, TINY).ok


def test_unwritten_tiles_are_located():
    no_column = kernel(BLOCKED, "blocked_kernel", ("pid_n = tl.program_id(1)", "pid_n = 0 * tl.program_id(1)"))
    diagnosis = diagnose.diagnose_kernel(no_column, FIRST)
    assert diagnosis.problem == "unwritten"
    assert "whole tiles, 4 of the 6" in diagnosis.detail and "columns 16 to 36" in diagnosis.detail


def test_an_untouched_kernel_is_not_answered_and_an_error_names_its_line():
    stub = kernel(STUB, "blocked_kernel")
    assert diagnose.is_stub(stub) and not diagnose.is_stub(kernel(BLOCKED, "blocked_kernel"))
    assert diagnose.diagnose_kernel(stub, FIRST) == diagnose.NOT_ANSWERED
    assert "not answered yet" in graded(diagnose.NOT_ANSWERED, hints.KERNEL)
    broken = kernel(BLOCKED, "blocked_kernel", ("acc = tl.dot(a, b, acc)", "acc = tl.dot(a, acc)"))
    diagnosis = diagnose.diagnose_kernel(broken, FIRST)
    assert diagnosis.problem == "error" and "in the line `acc = tl.dot(a, acc)`" in diagnosis.detail
    not_jit = diagnose.diagnose_kernel(lambda *args: None, FIRST)
    assert not_jit.problem == "error" and "@triton.jit" in not_jit.detail


def test_the_mistaken_reference_kernels_fail_and_the_correct_one_passes():
    """Every switch of the reference kernel is a real mistake on some case, and 0 is right on all of them."""
    for mistake in (None, *reference.KERNEL_MISTAKES):
        case = LONG if mistake and mistake.problem == "16-bit sums" else FIRST
        ops = diagnose.operands(case.m, case.n, case.k, 32)
        product, tol = ops.product(), diagnose.tolerance(torch.float16, case.k)
        grid = reference.blocked_grid(case.m, case.n, case.block_m, case.block_n)
        out = diagnose.run(reference.matmul_kernel, ops, grid, {**case.config, "MISTAKE": mistake.code if mistake
                                                                  else 0})
        said = diagnose.verdict(out, ops, product, tol, (case.block_m, case.block_n))
        assert said.ok == (mistake is None), (mistake, said)


GRIDS = [
    (lambda M, N, BM, BN: (M // BM, N // BN), "grid too small", "whole tiles"),
    (lambda M, N, BM, BN: (M // BM + 1, N // BN + 1), "grid too large", "programs have no tile"),
    (lambda M, N, BM, BN: (-(-N // BN), -(-M // BM)), "grid axes swapped", "the other way round"),
    (lambda M, N, BM, BN: (M / BM, N / BN), "not a grid", "whole numbers"),
    (lambda M, N, BM, BN: (-(-M // BM) * -(-N // BN),), "not a grid", "a grid of 2 axes"),
    (lambda M, N, BM, BN: None, "not answered", "not answered yet"),
]


@pytest.mark.parametrize(("grid", "problem", "said"), GRIDS, ids=[g[1] + str(i) for i, g in enumerate(GRIDS)])
def test_grid_mistakes_are_named(grid, problem, said):
    diagnosis = diagnose.diagnose_grid(grid)
    assert diagnosis.problem == problem and said in diagnosis.detail
    assert problem == "not answered" or " ".join(hints.GRID[problem].split()) in graded(diagnosis, hints.GRID)


def test_the_right_grids_pass():
    assert diagnose.diagnose_grid(lambda M, N, BM, BN: (-(-M // BM), -(-N // BN))).ok
    assert diagnose.diagnose_grid(lambda M, N, BM, BN: (-(-M // BM) * -(-N // BN),), grouped=True).ok
    assert diagnose.diagnose_grid(lambda M, N, BM, BN: (2, 3), grouped=True).problem == "grid not 1-D"
    assert diagnose.diagnose_grid(lambda *a: 1 / 0).problem == "error"
    assert diagnose.diagnose_grid(lambda M, N, BM, BN: (np.int64(-(-M // BM)), np.int64(-(-N // BN)))).ok


# The grouped numbering and kernel.

def test_the_grouped_numbering_and_kernel_pass():
    assert diagnose.diagnose_numbering(kernel(GROUPED_TILE, "grouped_tile")).ok
    grouped = kernel(GROUPED_KERNEL, "grouped_kernel")
    for case in diagnose.GROUPED_CASES:
        assert diagnose.diagnose_kernel(grouped, case).ok, case


def test_the_reference_numbering_is_the_plain_python_one():
    for case in diagnose.NUMBERING_CASES:
        assert diagnose.numbering(reference.grouped_tile, *case) == reference.grouped_order(*case)
    assert diagnose.numbering(reference.grouped_tile, *diagnose.NUMBERING_CASES[0], count=4) == \
        reference.grouped_order(*diagnose.NUMBERING_CASES[0])[:4]


NUMBERING_MISTAKES = [
    ("last group not clamped", [("min(tiles_m - first_m, GROUP_M)", "GROUP_M")], "outside C"),
    ("row not wrapped", [("pid_m = first_m + within % rows_in_group", "pid_m = first_m + tile_id % rows_in_group")],
     "in another order"),
    ("column divided by GROUP_M", [("pid_n = within // rows_in_group", "pid_n = within // GROUP_M")],
     "is given to the program ids"),
    ("group spans rows", [("tiles_per_group = GROUP_M * tiles_n", "tiles_per_group = GROUP_M * tiles_m")],
     "outside C"),
    ("row-major order", [("pid_m = first_m + within % rows_in_group", "pid_m = first_m + within // tiles_n"),
                         ("pid_n = within // rows_in_group", "pid_n = within % tiles_n")], "row by row"),
    ("grid order", [("pid_m = first_m + within % rows_in_group", "pid_m = tile_id % tiles_m"),
                    ("pid_n = within // rows_in_group", "pid_n = tile_id // tiles_m")], "column by column"),
    ("not one program per tile", [("pid_n = within // rows_in_group", "pid_n = within // rows_in_group // 2")],
     "and 5 tile(s) to none"),
    ("not grouped order", [("pid_n = within // rows_in_group", "pid_n = (within // rows_in_group + 1) % tiles_n")],
     "in another order"),
]


@pytest.mark.parametrize(("problem", "edits", "said"), NUMBERING_MISTAKES, ids=[m[0] for m in NUMBERING_MISTAKES])
def test_numbering_mistakes_are_named(problem, edits, said):
    diagnosis = diagnose.diagnose_numbering(kernel(GROUPED_TILE, "grouped_tile", *edits))
    assert diagnosis.problem == problem and said in diagnosis.detail
    assert " ".join(hints.NUMBERING[problem].split()) in graded(diagnosis, hints.NUMBERING)


def test_an_untouched_numbering_is_not_answered():
    stub = GROUPED_TILE.split("    tiles_m")[0] + "    # YOUR CODE HERE\n    pass\n"
    assert diagnose.diagnose_numbering(kernel(stub, "grouped_tile")) == diagnose.NOT_ANSWERED


def test_a_grouped_kernel_on_two_program_ids_leaves_tiles_unwritten():
    wrong = kernel(GROUPED_KERNEL, "grouped_kernel", (
        "pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)",
        "pid_m = tl.program_id(0)\n    pid_n = tl.program_id(1)"))
    diagnosis = diagnose.diagnose_kernel(wrong, diagnose.GROUPED_CASES[0])
    assert diagnosis.problem == "unwritten"
    assert "1-D grid" in graded(diagnosis, hints.GROUPED_KERNEL)


# The pipelining exercise.

@pytest.mark.parametrize(("config", "problem"), [
    (dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3), "ok"),
    (dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_warps=4, num_stages=4), "ok"),
    (None, "not answered"),
    ((128, 256, 64, 8, 3), "not a config"),
    (dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8), "not a config"),
    (dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=1), "one stage"),
    (dict(BLOCK_M=32, BLOCK_N=128, BLOCK_K=32, num_warps=4, num_stages=3), "small tiles"),
    (dict(BLOCK_M=128, BLOCK_N=32, BLOCK_K=32, num_warps=4, num_stages=3), "small tiles"),
    (dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=5), "too much shared memory"),
    (dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=48, num_warps=8, num_stages=3), "bad setting"),
    (dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=2, num_stages=3), "bad setting"),
])
def test_pipelined_settings(config, problem):
    assert questions.diagnose_config(config).problem == problem


@pytest.mark.parametrize(("count", "problem"), [
    (lambda bm, bn, bk, s, e: s * (bm + bn) * bk * e, "ok"),
    (lambda bm, bn, bk, s, e: (bm + bn) * bk * e, "stages not counted"),
    (lambda bm, bn, bk, s, e: 8 * s * (bm + bn) * bk * e, "bits, not bytes"),
    (lambda bm, bn, bk, s, e: s * (bm + bn) * bk * e / 1024, "kibibytes"),
    (lambda bm, bn, bk, s, e: s * (bm + bn) * bk, "element size not counted"),
    (lambda bm, bn, bk, s, e: s * bm * bk * e, "one tile only"),
    (lambda bm, bn, bk, s, e: s * (bm + bn) * bk * e + bm * bn * 4, "C tile counted"),
    (lambda bm, bn, bk, s, e: 1000, "wrong count"),
    (lambda bm, bn, bk, s, e: "many", "not a number"),
    (lambda bm, bn, bk, s, e: None, "not answered"),
    (lambda bm, bn, bk, s, e: 1 / 0, "error"),
])
def test_shared_memory_counts(count, problem):
    diagnosis = questions.diagnose_shared_bytes(count)
    assert diagnosis.problem == problem, diagnosis.detail
    if problem not in ("ok", "not answered", "error", "not a number"):
        assert "expected 147,456" in diagnosis.detail


def _compiled(one: dict, more: dict) -> dict:
    row = dict.fromkeys((f"sass_{op}" for op in SIGNATURE_OPCODES), 0)
    return {1: {**row, **one}, 3: {**row, **more}}


def test_the_async_copy_question_is_graded_against_the_compiled_code():
    compiled = _compiled({"sass_LDG": 12, "sass_STS": 28, "sass_HGMMA": 4},
                         {"sass_LDGSTS": 36, "sass_STS": 16, "sass_HGMMA": 4})
    assert questions.appearing(compiled) == ["LDGSTS"]
    assert questions.diagnose_async_copy("LDGSTS", compiled).ok
    assert questions.diagnose_async_copy("ldgsts.E.BYPASS", compiled).ok
    assert questions.diagnose_async_copy("LDG", compiled).problem == "not the new instruction"
    assert questions.diagnose_async_copy("HGMMA", compiled).problem == "not the new instruction"
    assert questions.diagnose_async_copy("TMA", compiled).problem == "not an instruction"
    assert questions.diagnose_async_copy(3, compiled).problem == "not an instruction"
    assert questions.diagnose_async_copy(None, compiled) == diagnose.NOT_ANSWERED
    assert questions.diagnose_async_copy("LDGSTS", None).problem == "not compiled"


def test_the_student_kernel_compiled_for_hopper_shows_the_pipeline():
    """Compiled for sm_90 in a second process (no GPU needed): one stage loads with LDG, two with LDGSTS, and the
    shared memory is a tile of A and of B per stage, as pipeline_shared_bytes counts."""
    config = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_warps=4, num_stages=2)
    compiled = evidence.compile_for_hopper(kernel(BLOCKED, "blocked_kernel"), config, [1, 2])
    assert isinstance(compiled, dict), compiled
    assert questions.appearing(compiled) == ["LDGSTS"]
    assert compiled[1]["sass_LDG"] > 0 and compiled[2]["sass_LDG"] == 0
    assert compiled[1]["tensor_core"] == compiled[2]["tensor_core"] == "HGMMA (wgmma)"
    for depth, row in compiled.items():
        assert row["shared_bytes"] == reference.pipeline_shared_bytes(64, 64, 32, depth)


def test_what_cannot_be_compiled_is_said_in_a_sentence():
    said = evidence.compile_for_hopper(lambda: None, {"BLOCK_M": 64}, [1])
    assert isinstance(said, str) and said.startswith("The kernel's source could not be read")
    with pytest.raises(ValueError, match="stages"):
        evidence.compile_for_hopper(kernel(BLOCKED, "blocked_kernel"), {}, [0])
    with pytest.raises(TypeError, match="config"):
        evidence.compile_for_hopper(kernel(BLOCKED, "blocked_kernel"), [64], [1])


# The counts and the measurement.

def test_the_panels_a_wave_reads():
    n, block_m, block_n = 8192, 128, 256
    assert reference.wave_panels(reference.grid_order(n, n, block_m, block_n), 132) == (64, 3)
    assert reference.wave_panels(reference.row_major_order(n, n, block_m, block_n), 132) == (5, 32)
    assert reference.wave_panels(reference.grouped_order(n, n, block_m, block_n, 8), 132) == (8, 17)
    assert reference.wave_bytes(reference.grouped_order(n, n, block_m, block_n, 8), 132, n, block_m, block_n) == \
        (8 * 128 + 17 * 256) * n * 2


def test_compare_with_cublas_needs_a_gpu():
    if kernel_mode.on_gpu():
        pytest.skip("a GPU is here")
    with pytest.raises(ValueError, match="compare_with_cublas"):
        measure.compare_with_cublas({}, 256)


def _ladder(device: str) -> Recording:
    rows = [{"n": 8192, "dtype": "float16", "kernel": name, "tflops": tflops, "share_of_cublas": share,
             "num_stages": stages, "sass_LDGSTS": ldgsts, "shared_bytes": shared}
            for name, tflops, share, stages, ldgsts, shared in (
                ("cuBLAS", 700.0, 1.0, None, None, None), ("step1_blocked", 300.0, 0.43, 1, 0, 16384),
                ("step2_pipelined", 500.0, 0.71, 3, 36, 147456), ("step2_pipelined (num_stages=1)", 250.0, 0.36, 1, 0,
                                                                 49152),
                ("step3_grouped", 520.0, 0.74, 3, 36, 147456), ("step4_tma", 650.0, 0.93, 3, 0, 147456))]
    rows.append({**rows[1], "n": 4096})
    provenance = {"device": {"name": device, "kind": "cuda"}, "recorded": True, "date": "2026-12-01"}
    return Recording("triton_gemm_ladder", "m:f", {}, rows, provenance)


def test_the_recorded_ladder_table():
    shown = str(measure.recorded_ladder([_ladder("NVIDIA H100 80GB HBM3"), _ladder("NVIDIA H200")], 8192))
    assert shown.count("step1_blocked") == 2 and "step4_tma" not in shown and "H200" in shown
    assert "71%" in shown and "144" in shown  # the share of cuBLAS, the shared memory in KiB
    assert measure.recorded_ladder([], 8192) is None
    assert measure.recorded_ladder([_ladder("NVIDIA H200")], 2048) is None



def test_the_recorded_ladder_in_sentences():
    said = measure.recorded_ladder_statements([_ladder("NVIDIA H100 80GB HBM3"), _ladder("NVIDIA H200")], 8192)
    assert len(said) == 2 and said[1].startswith("NVIDIA H200, recorded 2026-12-01, float16 at 8,192^3")
    assert said[0].endswith(f"the blocked kernel (step 1) ran at 43% of cuBLAS; the pipelined one (step 2, 3 "
                            f"stages) at 71%, {500 / 300:.2f}x the blocked kernel; with one stage, its larger tile "
                            f"alone ran at {250 / 300:.2f}x the blocked kernel; the grouped one (step 3) at 74%, "
                            f"{520 / 500 - 1:+.1%} on the pipelined one.")
    assert measure.recorded_ladder_statements([_ladder("NVIDIA H200")], 2048) == []

def test_the_results_table():
    rows = [{"kernel": "cuBLAS", "tflops": 700.0, "share_of_cublas": 1.0, "status": "ok"},
            {"kernel": "yours", "status": "not timed, its check fails: AssertionError: relative error"}]
    shown = str(measure.results_table(rows))
    assert "100%" in shown and "not timed" in shown


@needs_gpu(capability=(9, 0))
def test_compare_with_cublas_on_a_gpu():
    config = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3)
    blocked = kernel(BLOCKED, "blocked_kernel")
    wrong = kernel(BLOCKED, "blocked_kernel", *KERNEL_MISTAKES[2][2])
    rows = measure.compare_with_cublas({
        "yours": lambda a, b, out: reference.launch(blocked, a, b, out, reference.blocked_grid(
            a.shape[0], b.shape[1], 128, 128), config),
        "wrong": lambda a, b, out: reference.launch(wrong, a, b, out, reference.blocked_grid(
            a.shape[0], b.shape[1], 128, 128), config),
    }, 1024, rounds=2)
    by_name = {row["kernel"]: row for row in rows}
    assert by_name["cuBLAS"]["share_of_cublas"] == 1.0 and by_name["yours"]["tflops"] > 0
    assert by_name["yours"]["num_stages"] == 3 and by_name["yours"]["registers"] > 0
    assert by_name["wrong"]["status"].startswith("not timed") and "tflops" not in by_name["wrong"]
