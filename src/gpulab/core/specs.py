"""A table of GPUs, and the peak rates that follow from their hardware.

Each row holds what a vendor's whitepaper or datasheet says about one product: how many streaming
multiprocessors (SMs) it has, its boost clock, how many arithmetic units of each kind an SM holds,
how many fused multiply-adds (FMA) a tensor core completes per clock in each precision, and its
memory. Peak rates are never typed in; they are *derived*:

    peak = SMs x (FMA per clock per SM) x 2 FLOP per FMA x clock

and the unit tests hold the derived figures to the vendors' published ones. All tensor-core figures
are *dense*; "2:4 sparse" figures in datasheets are twice these.

The device in use is matched to its row by the name the driver reports (:func:`present`); a GPU the
table lacks is described from what the driver does report, and what that cannot tell is said
plainly (:func:`summary`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from gpulab.core import env

FLOP_PER_FMA = 2


@dataclass(frozen=True)
class GPU:
    """One GPU product. Unit counts are per SM; tensor-core rates are dense FMA per clock per tensor core."""

    name: str  # "H100 SXM5 80GB"
    architecture: str  # "Hopper"
    compute_capability: str  # "9.0"
    sms: int
    boost_clock_ghz: float  # the clock peak rates are quoted at
    cuda_cores_per_sm: Mapping[str, int]  # units of each kind per SM: one FMA (int32: one multiply-add) per clock
    tensor_cores_per_sm: int
    tensor_fma_per_clock: Mapping[str, int]  # per tensor core, by input precision; dense
    memory_gb: float
    memory_type: str
    bandwidth_gb_s: float
    l2_mb: float
    l1_shared_kb: int  # the SM's combined L1 cache and shared memory
    max_threads_per_sm: int
    pcie_generation: int = 4  # the host link: 16 lanes of PCIe of this generation
    register_file_kb: int = 256
    # Hopper's datasheets quote tensor-core peaks for tf32 and narrower at a lower clock than
    # everything else (FP64 tensor ops included): the chip cannot hold its top clock under that load.
    tensor_clock_ghz: float | None = None
    device_names: tuple[str, ...] = ()  # the names the driver reports for it
    source: str = ""  # bibliography key of the figures

    @property
    def tensor_cores(self) -> int:
        return self.sms * self.tensor_cores_per_sm

    @property
    def pcie_gb_s(self) -> float:
        """Per direction, 16 lanes: 8, 16, 32 GT/s for generations 3, 4, 5, with 128b/130b encoding."""
        return 16 * 8 * 2 ** (self.pcie_generation - 3) * 128 / 130 / 8

    @property
    def cuda_cores(self) -> int:
        """The marketing 'CUDA cores': FP32 units on the whole chip."""
        return self.sms * self.cuda_cores_per_sm["float32"]

    def fma_per_clock_per_sm(self, precision: str, unit: str) -> int:
        if unit == CUDA_CORES:
            return self.cuda_cores_per_sm[precision]
        return self.tensor_cores_per_sm * self.tensor_fma_per_clock[precision]

    def clock_ghz(self, precision: str, unit: str) -> float:
        if unit == TENSOR_CORES and precision != "float64" and self.tensor_clock_ghz:
            return self.tensor_clock_ghz
        return self.boost_clock_ghz


CUDA_CORES, TENSOR_CORES = "CUDA cores", "tensor cores"

# Precisions, in the order tables list them. "float16/acc16" is float16 inputs with a float16
# accumulator: GeForce cards run it at twice the rate of float32 accumulation (which deep learning uses).
PRECISIONS = ("float64", "float32", "tf32", "float16", "bfloat16", "float8", "int8", "int4", "int32",
              "float16/acc16")


@dataclass(frozen=True)
class Peak:
    """A peak rate and the hardware figures it follows from."""

    gpu: str
    precision: str
    unit: str  # CUDA_CORES or TENSOR_CORES
    sms: int
    fma_per_clock_per_sm: int
    clock_ghz: float

    @property
    def ops_per_s(self) -> float:
        return self.sms * self.fma_per_clock_per_sm * FLOP_PER_FMA * self.clock_ghz * 1e9

    @property
    def tflops(self) -> float:
        """Tera-operations per second (TFLOP/s; TOPS for integer precisions)."""
        return self.ops_per_s / 1e12

    @property
    def rate_unit(self) -> str:
        return "TOPS" if self.precision.startswith("int") else "TFLOP/s"

    def formula(self) -> str:
        """'108 SMs x 1,024 FMA/clock x 2 x 1.41 GHz = 311.9 TFLOP/s'."""
        return (f"{self.sms} SMs x {self.fma_per_clock_per_sm:,} FMA/clock x {FLOP_PER_FMA} x "
                f"{self.clock_ghz:g} GHz = {self.tflops:,.1f} {self.rate_unit}")


_VOLTA_SM = dict(architecture="Volta", compute_capability="7.0", sms=80, tensor_cores_per_sm=8,
                 cuda_cores_per_sm={"float64": 32, "float32": 64, "int32": 64},
                 tensor_fma_per_clock={"float16": 64}, l2_mb=6, l1_shared_kb=128, max_threads_per_sm=2048,
                 pcie_generation=3, source="nvidia2017volta")
_AMPERE_A100 = dict(architecture="Ampere", compute_capability="8.0", sms=108, boost_clock_ghz=1.41,
                    tensor_cores_per_sm=4, cuda_cores_per_sm={"float64": 32, "float32": 64, "int32": 64},
                    tensor_fma_per_clock={"float64": 16, "tf32": 128, "float16": 256, "bfloat16": 256,
                                          "int8": 512, "int4": 1024},
                    l2_mb=40, l1_shared_kb=192, max_threads_per_sm=2048, source="nvidia2020ampere")
_HOPPER_SXM = dict(architecture="Hopper", compute_capability="9.0", sms=132, boost_clock_ghz=1.98,
                   tensor_clock_ghz=1.83, tensor_cores_per_sm=4,
                   cuda_cores_per_sm={"float64": 64, "float32": 128, "int32": 64},
                   tensor_fma_per_clock={"float64": 32, "tf32": 256, "float16": 512, "bfloat16": 512,
                                         "float8": 1024, "int8": 1024},
                   l2_mb=50, l1_shared_kb=256, max_threads_per_sm=2048, pcie_generation=5,
                   source="nvidia2022hopper")

_A100_SXM4_40GB = GPU(name="A100 SXM4 40GB", memory_gb=40, memory_type="HBM2", bandwidth_gb_s=1555,
                       device_names=("A100-SXM4-40GB",), **_AMPERE_A100)
_H100_SXM5 = GPU(name="H100 SXM5 80GB", memory_gb=80, memory_type="HBM3", bandwidth_gb_s=3350,
                  device_names=("H100 80GB HBM3", "H100 SXM5 80GB"), **_HOPPER_SXM)

GPUS: dict[str, GPU] = {gpu.name: gpu for gpu in (
    GPU(name="V100 SXM2 32GB", boost_clock_ghz=1.53, memory_gb=32, memory_type="HBM2", bandwidth_gb_s=900,
         device_names=("V100-SXM2-32GB", "V100-SXM2-16GB"), **_VOLTA_SM),
    GPU(name="V100 PCIe 32GB", boost_clock_ghz=1.38, memory_gb=32, memory_type="HBM2", bandwidth_gb_s=900,
         device_names=("V100-PCIE-32GB", "V100-PCIE-16GB"), **_VOLTA_SM),
    GPU(name="T4", architecture="Turing", compute_capability="7.5", sms=40, boost_clock_ghz=1.59,
         cuda_cores_per_sm={"float64": 2, "float32": 64, "int32": 64}, tensor_cores_per_sm=8,
         tensor_fma_per_clock={"float16": 64, "int8": 128, "int4": 256}, memory_gb=16, memory_type="GDDR6",
         bandwidth_gb_s=320, l2_mb=4, l1_shared_kb=96, max_threads_per_sm=1024, pcie_generation=3,
         device_names=("T4",),
         source="nvidia2018turing"),
    _A100_SXM4_40GB,
    dataclasses.replace(_A100_SXM4_40GB, name="A100 SXM4 80GB", memory_gb=80, memory_type="HBM2e",
                        bandwidth_gb_s=2039, device_names=("A100-SXM4-80GB",)),
    dataclasses.replace(_A100_SXM4_40GB, name="A100 PCIe 80GB", memory_gb=80, memory_type="HBM2e",
                        bandwidth_gb_s=1935, device_names=("A100 80GB PCIe", "A100-PCIE-80GB")),
    GPU(name="RTX 3090", architecture="Ampere", compute_capability="8.6", sms=82, boost_clock_ghz=1.695,
         cuda_cores_per_sm={"float64": 2, "float32": 128, "int32": 64}, tensor_cores_per_sm=4,
         tensor_fma_per_clock={"tf32": 32, "float16": 64, "bfloat16": 64, "float16/acc16": 128, "int8": 256,
                               "int4": 512},
         memory_gb=24, memory_type="GDDR6X", bandwidth_gb_s=936, l2_mb=6, l1_shared_kb=128,
         max_threads_per_sm=1536, device_names=("GeForce RTX 3090",), source="nvidia2020ga102"),
    GPU(name="L4", architecture="Ada Lovelace", compute_capability="8.9", sms=58, boost_clock_ghz=2.04,
         cuda_cores_per_sm={"float64": 2, "float32": 128, "int32": 64}, tensor_cores_per_sm=4,
         tensor_fma_per_clock={"tf32": 64, "float16": 128, "bfloat16": 128, "float8": 256, "int8": 256},
         memory_gb=24, memory_type="GDDR6", bandwidth_gb_s=300, l2_mb=48, l1_shared_kb=128,
         max_threads_per_sm=1536, device_names=("L4",), source="nvidia2023l4"),
    _H100_SXM5,
    GPU(name="H100 PCIe 80GB", memory_gb=80, memory_type="HBM2e", bandwidth_gb_s=2000,
         device_names=("H100 PCIe",), **{**_HOPPER_SXM, "sms": 114, "boost_clock_ghz": 1.755,
                                         "tensor_clock_ghz": 1.62}),
    # The driver of an H200 reports 60 MB of L2 (torch's L2_cache_size), of an H100 SXM5 50 MB.
    dataclasses.replace(_H100_SXM5, name="H200 SXM 141GB", memory_gb=141, memory_type="HBM3e",
                        bandwidth_gb_s=4800, l2_mb=60, device_names=("H200",), source="nvidia2024h200"),
)}


@dataclass(frozen=True)
class CPU:
    """A CPU, for the CPU-versus-GPU comparison: peak = cores x clock x FLOP per cycle per core."""

    name: str
    cores: int
    threads: int
    base_clock_ghz: float
    boost_clock_ghz: float  # one or a few cores; all cores at once run nearer the base clock
    fp32_flop_per_cycle: int  # per core: vector units x lanes x 2 (FMA)
    memory: str
    bandwidth_gb_s: float
    source: str = ""

    @property
    def peak_tflops(self) -> float:
        """All cores busy at the base clock."""
        return self.cores * self.base_clock_ghz * self.fp32_flop_per_cycle / 1e3


# Zen 2: two 256-bit FMA pipes per core, 8 float32 lanes each: 2 x 8 x 2 = 32 FLOP per cycle.
THREADRIPPER_3970X = CPU(name="AMD Ryzen Threadripper 3970X", cores=32, threads=64, base_clock_ghz=3.7,
                         boost_clock_ghz=4.5, fp32_flop_per_cycle=32, memory="4 channels of DDR4-3200",
                         bandwidth_gb_s=4 * 25.6, source="amd2019threadripper")


def gpu(name: str) -> GPU:
    """The row called ``name`` (a key of :data:`GPUS`); ValueError naming the choices otherwise."""
    if name not in GPUS:
        raise ValueError(f"name: no GPU called {name!r} in gpulab.core.specs; choose one of {', '.join(GPUS)}")
    return GPUS[name]


def peaks(row: GPU) -> list[Peak]:
    """Every peak of ``row``: CUDA cores first, then tensor cores, each in :data:`PRECISIONS` order."""
    found = []
    for unit, rates in ((CUDA_CORES, row.cuda_cores_per_sm), (TENSOR_CORES, row.tensor_fma_per_clock)):
        for precision in (p for p in PRECISIONS if p in rates):
            found.append(Peak(row.name, precision, unit, row.sms, row.fma_per_clock_per_sm(precision, unit),
                              row.clock_ghz(precision, unit)))
    return found


def peak(row: GPU, precision: str, unit: str | None = None) -> Peak:
    """The peak of ``row`` in ``precision`` on ``unit`` (default: the faster unit that has it).

    This is the ceiling a dense matrix multiply in that precision can approach: float32 on the CUDA
    cores, tf32 and the 16-bit formats on the tensor cores, float64 on whichever is faster.
    """
    candidates = [p for p in peaks(row) if p.precision == precision and unit in (None, p.unit)]
    if not candidates:
        has = sorted({p.precision for p in peaks(row) if unit in (None, p.unit)}, key=PRECISIONS.index)
        where = f" on its {unit}" if unit else ""
        raise ValueError(f"precision: the {row.name} ({row.architecture}) has no {precision} rate{where}; "
                         f"it has {', '.join(has)}")
    return max(candidates, key=lambda p: p.ops_per_s)


def peak_tflops(row: GPU, precision: str) -> float | None:
    """:func:`peak` in TFLOP/s (TOPS for integers), or None where ``row`` has no unit for ``precision``."""
    try:
        return peak(row, precision).tflops
    except ValueError:
        return None


def _normalise(name: str) -> str:
    """'NVIDIA A100-SXM4-40GB' and 'a100 sxm4 40gb' -> 'A100SXM440GB'."""
    name = re.sub(r"^(NVIDIA|TESLA)\s+", "", name.strip().upper())
    return re.sub(r"[^A-Z0-9]", "", name)


def find(device_name: str) -> GPU | None:
    """The row whose driver name (or table name) matches ``device_name`` exactly, ignoring case and punctuation."""
    wanted = _normalise(device_name)
    for row in GPUS.values():
        if wanted in {_normalise(n) for n in (row.name, *row.device_names)}:
            return row
    return None


def present(device: torch.device | None = None) -> GPU | None:
    """The row of the GPU in use; None on a CPU, or for a GPU whose name or SM count the table lacks."""
    info = env.describe(device)
    if info.kind != "cuda":
        return None
    row = find(info.name)
    if row is None or row.sms != info.multiprocessors:  # a cut-down variant under the same name
        return None
    return row


@dataclass(frozen=True)
class DriverReport:
    """What the driver reports about any GPU (``torch.cuda.get_device_properties``)."""

    name: str
    sms: int
    compute_capability: str
    memory_bytes: int
    l2_bytes: int | None = None
    max_threads_per_sm: int | None = None

    @classmethod
    def from_device(cls, device: torch.device) -> DriverReport:
        props = torch.cuda.get_device_properties(device)
        return cls(props.name, props.multi_processor_count, f"{props.major}.{props.minor}", props.total_memory,
                   getattr(props, "L2_cache_size", None), getattr(props, "max_threads_per_multi_processor", None))


NOT_KNOWN_FROM_DRIVER = ("the boost clock the vendor rates it at", "the arithmetic units per SM",
                         "the tensor cores' FMA per clock", "the memory bandwidth")


def describe_unknown(report: DriverReport) -> str:
    """A plain account of a GPU the table lacks: what the driver says, and what it cannot say."""
    known = [f"{report.sms} SMs", f"compute capability {report.compute_capability}",
             f"{report.memory_bytes / 2**30:.1f} GiB of memory"]
    if report.l2_bytes:
        known.append(f"{report.l2_bytes / 2**20:.0f} MB of L2 cache")
    if report.max_threads_per_sm:
        known.append(f"up to {report.max_threads_per_sm} resident threads per SM")
    return (f"{report.name} is not in gpulab.core.specs. The driver reports {', '.join(known)}. It does not report "
            f"{', '.join(NOT_KNOWN_FROM_DRIVER[:-1])} or {NOT_KNOWN_FROM_DRIVER[-1]}, so no peak rate can be "
            "derived here: look them up in the vendor's whitepaper and add a row to gpulab.core.specs.GPUS.")


def describe(row: GPU) -> str:
    """Two lines on ``row``: its hardware, then its peaks."""
    clock = f"{row.boost_clock_ghz:g} GHz boost"
    if row.tensor_clock_ghz:
        clock += f" ({row.tensor_clock_ghz:g} GHz for tensor-core peaks)"
    rates = {unit: ", ".join(f"{p.precision} {p.tflops:,.1f}" for p in peaks(row)
                             if p.unit == unit and p.precision != "int32") for unit in (CUDA_CORES, TENSOR_CORES)}
    return (f"{row.name} ({row.architecture}, compute capability {row.compute_capability}): {row.sms} SMs, {clock}, "
            f"{row.memory_gb:g} GB {row.memory_type} at {row.bandwidth_gb_s:,.0f} GB/s, {row.l2_mb:g} MB L2\n"
            f"  peaks in TFLOP/s (TOPS for int), dense: {CUDA_CORES}: {rates[CUDA_CORES]}; "
            f"{TENSOR_CORES}: {rates[TENSOR_CORES]}")


def summary(device: torch.device | None = None) -> str:
    """What the book knows about the device in use: its row and peaks, or, for another GPU, the driver's report."""
    info = env.describe(device)
    if info.kind != "cuda":
        return "No GPU here: the chapters compare with the GPUs of the table instead."
    row = present(device)
    if row is not None:
        return describe(row)
    return describe_unknown(DriverReport.from_device(device or env.device()))


