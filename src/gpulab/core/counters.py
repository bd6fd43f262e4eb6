"""Rooflines from hardware counters: what Nsight Compute (``ncu``) measured of one kernel launch.

:func:`ncu_command` builds the command line that profiles one kernel of a Python program and writes ncu's
``--csv`` output; :func:`parse_csv` turns that text into one row per kernel launch (time, FLOPs, DRAM and L2
bytes, SM and memory throughput, warp stall reasons); :func:`counter_point` makes a row a point for
:func:`gpulab.core.plots.roofline_figure` and :func:`compare_counts` sets it against the book's own counts
(:mod:`gpulab.core.flops`).

The metric names in :data:`METRICS`, and where each comes from:

- documented in the Nsight Compute Kernel Profiling Guide (metrics reference, roofline and "Speed Of Light"
  sections): ``gpu__time_duration.sum``, ``dram__bytes_read.sum``, ``dram__bytes_write.sum``,
  ``lts__t_bytes.sum``, ``sm__throughput.avg.pct_of_peak_sustained_elapsed``,
  ``gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed`` and the SASS instruction counters
  ``sm__sass_thread_inst_executed_op_{ffma,fadd,fmul,dfma,dadd,dmul,hfma,hadd,hmul}_pred_on.sum`` that ncu's
  own roofline charts use (an FMA counts 2 FLOP: ``derived__sm__sass_thread_inst_executed_op_ffma_pred_on_x2``);
  ``sm__inst_executed_pipe_tensor_op_hmma.sum`` (warp-level tensor-core instructions; NVIDIA's blog on
  profiling mixed precision with Nsight Compute);
- listed by ``ncu --query-metrics`` (Nsight Compute 2025.3.1 on an H100, 2026-11-25), not in the guide's text:
  ``sm__ops_path_tensor_src_fp16.sum`` (any accumulator), ``..._src_bf16_dst_fp32.sum``,
  ``..._src_tf32_dst_fp32.sum``, ``..._src_fp8.sum`` and ``..._src_fp64.sum``, "math ops executed in Tensor
  path". On that H100, cuBLAS's TF32 GEMM of 4096^3 (an HGMMA kernel) gave exactly 2 M N K: one op is one FLOP,
  and Hopper's GMMA (``wgmma``) instructions are counted. ``sm__inst_executed_pipe_tensor_op_gmma.sum`` is listed
  too, beside ``..._op_hmma.sum``. (Names with ``_src_fp16_dst_fp32`` that earlier notes gave exist only per
  instruction kind, ``sm__ops_path_tensor_op_hmma_src_fp16_dst_fp32``: ncu reports an unknown name as n/a.)

Warp stalls: the counter-based family ``smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio``
(cycles a warp spends stalled for ``<reason>`` per issued instruction) is what ncu's WarpStateStats section and
its CPIStall* rules read, so it needs no sampling. The Profiling Guide's "Warp Stall Reasons" table documents the
sampled family ``smsp__pcsamp_warps_issue_stalled_<reason>`` (sample counts, collected by warp sampling).
:func:`parse_csv` accepts any metric with ``issue_stalled_<reason>`` in its name, so either family parses.

Caveats a page must state: ncu locks the clocks to base and flushes the caches before each replayed pass
(``--clock-control base``, ``--cache-control all``), so its times are slower than the book's timings and its DRAM
bytes are cold-cache bytes; packed half-precision instructions (HFMA2) do two operations per thread and the
FP16 SASS counters count instructions, so CUDA-core FP16 FLOPs may be undercounted by up to 2x.
"""

from __future__ import annotations

import csv
import io
import re
import sys
from collections.abc import Sequence
from pathlib import Path

TIME = "gpu__time_duration.sum"
DRAM_READ = "dram__bytes_read.sum"
DRAM_WRITE = "dram__bytes_write.sum"
L2 = "lts__t_bytes.sum"
SM_THROUGHPUT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEMORY_THROUGHPUT = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
HMMA_INST = "sm__inst_executed_pipe_tensor_op_hmma.sum"
GMMA_INST = "sm__inst_executed_pipe_tensor_op_gmma.sum"  # listed by ncu 2025.3.1 on the H100


def _sass(op: str) -> str:
    return f"sm__sass_thread_inst_executed_op_{op}_pred_on.sum"


