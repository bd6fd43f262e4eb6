"""Chapter 07, "CUDA threads, blocks and grids" (``notebooks/07_cuda_threads_blocks.ipynb``): first kernels,
divergence, launch configuration, SAXPY against the copy.
"""
