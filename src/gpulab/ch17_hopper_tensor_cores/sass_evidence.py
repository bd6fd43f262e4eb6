"""What the compiled kernels contain: the machine code (SASS) of chapter 10's WMMA kernel and of every step of the
Triton ladder, compiled for Hopper on any machine, without a GPU.

A compiler for a GPU needs no GPU: NVRTC turns chapter 10's CUDA C into a cubin for ``sm_90``, and Triton compiles
its kernels for a named target (:func:`gpulab.kernels.triton_gemm.ladder.cross_compile`). The ``cuobjdump`` that the
Triton wheel ships disassembles either cubin, so the instruction that makes the difference can be counted on the
machine that builds the book: ``HMMA`` (the per-warp ``mma.sync`` of Ampere, which WMMA compiles to) against
``HGMMA`` (Hopper's warpgroup ``wgmma``), and how the tiles reach shared memory (``LDG`` + ``STS`` through the
registers, ``LDGSTS`` = ``cp.async``, ``UTMALDG`` = a TMA copy). :func:`compiled_evidence` returns one row per kernel.

The Triton kernels must be *defined* for compiling, and Triton decides that when their module is imported
(:mod:`gpulab.kernels.triton_gemm.interpreter`): a chapter that runs them in the interpreter on a CPU cannot also
compile them in the same process. So :func:`compiled_evidence` runs :func:`collect` in a fresh Python process with
``TRITON_INTERPRET=0``, and reads its rows back as JSON. cuBLAS's own kernels are in a closed library: their SASS can
be read only where the library is installed (``cuobjdump`` on its binary) or on a GPU (Nsight Compute on a run).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HOPPER, AMPERE = 90, 80  # compute capabilities 9.0 (H100, H200) and 8.0 (A100), as Triton's targets name them
DTYPE = "float16"  # the instruction mix of bfloat16 is the same; float16 is what chapter 10's WMMA kernel takes
WMMA_LABEL = "WMMA, pipelined (chapter 10)"
AMPERE_STEP = "step2_pipelined"  # the step also compiled for Ampere: the same source, the other instruction
TIMEOUT_S = 300  # a cold Triton cache compiles the seven kernels in about ten seconds on two cores


class EvidenceUnavailable(RuntimeError):
    """The kernels could not be compiled here; the message says why, in a sentence."""


def resource_usage(cubin: bytes) -> dict:
    """Registers per thread, local memory (spills) and static shared memory of the one kernel in ``cubin``, as
    ``cuobjdump --dump-resource-usage`` reports them."""
    from triton import knobs

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        report = subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-resource-usage", str(path)],
                                capture_output=True, text=True, check=True).stdout
    found = {key: re.search(rf"\b{key}:(\d+)", report) for key in ("REG", "LOCAL", "SHARED")}
    if not found["REG"]:
        raise EvidenceUnavailable(f"cuobjdump reported no registers for the kernel: {report.strip()[:200]}")
    value = {key: int(match.group(1)) if match else 0 for key, match in found.items()}
    return {"registers": value["REG"], "local_bytes": value["LOCAL"], "static_shared_bytes": value["SHARED"]}


def sass_digest(sass: str) -> str:
    """A short hash of the instructions of ``sass``, without the kernel's name: equal for equal machine code."""
    lines = [line.strip() for line in sass.splitlines() if line.strip() and "Function :" not in line]
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()[:12]


def _mix(sass: str) -> dict:
    from gpulab.kernels.triton_gemm import ladder

    return {**ladder.sass_counts(sass), "sass_digest": sass_digest(sass)}


