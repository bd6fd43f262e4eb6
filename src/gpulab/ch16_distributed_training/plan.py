"""Chapter 16's sizes in every setting, and the work they make: the one place the notebook
``notebooks/16_distributed_training.ipynb`` takes its sizes from (:class:`gpulab.core.budget.Chapter`).

Every machine runs the simulated all-reduces (NumPy), the DDP check and the all-reduce sweep on two CPU processes
(gloo, each started by torchrun). The NCCL all-reduce sweep and the DDP scaling of :mod:`.ddp` need two GPUs, one
process each: on one GPU the notebook shows their recordings instead. The prediction counts them all, as a
machine with two of the GPU in question runs them (over PCIe, :data:`LINK_BYTES_PER_S`), so on one GPU the
chapter takes less than the table says.
"""

from __future__ import annotations

from gpulab.ch04_mlp_gemms import mlp
from gpulab.ch16_distributed_training import distributed
from gpulab.core import budget
from gpulab.core.budget import Work

FULL = dict(  # the sizes of the recordings (two H200s) and of the book's CPU build
    traffic_batches=[64, 256, 1024, 4096, 16384, 65536],  # the global batches of the traffic figure
    simulated_workers=list(range(2, 17)),  # the simulated all-reduces
    simulated_elements=720720,  # a vector divisible by 1 to 16, so that every ring has equal chunks
    ddp_sizes=[64, 128, 128, 10], ddp_batch=64,  # the DDP check: 2 processes, 32 samples each
    gloo_sizes=[2**k for k in range(3, 23, 2)],  # 8 B to 2 MiB: the all-reduce on this CPU (gloo)
    nccl_sizes=[2**k for k in range(3, 31)],  # 8 B to 1 GiB of float32: the all-reduce on two GPUs (NCCL)
    scaling_sizes=[4096, 4096, 4096, 4096, 4096, 10],  # four 4096 x 4096 layers and a classifier: 67 M parameters
    scaling_batches=[256, 1024, 4096],  # samples per GPU
    scaling_precisions=["float32", "bfloat16"],  # float32 with TF32 off; bfloat16 autocast
    scaling_micro_batches=[1, 4],  # batches per optimizer step: 4 accumulates gradients, all-reduced once
    # tensor, pipeline and FSDP checked against one process: 2 processes (gloo); widths divisible by 2
    parallel_sizes=[64, 128, 128, 128, 10], parallel_batch=64,
)

# What one GPU runs (the simulations, the DDP check, gloo) is cheap and keeps its full size in every candidate;
# the candidates differ in the two-GPU experiments. Each keeps the NCCL curve from its latency floor (bytes) to its
# plateau (hundreds of MiB), and the scaling's rising efficiency with the batch per GPU, with and without
# accumulation, in both precisions.
CLASSES = [
    # every other message size, up to 512 MiB; batches of 256 and 1,024 per GPU
    {**FULL, "nccl_sizes": [2**k for k in range(3, 31, 2)], "scaling_batches": [256, 1024]},
    # every message size; batches of 256 and 1,024 per GPU
    {**FULL, "scaling_batches": [256, 1024]},
    # every message size, and the largest batch per GPU too: the full sizes
    dict(FULL),
]

CPU = dict(FULL)  # the book's build runs the CPU experiments at full size; the two-GPU ones show the recordings
SMOKE = {**FULL, "traffic_batches": [256, 4096], "simulated_workers": [2, 3, 4, 8], "simulated_elements": 840,
         "ddp_sizes": [16, 32, 4], "ddp_batch": 8, "gloo_sizes": [8, 4096, 2**16], "nccl_sizes": [8, 2**20],
         "scaling_sizes": [256, 256, 10], "scaling_batches": [64], "parallel_sizes": [16, 32, 32, 4],
         "parallel_batch": 8}

# Tensor, pipeline and sharded parallelism measured on 2, 4 and 8 GPUs (tools/record_parallelism.py, one process per
# GPU, NCCL): not part of the notebook's run, which has one GPU in `make gpu-run`; the page draws their recordings.
MACHINES = dict(
    sizes=FULL["scaling_sizes"],  # the DDP scaling's MLP: four 4096 x 4096 layers and a classifier, 67 M parameters
    batches=[1024, 4096],  # per GPU for DDP and FSDP (weak scaling); the whole batch for tensor and pipeline (strong)
    precisions=["float32", "bfloat16"],  # float32 with TF32 off; bfloat16 autocast
    bubble_batch=8192, bubble_micro_batches=[1, 2, 4, 8, 16],  # float32: stages long enough to time, even at 16
    bubble_precision="float32",
    nccl_sizes=FULL["nccl_sizes"],  # the all-reduce's bus bandwidth on every machine size
)

