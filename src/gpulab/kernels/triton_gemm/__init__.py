"""A ladder of GEMM kernels in Triton, the book's first Triton: one idea per step, one module per step.

Each step computes ``C = A @ B`` for row-major 16-bit (float16 or bfloat16) matrices with float32 sums, and each
adds one idea to the one before it:

1. :mod:`.step1_blocked` -- one program per output tile, the tile product by ``tl.dot`` on tensor cores;
2. :mod:`.step2_pipelined` -- larger tiles and software pipelining: several K steps in flight through shared
   memory (``num_stages``);
3. :mod:`.step3_grouped` -- the order of the tiles: groups of rows of tiles, so that tiles running together
   share their A and B panels in L2;
4. :mod:`.step4_tma` -- TMA tensor descriptors: Hopper's copy engine moves whole tiles into shared memory;
5. :mod:`.step5_persistent` -- a persistent kernel: one program per SM walks over many tiles;
6. :mod:`.step6_warp_specialized` -- warp specialization: some warps only load, the others only multiply.

Every module has the ``@triton.jit`` kernel, a launcher ``matmul(a, b, *, out=None, **config)`` that checks its
inputs, and a docstring saying what the compiled kernel should show on the GPU if the idea worked.
:func:`.common.check` is the check before timing; :mod:`.ladder` checks and times the steps against cuBLAS
and reads the evidence from the compiled kernels (GPU only).

**Where the kernels run.** Without a GPU (:mod:`gpulab.core.kernel_mode`'s simulator), Triton's interpreter runs
every step on the CPU, on CPU tensors; that is how the unit tests check them. The interpreter must be chosen
before the kernels are defined, so :func:`.interpreter.choose_mode` runs first, here. All six steps run in the
Triton 3.6 interpreter, in float16 and float32 (its ``tl.dot`` does not do bfloat16 arithmetic, so bfloat16 is
checked on the GPU only): the TMA descriptors of steps 4 to 6 are emulated by NumPy loads and stores with the same
zero padding, and the loop options ``flatten`` and ``warp_specialize`` are compile-time hints the interpreter
ignores. So the interpreter checks what each step *computes*; what it *compiles to* (TMA, warpgroup MMA,
warp specialization) is shown only on the GPU, by :func:`.ladder.evidence`.

**NumPy 2.4.** Triton 3.6.0's interpreter cannot run a loop whose bound is a run-time argument under NumPy 2.4
(``int()`` of a one-element array, now a TypeError); every GEMM's K loop is one. We keep NumPy 2.4 and repair
that one method of the interpreter while it is in use; :mod:`.interpreter` explains the cause and the choice.
"""

from gpulab.kernels.triton_gemm import interpreter

interpreter.choose_mode()  # before any kernel module is imported: triton.jit reads TRITON_INTERPRET then
interpreter.install_index_repair()

from gpulab.kernels.triton_gemm import (  # noqa: E402  (the order above matters)
    step1_blocked,
    step2_pipelined,
    step3_grouped,
    step4_tma,
    step5_persistent,
    step6_warp_specialized,
)

STEPS = (step1_blocked, step2_pipelined, step3_grouped, step4_tma, step5_persistent, step6_warp_specialized)
