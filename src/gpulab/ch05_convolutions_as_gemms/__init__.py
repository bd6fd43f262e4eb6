"""Chapter 05, "Convolutions as GEMMs" (``notebooks/05_convolutions_as_gemms.ipynb``): direct, im2col and
implicit GEMM, their memory and time, layouts.
"""
