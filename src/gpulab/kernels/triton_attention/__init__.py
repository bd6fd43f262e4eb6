"""FlashAttention in Triton: the forward pass (online softmax over tiles kept on chip) and the backward pass.

Chapter 13 derived attention in blocks in NumPy; this package runs the same arithmetic as GPU kernels:

- :mod:`.forward` -- the forward kernel and :func:`.forward.attention_forward` (output and log-sum-exp);
- :mod:`.backward` -- the backward kernels (FlashAttention-2's order, no atomics) and :func:`.backward.attention`,
  a differentiable function like ``F.scaled_dot_product_attention``;
- :mod:`.reference` -- float64 attention on the host and the check that runs before anything is timed;
- :mod:`.measure` -- the GPU experiment: TFLOP/s of the kernels against every SDPA backend (GPU only).

The lab "Flash attention" (:mod:`gpulab.labs.lab13_flash_attention`) has the student write the online-softmax update
and the tile loop, in NumPy and then inside a Triton kernel of this shape, graded there.

**Where the kernels run.** As for :mod:`gpulab.kernels.triton_gemm`: on a machine without a GPU, Triton's
interpreter runs them on CPU tensors (float16 or float32: it has no bfloat16 arithmetic), which is how the unit
tests check them. Importing that package chooses the mode before any kernel here is defined, and installs its
repair of the Triton 3.6 interpreter under NumPy 2.4 (every loop here has a run-time bound);
:mod:`gpulab.kernels.triton_gemm.interpreter` explains both. Triton reads the mode wherever a function is
decorated with ``@triton.jit``, and that includes its own library (``tl.zeros`` and the like) when ``import triton``
runs; so this package imports ``triton_gemm`` before any of its modules imports triton (which also repairs
Triton's library if something imported triton earlier still).
"""

import gpulab.kernels.triton_gemm  # noqa: F401  (first: it chooses where the kernels run)
from gpulab.kernels.triton_attention.backward import attention, attention_backward
from gpulab.kernels.triton_attention.forward import attention_forward

__all__ = ["attention", "attention_backward", "attention_forward"]
