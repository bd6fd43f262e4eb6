"""Chapter 12's tables of what needs no GPU, and the sentences that sum them up: torch's switches and backends, the
descriptors, the talk's table read against a peak, the families checked and counted (:mod:`.measured` has the
tables of the cuDNN measurements); one function per thing the page shows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from gpulab.ch12_cudnn_convolution_algorithms import algorithms
from gpulab.ch12_cudnn_convolution_algorithms.backend import (
    backend_flags,
    conv_backend,
    conv_descriptors,
    describe_backend,
    tensor_descriptor,
)
from gpulab.core import specs
from gpulab.core.precision import matmul_mode
from gpulab.core.tables import Column, Table, table


def span(values: Sequence[float], fmt: str = ".2f", suffix: str = "x") -> str:
    return f"{min(values):{fmt}}{suffix} to {max(values):{fmt}}{suffix}" if values else "–"


# --- torch's switches, backends and descriptors -------------------------------------------------------------------

def flags_table() -> Table:
    return table(backend_flags(), [Column("flag", "switch"), Column("value", "value here"), Column("meaning")],
                 caption="the values on the machine that runs this notebook")


def tf32_switches_table() -> Table:
    """The two TF32 switches under the book's ``precision.matmul_mode``."""
    rows = []
    for mode in ("float32", "tf32"):
        with matmul_mode(mode):
            rows.append({"mode": f"matmul_mode('{mode}')", "cudnn": torch.backends.cudnn.allow_tf32,
                         "cuda": torch.backends.cuda.matmul.allow_tf32})
    return table(rows, [Column("mode", "inside"), Column("cudnn", "torch.backends.cudnn.allow_tf32"),
                        Column("cuda", "torch.backends.cuda.matmul.allow_tf32")])


def backends_table(device: torch.device) -> Table:
    """The backend torch's dispatcher picks for one convolution in several formats and layouts on ``device``."""
    x, weight = torch.randn(8, 64, 28, 28, device=device), torch.randn(64, 64, 3, 3, device=device)
    last = torch.channels_last
    cases = {"float32, NCHW": (x, weight),
             "float32, NHWC (channels_last)": (x.to(memory_format=last), weight.to(memory_format=last)),
             "float64, NCHW": (x.double(), weight.double()), "float16, NCHW": (x.half(), weight.half()),
             "bfloat16, NCHW": (x.bfloat16(), weight.bfloat16())}
    rows = []
    for label, (a, b) in cases.items():
        backend = conv_backend(a, b, padding=1)
        rows.append({"case": label, "backend": backend, "meaning": describe_backend(backend)})
    return table(rows, [Column("case", "data"), Column("backend"), Column("meaning", "what it is")],
                 caption=f"conv2d of an 8 x 64 x 28 x 28 input by 64 filters of 3 x 3, here ({device.type})")


def descriptors_table(inputs: Mapping[str, torch.Tensor], filters: torch.Tensor) -> Table:
    """For each input: torch's own tensor, then the descriptors torch hands cuDNN for a 3 x 3 convolution of it."""
    rows = []
    for label, x in inputs.items():
        for d in [tensor_descriptor(x, "torch's x"), *conv_descriptors(x, filters, stride=1, padding=1)[:3]]:
            rows.append({"input": label, **d, "sizes": str(d["sizes"]), "strides": str(d["strides"]),
                         "format": d["format"] + ("" if d["packed"] else ", with gaps")})
    return table(rows, [Column("input"), Column("tensor"), Column("sizes"), Column("strides"),
                        Column("data_type", "data type"), Column("format")])


def convolution_sentence(x: torch.Tensor, filters: torch.Tensor) -> str:
    d = conv_descriptors(x, filters, stride=1, padding=1)[3]
    return (f"The convolution's own descriptor: padding {d['padding']}, stride {d['stride']}, dilation "
            f"{d['dilation']}, `{d['mode']}`, compute type `{d['compute_type']}`.")


# --- the talk's table -----------------------------------------------------------------------------------------------

def talk_table() -> Table:
    """The talk's time and workspace of each forward algorithm, for both filters, and how the time grew."""
    rows: dict[str, dict] = {}
    for algorithm, r, ms, workspace in algorithms.TALK_TABLE:
        row = rows.setdefault(algorithm, {"algorithm": algorithm})
        row[f"ms{r}"], row[f"mb{r}"] = ms, workspace
    for row in rows.values():
        row["growth"] = row["ms11"] / row["ms3"] if row["ms11"] else None
    ms, mb = {"format": "g"}, {"format": "g"}
    return table(rows.values(), [Column("algorithm", "CUDNN_CONVOLUTION_FWD_ALGO_"),
                                 Column("ms3", "3 x 3", "ms", **ms), Column("mb3", "3 x 3 workspace", "MB", **mb),
                                 Column("ms11", "11 x 11", "ms", **ms),
                                 Column("mb11", "11 x 11 workspace", "MB", **mb),
                                 Column("growth", "11 x 11 / 3 x 3", format=lambda v: f"{v:.1f}x")],
                 caption=f"{algorithms.TALK_SETUP} (empty: unsupported); the direct method's arithmetic grows "
                         f"{121 / 9:.1f}x")


def peak_sentence() -> str:
    peak = specs.peak(specs.gpu(algorithms.TALK_GPU_ROW), "float32")
    return f"The GV100's float32 peak: {peak.formula()}."


