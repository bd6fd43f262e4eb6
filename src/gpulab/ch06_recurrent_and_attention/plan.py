"""Chapter 06's sizes in every setting, and what they cost: the one place the notebook's sizes are set.

Two experiments take the chapter's time. ``rnn_lstm_layer`` checks, then times, one LSTM layer three ways (a Python
loop of a GEMM and pointwise work per step, the same with the input GEMM hoisted, cuDNN's ``nn.LSTM``) for every
format, length and width; each point first runs ``nn.LSTM`` in float64 as its reference, on the GPU, where float64 is
slow on every GPU but the data-centre ones. ``attention_training_step`` trains a small transformer for a few steps
and profiles three of them, in each precision.
"""

from __future__ import annotations

import dataclasses

from gpulab.ch06_recurrent_and_attention import attention, recurrent
from gpulab.core import budget, flops

# The recorded sizes, from the notebook's parameters cell. LSTM layers of hidden size H (= input size D) over T steps,
# B sequences a batch; a transformer of 4 blocks of width 1,024 (16 heads, an MLP of 4,096), 16 sequences of 512
# tokens a step (8,192 tokens), in float32 and under bfloat16 autocast.
FULL = dict(hidden_sizes=[256, 1024, 2048], seq_lens=[64, 256], lstm_batch=128, lstm_dtypes=["float32", "float16"],
            layers=4, d_model=1024, heads=16, d_ff=4096, block_batch=16, block_seq_len=512,
            precisions=["float32", "bfloat16"])
CPU = dict(hidden_sizes=[64, 128, 256], seq_lens=[16, 64], lstm_batch=16, lstm_dtypes=["float32"],
           layers=2, d_model=128, heads=4, d_ff=512, block_batch=8, block_seq_len=128, precisions=["float32"])
SMOKE = dict(hidden_sizes=[16, 32], seq_lens=[8], lstm_batch=4, lstm_dtypes=["float32"],
             layers=1, d_model=32, heads=2, d_ff=64, block_batch=2, block_seq_len=16, precisions=["float32"])
CLASSES = [
    # Three widths from launch-bound (256) to GEMM-bound (1,024), two lengths, both formats: every row of the LSTM
    # table and figure; batch 64 and at most H = 1,024 keep the float64 references short on a GPU whose float64 is
    # slow (a T4's is 1/32 of its float32). Two transformer blocks at the recorded width, 8 sequences of 512: the
    # profile's shares of GEMM, attention and the memory-bound rest are those of four blocks.
    dict(FULL, hidden_sizes=[256, 512, 1024], lstm_batch=64, layers=2, block_batch=8),
    # The recorded widths and lengths at half the batch: H = 2,048 shows the loops turn GEMM-bound.
    dict(FULL, lstm_batch=64, layers=2, block_batch=8),
    # The recorded LSTM sweep; the transformer at half its depth.
    dict(FULL, layers=2),
]

LSTM_STEP_OPS = 12  # a step of the loops: cat (or the hoisted slice), addmm, four activations, five products, a store
REFERENCE_STEP_OPS = 3  # float64 nn.LSTM steps in C++ (no cuDNN for float64): a GEMM and a fused cell a step
MODULE_INIT_SECONDS = 6e-9  # per weight: nn.LSTM's initialisation on the host, its copy and its float64 twin
# A training step of the transformer: the H200's profiles (recorded) show about 90 kernels a block and 45 us of
# Python, autograd and AdamW per kernel (bfloat16: 364 kernels in a 17.4 ms step of 10.8 ms of kernels), and about
# 60 reads or writes of every (d + d_ff)-wide activation per block (float32: 8 ms of kernels besides GEMMs and
# attention).
STEP_KERNELS_PER_BLOCK, STEP_SECONDS_PER_KERNEL, STEP_PASSES = 90, 45e-6, 60
PROFILED_STEPS = 3  # profile_training_step's default
# Per precision, besides the steps and the profiler's session (budget.PROFILER_SESSION_SECONDS; the first one
# starts the profiler, budget.PROFILER_START_SECONDS, counted with it): the model and AdamW built,
# the first step in the format (cuBLAS and cuDNN handles, the fused attention's kernels loaded on first use) and the
# profiler's processing of a thousand kernels and their operators. The rest of the 11 s that the H200 took for
# attention_training_step (two precisions; about 2 s of steps, and the cells since rnn_lstm_layer).
NEW_MODEL_SECONDS = 2.9


