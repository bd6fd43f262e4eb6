"""Chapter 01, "From CPUs to GPUs" (``notebooks/01_cpus_to_gpus.ipynb``): peak rates against measured ones, the
memory hierarchy's copy bandwidths, host transfers.
"""
