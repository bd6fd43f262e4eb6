"""Chapter 04, "MLPs: forward and backward are three GEMMs" (``notebooks/04_mlp_gemms.ipynb``): a layer's three
GEMMs, training on digits, tile and wave quantization.
"""
