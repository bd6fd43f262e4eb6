"""The sizes of chapter 10 in every setting, and the work they make (:class:`gpulab.core.budget.Chapter`).

The chapter times matrix products: five formats at FORMAT_N^3, the WMMA kernels beside cuBLAS and the best SGEMM at
N^3, a float32 matmul under five TF32 settings, a linear layer's forward GEMM at 78 alignments, and the three GEMMs
of a layer's training step for two vocabularies and seven batch sizes. Each is checked against float64 first. A T4
skips what it lacks: TF32, bfloat16, float8 and the pipelined WMMA kernel (``cp.async``, compute capability 8.0).
"""

from __future__ import annotations

from gpulab.ch04_mlp_gemms import plan as mlp_plan
from gpulab.ch09_gemm_on_the_gpu import plan as gemm_plan
from gpulab.ch10_tensor_cores.tensor_cores import CHECK_ROWS, FORMATS_COMPARED, PEAK_KEY, TF32_SETTINGS
from gpulab.core import budget, flops
from gpulab.core.budget import Work, once

ALIGNMENT_SIZES = [4080, 4088, 4095, 4096, 4097, 4098, 4099, 4100, 4101, 4102, 4103, 4104, 4112]
FULL = {
    "n": 4096,  # the WMMA kernels against cuBLAS: N x N x N (a multiple of 16)
    # Variants of 26_wmma_pipelined.cu: block tile BM x BN, depth BK, warp tile WM x WN, pipeline STAGES, and its
    # two options, block rasterization (GROUP_M) and an epilogue staged through shared memory (STAGED_EPILOGUE).
    "wmma_variants": [{}, {"STAGES": 4}, {"STAGES": 2}, {"BK": 64}, {"BN": 256, "STAGES": 4}, {"WM": 32}, {"WN": 32},
                      {"GROUP_M": 8}, {"STAGED_EPILOGUE": 1}, {"GROUP_M": 8, "STAGED_EPILOGUE": 1}],
    "format_n": 8192,  # the formats side by side: FORMAT_N^3 matmuls
    "tf32_n": 4096,  # the TF32 switches
    "alignment_base": 4096,  # the multiple-of-8 sweep: one of batch, inputs, outputs moves, the others stay here
    "alignment_sizes": ALIGNMENT_SIZES,
    "alignment_dtypes": ["float16", "tf32"],
    "vocabulary": {"batch": 4096, "inputs": 1024, "outputs": [33708, 33712]},  # tokens, hidden size, classes
    "batch_sizes": [4088, 4092, 4095, 4096, 4097, 4100, 4104],  # a 4096 -> 4096 layer's batch around 4096
    "layer_dtype": "float16",
}
# Tensor cores, TF32 and fast float16 are GPU features: small float32 runs on a CPU (CI's smoke test runs on one).
CPU = {**FULL, "format_n": 512, "tf32_n": 512, "alignment_base": 512, "alignment_sizes": [504, 511, 512, 513, 516, 520],
       "alignment_dtypes": ["float32"], "vocabulary": {"batch": 256, "inputs": 64, "outputs": [3371, 3376]},
       "batch_sizes": [248, 255, 256, 257, 264], "layer_dtype": "float32"}
SMOKE = {**CPU, "format_n": 64, "tf32_n": 64, "alignment_base": 64, "alignment_sizes": [56, 63, 64, 65, 68, 72],
         "vocabulary": {"batch": 16, "inputs": 16, "outputs": [1001, 1008]}, "batch_sizes": [60, 63, 64, 65, 68]}
CLASSES = [
    # Half the sizes: formats at 4096^3, the WMMA kernels and TF32 switches at 2048^3, the alignments around 2048
    # (every size from 2048 to 2056, and one below and above), half the vocabulary's tokens and a 2048-wide layer.
    {**FULL, "n": 2048, "format_n": 4096, "tf32_n": 2048, "alignment_base": 2048,
     "alignment_sizes": [2032, 2040, 2047, 2048, 2049, 2050, 2051, 2052, 2053, 2054, 2055, 2056, 2064],
     "vocabulary": {"batch": 2048, "inputs": 1024, "outputs": [33708, 33712]},
     "batch_sizes": [2040, 2044, 2047, 2048, 2049, 2052, 2056]},
    FULL,  # the recordings' sizes: a T4 runs them in about two minutes
]

