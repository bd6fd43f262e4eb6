"""Chapter 09, "GEMM on the GPU" (``notebooks/09_gemm_on_the_gpu.ipynb``): the SGEMM worklog against cuBLAS,
tuning, wave and tile quantization.
"""
