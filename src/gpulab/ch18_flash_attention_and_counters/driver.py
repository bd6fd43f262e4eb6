"""One of the book's kernels, launched for Nsight Compute: ``python -m gpulab.ch18_flash_attention_and_counters.driver
KERNEL [--size N] [--warmup W]``.

ncu profiles kernel launches, not programs, so the program it runs must make the launch worth profiling happen at a
known place. This driver does, for each kernel of :data:`KERNELS` (the book's own, reused from the chapters that
teach them, never copied):

1. it builds the kernel's inputs (fresh random data; the output filled with NaN first) and compiles the kernel;
2. it launches the kernel ``W`` times (warm-up: the module loaded, caches and clocks as in a timed run);
3. it launches it once more: the launch ncu profiles. The kernel's name is matched by :attr:`Kernel.regex` and ncu
   skips the ``W`` matching launches before it (``--launch-skip W --launch-count 1``); no other launch before it
   matches (random numbers, fills and conversions have other names);
4. it checks what that launch wrote against a float64 reference (:func:`gpulab.core.correctness.check_close`) and
   prints one line, ``gpulab-driver: {json}``, with the relative error. A wrong answer raises: its counters are
   worth nothing.

The checks run after the profiled launch, so that the launches they make (a float64 GEMM also matches cuBLAS's
regex) cannot shift which launch ncu picks.

Session mode, ``python -m gpulab.ch18_flash_attention_and_counters.driver --session KERNEL [KERNEL ...]
[--sizes name=n,...] [--warmup W]``, runs several kernels in one process, for ncu's ``--profile-from-start off``
(:func:`run_session`): each kernel's profiled launch, and nothing else, is bracketed by
``torch.cuda.profiler.start()`` and ``stop()``, so ncu needs no ``--launch-skip``; each kernel prints its own
:data:`MARKER` line, with its relative error or, if its preparation, launch or check raised, the error in one line
and the stage it reached (``prepare``, ``warmup``, ``launch`` or ``check``); the next kernel runs anyway.

Each kernel also gives the book's own count of its FLOPs and DRAM bytes
(:attr:`Kernel.cost`, from :mod:`gpulab.core.flops` or the chapter's counting function), which
:func:`.profiled.profile_kernels` sets against the counters.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gpulab.ch08_memory_hierarchy import memory
from gpulab.ch09_gemm_on_the_gpu import gemm
from gpulab.ch10_tensor_cores import wmma
from gpulab.ch13_memory_bound_layers_and_fusion import fusion
from gpulab.core import env, flops, kernel_mode
from gpulab.core.correctness import check_close, poisoned, random_tensor
from gpulab.core.precision import MATMUL_TOLERANCE, float32_accumulation, matmul_mode
from gpulab.core.validation import positive_int, torch_dtype
from gpulab.kernels import cuda_c
from gpulab.kernels.triton_attention import forward as flash_forward
from gpulab.kernels.triton_attention.measure import forward_flops
from gpulab.kernels.triton_gemm import step5_persistent
from gpulab.kernels.triton_gemm.common import tolerance

MODULE = "gpulab.ch18_flash_attention_and_counters.driver"  # what `python -m` runs
MARKER = "gpulab-driver: "  # the start of the line that reports the check
WARMUP = 2  # launches before the profiled one
CUBLAS_REGEX = "gemm|nvjet|cutlass|xmma"  # the names cuBLAS gives its GEMM kernels (sm80_xmma_gemm_..., nvjet_sm90_...)
FUSED_COLUMNS = 4096  # the fused kernel's rows are this wide, as in chapter 13's recording
ATTENTION_TOKENS, ATTENTION_WIDTH, HEAD_DIM = 16384, 2048, 128  # batch x seq, heads x head_dim (as measure.py)
DROPOUT_P, DROPOUT_SEED = 0.1, 1234


@dataclass(frozen=True)
class Prepared:
    """A kernel ready to run: ``launch()`` runs it once on the prepared inputs (asynchronously); ``check()`` returns
    the relative error of what the last launch wrote, raising AssertionError above the dtype's tolerance."""

    launch: Callable[[], object]
    check: Callable[[], float]


