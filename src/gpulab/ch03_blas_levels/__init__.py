"""Chapter 03, "Linear algebra on GPUs: BLAS levels 1, 2 and 3" (``notebooks/03_blas_levels.ipynb``): levels 1 to
3 measured on the roofline, blocking.
"""
