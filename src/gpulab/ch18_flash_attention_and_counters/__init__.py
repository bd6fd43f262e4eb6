"""Chapter 18, "Attention at tensor-core speed, and where the time goes"
(``notebooks/18_flash_attention_and_counters.ipynb``): FlashAttention in Triton against every SDPA backend, and the
book's own kernels profiled with Nsight Compute's hardware counters (:mod:`.profiled`, which runs :mod:`.driver`
under ncu; drawn by :mod:`gpulab.core.counter_figures`).

The chapter's sizes and their time are in :mod:`.plan`; the kernels' checks, the compiled code's evidence, and the
race's tables and figures in :mod:`.figures`; what the page states as rules over every recorded GPU in
:mod:`.claims`; the worked answers to its exercises in :mod:`.answers`. The kernels themselves are
:mod:`gpulab.kernels.triton_attention`'s.
"""