@dataclass(frozen=True)
class Kernel:
    """One of the book's kernels, as the driver runs it and ncu finds it."""

    name: str  # the driver's argument, a row's 'kernel'
    label: str  # for a reader
    chapter: str  # the chapter that teaches it: "09"
    regex: str  # ncu's --kernel-name regex:... for the kernel's function name
    dtype: str  # of its inputs (tf32: float32 data, TF32 arithmetic)
    size: int  # the default size
    size_means: str  # what --size sets
    prepare: Callable[[int, torch.device], Prepared]
    cost: Callable[[int], flops.Cost]  # the book's count of its FLOPs and fewest DRAM bytes at a size


# ---- the kernels: inputs, launch, check and the book's count, each from its chapter ------------------------------

def _square(n: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return random_tensor((n, n), dtype, device), random_tensor((n, n), dtype, device)


def _sgemm(step: gemm.Step) -> Callable[[int, torch.device], Prepared]:
    """Chapter 09's worklog step ``step``: C = A B in float32 on the CUDA cores."""
    def prepare(n: int, device: torch.device) -> Prepared:
        A, B = _square(n, torch.float32, device)
        C = poisoned((n, n), torch.float32, device)
        return Prepared(gemm.prepared(step, A, B, C), lambda: check_close(
            C, A.double() @ B.double(), MATMUL_TOLERANCE["float32"], f"SGEMM step {step.number} ({step.label})"))
    return prepare


def _wmma(kernel: wmma.WmmaKernel) -> Callable[[int, torch.device], Prepared]:
    """Chapter 10's WMMA kernel: float16 A and B, float32 C."""
    def prepare(n: int, device: torch.device) -> Prepared:
        reason = wmma.unavailable(kernel)
        if reason is not None:
            raise ValueError(f"kernel: {kernel.label} is not available here: {reason}")
        A, B = _square(n, torch.float16, device)
        C = poisoned((n, n), torch.float32, device)
        return Prepared(wmma.prepared(kernel, A, B, C), lambda: check_close(
            C, A.double() @ B.double(), MATMUL_TOLERANCE["float32"], kernel.label))
    return prepare


def _cublas(dtype: str) -> Callable[[int, torch.device], Prepared]:
    """cuBLAS through ``torch.mm`` in ``dtype`` ('float32' with TF32 off, 'tf32', 'bfloat16' with float32 sums)."""
    def prepare(n: int, device: torch.device) -> Prepared:
        storage = torch_dtype(dtype) if dtype != "tf32" else torch.float32
        A, B = _square(n, storage, device)
        C = poisoned((n, n), storage, device)

        def launch() -> None:
            with matmul_mode(dtype), float32_accumulation():
                torch.mm(A, B, out=C)

        return Prepared(launch, lambda: check_close(C, A.double() @ B.double(), MATMUL_TOLERANCE[dtype],
                                                    f"cuBLAS {dtype}"))
    return prepare


def _triton_gemm(n: int, device: torch.device) -> Prepared:
    """The Triton GEMM ladder's step 5 (persistent, TMA) in bfloat16: the fastest of its steps on the H100."""
    a, b = _square(n, torch.bfloat16, device)
    c = poisoned((n, n), torch.bfloat16, device)
    return Prepared(lambda: step5_persistent.matmul(a, b, out=c), lambda: check_close(
        c, a.double() @ b.double(), tolerance(torch.bfloat16, n), "Triton GEMM, step 5 (persistent)"))


def _transpose(file: str, function: str, label: str) -> Callable[[int, torch.device], Prepared]:
    """Chapter 08's transposes of an n x n float32 matrix, launched as that chapter launches them."""
    def prepare(n: int, device: torch.device) -> Prepared:
        if n % memory.TILE:
            raise ValueError(f"size: a multiple of the tile width {memory.TILE}, got {n}")
        a = random_tensor((n, n), torch.float32, device)
        out = poisoned((n, n), torch.float32, device)
        run = cuda_c.prepared(file, function, (n // memory.TILE, n // memory.TILE), (memory.TILE, memory.BLOCK_ROWS),
                              a, out, n)
        return Prepared(run, lambda: check_close(out, a.t(), 0.0, label))
    return prepare


def _fused(rows: int, device: torch.device) -> Prepared:
    """Chapter 13's hand-fused bias + GELU (erf) + dropout on a rows x 4096 float32 matrix."""
    x = random_tensor((rows, FUSED_COLUMNS), torch.float32, device)
    bias = random_tensor((FUSED_COLUMNS,), torch.float32, device)
    out = poisoned((rows, FUSED_COLUMNS), torch.float32, device)
    run = fusion.prepared_bias_gelu_dropout(x, bias, DROPOUT_P, DROPOUT_SEED, out)
    return Prepared(run, lambda: check_close(
        out, fusion.reference_bias_gelu_dropout(x, bias, DROPOUT_P, DROPOUT_SEED), fusion.TOLERANCE["none"],
        "fused bias + GELU + dropout"))


def attention_shape(seq_len: int) -> tuple[int, int, int, int]:
    """(batch, heads, seq_len, head_dim) at ``seq_len``, with FlashAttention's papers' constant 16k tokens and a
    model 2048 wide, as the attention race measures (:mod:`gpulab.kernels.triton_attention.measure`)."""
    seq_len = positive_int("size", seq_len)
    return max(1, ATTENTION_TOKENS // seq_len), ATTENTION_WIDTH // HEAD_DIM, seq_len, HEAD_DIM


def _attention_error(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor) -> float:
    """Relative error of the attention output ``o`` against float64 attention on the GPU, a batch at a time."""
    expected = torch.empty(o.shape, dtype=torch.float64, device=o.device)
    scale = q.shape[-1] ** -0.5
    for i in range(q.shape[0]):
        scores = (q[i].double() @ k[i].double().transpose(-2, -1)) * scale
        expected[i] = torch.softmax(scores, dim=-1) @ v[i].double()
        del scores
    return check_close(o, expected, MATMUL_TOLERANCE["bfloat16"], "Triton FlashAttention forward")


def _attention(seq_len: int, device: torch.device) -> Prepared:
    """The Triton FlashAttention forward, non-causal, bfloat16, head size 128."""
    shape = attention_shape(seq_len)
    q, k, v = (random_tensor(shape, torch.bfloat16, device) for _ in range(3))
    out: dict[str, torch.Tensor] = {}

    def launch() -> None:
        out["o"], _ = flash_forward.attention_forward(q, k, v, causal=False)

    return Prepared(launch, lambda: _attention_error(q, k, v, out["o"]))


def _gemm_cost(dtype: str) -> Callable[[int], flops.Cost]:
    return lambda n: flops.gemm(n, n, n, "float32" if dtype == "tf32" else dtype)


def _wmma_cost(n: int) -> flops.Cost:
    """float16 A and B read once, float32 C written once."""
    return flops.Cost(flops.gemm(n, n, n).flops, 2 * n * n * 2 + n * n * 4)


def _transpose_cost(n: int) -> flops.Cost:
    """No arithmetic; every float32 element read once and written once."""
    return flops.Cost(0.0, 2 * 4 * n * n)


def _fused_cost(rows: int) -> flops.Cost:
    return fusion.chain_cost("bias_gelu_dropout", rows * FUSED_COLUMNS, fused=True)


def _attention_cost(seq_len: int) -> flops.Cost:
    """``4 b h s^2 d`` FLOP; q, k and v read once, the output and the float32 log-sum-exp rows written once."""
    batch, heads, seq_len, head_dim = attention_shape(seq_len)
    return flops.Cost(forward_flops(batch, heads, seq_len, head_dim, False),
                      4 * batch * heads * seq_len * head_dim * 2 + batch * heads * seq_len * 4)


_GEMM_SIZE = "n: C = A B with n x n matrices"
KERNELS: tuple[Kernel, ...] = (
    *(Kernel(function, label, "08", function, "float32", 16384, "n: an n x n matrix", _transpose(file, function, label),
             _transpose_cost)
      for file, function, label in memory.TRANSPOSES if function.startswith("transpose")),
    *(Kernel(s.kernel, f"SGEMM step {s.number}: {s.label}", "09", s.kernel, "float32", 4096, _GEMM_SIZE, _sgemm(s),
             _gemm_cost("float32")) for s in gemm.STEPS),
    Kernel("cublas_float32", "cuBLAS float32 (TF32 off)", "09", CUBLAS_REGEX, "float32", 4096, _GEMM_SIZE,
           _cublas("float32"), _gemm_cost("float32")),
    *(Kernel(k.kernel, k.label, "10", k.kernel, "float16", 4096, _GEMM_SIZE, _wmma(k), _wmma_cost)
      for k in wmma.KERNELS),
    Kernel("cublas_tf32", "cuBLAS TF32", "10", CUBLAS_REGEX, "tf32", 4096, _GEMM_SIZE, _cublas("tf32"),
           _gemm_cost("tf32")),
    Kernel("cublas_bfloat16", "cuBLAS bfloat16", "10", CUBLAS_REGEX, "bfloat16", 4096, _GEMM_SIZE,
           _cublas("bfloat16"), _gemm_cost("bfloat16")),
    Kernel("triton_gemm_persistent", "Triton GEMM, step 5 (persistent, TMA)", "17", "persistent_kernel", "bfloat16",
           4096, _GEMM_SIZE, _triton_gemm, _gemm_cost("bfloat16")),
    Kernel("fused_bias_gelu_dropout", "fused bias + GELU + dropout (CUDA C)", "13", fusion.KERNEL_FUNCTION, "float32",
           65536, f"rows: a rows x {FUSED_COLUMNS} matrix", _fused, _fused_cost),
    Kernel("flash_attention_forward", "Triton FlashAttention forward", "18", "forward_kernel", "bfloat16", 4096,
           f"seq_len: {ATTENTION_TOKENS:,} tokens of head size {HEAD_DIM}, {ATTENTION_WIDTH // HEAD_DIM} heads",
           _attention, _attention_cost),
)
NAMES = tuple(k.name for k in KERNELS)  # in the book's reading order (chapter 17 is read after chapter 10)


def kernel(name: object) -> Kernel:
    """The kernel called ``name``; ValueError naming the choices otherwise."""
    for k in KERNELS:
        if k.name == name:
            return k
    raise ValueError(f"kernel: no kernel called {name!r}; choose one of {', '.join(NAMES)}")


def check_warmup(warmup: object) -> int:
    """``warmup`` if it is a whole number >= 0; ValueError naming it otherwise."""
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup: a whole number of launches >= 0, got {warmup!r}")
    return warmup


def run(name: str, size: int | None = None, warmup: int = WARMUP) -> dict:
    """Prepare kernel ``name`` at ``size`` (its default if None), launch it ``warmup`` times, then once more (the
    launch ncu profiles), then check what that launch wrote. GPU only. Returns what the driver reports."""
    spec = kernel(name)
    size = spec.size if size is None else positive_int("size", size)
    warmup = check_warmup(warmup)
    kernel_mode.require_gpu(f"driver {spec.name}")
    device = env.device()
    prepared = spec.prepare(size, device)
    for _ in range(warmup):
        prepared.launch()
    torch.cuda.synchronize(device)
    prepared.launch()  # the profiled launch: the (warmup + 1)-th that matches spec.regex
    torch.cuda.synchronize(device)
    return {"kernel": spec.name, "size": size, "warmup": warmup, "relative_error": prepared.check()}


def parse_arguments(argv: Sequence[str] | None = None) -> tuple[str, int | None, int]:
    """``(kernel, size, warmup)`` from the command line, each checked (ValueError naming the bad one)."""
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}",
                                     description="Launch one of the book's kernels for Nsight Compute.")
    parser.add_argument("kernel", help=f"one of {', '.join(NAMES)}")
    parser.add_argument("--size", default=None, help="the kernel's size (see the module's KERNELS)")
    parser.add_argument("--warmup", default=str(WARMUP), help="launches before the profiled one")
    args = parser.parse_args(argv)
    spec = kernel(args.kernel)
    size = None if args.size is None else positive_int("size", _whole(args.size, "size"))
    return spec.name, size, check_warmup(_whole(args.warmup, "warmup"))


def _whole(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}: a whole number, got {text!r}") from None


def parse_sizes(text: str, names: Sequence[str]) -> dict[str, int]:
    """``{kernel: size}`` from ``'name=n,name=n'`` ('' for none), each name one of ``names``; ValueError naming
    ``sizes`` otherwise."""
    sizes: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, equals, value = item.partition("=")
        if not equals or not name.strip():
            raise ValueError(f"sizes: name=size pairs separated by commas, got {item!r}")
        name = name.strip()
        if name not in names:
            raise ValueError(f"sizes: {name!r} is not among the session's kernels ({', '.join(names)})")
        if name in sizes:
            raise ValueError(f"sizes: {name!r} given twice")
        sizes[name] = positive_int(f"sizes[{name!r}]", _whole(value.strip(), f"sizes[{name!r}]"))
    return sizes


def parse_session_arguments(argv: Sequence[str] | None = None) -> tuple[list[str], dict[str, int], int]:
    """``(kernels, sizes, warmup)`` of session mode from the command line, each checked (ValueError naming the bad
    one): the kernels known and each once, ``--sizes name=n,...`` for some of them."""
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE} --session",
                                     description="Launch several of the book's kernels for one Nsight Compute run.")
    parser.add_argument("--session", nargs="+", required=True, metavar="KERNEL", help=f"of {', '.join(NAMES)}")
    parser.add_argument("--sizes", default="", help="name=size,... for the kernels not at their default size")
    parser.add_argument("--warmup", default=str(WARMUP), help="launches before each profiled one")
    args = parser.parse_args(argv)
    names = [kernel(name).name for name in args.session]
    if len(set(names)) != len(names):
        raise ValueError(f"session: each kernel once, got {names}")
    return names, parse_sizes(args.sizes, names), check_warmup(_whole(args.warmup, "warmup"))