# Shares of the float16 tensor-core peak the WMMA kernels reached at 4096^3, rounded from the H200 recording
# (tensor_wmma): fragments straight from global memory about 3%, the pipelined variants 27% to 32%.
NAIVE_SHARE, PIPELINED_SHARE = 0.03, 0.3
WMMA_CHECK_SIZE = (1008, 1200, 784)  # wmma.wmma_comparison's check_size
POINT_SECONDS = 0.01  # one point of a sweep on the host: operands made, Python (H200: 78 alignments in 2 s)


def _float64_rows(label: str, rows: int, columns: int, summed: int, **work) -> Work:
    """A check of ``rows`` rows of a product against float64: those rows computed in float64 on the GPU (``columns``
    wide, a sum over ``summed``), then compared on the host."""
    return once(label, flops=2 * rows * columns * summed, precision="float64", checked_elements=rows * columns,
                **work)


def _format_work(n: int) -> list[Work]:
    """tensor_cores.matmul_formats: each format checked on :data:`CHECK_ROWS` rows, then timed (the L2 flushed);
    a format the GPU lacks is a row that says so."""
    cost = flops.gemm(n, n, n)
    found = []
    for fmt in FORMATS_COMPARED:
        precision = PEAK_KEY[fmt]
        product = dict(flops=cost.flops, precision=precision, missing="skip", memory_bytes=24 * n * n)
        found += [once(f"formats: {fmt}, checked product", **product),
                  _float64_rows(f"formats: {fmt}, float64 rows", CHECK_ROWS, n, n, requires=precision),
                  Work(f"formats: {fmt}", bytes=3 * flops.bytes_per_element(fmt) * n * n, **product)]
    return found


def _wmma_check(label: str, m: int, n: int, k: int, share: float, **work) -> list[Work]:
    """``wmma.check``: one call of a WMMA kernel on float16 operands, its float64 reference, compared on the host."""
    cost = flops.gemm(m, n, k)
    return [once(f"{label}: checked call", flops=cost.flops, precision="float16", share=share, **work),
            once(f"{label}: float64 reference", flops=cost.flops, precision="float64", checked_elements=m * n,
                 memory_bytes=32 * m * n, **work)]  # float16 operands, float32 C, the float64 check


def _wmma_work(n: int, variants: int) -> list[Work]:
    """wmma.wmma_comparison: the naive WMMA kernel and each variant of the pipelined one (``cp.async``: compute
    capability 8.0) checked at their edges and at n^3, then timed (the L2 not flushed); cuBLAS in float16, checked,
    timed and profiled; then chapter 09's worklog of cuBLAS in float32 and the best SGEMM."""
    cost = flops.gemm(n, n, n)
    kernels = [("WMMA naive", NAIVE_SHARE, 1, "0.0"), ("WMMA pipelined", PIPELINED_SHARE, variants, "8.0")]
    found = []
    for label, share, count, capability in kernels:
        where = dict(measurements=count, min_capability=capability)
        found += [*_wmma_check(f"wmma: {label}, edges", *WMMA_CHECK_SIZE, share, **where),
                  *_wmma_check(f"wmma: {label}", n, n, n, share, **where),
                  Work(f"wmma: {label}", flops=cost.flops, precision="float16", share=share, flush_l2=False,
                       **where)]
    cublas = dict(flops=cost.flops, precision="float16")
    return [*found,
            once("wmma: cuBLAS float16, checked call", **cublas),
            once("wmma: cuBLAS float16, float64 reference", flops=cost.flops, precision="float64",
                 checked_elements=n * n),
            Work("wmma: cuBLAS float16", flush_l2=False, **cublas),
            once("wmma: cuBLAS float16, profiled", extra_seconds=budget.PROFILER_SESSION_SECONDS, **cublas),
            *gemm_plan.worklog_work(n, steps=[len(gemm_plan.STEP_SHARES)])]


