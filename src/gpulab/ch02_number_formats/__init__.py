"""Chapter 02, "Number formats: what 16 bits can and cannot hold" (``notebooks/02_number_formats.ipynb``):
rounding, summation error, softmax overflow, the 16-bit formats.
"""
