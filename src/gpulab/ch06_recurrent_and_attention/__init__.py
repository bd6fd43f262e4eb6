"""Chapter 06, "Recurrent networks and attention" (``notebooks/06_recurrent_and_attention.ipynb``): the LSTM by
hand and as GEMMs, self-attention's FLOPs and a training step's kernels.
"""
