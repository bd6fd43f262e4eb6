"""Chapter 17, "Hopper's tensor cores from Python" (``notebooks/17_hopper_tensor_cores.ipynb``): why WMMA stops at
half of cuBLAS on Hopper, a ladder of Triton GEMMs to cuBLAS (:mod:`gpulab.kernels.triton_gemm`) and FP8
(:mod:`gpulab.kernels.fp8`).
"""
