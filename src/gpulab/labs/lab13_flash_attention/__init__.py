"""Lab 13, "Flash attention" (``labs/13_flash_attention.ipynb``): the online-softmax update and the tile loop in
NumPy with their graders (:mod:`.online_softmax`), the update inside a Triton kernel (:mod:`.kernel`) and its grader
(:mod:`.diagnose`), and the kernel timed against SDPA's backends on a GPU (:mod:`.measure`).

As for :mod:`gpulab.kernels.triton_attention`, the Triton kernels run in Triton's interpreter on a machine without a
GPU; :mod:`gpulab.kernels.triton_gemm` chooses that before any kernel is defined, so it is imported first here --
and a notebook that defines its own ``@triton.jit`` kernel imports this package before it does.
"""

import gpulab.kernels.triton_gemm  # noqa: F401  (first: it chooses where the kernels run)
