"""Worked answers to the exercises of chapter 10, "Tensor cores": every number computed when it is shown, from
:mod:`gpulab.core.specs`, the chapter's own functions, the compiler's report and the recordings. No experiment runs
here, and no GPU is needed.
"""

from __future__ import annotations

import torch

from gpulab.ch10_tensor_cores import tensor_cores, wmma
from gpulab.core import recordings, specs
from gpulab.core.precision import FORMATS
from gpulab.core.printing import Answer

FRAGMENT = 16  # a WMMA fragment is 16 x 16, its matrix instruction 16 x 16 x 16
GPT2_VOCABULARY, GPT2_PADDED = 50257, 50304


def exercise_1() -> Answer:
    lines = []
    for row in tensor_cores.peak_rows(["A100 PCIe 80GB", "L4"]):
        gpu = specs.gpu(row["gpu"])
        tensor, fp32 = specs.peak(gpu, "float16", specs.TENSOR_CORES), specs.peak(gpu, "float32", specs.CUDA_CORES)
        lines.append(f"- {row['gpu']}: float16 on the tensor cores, {tensor.formula()} (`peak_rows` agrees: "
                     f"{row['tensor_tflops']:,.1f}); float32 on the CUDA cores, {fp32.formula()}. Ratio "
                     f"{row['ratio']:.0f}.")
    a100, l4 = specs.gpu("A100 PCIe 80GB"), specs.gpu("L4")
    lines.append(f"The L4 (Ada) has {l4.cuda_cores_per_sm['float32']} float32 units per SM, twice the A100's "
                 f"{a100.cuda_cores_per_sm['float32']}, while each of its tensor cores does "
                 f"{l4.tensor_fma_per_clock['float16']} float16 FMA per clock, half the A100's "
                 f"{a100.tensor_fma_per_clock['float16']}. Each halves the ratio, which leaves it a quarter of the "
                 "A100's: the L4 is built for graphics and inference, the A100 for training.")
    return Answer("Answer to exercise 1", tuple(lines))


def _stalls(k: int) -> bool:
    """Whether the float16 sum of k products 1 x 1, as :func:`tensor_cores.tile_mma` adds them, falls short of k."""
    D = tensor_cores.tile_mma(torch.ones(1, k), torch.ones(k, 1), torch.zeros(1, 1), "float16")
    return D.item() < k


def exercise_2() -> Answer:
    low, high = 1, 1
    while not _stalls(high):
        low, high = high, 2 * high
    while high - low > 1:  # _stalls(low) is False, _stalls(high) True
        middle = (low + high) // 2
        low, high = (low, middle) if _stalls(middle) else (middle, high)
    fp16 = FORMATS["float16"]
    top = high - 1
    total = tensor_cores.tile_mma(torch.ones(1, high), torch.ones(high, 1), torch.zeros(1, 1), "float16").item()
    return Answer("Answer to exercise 2", (
        f"Search K with `tensor_cores.tile_mma(torch.ones(1, K), torch.ones(K, 1), torch.zeros(1, 1), \"float16\")`: "
        f"the sum equals K up to K = {top:,}; at K = {high:,} it stays {total:,.0f}.",
        f"float16's epsilon, the spacing of its numbers between 1 and 2, is {fp16.epsilon:g} = 2^-10. Between "
        f"{top:,} and twice that the spacing is {top:,} x 2^-10 = {fp16.spacing(top):g}.",
        f"So {top:,} + 1 lies exactly halfway between two float16 numbers, {top:,} and {top + fp16.spacing(top):,.0f}, "
        "and rounds to the even one, the first: each further 1 is lost. In general a float16 sum of ones stalls at "
        "2 / epsilon.",
    ))


def _fragment_loads(kernel: wmma.WmmaKernel) -> tuple[int, int]:
    """(fragment loads, matrix instructions) of one warp per 16-deep slice of K."""
    d = {**wmma.TUNABLE, **dict(kernel.defines)}
    rows, columns = d["WM"] // FRAGMENT, d["WN"] // FRAGMENT
    return rows + columns, rows * columns


