"""gpulab: the library behind the book "DNN Computing on GPUs".

Chapters import the modules they need, e.g. ``from gpulab import blas, env, plots, results``.
Every module has one job: ``env`` (device and banner), ``timing`` (honest timers), ``clocks`` (the
GPU's real clock, sampled), ``specs`` (the GPU table and derived peaks), ``hardware`` (the CPUs-to-GPUs
chapter's experiments), ``flops`` (operation and byte counts), ``roofline`` (the model), ``blas`` (the
BLAS chapter's experiments), ``precision`` (number formats, rounding, matmul modes), ``rounding`` (the
number-formats chapter's experiments), ``mlp``, ``conv``, ``recurrent`` and ``attention`` (the DNN-layer
chapters: each kind of layer written as GEMMs, and its experiments), ``kernels``, ``occupancy``, ``threads``,
``memory`` and ``gemm`` (the CUDA chapters), ``tensor_cores`` and ``amp`` (tensor cores and mixed precision),
``cudnn`` (convolution algorithms and cuDNN's switches), ``fusion`` and ``blocked_attention`` (memory-bound
layers, fused kernels, the online softmax), ``batched`` (many small problems, LU), ``sparsity`` (2:4
structured sparsity), ``distributed`` and ``ddp`` (parallelism, all-reduce, DistributedDataParallel under
torchrun), ``profiling`` (which kernels ran), ``results`` (live or recorded runs), ``plots`` and ``widgets``
(figures and explorers), ``printing`` (source listings, byte counts), ``checks`` (lab graders, with
``kernel_checks``, ``amp_checks``, ``conv_choice_checks``, ``fusion_checks`` and ``allreduce_checks`` for the
labs that diagnose a student's code), ``correctness``, ``sweep`` and ``validation`` (shared helpers).
"""

__version__ = "0.1.0"