# precision -> {metric: FLOP per counted thread instruction}
SASS_FLOPS: dict[str, dict[str, int]] = {
    "fp32": {_sass("ffma"): 2, _sass("fadd"): 1, _sass("fmul"): 1},
    "fp64": {_sass("dfma"): 2, _sass("dadd"): 1, _sass("dmul"): 1},
    "fp16": {_sass("hfma"): 2, _sass("hadd"): 1, _sass("hmul"): 1},
}
# tensor-core operations, counted as FLOP (confirm on the GPU: a GEMM of M x N x K should read 2 M N K)
TENSOR_OPS = tuple(f"sm__ops_path_tensor_src_{src}.sum"
                   for src in ("fp16", "bf16_dst_fp32", "tf32_dst_fp32", "fp8", "fp64"))
STALL_REASONS = ("barrier", "branch_resolving", "dispatch_stall", "drain", "gmma", "imc_miss", "lg_throttle",
                 "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction",
                 "not_selected", "selected", "short_scoreboard", "sleeping", "tex_throttle", "wait")
STALLS = tuple(f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in STALL_REASONS)

METRICS: tuple[str, ...] = (
    TIME, DRAM_READ, DRAM_WRITE, L2, SM_THROUGHPUT, MEMORY_THROUGHPUT, HMMA_INST, GMMA_INST,
    *(m for group in SASS_FLOPS.values() for m in group), *TENSOR_OPS, *STALLS,
)
REQUIRED = (TIME, DRAM_READ, DRAM_WRITE)  # a launch without these cannot be placed under the roofline
TOLERANCE = 0.10  # the target: counter counts within 10% of the book's

_METRIC_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*$")
_STALL = re.compile(r"issue_stalled_([a-z_]+?)(?:_per_issue_active)?(?:\.|$)")

# ncu's units (older releases spell them out: "nsecond", "Kbyte"; newer ones print "ns", "KB"); SI prefixes
_TIME_UNITS = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3,
               "second": 1.0, "s": 1.0}
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_SCALED = re.compile(r"^([KMGT]?)(byte|B|inst|warp|cycle|sector|request|op)$")


def _check_metrics(metrics: object) -> list[str]:
    if isinstance(metrics, str) or not isinstance(metrics, Sequence) or not metrics:
        raise ValueError(f"metrics: need a non-empty sequence of ncu metric names, got {metrics!r}")
    bad = [m for m in metrics if not isinstance(m, str) or not _METRIC_NAME.match(m)]
    if bad:
        raise ValueError(f"metrics: not ncu metric names (lower case, dots between parts): {bad}")
    return list(metrics)


def _check_count(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name}: need an integer >= {least}, got {value!r}")
    return value


def ncu_command(python_args: Sequence[str], kernel_regex: str, metrics: Sequence[str] = METRICS,
                launch_skip: int = 0, launch_count: int | None = 1, output_csv: str | Path | None = None,
                *, python: str = sys.executable, ncu: str = "ncu", profile_from_start: bool = True) -> list[str]:
    """The command line that profiles launches of the kernels matching ``kernel_regex`` in ``python python_args``.

    ncu skips the first ``launch_skip`` matching launches (the warm-up, Triton's autotuning) and profiles the
    next ``launch_count`` (None: every one after them; then ``--launch-skip 0`` and ``--launch-count`` are left
    out of the command). The output is ncu's default ``--csv`` page, "details": one line per (launch, metric),
    which :func:`parse_csv` reads. With ``output_csv`` ncu writes it to that file (``--log-file``) instead of
    mixing it with the program's own output on stdout.

    With ``profile_from_start=False`` (``--profile-from-start off``) ncu profiles only the matching launches the
    program makes between its calls of ``cudaProfilerStart`` and ``cudaProfilerStop``
    (``torch.cuda.profiler.start()`` and ``stop()``), in as many such ranges as it opens.
    """
    if isinstance(python_args, str) or not isinstance(python_args, Sequence) or not python_args:
        raise ValueError(f"python_args: need a non-empty list of arguments (a script or -m module...), "
                         f"got {python_args!r}")
    if not all(isinstance(a, str) and a for a in python_args):
        raise ValueError(f"python_args: every argument must be a non-empty string, got {python_args!r}")
    if not isinstance(kernel_regex, str) or not kernel_regex.strip():
        raise ValueError(f"kernel_regex: need a non-empty regular expression, got {kernel_regex!r}")
    try:
        re.compile(kernel_regex)
    except re.error as error:
        raise ValueError(f"kernel_regex: not a regular expression ({error}): {kernel_regex!r}") from None
    metrics = _check_metrics(metrics)
    launch_skip = _check_count("launch_skip", launch_skip, 0)
    if launch_count is not None:
        launch_count = _check_count("launch_count", launch_count, 1)
    if not isinstance(profile_from_start, bool):
        raise ValueError(f"profile_from_start: True or False, got {profile_from_start!r}")
    command = [ncu, "--csv", *([] if profile_from_start else ["--profile-from-start", "off"]),
               "--metrics", ",".join(metrics), "--kernel-name", f"regex:{kernel_regex}"]
    if launch_skip or launch_count is not None:
        command += ["--launch-skip", str(launch_skip)]
    if launch_count is not None:
        command += ["--launch-count", str(launch_count)]
    if output_csv is not None:
        if not str(output_csv).strip():
            raise ValueError("output_csv: need a file name or None")
        command += ["--log-file", str(output_csv)]
    return [*command, python, *python_args]