COMPARED_PRECISIONS = ("float64", "float32", "tf32", "float16", "bfloat16", "float8", "int8")


def figures(row: GPU) -> list[dict]:
    """The figures the comparison shows: rows of 'metric', 'value' (None where the GPU lacks it) and 'peak'.

    Peak rows are dense TFLOP/s (TOPS for int8), named 'peak <precision>'.
    """
    hardware = [
        ("SMs", row.sms), ("boost clock (GHz)", row.boost_clock_ghz),
        ("FP32 units per SM", row.cuda_cores_per_sm["float32"]),
        ("FP64 units per SM", row.cuda_cores_per_sm["float64"]),
        ("tensor cores per SM", row.tensor_cores_per_sm), ("memory (GB)", row.memory_gb),
        ("bandwidth (GB/s)", row.bandwidth_gb_s), ("L2 (MB)", row.l2_mb),
        ("L1 + shared per SM (KB)", row.l1_shared_kb),
    ]
    found = [{"metric": metric, "value": value, "peak": False} for metric, value in hardware]
    for precision in COMPARED_PRECISIONS:
        found.append({"metric": f"peak {precision}", "value": peak_tflops(row, precision), "peak": True})
    return found


def comparison(a: GPU, b: GPU) -> list[dict]:
    """Rows of 'metric', the value for ``a``, for ``b``, and the ratio b / a (None where either lacks it)."""
    return [{"metric": fa["metric"], "a": fa["value"], "b": fb["value"],
             "ratio": fb["value"] / fa["value"] if fa["value"] and fb["value"] else None}
            for fa, fb in zip(figures(a), figures(b), strict=True)]