PROCESSES = 2
# The link between the two GPUs: PCIe 3 between two T4s (a class's likeliest pair) carries about 10 GB/s each way;
# the recording's H200s, joined by NVLink, reached 330 GB/s of bus bandwidth. Counted at the slower, on every GPU.
LINK_BYTES_PER_S = 10e9
NCCL_LATENCY_SECONDS = 65e-6  # one all-reduce of a small message from Python: the H200 recording's 62-76 us
NCCL_INIT_SECONDS = 4.0  # NCCL's communicator, over torchrun's start
# ddp.allreduce_bandwidth on NCCL: 5 warm-up calls, then about 4 GiB per size in 5 to 200 timed calls
NCCL_WARMUP, NCCL_BUDGET_BYTES, NCCL_LEAST, NCCL_MOST = 5, 4 * 2**30, 5, 200
SCALING_WARMUP, SCALING_REPEATS = 5, 20  # ddp.ddp_scaling's timer: 5 warm-up steps, 20 timed, no flush
# Building the MLP on the host (its default initialisation), then moving it to the GPU: about 5 ns a parameter.
MODEL_SECONDS_PER_PARAMETER = 5e-9
# A step's few dozen launches from Python, whatever the batch, and as many again per further micro-batch: the H200's
# bfloat16 steps took 1.9 ms at 256 per GPU with one micro-batch, 9.6 ms with four
STEP_HOST_SECONDS = 2e-3
SIMULATION_SECONDS = 2.2  # distributed.allreduce_traffic at full size on this 2-core machine
GLOO_SWEEP_SECONDS = 1.0  # the gloo sweep's calls and checks, beyond its torchrun
FIGURES_SECONDS = 2.0  # the figures and tables drawn from recordings and models


def _ring_seconds(nbytes: float) -> float:
    """One all-reduce of ``nbytes`` on the link: the ring sends 2 (p - 1) / p of the message."""
    return nbytes * 2 * (PROCESSES - 1) / PROCESSES / LINK_BYTES_PER_S


def _nccl(sizes: list[int]) -> list[Work]:
    """ddp.allreduce_bandwidth on NCCL: per size, a checked all-reduce, the warm-ups and the timed calls, each a
    fixed latency plus the ring's share of the message on the link (whatever the GPU)."""
    return [Work(f"NCCL all-reduce of {size} bytes", least_seconds=NCCL_LATENCY_SECONDS + _ring_seconds(size),
                 warmup=1 + NCCL_WARMUP, repeats=max(NCCL_LEAST, min(NCCL_MOST, NCCL_BUDGET_BYTES // size)),
                 flush_l2=False) for size in sizes]


def _configurations(s: dict) -> list[tuple[str, int, int]]:
    return [(precision, batch, micro) for precision in s["scaling_precisions"] for batch in s["scaling_batches"]
            for micro in s["scaling_micro_batches"]]


def _scaling(s: dict) -> list[Work]:
    """ddp.ddp_scaling on two GPUs: per configuration, a model built and its steps timed alone, then another
    under DDP, its first step checked (the weights broadcast) before the timed ones. A step's GEMMs run in its
    precision (float32 with TF32 off, or bfloat16 autocast), for no less than Python takes to launch them; under
    DDP it also all-reduces the float32 gradients."""
    parameters = distributed.parameter_count(s["scaling_sizes"])
    work = []
    for precision, batch, micro in _configurations(s):
        # a GPU without the format runs none of it (the notebook leaves it out: validation.supported_dtypes)
        step = dict(flops=micro * mlp.step_totals(mlp.training_step_operations(s["scaling_sizes"], batch))["gemm"],
                    precision=precision, repeats=SCALING_REPEATS, flush_l2=False, missing="skip")
        host = micro * STEP_HOST_SECONDS
        label = f"{precision}, {batch} x {micro} per GPU"
        built = 2 * parameters * MODEL_SECONDS_PER_PARAMETER + _ring_seconds(4 * parameters)
        work += [Work(f"{label}: two models built, the check's broadcast", extra_seconds=built, launches=0,
                      requires=precision),
                 Work(f"{label}, alone", least_seconds=host, warmup=SCALING_WARMUP, **step),
                 Work(f"{label}, under DDP", least_seconds=host + _ring_seconds(4 * parameters),
                      warmup=1 + SCALING_WARMUP, **step)]
    return work


def work(s: dict) -> list[Work]:
    """The simulation, the DDP check, the checks of tensor, pipeline and sharded parallelism and the gloo sweep on
    the CPU (each a torchrun); on two GPUs, the NCCL sweep and the scaling, each a torchrun that sets up NCCL."""
    simulation = SIMULATION_SECONDS * (s["simulated_elements"] / FULL["simulated_elements"]) * (
        sum(s["simulated_workers"]) / sum(FULL["simulated_workers"]))
    return [budget.host_seconds("simulated all-reduces (NumPy)", simulation),
            budget.host_seconds("DDP check on two CPU processes (gloo)", budget.TORCHRUN_SECONDS),
            budget.host_seconds("tensor, pipeline and FSDP checks on two CPU processes (gloo)",
                                budget.TORCHRUN_SECONDS, 3),
            budget.host_seconds("all-reduce sweep on two CPU processes (gloo)",
                                budget.TORCHRUN_SECONDS + GLOO_SWEEP_SECONDS),
            budget.host_seconds("torchrun and NCCL, twice", budget.TORCHRUN_SECONDS + NCCL_INIT_SECONDS, 2),
            *_nccl(s["nccl_sizes"]), *_scaling(s)]


CHAPTER = budget.Chapter(name="16 distributed training", full=FULL, classes=CLASSES, cpu=CPU, smoke=SMOKE, work=work,
                         fixed_seconds=lambda s: budget.NOTEBOOK_SECONDS + FIGURES_SECONDS)
