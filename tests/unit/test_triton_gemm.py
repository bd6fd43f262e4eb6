"""The Triton GEMM ladder (gpulab.kernels.triton_gemm): every step against float64 under Triton's interpreter on the
CPU (compiled on a GPU), the launchers' errors, the NumPy 2.4 repair of the interpreter, and the evidence reader.

The package itself switches the interpreter on (TRITON_INTERPRET=1) when there is no GPU, before its kernels are
defined, so nothing needs setting here."""

from __future__ import annotations

import operator
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import needs_gpu
from gpulab.core import kernel_mode
from gpulab.kernels import triton_gemm
from gpulab.kernels.triton_gemm import common, interpreter, ladder, step4_tma, step5_persistent

DEVICE = kernel_mode.device()
SMALL = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16}  # several tiles and K steps at small shapes
STEP_IDS = [step.__name__.rsplit(".", 1)[-1] for step in triton_gemm.STEPS]
TMA_STEPS = {"step4_tma", "step5_persistent", "step6_warp_specialized"}


def small_config(step) -> dict:
    return {**SMALL, **({"GROUP_M": 2} if "GROUP_M" in step.CONFIG else {})}


def test_ladder_lists_six_steps_in_order():
    assert STEP_IDS == ["step1_blocked", "step2_pipelined", "step3_grouped", "step4_tma", "step5_persistent",
                        "step6_warp_specialized"]
    assert all(callable(step.matmul) and step.__doc__ for step in triton_gemm.STEPS)


# Shapes that are no multiple of the blocks; K and N multiples of 8 where TMA needs 16-byte rows.
SHAPES = [(37, 40, 24), (70, 56, 88)]
ODD_SHAPE = (33, 17, 29)


