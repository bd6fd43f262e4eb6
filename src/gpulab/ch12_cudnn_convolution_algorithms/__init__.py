"""Chapter 12, "cuDNN and convolution algorithms" (``notebooks/12_cudnn_convolution_algorithms.ipynb``): FFT and
Winograd, cuDNN's choices, layouts, precisions, determinism.
"""
