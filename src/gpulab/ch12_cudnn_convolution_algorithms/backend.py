"""What torch hands to cuDNN and what cuDNN ran: the backend and its switches, the descriptors, and the kernels
a convolution launched, grouped into algorithm families (from the profiler).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

import torch

from gpulab.ch05_convolutions_as_gemms import conv
from gpulab.ch06_recurrent_and_attention import attention
from gpulab.core import profiling
from gpulab.core.sweep import ok_rows
from gpulab.core.validation import positive_int

T = TypeVar("T")


KERNELS_KEPT = 8  # kernels (or CPU operators) a row keeps, the longest first





# torch's names for the backends of a convolution (torch._C._ConvBackend) and what each one is.
BACKENDS = {
    "Cudnn": "cuDNN",
    "CudnnTranspose": "cuDNN (transposed convolution)",
    "Miopen": "MIOpen (AMD GPUs)",
    "Mkldnn": "oneDNN (MKL-DNN), Intel's CPU library",
    "MkldnnEmpty": "oneDNN, empty input",
    "Slow2d": "torch's own im2col + GEMM (slow_conv2d)",
    "SlowDilated2d": "torch's own im2col + GEMM for dilated convolutions",
    "NnpackSpatial": "NNPACK (CPU)",
    "Xnnpack2d": "XNNPACK (mobile CPUs)",
    "CudaDepthwise2d": "torch's own CUDA kernel for depthwise convolutions",
    "Mps": "Metal Performance Shaders (Apple GPUs)",
    "Empty": "nothing to compute (an empty tensor)",
}

# cuDNN's data type for each torch dtype (cudnnDataType_t)
CUDNN_DATA_TYPES = {
    torch.float64: "CUDNN_DATA_DOUBLE",
    torch.float32: "CUDNN_DATA_FLOAT",
    torch.float16: "CUDNN_DATA_HALF",
    torch.bfloat16: "CUDNN_DATA_BFLOAT16",
    torch.int8: "CUDNN_DATA_INT8",
}


def backend_flags() -> list[dict]:
    """The switches torch offers for cuDNN (and, for a CPU, oneDNN), each with its value here and what it does."""
    cudnn, mkldnn = torch.backends.cudnn, torch.backends.mkldnn
    rows = [
        ("torch.backends.cudnn.is_available()", cudnn.is_available(), "torch was built with cuDNN and found it"),
        ("torch.backends.cudnn.version()", cudnn.version(), "cuDNN's version, e.g. 91900 for 9.19.0"),
        ("torch.backends.cudnn.enabled", cudnn.enabled, "False sends CUDA convolutions to torch's own kernels"),
        ("torch.backends.cudnn.benchmark", cudnn.benchmark,
         "True: time the candidate algorithms at a shape's first call and keep the fastest"),
        ("torch.backends.cudnn.benchmark_limit", getattr(cudnn, "benchmark_limit", None),
         "how many candidates the benchmark tries (0: all)"),
        ("torch.backends.cudnn.deterministic", cudnn.deterministic,
         "True: only algorithms that give bitwise the same result every run"),
        ("torch.backends.cudnn.allow_tf32", cudnn.allow_tf32,
         "float32 convolutions may use TF32 tensor cores (default True)"),
        ("torch.backends.cuda.matmul.allow_tf32", torch.backends.cuda.matmul.allow_tf32,
         "the same for cuBLAS matmuls, a separate switch (default False)"),
        ("torch.backends.mkldnn.is_available()", mkldnn.is_available(), "torch was built with oneDNN (CPU)"),
        ("torch.backends.mkldnn.enabled", mkldnn.enabled, "False sends CPU convolutions to torch's own code"),
    ]
    return [{"flag": flag, "value": value, "meaning": meaning} for flag, value, meaning in rows]


def conv_backend(x: torch.Tensor, weight: torch.Tensor, stride: int = 1, padding: int = 0) -> str:
    """The backend torch picks for ``conv2d(x, weight)``: 'Cudnn', 'Mkldnn', 'Slow2d', ... ('unknown' if torch
    does not say). Asked of torch's own dispatcher (``torch._C._select_conv_backend``), a private function."""
    conv.ConvLayer.of(x, weight, stride, padding)  # ValueError for operands that do not fit
    select = getattr(torch._C, "_select_conv_backend", None)
    if select is None:
        return "unknown"
    try:
        chosen = select(x, weight, None, [stride] * 2, [padding] * 2, [1, 1], False, [0, 0], 1, None)
    except (RuntimeError, TypeError):  # a torch whose private signature differs
        return "unknown"
    return str(chosen).rsplit(".", 1)[-1]