def exercise_3() -> Answer:
    default, narrow = wmma.PIPELINED, wmma.pipelined(WM=32)
    lines = []
    for kernel in (default, narrow):
        loads, instructions = _fragment_loads(kernel)
        d = {**wmma.TUNABLE, **dict(kernel.defines)}
        lines.append(f"- {d['WM']} x {d['WN']} warp tile: {d['WM'] // FRAGMENT} x {d['WN'] // FRAGMENT} accumulator "
                     f"fragments; per 16-deep slice, {loads} fragment loads (A and B) feed {instructions} matrix "
                     f"instructions, {loads / instructions:.2f} loads per instruction.")
    (l0, i0), (l1, i1) = _fragment_loads(default), _fragment_loads(narrow)
    lines.append(f"The narrower tile loads {l1 / i1 / (l0 / i0):.1f} times as many fragments per instruction. Each "
                 "load is an `ldmatrix` from shared memory that the warp must issue between its matrix instructions, "
                 "so shared-memory bandwidth and issue slots run out before the extra warps can help.")
    for run in recordings.recorded("tensor_wmma"):
        rate = {row["name"]: row.get("tflops") for row in run.rows}
        if rate.get(default.label) and rate.get(narrow.label):
            lines.append(f"On the {run.short_label} (recorded) the narrower tile ran at "
                         f"{rate[narrow.label] / rate[default.label]:.0%} of the default's rate.")
    return Answer("Answer to exercise 3", tuple(lines))


def exercise_4() -> Answer:
    t4 = specs.gpu("T4")
    lines = [
        "Copy `cuda_c.source(\"26_wmma_pipelined\")`, and in `load_a` and `load_b` drop `.shared` from the "
        "`wmma.load` instructions and pass a 64-bit generic pointer (`\"l\"`, `shared + offset`) for the 32-bit "
        "shared address (`\"r\"`). `cuda_c.compile_report` on both gives the registers and spills.",
        "What to look for: told `.shared`, the compiler emits `ldmatrix`; from a generic address it cannot know the "
        "state space and emits generic loads, several per fragment, each checked at run time for the memory it "
        "points to. Expect more instructions between the matrix instructions, and a slower kernel.",
    ]
    for run in recordings.recorded("tensor_wmma"):
        rate = {row["name"]: row.get("tflops") for row in run.rows}
        cublas = rate.get("cuBLAS float16")
        if cublas and rate.get(wmma.PIPELINED.label):
            lines.append(f"For scale: the {run.short_label} (recorded) ran the pipelined kernel at "
                         f"{rate[wmma.PIPELINED.label] / cublas:.0%} of cuBLAS float16, its naive WMMA kernel at "
                         f"{rate[wmma.NAIVE.label] / cublas:.0%}. Expect the generic loads to land between the two.")
    lines.append(f"Not on a T4: the pipelined kernel's `cp.async` needs compute capability 8.0, and a T4 has "
                 f"{t4.compute_capability}. Use an A100, an L4 or a Hopper GPU.")
    return Answer("Answer to exercise 4", tuple(lines))


def exercise_5() -> Answer:
    batch, hidden = 4096, 1024
    lines = [
        f"Run `tensor_cores.layer_gemms_sweep([{{\"batch\": {batch}, \"inputs\": {hidden}, \"outputs\": v}} for v in "
        f"({GPT2_VOCABULARY}, {GPT2_PADDED})])` on a GPU and compare each GEMM's rate.",
        f"{GPT2_VOCABULARY:,} is odd: a float16 row of it is {2 * GPT2_VOCABULARY:,} bytes, aligned to 2 bytes only; "
        f"{GPT2_PADDED:,} = {GPT2_PADDED // 64} x 64 is a multiple of 16 bytes and of every tile width up to 64. The "
        f"padding adds {GPT2_PADDED / GPT2_VOCABULARY - 1:.2%} arithmetic.",
    ]
    for run in recordings.recorded("tensor_vocabulary"):
        rows = [r for r in run.rows if r.get("status") == "ok" and r["gemm"] != "step"]
        sizes = sorted({r["outputs"] for r in rows})
        if len(sizes) != 2:
            continue
        gains = {r["gemm"]: r["tflops"] for r in rows if r["outputs"] == sizes[1]}
        gains = {g: gains[g] / r["tflops"] for r in rows if r["outputs"] == sizes[0] for g in [r["gemm"]]}
        best = max(gains, key=gains.get)
        aligned = sizes[0] & -sizes[0]  # the largest power of two that divides it
        lines.append(f"On the {run.short_label} (recorded), padding {sizes[0]:,} to {sizes[1]:,} sped up the "
                     + ", ".join(f"{g} {x:.2f}x" for g, x in gains.items())
                     + f": the {best} gained most. Expect the same at {GPT2_VOCABULARY:,}, less aligned still "
                     f"({sizes[0]:,} is a multiple of {aligned}).")
    lines.append("All three GEMMs write or read rows of vocabulary length (Y and dY), so all three lose their "
                 "alignment; the activation gradient also sums over the vocabulary (its K), so every one of its "
                 "loads of dY crosses the misaligned rows. On a T4 the model sees only the arithmetic, the same "
                 "within the padding's share: any gap you measure there is the alignment's cost.")
    return Answer("Answer to exercise 5", tuple(lines))