@pytest.mark.parametrize("step", triton_gemm.STEPS, ids=STEP_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_step_matches_float64_on_small_shapes(step, shape):
    dtype = torch.float16
    error = common.check(lambda a, b, out: step.matmul(a, b, out=out, **small_config(step)), *shape, dtype, DEVICE)
    assert error <= common.tolerance(dtype, shape[2])


@pytest.mark.parametrize("step", triton_gemm.STEPS, ids=STEP_IDS)
def test_every_step_with_its_own_tiles(step):
    """The step's real configuration (e.g. 128 x 256 x 64 tiles) on a matrix smaller than one tile."""
    common.check(step.matmul, 24, 40, 72, torch.float16, DEVICE, seed=1)


@pytest.mark.parametrize("step", [s for s in triton_gemm.STEPS if s.__name__.rsplit(".", 1)[-1] not in TMA_STEPS],
                         ids=lambda s: s.__name__.rsplit(".", 1)[-1])
def test_pointer_steps_take_any_shape(step):
    common.check(lambda a, b, out: step.matmul(a, b, out=out, **small_config(step)), *ODD_SHAPE, torch.float16,
                 DEVICE, seed=2)


@pytest.mark.skipif(kernel_mode.on_gpu(), reason="float32 operands are an interpreter-only test")
def test_float32_under_the_interpreter():
    for step in (triton_gemm.step1_blocked, step5_persistent):
        common.check(lambda a, b, out, step=step: step.matmul(a, b, out=out, **small_config(step)), *SHAPES[0],
                     torch.float32, DEVICE, seed=3)


def test_persistent_programs_walk_several_tiles():
    """With 3 programs and 3 x 2 = 6 tiles every program computes two: the tile loop really loops."""
    a, b = common.random_operands(48, 64, 32, torch.float16, DEVICE, seed=4)
    if DEVICE.type == "cpu":
        assert step5_persistent.programs(DEVICE) == 3
    c = step5_persistent.matmul(a, b, **small_config(step5_persistent))
    assert common.check_close(c, a.double().cpu() @ b.double().cpu(), common.tolerance(torch.float16, 32), "tiles")


def test_a_wrong_kernel_fails_the_check():
    def off_by_one_row(a, b, out):
        out.copy_(triton_gemm.step1_blocked.matmul(a, b, **SMALL).roll(1, dims=0))
        return out

    with pytest.raises(AssertionError, match="relative error"):
        common.check(off_by_one_row, *SHAPES[0], torch.float16, DEVICE)


def test_tolerance_follows_the_arithmetic():
    assert common.tolerance(torch.bfloat16, 64) > common.tolerance(torch.float16, 64)
    assert common.tolerance(torch.float16, 8192) > common.tolerance(torch.float16, 64)
    # summing 8192 float16 products in float16 would be off by about sqrt(K) x its roundoff: far above
    assert common.tolerance(torch.float16, 8192) < 8192**0.5 * common.unit_roundoff(torch.float16) / 10


def test_random_operands_are_seeded():
    a1, b1 = common.random_operands(5, 6, 7, torch.float16, DEVICE, seed=9)
    a2, b2 = common.random_operands(5, 6, 7, torch.float16, DEVICE, seed=9)
    assert torch.equal(a1, a2) and torch.equal(b1, b2) and a1.shape == (5, 7) and b1.shape == (7, 6)


def _pair(m=16, n=16, k=16, dtype=torch.float16):
    return common.random_operands(m, n, k, dtype, DEVICE)


@pytest.mark.parametrize("make, error, match", [
    (lambda: ("A", _pair()[1]), TypeError, "a: a torch.Tensor"),
    (lambda: (_pair()[0][0], _pair()[1]), ValueError, "a: a 2-D matrix"),
    (lambda: (_pair(k=16)[0], _pair(k=24)[1]), ValueError, "b: a is 16 x 16, so b needs 16 rows"),
    (lambda: (_pair()[0], _pair()[1].float()), TypeError, "b: the same dtype as a"),
    (lambda: (_pair()[0].to(torch.int32), _pair()[1].to(torch.int32)), TypeError, "a: dtype"),
    (lambda: (_pair(m=32)[0][::2], _pair()[1]), ValueError, "a: contiguous"),
    (lambda: (_pair()[0], _pair()[1].t()), ValueError, "b: contiguous"),
], ids=["not-a-tensor", "one-dimensional", "inner-dimension", "mixed-dtypes", "integer", "strided-a",
        "transposed-b"])
def test_bad_inputs_raise_clear_errors(make, error, match):
    a, b = make()
    for step in triton_gemm.STEPS:
        with pytest.raises(error, match=match):
            step.matmul(a, b)


def test_bad_settings_and_out_raise_clear_errors():
    a, b = _pair()
    with pytest.raises(ValueError, match="unknown"):
        triton_gemm.step1_blocked.matmul(a, b, GROUP_M=8)
    with pytest.raises(ValueError, match="BLOCK_K must be a power of two >= 16"):
        triton_gemm.step3_grouped.matmul(a, b, BLOCK_K=24)
    with pytest.raises(ValueError, match="num_warps must be a positive int"):
        triton_gemm.step2_pipelined.matmul(a, b, num_warps=0)
    with pytest.raises(ValueError, match="out: a contiguous"):
        triton_gemm.step1_blocked.matmul(a, b, out=torch.empty(16, 8, dtype=a.dtype, device=DEVICE))


def test_tma_steps_name_the_alignment_they_need():
    a, b = _pair(k=20)  # a row of a is 20 x 2 = 40 bytes, not a multiple of 16
    for step in (step4_tma, step5_persistent, triton_gemm.step6_warp_specialized):
        with pytest.raises(ValueError, match="a: TMA needs rows of a multiple of 16 bytes"):
            step.matmul(a, b)


@pytest.mark.skipif(kernel_mode.on_gpu(), reason="the interpreter's limitation")
def test_bfloat16_is_refused_under_the_interpreter():
    a, b = _pair(dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16 runs on the GPU only"):
        triton_gemm.step1_blocked.matmul(a, b)


# The NumPy 2.4 repair of Triton 3.6's interpreter (gpulab.kernels.triton_gemm.interpreter).

@pytest.mark.skipif(kernel_mode.on_gpu(), reason="the interpreter runs without a GPU")
def test_interpreter_is_on_and_repaired_without_a_gpu():
    assert interpreter.interpreting() and os.environ["TRITON_INTERPRET"] == "1"
    assert interpreter.numpy_refuses_scalar_of_array() == (np.lib.NumpyVersion(np.__version__) >= "2.4.0")
    assert interpreter.index_repair_installed() == interpreter.numpy_refuses_scalar_of_array()


def test_pinned_triton_still_has_the_index_bug():
    """Fails when Triton fixes __index__ (triton-lang/triton#9172): then drop the repair and this test."""
    import triton

    assert triton.__version__ == "3.6.0"
    assert interpreter.triton_has_index_bug()


def _interpreted_scalar(value: int):
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    return tl.tensor(TensorHandle(np.array([value], dtype=np.int32), tl.int32), tl.int32)


def test_triton_index_fails_under_numpy_2_4_and_the_repair_converts():
    """The cause, with Triton's own method: a scalar is a one-element array, and int() of it is refused."""
    import triton.language as tl
    from triton.runtime import interpreter as triton_interpreter

    original = getattr(interpreter._index_repaired, "original", triton_interpreter._patch_lang_tensor)
    for patch, works in ((original, not interpreter.numpy_refuses_scalar_of_array()),
                         (interpreter._index_repaired, True)):
        interpreter._index_repaired.original = original
        scope = triton_interpreter._LangPatchScope()
        patch(tl.tensor, scope)
        try:
            if works:
                assert operator.index(_interpreted_scalar(7)) == 7
                assert list(range(_interpreted_scalar(3))) == [0, 1, 2]
            else:
                with pytest.raises(TypeError, match="only 0-dimensional arrays"):
                    operator.index(_interpreted_scalar(7))
        finally:
            scope.restore()
    assert not hasattr(tl.tensor, "__index__") or tl.tensor.__index__ is not interpreter.scalar_index


# Reading the evidence from a compiled kernel.

SASS_CUOBJDUMP = textwrap.dedent("""\
        code for sm_90a
                Function : matmul_kernel
        /*0000*/                   LDC R1, c[0x0][0x28] ;                      /* 0x00000a00ff017b82 */
        /*0010*/              @!P0 LDG.E.128 R4, desc[UR4][R2.64] ;            /* 0x000000040204a981 */
        /*0020*/                   UTMALDG.2D [UR8], [UR4] ;                   /* 0x00000008040075b4 */
        /*0030*/                   HGMMA.64x256x16.F32 R24, gdesc[UR8], R24 ;  /* 0x0000000818187df0 */
        /*0040*/                   HGMMA.64x256x16.F32 R24, gdesc[UR12], R24 ; /* 0x0000000c18187df0 */
        /*0050*/              @UP0 USETMAXREG.DEALLOC.CTAPOOL 0x28 ;           /* 0x0000000000000000 */
        /*0060*/                   EXIT ;                                      /* 0x000000000000794d */
""")
SASS_TRITON = "Function:k\n--:-:1:-:1\tLDC R1, c[0x0][0x28];\n02:-:-:Y:2\tHMMA.16816.F32 R4, R8, R12, R4;\n" \
              "--:-:-:-:1\t@P1 LDGSTS.E.BYPASS.128 [R3], desc[UR6][R4.64];\n--:-:-:-:5\tEXIT;\n"


def test_instruction_mix_reads_both_disassembly_formats():
    mix = ladder.instruction_mix(SASS_CUOBJDUMP)
    assert mix == {"LDC": 1, "LDG": 1, "UTMALDG": 1, "HGMMA": 2, "USETMAXREG": 1, "EXIT": 1}
    assert ladder.instruction_mix(SASS_TRITON) == {"LDC": 1, "HMMA": 1, "LDGSTS": 1, "EXIT": 1}
    with pytest.raises(TypeError, match="sass"):
        ladder.instruction_mix(b"HGMMA")


def test_evidence_of_a_compiled_kernel():
    compiled = SimpleNamespace(asm={"sass": SASS_CUOBJDUMP, "ttgir": ""}, n_regs=168, n_spills=0,
                               metadata=SimpleNamespace(shared=147480, num_stages=3, num_warps=8))
    row = ladder.evidence(compiled)
    assert row["sass_HGMMA"] == 2 and row["sass_UTMALDG"] == 1 and row["sass_HMMA"] == 0
    assert row["tensor_core"] == "HGMMA (wgmma)" and row["warp_specialized"] is True
    assert (row["registers"], row["shared_bytes"], row["num_stages"], row["sass_instructions"]) == (168, 147480, 3, 7)


def test_cross_compiling_for_hopper_shows_each_steps_instructions():
    """Compiled for sm_90 without a GPU (Triton's own ptxas and cuobjdump), in a process whose kernels are
    defined for compiling: step 1 multiplies with HGMMA fed by the threads' own loads (LDG, or LDGSTS when
    pipelined), step 4 loads by TMA."""
    script = textwrap.dedent("""
        from gpulab.kernels import triton_gemm
        from gpulab.kernels.triton_gemm import ladder
        for step in (triton_gemm.step1_blocked, triton_gemm.step4_tma):
            e = ladder.evidence(ladder.cross_compile(step, "float16", BLOCK_N=128, num_stages=2))
            loads = e["sass_LDG"] + e["sass_LDGSTS"]
            print(step.__name__, e["sass_HGMMA"], loads, e["sass_UTMALDG"], e["shared_bytes"])
    """)
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    hgmma1, ldg1, tma1, _ = map(int, lines["gpulab.kernels.triton_gemm.step1_blocked"].split())
    hgmma4, ldg4, tma4, _ = map(int, lines["gpulab.kernels.triton_gemm.step4_tma"].split())
    assert hgmma1 > 0 and ldg1 > 0 and tma1 == 0
    assert hgmma4 > 0 and ldg4 == 0 and tma4 > 0


def test_the_pointer_steps_load_sixteen_bytes_at_a_time_without_spilling():
    """Steps 1-3 at their own configs, compiled for sm_90: their global loads move 16 bytes (LDG.E.128 or the
    asynchronous LDGSTS), never one 2-byte element (LDG.E.U16), and nothing spills to local memory. Clamping the
    tile's indices with tl.where hid their contiguity from the compiler: B was loaded 2 bytes at a time, with 255
    registers and spills, and the steps ran at 7% of cuBLAS on an H100."""
    script = textwrap.dedent("""
        import re
        from gpulab.kernels import triton_gemm
        from gpulab.kernels.triton_gemm import ladder
        for step in (triton_gemm.step1_blocked, triton_gemm.step2_pipelined, triton_gemm.step3_grouped):
            sass = ladder.cross_compile(step, "float16").asm["sass"]
            widths = sorted(set(re.findall(r"\\b(LDG\\.E[.\\w]*|LDGSTS[.\\w]*)", sass)))
            spills = len(re.findall(r"\\b(STL|LDL)\\b", sass))
            print(step.__name__.rsplit(".", 1)[-1], spills, *widths)
    """)
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 3, done.stdout
    for line in lines:
        step, spills, *loads = line.split()
        assert loads and all(".128" in op or op.startswith("LDGSTS") for op in loads), f"{step}: loads {loads}"
        assert spills == "0", f"{step}: {spills} local-memory loads and stores (spills)"


def test_cross_compile_refuses_interpreted_kernels():
    if not interpreter.interpreting():
        pytest.skip("the kernels are compiled here")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=0"):
        ladder.cross_compile(triton_gemm.step1_blocked)


@needs_gpu(capability=(9, 0))
@pytest.mark.parametrize("step", triton_gemm.STEPS, ids=STEP_IDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_every_step_on_the_gpu(step, dtype):
    common.check(step.matmul, *ladder.CHECK_SIZE, dtype)