def _one_line(error: BaseException) -> str:
    """``Type: first line of the message``, as a report's 'error'."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _session_kernel(spec: Kernel, size: int, warmup: int, device: torch.device) -> dict:
    """One kernel of a session: prepare, warm up, the profiled launch between the profiler's start and stop, check.
    Returns its report, with 'error' and 'stage' instead of 'relative_error' if a step raised."""
    stage, prepared = "prepare", None
    try:
        prepared = spec.prepare(size, device)
        stage = "warmup"
        for _ in range(warmup):
            prepared.launch()
        torch.cuda.synchronize(device)
        stage = "launch"
        torch.cuda.profiler.start()  # ncu --profile-from-start off profiles from here ...
        try:
            prepared.launch()
            torch.cuda.synchronize(device)
        finally:
            torch.cuda.profiler.stop()  # ... to here: this launch and nothing else of this kernel
        stage = "check"
        return {"kernel": spec.name, "size": size, "warmup": warmup, "relative_error": prepared.check()}
    except Exception as error:  # any kernel's failure is reported, and the session goes on
        return {"kernel": spec.name, "size": size, "warmup": warmup, "stage": stage, "error": _one_line(error)}
    finally:
        del prepared  # its tensors, before the next kernel allocates its own
        gc.collect()
        torch.cuda.empty_cache()


def run_session(names: Sequence[str], sizes: dict[str, int] | None = None, warmup: int = WARMUP) -> list[dict]:
    """Run each of ``names`` in order as :func:`_session_kernel` does, printing each report's :data:`MARKER` line as
    it comes (a crash later leaves the earlier ones). GPU only. Returns the reports."""
    specs = [kernel(name) for name in names]
    sizes = sizes or {}
    warmup = check_warmup(warmup)
    kernel_mode.require_gpu("driver --session")
    device = env.device()
    reports = []
    for spec in specs:
        size = positive_int("size", sizes.get(spec.name, spec.size))
        reports.append(_session_kernel(spec, size, warmup, device))
        print(MARKER + json.dumps(reports[-1]), flush=True)
    return reports


def _session_main(argv: Sequence[str]) -> int:
    try:
        names, sizes, warmup = parse_session_arguments(argv)
        kernel_mode.require_gpu("driver --session")
    except ValueError as error:
        print(f"driver: {error}", file=sys.stderr)
        return 2
    reports = run_session(names, sizes, warmup)
    return 0 if all("relative_error" in r for r in reports) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """The entry point: run the kernel, print the :data:`MARKER` line; a bad argument exits with status 2. With
    ``--session``, run several kernels (:func:`run_session`); status 1 if any of them failed."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(word == "--session" or word.startswith("--session=") for word in argv):
        return _session_main(argv)
    try:
        name, size, warmup = parse_arguments(argv)
    except ValueError as error:
        print(f"driver: {error}", file=sys.stderr)
        return 2
    print(MARKER + json.dumps(run(name, size, warmup)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