def talk_readings_table(readings: Sequence[dict]) -> Table:
    """Per batch N the talk's table is read with: the rates its rows imply, the rows above the GV100's float32 peak,
    and the GEMM row's workspace against the im2col matrix of that batch."""
    rows = []
    for n in dict.fromkeys(r["batch"] for r in readings):
        timed = [r for r in readings if r["batch"] == n and r["milliseconds"] is not None]
        over = [r for r in timed if r["implied_tflops"] > r["peak_tflops"]]
        gemm = {r["filter"]: r for r in timed if r["algorithm"] == "GEMM"}
        rows.append({"n": n, "rates": span([r["implied_tflops"] for r in timed], ",.1f", ""),
                     "over": f"{len(over)} of {len(timed)}",
                     "which": ", ".join(sorted({r["algorithm"] for r in over})) or "none",
                     **{f"im2col{f}": f"{g['im2col_mib']:,.1f} MiB (talk: {g['workspace_mb']:g} MB)"
                        for f, g in gemm.items()}})
    return table(rows, [Column("n", "batch N"), Column("rates", "rates implied", "TFLOP/s"),
                        Column("over", "rows above the peak"), Column("which", "which"),
                        Column("im2col3", "GEMM 3 x 3: im2col matrix"),
                        Column("im2col11", "GEMM 11 x 11: im2col matrix")],
                 caption=f"against the GV100's float32 peak, {readings[0]['peak_tflops']:.1f} TFLOP/s")


def plausible_sentence(readings: Sequence[dict]) -> str:
    plausible = [n for n in dict.fromkeys(r["batch"] for r in readings)
                 if all(r["implied_tflops"] <= r["peak_tflops"] for r in readings
                        if r["batch"] == n and r["algorithm"] in ("GEMM", "IMPLICIT_GEMM") and r["implied_tflops"])]
    return f"Batches whose GEMM rows stay below the peak: {', '.join(map(str, plausible)) or 'none'}."


def workspace_model_table(readings: Sequence[dict], batch: int = 1) -> Table:
    """The talk's workspace of each algorithm beside the family's model (:func:`.algorithms.workspace_bytes`)."""
    rows = [{**r, "ratio": r["model_workspace_mib"] / r["workspace_mb"] if r["workspace_mb"] else None}
            for r in readings if r["batch"] == batch and r["workspace_mb"] is not None]
    return table(rows, [Column("algorithm"), Column("filter", "filter R = S"),
                        Column("workspace_mb", "talk", "MB", "g"),
                        Column("model_workspace_mib", "model", "MiB", ",.1f"),
                        Column("ratio", "model / talk", format=".2f")], caption=f"N = {batch}")


# --- the families, checked and counted --------------------------------------------------------------------------

def winograd_table() -> Table:
    """The matrices of Winograd's F(2 x 2, 3 x 3), a row of the table per row of a matrix."""
    rows = []
    for name, matrix in zip(("B^T (input transform)", "G (filter transform)", "A^T (output transform)"),
                            algorithms.winograd_matrices(), strict=True):
        for i, values in enumerate(matrix.tolist()):
            rows.append({"matrix": name if i == 0 else "", **{f"c{j}": v for j, v in enumerate(values)}})
    return table(rows, [Column("matrix"), *(Column(f"c{j}", f"column {j + 1}", format="g") for j in range(4))])


def check_table(checked: Sequence[dict], methods: Sequence[str]) -> Table:
    """The relative error of each family's implementation against float64, a row per case."""
    rows = {}
    for r in checked:
        rows.setdefault(r["name"], {"case": r["name"]})[r["method"]] = r["relative_error"]
    return table(rows.values(), [Column("case"), *(Column(m, format=".1e") for m in methods)],
                 caption=f"relative error against float64, data in {checked[0]['dtype']} (–: does not apply)")


def float32_sentence(checked: Sequence[dict]) -> str:
    errors = {r["method"]: r["relative_error"] for r in checked}
    base = errors["im2col + GEMM"]
    return (f"In float32, on {checked[0]['name']}: " + ", ".join(f"{m} {e:.2e}" for m, e in errors.items())
            + f". Winograd's error is {errors['Winograd F(2x2, 3x3)'] / base:.2f} times im2col + GEMM's, the FFT's "
            f"{errors['FFT'] / base:.2f} times.")


def crossover_table(counts: Sequence[dict]) -> Table:
    """Per batch: the smallest filter size at which each family needs fewer multiplies than the direct method."""
    methods = ("Winograd F(2x2)", "FFT", "FFT tiled")
    rows = [{"batch": n, **{m: algorithms.crossover(counts, m, n) for m in methods}}
            for n in dict.fromkeys(r["batch"] for r in counts)]
    size = {"format": lambda r: f"{r} x {r}"}
    return table(rows, [Column("batch", "batch N"), *(Column(m, **size) for m in methods)],
                 caption="the smallest filter with fewer multiplies than the direct method (–: none in the range)")


def per_output_table(counts: Sequence[dict], batch: int, filters: Sequence[int] = (3, 11)) -> Table:
    """Multiplies per output element of each family, for the ``filters`` that ``counts`` has."""
    counted = {c["filter"] for c in counts}
    rows = [{"filter": f"{r} x {r}", **{c["method"]: c["per_output"] for c in counts
                                       if c["batch"] == batch and c["filter"] == r}} for r in filters if r in counted]
    return table(rows, [Column("filter"), *(Column(m, format=",.0f") for m in algorithms.COUNTED)],
                 caption=f"multiplies per output element, N = {batch}")


def talk_measured_sentence() -> str:
    talk_ms = {(a, r): ms for a, r, ms, _ in algorithms.TALK_TABLE}
    return (f"The talk measured, for 3 x 3: FFT_TILING {talk_ms['FFT_TILING', 3]} ms against "
            f"IMPLICIT_PRECOMP_GEMM {talk_ms['IMPLICIT_PRECOMP_GEMM', 3]} ms.")
