"""Chapter 16, "Distributed DNN training" (``notebooks/16_distributed_training.ipynb``): parallelism's traffic,
the all-reduce, DDP under torchrun.
"""
