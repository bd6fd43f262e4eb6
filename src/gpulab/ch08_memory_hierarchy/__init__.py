"""Chapter 08, "The GPU memory hierarchy" (``notebooks/08_memory_hierarchy.ipynb``): sizes, coalescing, the
shared-memory stencil, transposes, bytes in flight.
"""