def to_number(value: str, unit: str = "") -> float | None:
    """``value`` (ncu's text: '1,215,000.50', 'n/a') in base units: seconds, bytes, counts; None for 'n/a'."""
    text = value.strip().replace(",", "")
    if text in ("", "n/a", "N/A"):
        return None
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"value: not a number: {value!r}") from None
    unit = unit.strip()
    if unit in _TIME_UNITS:
        return number * _TIME_UNITS[unit]
    scaled = _SCALED.match(unit)
    return number * _PREFIX[scaled.group(1)] if scaled else number


def _lines(text: str) -> list[str]:
    """The CSV part of ncu's output: from the header line on, without ncu's '==PROF==' and the program's lines."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith('"ID",'):
            return [x for x in lines[i:] if x.startswith('"')]
    raise ValueError('text: no ncu CSV header (a line starting with "ID",) found; was ncu run with --csv?')


def _details(records: list[dict]) -> list[tuple[str, str, dict[str, float | None]]]:
    """(id, kernel name, {metric: value}) per launch of the "details" page."""
    for column in ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value"):
        if column not in records[0]:
            raise ValueError(f"text: the CSV has no {column!r} column; columns: {', '.join(records[0])}")
    launches: dict[str, tuple[str, dict]] = {}
    for number, record in enumerate(records, start=2):
        if None in record.values() or None in record:
            raise ValueError(f"text: line {number} has a different number of fields than the header")
        launch = launches.setdefault(record["ID"], (record["Kernel Name"], {}))
        try:
            launch[1][record["Metric Name"]] = to_number(record["Metric Value"], record["Metric Unit"])
        except ValueError as error:
            raise ValueError(f"text: line {number}, metric {record['Metric Name']}: {error}") from None
    return [(key, name, values) for key, (name, values) in launches.items()]


def _raw(records: list[dict]) -> list[tuple[str, str, dict[str, float | None]]]:
    """(id, kernel name, {metric: value}) per launch of the "raw" page (``--page raw``): a units row first."""
    if "Kernel Name" not in records[0]:
        raise ValueError(f"text: the CSV has no 'Kernel Name' column; columns: {', '.join(records[0])}")
    units, launches = records[0], []
    metric_columns = [c for c in units if c and _METRIC_NAME.match(c)]
    for number, record in enumerate(records[1:], start=3):
        if None in record.values() or None in record:
            raise ValueError(f"text: line {number} has a different number of fields than the header")
        try:
            values = {c: to_number(record[c], units[c] or "") for c in metric_columns}
        except ValueError as error:
            raise ValueError(f"text: line {number}: {error}") from None
        launches.append((record["ID"], record["Kernel Name"], values))
    return launches


def parse_csv(text: str) -> list[dict]:
    """One row per kernel launch of ncu's ``--csv`` output ``text``, in the order ncu profiled them.

    Reads the default "details" page that :func:`ncu_command` asks for (columns ..., "Kernel Name", ...,
    "Metric Name", "Metric Unit", "Metric Value"; one line per launch and metric), and also the "raw" page
    (``--page raw``: one line per launch, one column per metric, a units line under the header). Lines before
    the header (``==PROF==`` messages, the program's output) are skipped. Values are converted to seconds,
    bytes and plain counts; a value ncu could not collect ('n/a') or a metric not asked for is left out of the
    totals and named in the row's 'missing'. Raises ValueError naming what is missing from malformed text.
    """
    if not isinstance(text, str):
        raise ValueError(f"text: need ncu's CSV output as a string, got {type(text).__name__}")
    lines = _lines(text)
    records = list(csv.DictReader(io.StringIO("\n".join(lines))))
    if not records:
        raise ValueError("text: the ncu CSV has a header but no kernel launches")
    launches = _details(records) if "Metric Name" in records[0] else _raw(records)
    return [_row(key, name, values) for key, name, values in launches]


def _row(key: str, kernel: str, values: dict[str, float | None]) -> dict:
    lacking = [m for m in REQUIRED if values.get(m) is None]
    if lacking:
        raise ValueError(f"text: kernel launch {key} ({kernel}) lacks {', '.join(lacking)}")
    missing = [m for m in METRICS if values.get(m) is None]
    by_precision = {p: sum(values[m] * k for m, k in group.items() if values.get(m) is not None)
                    for p, group in SASS_FLOPS.items()}
    by_precision["tensor"] = sum(values[m] for m in TENSOR_OPS if values.get(m) is not None)
    stalls = {}
    for metric, value in values.items():
        found = _STALL.search(metric)
        if found and value is not None:
            stalls[found.group(1)] = value
    return {
        "id": int(key) if key.isdigit() else key,
        "kernel": kernel,
        "seconds": values[TIME],
        "flops": sum(by_precision.values()),
        "flops_by_precision": by_precision,
        "dram_read_bytes": values[DRAM_READ],
        "dram_write_bytes": values[DRAM_WRITE],
        "dram_bytes": values[DRAM_READ] + values[DRAM_WRITE],
        "l2_bytes": values.get(L2),
        "sm_throughput_pct": values.get(SM_THROUGHPUT),
        "memory_throughput_pct": values.get(MEMORY_THROUGHPUT),
        "tensor_instructions": {"hmma": values.get(HMMA_INST), "gmma": values.get(GMMA_INST)},
        "stalls": stalls,
        "top_stalls": top_stalls(stalls),
        "missing": missing,
    }


def top_stalls(stalls: dict[str, float], count: int = 3) -> list[tuple[str, float]]:
    """The ``count`` largest stall reasons, largest first ('selected' is issuing, not a stall: left out)."""
    ranked = sorted(((r, v) for r, v in stalls.items() if r != "selected" and v > 0), key=lambda rv: -rv[1])
    return ranked[:count]


def counter_point(row: dict) -> dict:
    """A parsed launch as a point of :func:`gpulab.core.plots.roofline_figure`: achieved FLOP/s and the
    arithmetic intensity against DRAM bytes ('intensity') and against L2 bytes ('intensity_l2')."""
    for key in ("kernel", "seconds", "flops", "dram_bytes"):
        if key not in row:
            raise ValueError(f"row: no {key!r}; pass a row of parse_csv")
    if not row["seconds"] or row["seconds"] <= 0:
        raise ValueError(f"row: the time must be > 0, got {row['seconds']}")
    rate = row["flops"] / row["seconds"]
    l2 = row.get("l2_bytes")
    return {
        "op": row["kernel"],
        "seconds": row["seconds"],
        "flops": row["flops"],
        "flops_per_s": rate,
        "gflops": rate / 1e9,
        "intensity": row["flops"] / row["dram_bytes"] if row["dram_bytes"] > 0 else float("inf"),
        "intensity_l2": (row["flops"] / l2 if l2 else None),
    }


def compare_counts(row: dict, book_flops: float, book_bytes: float, tolerance: float = TOLERANCE) -> dict:
    """How the counters' FLOPs and DRAM bytes compare with the book's counts (:mod:`gpulab.core.flops`).

    The ratios are counter / book; each is within ``tolerance`` when ``|ratio - 1| <= tolerance``. Bytes above
    the book's are the kernel's re-reads (the book counts the fewest bytes that must move); below them, caches
    that kept data across ncu's replay or operands smaller than the book assumed.
    """
    for name, value in (("book_flops", book_flops), ("book_bytes", book_bytes)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name}: must be a number > 0, got {value!r}")
    if not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
        raise ValueError(f"tolerance: must be in [0, 1), got {tolerance!r}")
    flops_ratio, bytes_ratio = row["flops"] / book_flops, row["dram_bytes"] / book_bytes
    return {
        "kernel": row.get("kernel", ""),
        "flops_ratio": flops_ratio,
        "bytes_ratio": bytes_ratio,
        "flops_within": abs(flops_ratio - 1) <= tolerance + 1e-12,
        "bytes_within": abs(bytes_ratio - 1) <= tolerance + 1e-12,
    }
