"""Chapter 10, "Tensor cores" (``notebooks/10_tensor_cores.ipynb``): formats and their rates, TF32, WMMA kernels
against cuBLAS, layer shapes.
"""