def describe_backend(name: str) -> str:
    """What a backend name of :func:`conv_backend` stands for."""
    return BACKENDS.get(name, name)


def layout_of(t: torch.Tensor) -> str:
    """The layout letters of a 4-d tensor, slowest to fastest index, as cuDNN names formats: 'NCHW', 'NHWC', ...

    torch's own tests come first (a dimension of size 1 makes the strides ambiguous); otherwise the
    letters are sorted by decreasing stride.
    """
    if t.dim() != 4:
        raise ValueError(f"t: expected a 4-d tensor (N x C x H x W), got shape {tuple(t.shape)}")
    if t.is_contiguous():
        return "NCHW"
    if t.is_contiguous(memory_format=torch.channels_last):
        return "NHWC"
    return "".join(sorted("NCHW", key=lambda letter: -t.stride("NCHW".index(letter))))


def tensor_descriptor(t: torch.Tensor, name: str = "x") -> dict:
    """What a cuDNN tensor descriptor holds for ``t``: sizes (always N, C, H, W), strides, data type, and the
    format those strides make ('NCHW', 'NHWC' or another order; 'packed' says if it has no gaps)."""
    if t.dtype not in CUDNN_DATA_TYPES:
        raise ValueError(f"{name}: cuDNN has no data type for {t.dtype}")
    packed = t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last)
    return {"tensor": name, "sizes": list(t.shape), "strides": list(t.stride()),
            "data_type": CUDNN_DATA_TYPES[t.dtype], "format": layout_of(t), "packed": packed}


def cudnn_memory_format(x: torch.Tensor, weight: torch.Tensor) -> torch.memory_format:
    """The layout torch runs a cuDNN convolution in: NHWC if the input or the filters are channels_last
    (and the data is not float64), NCHW otherwise -- torch's ``cudnn_conv_suggest_memory_format``."""
    if torch.float64 in (x.dtype, weight.dtype):
        return torch.contiguous_format
    if "NHWC" in (layout_of(x), layout_of(weight)):  # strides in NHWC order, whether packed or not
        return torch.channels_last
    return torch.contiguous_format


def conv_descriptors(x: torch.Tensor, weight: torch.Tensor, stride: int = 1, padding: int = 0) -> list[dict]:
    """The descriptors torch builds for a cuDNN convolution of ``x`` by ``weight``: input, filters, output,
    and the convolution itself (padding, stride, dilation, mode and the compute type).

    torch first makes both operands contiguous in :func:`cudnn_memory_format` (a copy if they are not),
    and the output has that layout too; the 16-bit formats are computed (accumulated) in float32.
    """
    shape = conv.ConvLayer.of(x, weight, stride, padding)
    layout = cudnn_memory_format(x, weight)
    x, weight = x.contiguous(memory_format=layout), weight.contiguous(memory_format=layout)
    y = torch.empty((shape.n, shape.k, shape.p, shape.q), dtype=x.dtype, device="meta").contiguous(
        memory_format=layout)
    compute = "CUDNN_DATA_DOUBLE" if x.dtype == torch.float64 else "CUDNN_DATA_FLOAT"
    return [tensor_descriptor(x, "x (input)"), tensor_descriptor(weight, "w (filters)"),
            tensor_descriptor(y, "y (output)"),
            {"tensor": "convolution", "padding": [padding] * 2, "stride": [stride] * 2, "dilation": [1, 1],
             "mode": "CUDNN_CROSS_CORRELATION", "compute_type": compute}]


