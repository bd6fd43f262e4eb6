"""Chapter 13, "Memory-bound layers and kernel fusion" (``notebooks/13_memory_bound_layers_and_fusion.ipynb``):
elementwise layers on the roofline, torch.compile, a hand-fused kernel, blocked attention.
"""
