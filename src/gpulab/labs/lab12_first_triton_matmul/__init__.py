"""Lab 12, "Your first Triton matmul" (``labs/12_first_triton_matmul.ipynb``): the student writes the blocked GEMM
kernel of :mod:`gpulab.kernels.triton_gemm.step1_blocked`, pipelines it (step 2) and orders its tiles in groups
(step 3).

- :mod:`.reference` -- the lab's reference kernel with each usual mistake as a compile-time switch, the grouped
  tile numbering with its usual mistakes, the probe kernel that reads a numbering, and the counts (grids, shared
  memory, the panels a wave of programs reads);
- :mod:`.diagnose` -- the graders of the kernels, the grids and the grouped numbering;
- :mod:`.questions` -- the graders of the pipelining exercise: the launch settings, the shared memory, the
  instruction the compiled code gains;
- :mod:`.hints` -- what each kind of mistake should make the student look at;
- :mod:`.evidence` -- a notebook's kernel compiled for Hopper (sm_90) without a GPU, in a separate process;
- :mod:`.measure` -- the student's kernels timed against cuBLAS on a GPU, and the book's recorded ladder.

The package imports :mod:`gpulab.kernels.triton_gemm` first: it chooses where Triton kernels run (Triton's
interpreter without a GPU) before any kernel is defined, and repairs the interpreter for NumPy 2.4.
"""

import gpulab.kernels.triton_gemm  # noqa: F401  (first: it chooses where Triton kernels run)