def _lstm_work(sizes: budget.Sizes) -> list[budget.Work]:
    items = []
    batch, call = sizes["lstm_batch"], budget.HOST_CALL_SECONDS
    for dtype in sizes["lstm_dtypes"]:
        size = flops.bytes_per_element(dtype)
        for steps in sizes["seq_lens"]:
            for hidden in sizes["hidden_sizes"]:
                work = recurrent.layer_flops(hidden, steps, batch, hidden)
                weights = 8 * hidden * hidden
                # every step reads the weights and the step's inputs, and writes the four gates and the state
                traffic = steps * (weights + 12 * batch * hidden) * size
                memory = steps * batch * 6 * hidden * (size + 8) + 16 * hidden * hidden * 8
                label = f"{dtype}, T = {steps}, H = {hidden}"
                # each implementation's point builds its module and its float64 twin (host), runs the twin as its
                # reference (on the GPU, a C++ loop of steps), compares, then times: the checked call and the
                # timer's two warm-up calls, repeats behind L2 flushes
                items.append(budget.once(f"float64 nn.LSTM reference, {label}", flops=work, precision="float64",
                                         measurements=len(recurrent.IMPLEMENTATIONS),
                                         least_seconds=steps * REFERENCE_STEP_OPS * call))
                common = dict(flops=work, bytes=traffic, precision=dtype, warmup=1 + 2, memory_bytes=memory,
                              checked_elements=steps * batch * hidden, extra_seconds=weights * MODULE_INIT_SECONDS)
                items += [
                    budget.Work(f"per-step GEMM, {label}", least_seconds=steps * LSTM_STEP_OPS * call, **common),
                    budget.Work(f"hoisted input GEMM, {label}", least_seconds=(steps * (LSTM_STEP_OPS - 1) + 2) * call,
                                **common),
                    # cuDNN runs the steps one after another too: two launches a step
                    budget.Work(f"torch.nn.LSTM, {label}", launches=2 * steps, **common),
                ]
    return items


def _parameters(sizes: budget.Sizes) -> int:
    """The transformer's weights: per block, four d x d projections and the MLP's two d x d_ff matrices."""
    return sizes["layers"] * (4 * sizes["d_model"] ** 2 + 2 * sizes["d_model"] * sizes["d_ff"])


def training_step(sizes: budget.Sizes, precision: str) -> tuple[budget.Work, budget.Work]:
    """One training step of ``attention_training_step`` in ``precision``, as the kernels of two kinds it runs one
    after the other: its GEMMs (attention's products with them), with the host's floor of Python, autograd and
    AdamW under the whole step, and its memory-bound kernels. A GPU without ``precision`` runs neither (the notebook
    leaves the format out, as a T4 does bfloat16)."""
    blocks, batch, length = sizes["layers"], sizes["block_batch"], sizes["block_seq_len"]
    d_model, d_ff = sizes["d_model"], sizes["d_ff"]
    gemms = 3 * blocks * sum(attention.block_flops(batch, length, d_model, d_ff).values())  # forward and backward
    activations = batch * length * blocks * (12 * d_model + 2 * d_ff + 3 * sizes["heads"] * length)
    memory = 4 * (4 * _parameters(sizes) + activations)  # weights, gradients, AdamW's two moments; activations
    return (budget.Work(f"training step, {precision}", flops=gemms, precision=precision, missing="skip",
                        least_seconds=blocks * STEP_KERNELS_PER_BLOCK * STEP_SECONDS_PER_KERNEL, memory_bytes=memory),
            budget.Work(f"training step's memory-bound kernels, {precision}", requires=precision,
                        bytes=STEP_PASSES * blocks * batch * length * (d_model + d_ff) * 4))


def _step_work(sizes: budget.Sizes) -> list[budget.Work]:
    items = []
    for precision in sizes["precisions"]:
        gemms, rest = training_step(sizes, precision)
        # the first step (its loss checked), the timer's two warm-up steps, the one that picks the repeats and the
        # repeats (no L2 flush), then the profiled steps. The timer's repeats follow the GEMMs and the host's
        # floor; the memory-bound kernels run in each of those steps, at least the timer's ten repeats.
        calls = 1 + 2 + 1 + budget.MIN_REPEATS + PROFILED_STEPS
        items += [dataclasses.replace(gemms, warmup=1 + 2 + PROFILED_STEPS, flush_l2=False,
                                      extra_seconds=budget.PROFILER_SESSION_SECONDS + NEW_MODEL_SECONDS
                                      + _parameters(sizes) * MODULE_INIT_SECONDS),
                  budget.once(rest.label, bytes=rest.bytes, requires=rest.requires, measurements=calls)]
    return items


def work(sizes: budget.Sizes) -> list[budget.Work]:
    """Every measurement of ``rnn_lstm_layer`` and ``attention_training_step`` at ``sizes``."""
    return [*_lstm_work(sizes), *_step_work(sizes)]


def fixed_seconds(sizes: budget.Sizes) -> float:
    """The notebook's other cells: start and imports, the worked example and its float64 checks, the attention
    checks, FlopCounterMode on a small block, the explorer (a few seconds on the host in all)."""
    return budget.NOTEBOOK_SECONDS + 3.0


CHAPTER = budget.Chapter(name="06 Recurrent networks and attention", full=FULL, classes=CLASSES, cpu=CPU,
                         smoke=SMOKE, work=work, fixed_seconds=fixed_seconds)