def _wmma_cubin(capability: int) -> bytes:
    """Chapter 10's pipelined WMMA kernel (its default sizes) compiled by NVRTC for ``sm_<capability>``."""
    from gpulab.ch10_tensor_cores import wmma
    from gpulab.kernels import cuda_c

    try:
        from cuda.bindings import nvrtc
    except ImportError as error:
        raise EvidenceUnavailable("compiling chapter 10's CUDA C needs NVRTC's Python bindings (pip install "
                                  "cuda-bindings nvidia-cuda-nvrtc)") from error
    text = cuda_c.source(wmma.PIPELINED.file)
    _, program = nvrtc.nvrtcCreateProgram(text.encode(), f"{wmma.PIPELINED.file}.cu".encode(), 0, [], [])
    try:
        options = [*(o.encode() for o in cuda_c.OPTIONS), f"--gpu-architecture=sm_{capability}".encode()]
        (status,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        if int(status) != 0:
            raise EvidenceUnavailable(f"NVRTC did not compile {wmma.PIPELINED.file}.cu for sm_{capability}")
        _, size = nvrtc.nvrtcGetCUBINSize(program)
        cubin = bytearray(size)
        nvrtc.nvrtcGetCUBIN(program, cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    return bytes(cubin)


def wmma_evidence(capability: int = HOPPER) -> dict:
    """The row of chapter 10's pipelined WMMA kernel compiled for ``capability``."""
    from triton.tools.disasm import get_sass

    from gpulab.ch10_tensor_cores import wmma

    cubin = _wmma_cubin(capability)
    usage = resource_usage(cubin)
    kernel = wmma.PIPELINED
    return {"kernel": WMMA_LABEL, "source": f"{kernel.file}.cu", "target": f"sm_{capability}", **_mix(get_sass(cubin)),
            "registers": usage["registers"], "local_bytes": usage["local_bytes"],
            "shared_bytes": usage["static_shared_bytes"] + kernel.shared_bytes,
            "num_stages": wmma.TUNABLE["STAGES"], "num_warps": kernel.threads // 32, "warp_specialized": False}


def triton_evidence(step, capability: int = HOPPER) -> dict:
    """The row of a ladder step (a module of :data:`gpulab.kernels.triton_gemm.STEPS`) compiled for ``capability``
    with its own configuration. The kernels must be defined for compiling (see the module's docstring)."""
    from gpulab.kernels.triton_gemm import ladder

    compiled = ladder.cross_compile(step, DTYPE, capability)
    usage = resource_usage(compiled.asm["cubin"])
    evidence = ladder.evidence(compiled)
    name = step.__name__.rsplit(".", 1)[-1]
    return {"kernel": name, "source": f"{name}.py", "target": f"sm_{capability}", **_mix(compiled.asm["sass"]),
            "registers": usage["registers"], "local_bytes": usage["local_bytes"],
            **{key: evidence[key] for key in ("shared_bytes", "num_stages", "num_warps", "warp_specialized")}}


def collect() -> list[dict]:
    """Every row: the WMMA kernel and the ladder's steps for Hopper, and one step for Ampere. Run it where the Triton
    kernels are compiled, not interpreted (:func:`compiled_evidence` does)."""
    from gpulab.kernels import triton_gemm
    from gpulab.kernels.triton_gemm import interpreter

    if interpreter.interpreting():
        raise EvidenceUnavailable("the Triton kernels were defined for the interpreter in this process; "
                                  "compiled_evidence() compiles them in a fresh one")
    rows = [wmma_evidence(HOPPER)]
    rows += [triton_evidence(step, HOPPER) for step in triton_gemm.STEPS]
    rows.append(triton_evidence(getattr(triton_gemm, AMPERE_STEP), AMPERE))
    return rows


def compiled_evidence(timeout_s: float = TIMEOUT_S) -> list[dict]:
    """:func:`collect`'s rows, computed in a fresh Python process whose Triton kernels are compiled; raises
    :class:`EvidenceUnavailable` with a one-sentence reason where that cannot be done here."""
    try:
        import triton  # noqa: F401  (only to say plainly that it is missing)
    except ImportError as error:
        raise EvidenceUnavailable("Triton is not installed here (pip install triton), so nothing can be compiled "
                                  "for sm_90") from error
    source = str(Path(__file__).resolve().parents[2])  # the folder holding gpulab (Colab puts it on sys.path)
    env = {**os.environ, "TRITON_INTERPRET": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, (source, os.environ.get("PYTHONPATH"))))}
    try:
        done = subprocess.run([sys.executable, "-m", __name__], env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired as error:
        raise EvidenceUnavailable(f"compiling the kernels for sm_90 took more than {timeout_s:.0f} s here") from error
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise EvidenceUnavailable(f"compiling the kernels for sm_90 failed here ({last})")
    return json.loads(lines[-1])


def evidence_or_reason(timeout_s: float = TIMEOUT_S) -> tuple[list[dict], str | None]:
    """(:func:`compiled_evidence`'s rows, None), or (no rows, the sentence that says why) for a page to print."""
    try:
        return compiled_evidence(timeout_s), None
    except EvidenceUnavailable as reason:
        return [], f"The kernels could not be compiled for Hopper here: {reason}."


if __name__ == "__main__":
    try:
        print(json.dumps(collect()))
    except EvidenceUnavailable as reason:
        print(reason, file=sys.stderr)
        sys.exit(1)
