"""The course's GPU kernels, in two forms.

CUDA C: the ``NN_name.cu`` files in this folder, numbered in the order the chapters teach them;
:mod:`gpulab.kernels.cuda_c` compiles them with NVRTC (no GPU needed) and launches them through CuPy. Python:
numba-cuda's ``@cuda.jit`` kernels of :mod:`gpulab.kernels.numba_kernels`, which run on a GPU or, without one,
in numba's CUDA simulator. Where they run is decided once, by :mod:`gpulab.core.kernel_mode`.
"""