@contextmanager
def cudnn_settings(*, benchmark: bool | None = None, deterministic: bool | None = None) -> Iterator[None]:
    """Within the block, ``torch.backends.cudnn.benchmark`` and ``deterministic`` take the given values
    (None leaves one as it is); both are restored afterwards. For ``allow_tf32`` use
    :func:`gpulab.core.precision.matmul_mode`."""
    cudnn = torch.backends.cudnn
    saved = cudnn.benchmark, cudnn.deterministic
    if benchmark is not None:
        cudnn.benchmark = bool(benchmark)
    if deterministic is not None:
        cudnn.deterministic = bool(deterministic)
    try:
        yield
    finally:
        cudnn.benchmark, cudnn.deterministic = saved


# GPU kernel names (lower case), first match wins. NVIDIA does not document which kernel belongs to which
# algorithm, so the families are read off the names, an inference: 'winograd', 'fft' and 'im2col' say so
# plainly; the transposes between NCHW and NHWC and the split-K reductions (adding partial sums) come
# before the GEMM patterns; 'precomp', and the 'scudnn'/'hcudnn' kernels of older cuDNN versions, are taken
# for the precomputed-offset implicit GEMM; 'implicit_gemm', 'fprop' (forward), 'dgrad' (data gradient)
# and 'wgrad' (weight gradient) name implicit-GEMM kernels; cuBLAS's GEMMs (gpulab's im2col + GEMM) last.
KERNEL_FAMILIES: tuple[tuple[str, str], ...] = (
    ("Winograd", r"winograd"),
    ("FFT", r"fft|flip_filter|r2c|c2r|_cf32|cgemm"),  # cf32: the complex GEMM of each frequency
    ("im2col (GEMM algorithm)", r"im2col"),
    ("layout transform", r"nchwtonhwc|nhwctonchw|nchw_to_nhwc|nhwc_to_nchw|transpose|permute|convert|"
                         r"tensortransform|addpadding|scalepackedtensor"),
    ("split-K reduction", r"splitk|split_k"),
    ("implicit precomputed GEMM", r"precomputed_convolve|kern_precompute|implicit_precomp|scudnn|hcudnn"),
    ("direct convolution", r"direct"),
    ("implicit GEMM", r"implicit|fprop|dgrad|wgrad|convolve|conv2d|conv_|cudnn"),
    ("GEMM", r"gemm|gemv|nvjet|cublas|cutlass|xmma|sm\d\d_"),
    ("elementwise", r"elementwise|vectorized|unrolled|fill|memset|memcpy|copy|reduce"),
)
# CPU operator names (their own time): oneDNN's convolution, torch's im2col + GEMM, and the rest.
OPERATOR_FAMILIES: tuple[tuple[str, str], ...] = (
    ("oneDNN", r"mkldnn|onednn"),
    ("NNPACK", r"nnpack"),
    ("FFT", r"fft"),
    ("im2col (GEMM algorithm)", r"slow_conv|thnn_conv|im2col|unfold"),
    ("backward convolution", r"convolution_backward"),  # the backend's backward runs inside this operator
    ("GEMM", r"^aten::(mm|addmm|bmm|baddbmm|matmul)$"),
    ("layout transform", r"^aten::(copy_|_to_copy|contiguous|clone|permute|to)$"),
    ("elementwise", r"^aten::(add|mul|sub|div|neg|conj|conj_physical|fill_|zero_|masked_fill_|constant_pad_nd)\w*$"),
)
# families that do the convolution's arithmetic (the rest move data or tidy up around it)
ARITHMETIC_FAMILIES = ("Winograd", "FFT", "im2col (GEMM algorithm)", "implicit precomputed GEMM", "direct convolution",
                       "implicit GEMM", "GEMM", "oneDNN", "NNPACK", "backward convolution")


def kernel_family(name: str, device_type: str = "cuda") -> str:
    """The family of a GPU kernel's name (:data:`KERNEL_FAMILIES`) or a CPU operator's (:data:`OPERATOR_FAMILIES`)."""
    if device_type == "cuda":
        return attention.classify(name.lower(), KERNEL_FAMILIES)
    return attention.classify(name, OPERATOR_FAMILIES)


_profiler_ready = False


