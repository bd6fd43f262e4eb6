"""The ladder measured: every step checked, timed against cuBLAS, and the evidence of why it gained.

:func:`ladder_sweep` (GPU only) runs, for each size and dtype, cuBLAS (``torch.mm``) and each step of
:data:`gpulab.kernels.triton_gemm.STEPS`, each first checked against float64 on fresh random data
(:func:`.common.check`, at a size that is no multiple of the tiles and then at the timed size), then timed with
:func:`gpulab.core.timing.measure` in the same run. A row gives the TFLOP/s, the share of cuBLAS, and the
evidence read from the compiled kernel (:func:`evidence`): its tensor-core instructions (HMMA, the per-warp
``mma.sync`` of Ampere, against HGMMA, Hopper's warpgroup ``wgmma``), its loads (LDG, LDGSTS = ``cp.async``,
UTMALDG = TMA), USETMAXREG (warp specialization's register hand-over), registers per thread, shared memory per
program, stages and warps.

:func:`cross_compile` reads the same evidence without a GPU: Triton compiles for a named target (sm_90, Hopper)
on any machine, with the ``ptxas`` and ``cuobjdump`` its wheel ships, as long as the kernels were defined for
compiling (``TRITON_INTERPRET=0`` set explicitly before the package is imported; see :mod:`.interpreter`).
Compiled that way for sm_90 with Triton 3.6.0, the steps show: step 1 HGMMA fed by LDG + STS; step 2 LDGSTS
(``cp.async``) pipelining; step 3 the same instructions as step 2; step 4 UTMALDG/UTMASTG with SYNCS (mbarrier)
and about a third of step 3's instructions; step 5 a larger shared-memory footprint (the staged C tile);
step 6 *no* warp specialization (no USETMAXREG, the SASS of step 5) -- the recordings on the H100 and H200 are
what the chapter may quote.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

import torch

from gpulab.core import env, flops, kernel_mode, timing
from gpulab.core.provenance import experiment
from gpulab.core.validation import fits_in_memory, positive_ints
from gpulab.kernels import triton_gemm
from gpulab.kernels.triton_gemm import (
    step1_blocked,
    step2_pipelined,
    step3_grouped,
    step4_tma,
    step5_persistent,
    step6_warp_specialized,
)
from gpulab.kernels.triton_gemm.common import check, random_operands, settings

# The SASS mnemonics that tell the steps apart (the counts of all the others are kept in 'instructions').
SIGNATURE_OPCODES = ("HMMA", "HGMMA", "LDG", "LDGSTS", "LDS", "LDSM", "STS", "STG", "UTMALDG", "UTMASTG", "SYNCS",
                     "BAR", "USETMAXREG")
# One SASS instruction line, as cuobjdump prints it ("/*0070*/  @!P0 LDG.E ...") or as Triton's disassembly
# does (control bits, a tab, then the instruction): the mnemonic up to its first '.', after any predicate.
_INSTRUCTION = re.compile(r"^\s*(?:/\*[0-9a-fA-F]+\*/|[-\w]{2}:[-\w]:[-\w]:[-\w]:\w+)\s+(?:@!?U?P[T\d]+\s+)?"
                          r"([A-Z][A-Z0-9_]*)")
CHECK_SIZE = (1000, 1240, 1000)  # no multiple of any tile; K and N multiples of 8, as TMA needs
DTYPES = ("bfloat16", "float16")
# The code ladder_sweep reaches only through triton_gemm.STEPS, named here (and in its runs=) so that the
# recordings' fingerprint covers every kernel and launcher.
STEP_CODE = (step1_blocked.launch, step1_blocked.matmul, step2_pipelined.matmul, step3_grouped.launch,
             step3_grouped.matmul, step4_tma.launch, step4_tma.matmul, step5_persistent.launch,
             step5_persistent.matmul, step6_warp_specialized.matmul)


def instruction_mix(sass: str) -> Counter:
    """How many times each SASS mnemonic (``HGMMA``, ``LDG``, ... without their ``.`` modifiers) appears."""
    if not isinstance(sass, str):
        raise TypeError(f"sass: the disassembly as text, got {type(sass).__name__}")
    return Counter(m.group(1) for line in sass.splitlines() if (m := _INSTRUCTION.match(line)))


def sass_counts(sass: str) -> dict:
    """The instruction counts of ``sass`` that tell kernels apart (:data:`SIGNATURE_OPCODES` and the total), and
    which tensor-core instruction it multiplies with."""
    mix = instruction_mix(sass)
    return {**{f"sass_{op}": mix[op] for op in SIGNATURE_OPCODES}, "sass_instructions": sum(mix.values()),
            "tensor_core": "HGMMA (wgmma)" if mix["HGMMA"] else "HMMA (mma.sync)" if mix["HMMA"] else "none"}


def evidence(compiled) -> dict:
    """What a compiled Triton kernel shows about itself: instruction counts (:data:`SIGNATURE_OPCODES` and the
    total), registers per thread and spills (known once the kernel is loaded on a GPU), shared memory per
    program, stages, warps, and whether the compiler built a warp-specialized kernel."""
    metadata = compiled.metadata
    counts = sass_counts(compiled.asm["sass"])
    ttgir = compiled.asm.get("ttgir", "")
    return {
        **counts,
        "registers": getattr(compiled, "n_regs", None), "spills": getattr(compiled, "n_spills", None),
        "shared_bytes": metadata.shared, "num_stages": metadata.num_stages, "num_warps": metadata.num_warps,
        "warp_specialized": "ttg.warp_specialize(" in ttgir or counts["sass_USETMAXREG"] > 0,
    }


def _kernel_signature(kernel, config: dict, dtype: str) -> tuple[dict, dict]:
    """Triton's signature and constants for compiling ``kernel`` ahead of time, as a launch with contiguous
    ``dtype`` matrices would specialize it (unit strides become constants)."""
    short = {"float16": "fp16", "bfloat16": "bf16"}[dtype]
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    boxes = {"a_desc": (bm, bk), "b_desc": (bk, bn), "c_desc": (bm, bn)}
    signature, constants = {}, {}
    for name in kernel.arg_names:
        if name in config:
            signature[name], constants[name] = "constexpr", config[name]
        elif name in ("stride_ak", "stride_bn", "stride_cn"):
            signature[name], constants[name] = "constexpr", 1
        elif name.endswith("_ptr"):
            signature[name] = f"*{short}"
        elif name.endswith("_desc"):
            signature[name] = f"tensordesc<{short}[{boxes[name][0]},{boxes[name][1]}]>"
        else:
            signature[name] = "i32"
    return signature, constants


def cross_compile(step, dtype: str = "float16", capability: int = 90, sms: int = 132, **config):
    """Compile ``step``'s kernel for an NVIDIA GPU of compute ``capability`` without one; the compiled kernel
    (pass it to :func:`evidence`). The kernels must be defined for compiling (not under the interpreter)."""
    import triton
    from triton.backends.compiler import GPUTarget

    from gpulab.kernels.triton_gemm import interpreter

    if interpreter.interpreting():
        raise RuntimeError("cross_compile: the kernels were defined for Triton's interpreter; set "
                           "TRITON_INTERPRET=0 before importing gpulab.kernels.triton_gemm")
    merged = settings(step.CONFIG, config, step.__name__)
    options = {key: merged.pop(key) for key in ("num_warps", "num_stages")}
    extra = {"NUM_SMS": sms, "WARP_SPECIALIZE": step.LAUNCH_OPTIONS.get("warp_specialize", False)}
    extra = {name: value for name, value in extra.items() if name in step.KERNEL.arg_names}
    signature, constants = _kernel_signature(step.KERNEL, {**merged, **extra}, dtype)
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(step.KERNEL.arg_names)
             if signature[name] == "i32" or signature[name].startswith("*")}
    source = triton.compiler.ASTSource(fn=step.KERNEL, signature=signature, constexprs=constants, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)


def _time(run, m: int, n: int, k: int, device: torch.device) -> dict:
    t = timing.measure(run, device=device, warmup=10, target_s=0.5)
    return {"seconds": t.median_s, "spread": t.spread, "tflops": flops.gemm(m, n, k).flops / t.median_s / 1e12}


def _variants(stages: Sequence[int]):
    """(name, step module, config overrides) for every kernel timed: each step, and step 2 at other depths."""
    for step in triton_gemm.STEPS:
        yield step.__name__.rsplit(".", 1)[-1], step, {}
        if step is step2_pipelined:
            for s in stages:
                if s != step.CONFIG["num_stages"]:
                    yield f"{step.__name__.rsplit('.', 1)[-1]} (num_stages={s})", step, {"num_stages": s}


@experiment("triton_gemm_ladder", runs=("STEP_CODE",))
def ladder_sweep(sizes: Sequence[int] = (4096, 8192), dtypes: Sequence[str] = DTYPES,
                 stages: Sequence[int] = step2_pipelined.STAGES) -> list[dict]:
    """Each step of the Triton GEMM ladder and cuBLAS, at n^3 for each of ``sizes`` and ``dtypes``: checked,
    timed, and (for the steps) the evidence of the compiled kernel. GPU only.

    Every kernel is checked against float64 at :data:`CHECK_SIZE` and at n^3 before it is timed (a failed check
    raises). cuBLAS runs in the same process, just before the steps of each size and dtype, and each row
    carries its ``share_of_cublas``. ``stages``: pipeline depths at which step 2 is timed as well.
    """
    sizes = positive_ints("sizes", sizes)
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown or not dtypes:
        raise ValueError(f"dtypes: some of {DTYPES}, got {list(dtypes)}")
    kernel_mode.require_gpu("ladder_sweep")
    device = env.device()
    rows = []
    for n in sizes:
        fits_in_memory("sizes", n * n * (3 * 2 + 3 * 8), device)  # A, B, C; the float64 check on the host
        for name in dtypes:
            dtype = getattr(torch, name)
            a, b = random_operands(n, n, n, dtype, device, seed=n)
            c = torch.empty((n, n), dtype=dtype, device=device)

            def cublas(a, b, out):
                return torch.mm(a, b, out=out)

            check(cublas, *CHECK_SIZE, dtype, device, what="cuBLAS")
            error = check(cublas, n, n, n, dtype, device, what="cuBLAS")
            base = _time(lambda a=a, b=b, c=c: torch.mm(a, b, out=c), n, n, n, device)
            rows.append({"n": n, "dtype": name, "kernel": "cuBLAS", **base, "relative_error": error,
                         "share_of_cublas": 1.0})
            for label, step, overrides in _variants(stages):
                def run(a, b, out, step=step, overrides=overrides):
                    return step.matmul(a, b, out=out, **overrides)

                check(run, *CHECK_SIZE, dtype, device, what=label)
                error = check(run, n, n, n, dtype, device, what=label)
                config = settings(step.CONFIG, overrides, label)
                _, compiled = step.launch(a, b, c, config, **step.LAUNCH_OPTIONS)
                def timed(a=a, b=b, c=c, step=step, config=config):
                    return step.launch(a, b, c, config, **step.LAUNCH_OPTIONS)

                measured = _time(timed, n, n, n, device)
                rows.append({"n": n, "dtype": name, "kernel": label, **measured, "relative_error": error,
                             "share_of_cublas": measured["tflops"] / base["tflops"], **config,
                             **evidence(compiled)})
    return rows
