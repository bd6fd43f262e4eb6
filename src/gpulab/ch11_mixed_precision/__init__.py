"""Chapter 11, "Automatic mixed precision" (``notebooks/11_mixed_precision.ipynb``): autocast, loss scaling,
training in each precision.
"""
