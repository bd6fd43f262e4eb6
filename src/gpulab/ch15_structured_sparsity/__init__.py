"""Chapter 15, "Structured sparsity" (``notebooks/15_structured_sparsity.ipynb``): 2:4 patterns, pruning and
accuracy, sparse tensor-core speed-ups.
"""