def _tf32_work(n: int) -> list[Work]:
    """tensor_cores.tf32_switch: the float64 rows once; under each setting a checked call, a measurement (the L2
    flushed) and a call under the profiler. A GPU without TF32 computes every setting in float32."""
    cost = flops.gemm(n, n, n)
    found = [once("tf32: float64 rows", flops=2 * CHECK_ROWS * n * n, precision="float64")]
    for setting, switches in TF32_SETTINGS.items():
        precision = "float32" if switches["precision"] == "highest" or switches["allow_tf32"] is False else "tf32"
        product = dict(flops=cost.flops, precision=precision, memory_bytes=20 * n * n)
        found += [once(f"tf32: {setting}, checked", checked_elements=CHECK_ROWS * n, **product),
                  Work(f"tf32: {setting}", bytes=12 * n * n, **product),
                  once(f"tf32: {setting}, profiled", extra_seconds=budget.PROFILER_SESSION_SECONDS, **product)]
    return found


def _alignment_work(base: int, sizes: list[int], dtypes: list[str]) -> list[Work]:
    """chapter 04's sweeps.alignment_sweep: batch, inputs and outputs in turn take each size, the others the base,
    each point a checked and timed forward GEMM (:func:`gpulab.ch04_mlp_gemms.plan.linear`)."""
    shape = dict(batch=base, inputs=base, outputs=base)
    return [work for dtype in dtypes for dim in shape for size in dict.fromkeys([base, *sizes])
            for work in mlp_plan.linear(**{**shape, dim: size}, dtype=dtype)]


def _layer_work(label: str, shapes: list[dict], dtype: str) -> list[Work]:
    """tensor_cores.layer_gemms_sweep: per shape, the forward GEMM and the two of the backward pass, each checked on
    :data:`CHECK_ROWS` rows of its result, then timed (the L2 flushed)."""
    found = []
    size = flops.bytes_per_element(dtype)
    for shape in shapes:
        b, i, o = shape["batch"], shape["inputs"], shape["outputs"]
        for columns, summed in ((o, i), (i, o), (i, b)):  # forward, activation gradient, weight gradient
            product = dict(flops=2 * b * i * o, precision=dtype)
            found += [once(f"{label}: checked GEMM", extra_seconds=POINT_SECONDS, **product),
                      _float64_rows(f"{label}: float64 rows", CHECK_ROWS, columns, summed),
                      Work(f"{label}: GEMM", memory_bytes=2 * (b * i + o * i + b * o) * size
                           + 8 * (o * i + b * max(i, o)), **product)]
    return found


def work(sizes: dict) -> list[Work]:
    vocabulary = sizes["vocabulary"]
    base = sizes["alignment_base"]
    return [*_format_work(sizes["format_n"]),
            *_wmma_work(sizes["n"], len(sizes["wmma_variants"])),
            *_tf32_work(sizes["tf32_n"]),
            *_alignment_work(base, sizes["alignment_sizes"], sizes["alignment_dtypes"]),
            *_layer_work("vocabulary", [{**vocabulary, "outputs": v} for v in vocabulary["outputs"]],
                         sizes["layer_dtype"]),
            *_layer_work("batch sizes", [{"batch": b, "inputs": base, "outputs": base} for b in sizes["batch_sizes"]],
                         sizes["layer_dtype"])]


def fixed_seconds(sizes: dict) -> float:
    """The notebook, NVRTC for each kernel file and set of defines (the compiler's report, then CuPy's compile): the
    naive WMMA kernel, each pipelined variant and the best SGEMM; and the profiler's start (its sessions are in the
    work)."""
    kernels = 1 + len(sizes["wmma_variants"]) + 1
    return budget.NOTEBOOK_SECONDS + kernels * budget.NVRTC_SECONDS + budget.PROFILER_START_SECONDS


CHAPTER = budget.Chapter(name="10 Tensor cores", full=FULL, classes=CLASSES, cpu=CPU, smoke=SMOKE, work=work,
                         fixed_seconds=fixed_seconds)