def _prime_profiler() -> None:
    """Start and stop the profiler once in the calling thread (the main one): kineto must be set up in the
    thread that first registers it, or it complains on stderr when a worker thread profiles. Its log
    level is read once, at that first use."""
    global _profiler_ready
    if _profiler_ready:
        return
    profiling.profile_calls(lambda: None, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    _profiler_ready = True


def profile_kernels(fn: Callable[[], object], device: torch.device, calls: int = 2) -> list[dict]:
    """Run ``fn()`` ``calls`` times under ``torch.profiler``; a row per kernel name (on a GPU) or CPU operator
    (on a CPU: its own time), the longest first: name, family, seconds and launches per call, share of the time."""
    calls = positive_int("calls", calls)
    prof = profiling.profile_calls(fn, device, calls)
    if device.type == "cuda":
        timed = profiling.device_kernels(prof)
    else:
        timed = [(e.name, e.self_cpu_time_total / 1e6) for e in prof.events()]
    totals: dict[str, list[float]] = {}
    for name, seconds in timed:
        entry = totals.setdefault(name, [0.0, 0])
        entry[0] += seconds
        entry[1] += 1
    everything = sum(seconds for seconds, _ in totals.values()) or 1.0
    rows = [{"name": name, "family": kernel_family(name, device.type), "seconds": seconds / calls,
             "launches": count / calls, "share": seconds / everything}
            for name, (seconds, count) in totals.items()]
    return sorted(rows, key=lambda r: -r["seconds"])


def main_family(kernels: Sequence[dict]) -> str:
    """The arithmetic family (:data:`ARITHMETIC_FAMILIES`) that took the most time, or the top family if none did."""
    time_of: dict[str, float] = {}
    for k in kernels:
        time_of[k["family"]] = time_of.get(k["family"], 0.0) + k["seconds"]
    arithmetic = {f: s for f, s in time_of.items() if f in ARITHMETIC_FAMILIES}
    pool = arithmetic or time_of
    return max(pool, key=pool.get) if pool else "none"


def setting_label(row: dict) -> str:
    """A row's setting in words: 'float16 NHWC, benchmark on', or 'gpulab FFT' for gpulab's own implementations."""
    if row.get("method", "conv2d") != "conv2d":
        return f"gpulab {row['method']}"
    label = f"{row['dtype']} {row['layout']}"
    if row.get("benchmark") is not None:
        label += ", benchmark " + ("on" if row["benchmark"] else "off")
    return label


def truncated(name: str, width: int = 90) -> str:
    """A kernel's raw name cut to ``width`` characters (C++ template arguments make some hundreds long); unlike
    :func:`gpulab.core.profiling.short_name` it keeps the signature, which tells cuDNN's kernels apart."""
    return name if len(name) <= width else name[:width - 3] + "..."


def algorithm_rows(rows: Sequence[dict], kernels: int = 3, width: int = 90) -> list[dict]:
    """For each measured row: its layer, setting, the family that did the arithmetic, and its ``kernels`` longest
    kernels as 'name [family, share]' strings (the raw names, cut to ``width``)."""
    found = []
    for r in ok_rows(rows):
        if not r.get("kernels"):
            continue
        names = [f"{truncated(k['name'], width)} [{k['family']}, {k['share']:.0%}]" for k in r["kernels"][:kernels]]
        found.append({"layer": r["layer"], "setting": setting_label(r), "algorithm": r["algorithm"],
                      "kernels": names})
    return found






def in_fresh_thread(fn: Callable[[], T]) -> T:
    """``fn()`` run in a new thread; its result, or its exception raised here.

    torch keeps the cuDNN plan it picked for a convolution (by heuristics, or by timing with
    ``benchmark=True``) in a cache per thread (aten/src/ATen/native/cudnn/Conv_v8.cpp). Its key holds the
    shapes, dtype, layout, ``deterministic`` and ``allow_tf32`` but not ``benchmark``: in one thread, a
    shape run once with benchmark off is never benchmarked. A new thread starts with an empty cache.
    """
    box: dict = {}
    current = torch.cuda.current_device() if torch.cuda.is_available() else None

    def target() -> None:
        try:
            if current is not None:
                torch.cuda.set_device(current)  # the device is per host thread in CUDA
            box["result"] = fn()
        except BaseException as error:  # noqa: BLE001 - handed to the caller, who re-raises it
            box["error"] = error

    worker = threading.Thread(target=target, name="gpulab-cudnn")
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["result"]
