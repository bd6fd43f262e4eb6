"""Chapter 14, "Batched linear algebra" (``notebooks/14_batched_linear_algebra.ipynb``): many small GEMMs and LU
factorizations.
"""
