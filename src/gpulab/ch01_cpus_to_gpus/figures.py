"""Chapter 01's figures and tables: the hardware table of :mod:`gpulab.core.specs` (two GPUs compared, the SMs of
three generations, every GPU's derived peaks), and the recorded runs of :mod:`.hardware` (each recorded GPU behind
a menu, or in the rows of a table)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import plotly.graph_objects as go

from gpulab.ch01_cpus_to_gpus import hardware
from gpulab.core import plots, specs
from gpulab.core.plots import PALETTE, PATTERNS
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows
from gpulab.core.tables import Column, Table, stacked, table


def gpu_comparison_figure(table: dict[str, list[dict]], a: str, b: str, *, title: str) -> go.Figure:
    """Two GPUs' peak rates side by side, as bars on a log scale; each GPU picked from its own menu.

    ``table`` maps a GPU's name to its rows of {'metric', 'value', 'peak'}; rows with ``peak`` True are drawn.
    Every GPU's bars are in the figure already, so the menus work on the static page with no kernel: menu A
    restyles the first trace, menu B the second. Hovering over a bar gives its value. (The chapter's table of
    the hardware lists every other figure of every GPU.)
    """
    def bars(name: str) -> tuple[list[str], list[float]]:
        shown = [r for r in table[name] if r["peak"] and r["value"] is not None]
        return [r["metric"].removeprefix("peak ") for r in shown], [r["value"] for r in shown]

    fig = go.Figure()
    for i, name in enumerate((a, b)):
        x, y = bars(name)
        fig.add_trace(go.Bar(x=x, y=y, name=name, marker_color=PALETTE[i], marker_pattern_shape=PATTERNS[i],
                             hovertemplate=f"{name}<br>%{{x}}: %{{y:,.4g}}<extra></extra>"))

    def menu(trace: int, letter: str, chosen: str, x: float) -> dict:
        buttons = []
        for name in table:
            xs, ys = bars(name)
            buttons.append(dict(label=f"{letter}: {name}", method="restyle", args=[
                {"x": [xs], "y": [ys], "name": [name],
                 "hovertemplate": [f"{name}<br>%{{x}}: %{{y:,.4g}}<extra></extra>"]}, [trace]]))
        return dict(buttons=buttons, active=list(table).index(chosen), x=x, xanchor="left", y=1.0, yanchor="bottom",
                    direction="down", pad=dict(b=6))

    fig.update_layout(title=dict(text=title, y=0.97, yanchor="top"), barmode="group", height=480,
                      updatemenus=[menu(0, "A", a, 0.0), menu(1, "B", b, 0.45)], margin=dict(t=110),
                      legend=dict(orientation="h", y=-0.25))
    fig.update_xaxes(title="number format")
    fig.update_yaxes(type="log", title="dense peak (TFLOP/s; TOPS for int8)")
    return fig


# ---- the hardware table ------------------------------------------------------------------------------------------

def cpu_gpu_table(cpu: specs.CPU, gpu: specs.GPU) -> Table:
    """The course's CPU against GPU: cores, threads in flight, clock, memory bandwidth and the derived FP32 peak."""
    rows = [{"chip": cpu.name, "cores": cpu.cores, "threads": cpu.threads, "clock": cpu.base_clock_ghz,
             "bandwidth": cpu.bandwidth_gb_s, "peak": cpu.peak_tflops},
            {"chip": f"NVIDIA {gpu.name}", "cores": gpu.cuda_cores, "threads": gpu.sms * gpu.max_threads_per_sm,
             "clock": gpu.boost_clock_ghz, "bandwidth": gpu.bandwidth_gb_s,
             "peak": specs.peak(gpu, "float32").tflops}]
    return table(rows, [Column("chip"), Column("cores", "cores (GPU: FP32 units)"),
                        Column("threads", "threads in flight"), Column("clock", "clock", "GHz", "g"),
                        Column("bandwidth", "memory bandwidth", "GB/s", ",.0f"),
                        Column("peak", "peak FP32", "TFLOP/s", ",.1f")])


def cpu_gpu_peaks(cpu: specs.CPU, gpu: specs.GPU) -> list[str]:
    """How each peak of :func:`cpu_gpu_table` follows from the hardware, and the GPU's factors over the CPU."""
    fp32 = specs.peak(gpu, "float32")
    tensor = "; ".join(f"{precision}: {specs.peak(gpu, precision).formula()}"
                       for precision in ("float16/acc16", "float16"))
    threads = gpu.sms * gpu.max_threads_per_sm
    return [f"CPU: {cpu.cores} cores x {cpu.base_clock_ghz} GHz x {cpu.fp32_flop_per_cycle} FLOP/cycle = "
            f"{cpu.peak_tflops:.2f} TFLOP/s (all cores at the base clock).",
            f"GPU: {fp32.formula()}. Its tensor cores, {tensor}.",
            f"The GPU has {fp32.tflops / cpu.peak_tflops:.0f}x the arithmetic, "
            f"{gpu.bandwidth_gb_s / cpu.bandwidth_gb_s:.0f}x the memory bandwidth and "
            f"{threads / cpu.threads:,.0f}x the threads in flight."]


SM_FIGURES = (  # (row of the table, unit, the value of a GPU)
    ("architecture", "", lambda g: g.architecture),
    ("FP32 units per SM", "", lambda g: g.cuda_cores_per_sm["float32"]),
    ("FP64 units per SM", "", lambda g: g.cuda_cores_per_sm["float64"]),
    ("INT32 units per SM", "", lambda g: g.cuda_cores_per_sm["int32"]),
    ("tensor cores per SM", "", lambda g: g.tensor_cores_per_sm),
    ("FP16 FMA per clock per tensor core", "", lambda g: g.tensor_fma_per_clock["float16"]),
    ("FP16 FMA per clock per SM", "", lambda g: g.fma_per_clock_per_sm("float16", specs.TENSOR_CORES)),
    ("register file per SM", "KB", lambda g: g.register_file_kb),
    ("L1 + shared memory per SM", "KB", lambda g: g.l1_shared_kb),
    ("resident threads per SM", "", lambda g: g.max_threads_per_sm),
    ("SMs", "", lambda g: g.sms),
    ("L2 cache", "MB", lambda g: g.l2_mb),
    ("memory bandwidth", "GB/s", lambda g: g.bandwidth_gb_s),
)


def sm_generations_table(names: Sequence[str]) -> Table:
    """The SMs of the GPUs called ``names`` (rows of :mod:`gpulab.core.specs`), a column each, a row per figure."""
    gpus = [specs.gpu(name) for name in names]
    rows = [{"figure": f"{label} ({unit})" if unit else label, **{g.name: value(g) for g in gpus}}
            for label, unit, value in SM_FIGURES]
    return table(rows, [Column("figure", "hardware figure"), *(Column(g.name, format=",.4g") for g in gpus)])


def tensor_core_peaks_table(names: Sequence[str], precision: str = "float16") -> Table:
    """The tensor-core peak of each GPU called ``names`` as the product of its hardware figures."""
    rows = []
    for name in names:
        row, peak = specs.gpu(name), specs.peak(specs.gpu(name), precision, specs.TENSOR_CORES)
        rows.append({"gpu": name, "cores": row.tensor_cores_per_sm, "fma": row.tensor_fma_per_clock[precision],
                     "per_sm": peak.fma_per_clock_per_sm, "flop": 2 * peak.fma_per_clock_per_sm,
                     "formula": peak.formula()})
    return table(rows, [Column("gpu", "GPU"), Column("cores", "tensor cores per SM"),
                        Column("fma", "FMA per clock per tensor core"), Column("per_sm", "FMA per clock per SM"),
                        Column("flop", "FLOP per clock per SM"), Column("formula", f"{precision} peak")])


def peaks_table(precisions: Sequence[str] = specs.COMPARED_PRECISIONS) -> Table:
    """Every GPU of :mod:`gpulab.core.specs` with its derived dense peaks (a dash: no unit for that format)."""
    rows = [{"gpu": row.name, "arch": row.architecture, "sms": row.sms, "clock": row.boost_clock_ghz,
             **{p: specs.peak_tflops(row, p) for p in precisions}, "bandwidth": row.bandwidth_gb_s}
            for row in specs.GPUS.values()]
    return table(rows, [Column("gpu", "GPU"), Column("arch", "architecture"), Column("sms", "SMs"),
                        Column("clock", "boost clock", "GHz", "g"),
                        *(Column(p, p, "TOPS" if p.startswith("int") else "TFLOP/s", ",.1f") for p in precisions),
                        Column("bandwidth", "bandwidth", "GB/s", ",.0f")],
                 caption="dense peaks, derived from the hardware")


# ---- measured against the peaks ------------------------------------------------------------------------------

def recorded_formulas_table(runs: Sequence[Recording]) -> Table:
    """Per GPU and number format: the unit the peak is on and how it follows from the hardware."""
    return stacked(runs, [Column("dtype", "number format"), Column("unit_kind", "on its"),
                          Column("formula", "peak from the hardware")], where=lambda r: bool(r.get("formula")))


def peaks_figure(runs: Sequence[Recording]) -> go.Figure:
    """Per GPU: each format's matmul against its peak at the rated clock and at the clock it ran at."""
    def figure(run: Recording) -> go.Figure:
        matmuls = [r for r in run.rows if r["work"] != "copy" and r["status"] == "ok" and r.get("peak")]
        return plots.bars_figure(
            matmuls, "dtype", {"peak at the rated clock": "peak", "peak at the measured clock": "peak_at_clock",
                               "measured (sustained)": "sustained"},
            title=f"Matrix multiply against its peak: {run.label}", x_title="number format",
            y_title="TFLOP/s (log scale)", log_y=True, hover=("dtype", "n", "clock_mhz", "power_w", "temperature_c"))
    return plots.by_gpu(runs, figure)


def measured_table(runs: Sequence[Recording]) -> Table:
    """Per GPU: each matmul and the copy, measured against the peak, and the sustained run's clock and power."""
    rows = [{**r, "gpu": run.short_label, "work": r["work"] if r["status"] == "ok" else f"{r['work']} ({r['status']})"}
            for run in runs for r in run.rows]
    return table(rows, [Column("gpu", "GPU"), Column("work"), Column("measured", format=",.1f"), Column("unit"),
                        Column("peak", format=",.1f"), Column("fraction", "of the peak", format=".0%"),
                        Column("sustained", "sustained", "TFLOP/s", ",.1f"),
                        Column("clock_mhz", "SM clock", "MHz", ",.0f"), Column("power_w", "power", "W", ",.0f"),
                        Column("fraction_at_clock", "sustained, of the peak at that clock", format=".0%")])


# ---- the memory hierarchy -------------------------------------------------------------------------------------

def hierarchy_figure(runs: Sequence[Recording]) -> go.Figure:
    """Per GPU: copy bandwidth against the working set, hot and cold, with its L2 and datasheet bandwidth."""
    def figure(run: Recording) -> go.Figure:
        rows = [{**r, "working_set": 2 * r["nbytes"]} for r in run.rows]
        fig = plots.sweep_figure(rows, "working_set", "gbytes_per_s", color="cache", log_x=True,
                                 title=f"Copy bandwidth against working set: {run.label}",
                                 x_title="source + target (bytes)", y_title="GB/s (read + written)",
                                 hover=("nbytes", "seconds_per_copy", "copies", "gbytes_per_s"))
        row = specs.find(run.device_name)
        if row is not None:
            plots.vertical_marker(fig, row.l2_mb * 1e6, f"L2 = {row.l2_mb:g} MB")
            fig.add_hline(y=row.bandwidth_gb_s, line_dash="dash",
                          annotation_text=f"datasheet {row.memory_type}: {row.bandwidth_gb_s:,.0f} GB/s")
        return fig
    return plots.by_gpu(runs, figure)


def host_copies_figure(runs: Sequence[Recording]) -> go.Figure:
    """Per GPU: host-device copy bandwidth against size, both directions, pinned and pageable, with PCIe's rate."""
    def figure(run: Recording) -> go.Figure:
        rows = [{**r, "copy": f"{r['direction']}, {r['memory']}"} for r in run.rows]
        fig = plots.sweep_figure(rows, "nbytes", "gbytes_per_s", color="copy", log_x=True,
                                 title=f"Host-device copies: {run.label}", x_title="bytes copied", y_title="GB/s",
                                 hover=("direction", "memory", "nbytes", "seconds", "gbytes_per_s"))
        row = specs.find(run.device_name)
        if row is not None:
            fig.add_hline(y=row.pcie_gb_s, line_dash="dash", annotation_text=(
                f"PCIe {row.pcie_generation}.0 x16: {row.pcie_gb_s:.0f} GB/s per direction"))
        return fig
    return plots.by_gpu(runs, figure)


def _best(rows: Iterable[dict], **match) -> dict | None:
    good = [r for r in ok_rows(rows) if all(r.get(k) == v for k, v in match.items())]
    return max(good, key=lambda r: r["gbytes_per_s"]) if good else None


def _relative(value: float) -> str:
    if value == 1:
        return "the reference"
    return f"{value:.2f}x faster" if value > 1 else f"{1 / value:,.0f}x slower"


def levels_table(hierarchy: Sequence[Recording], transfers: Sequence[Recording]) -> Table:
    """Per GPU: each level at its best measured size (cache, device memory, the host both ways, pinned and
    pageable), and how it compares with device memory (the best cold copy)."""
    host = {run.device_name: run for run in transfers}
    rows = []
    for run in hierarchy:
        cold = _best(run.rows, cache="cold")
        levels = [("cache (hot copies)", _best(run.rows, cache="hot")), ("device memory (cold copies)", cold)]
        if run.device_name in host:
            levels += [(f"host {direction}, {memory}", _best(host[run.device_name].rows, direction=direction,
                                                              memory=memory))
                       for direction in ("h2d", "d2h") for memory in ("pinned", "pageable")]
        rows += [{"gpu": run.short_label, "level": name, "rate": best["gbytes_per_s"], "at": best["nbytes"],
                  "relative": best["gbytes_per_s"] / cold["gbytes_per_s"]}
                 for name, best in levels if best is not None and cold is not None]
    return table(rows, [Column("gpu", "GPU"), Column("level"), Column("rate", "best bandwidth", "GB/s", ",.0f"),
                        Column("at", "at a copy of", "bytes", ",d"),
                        Column("relative", "against device memory", format=_relative)])


# ---- Little's law -----------------------------------------------------------------------------------------------

def _fit(run: Recording) -> dict | None:
    """The latency fit of a run's cold copies, or None where the timings give no positive latency or bandwidth."""
    try:
        fit = hardware.latency_fit(run.rows)
    except ValueError:
        return None
    return fit if fit["t0_s"] > 0 and fit["bandwidth"] > 0 else None


def latency_figure(runs: Sequence[Recording]) -> go.Figure:
    """Per GPU: the cold copies' bandwidth against the bytes moved, with the fitted t0 + m / B and B t0 marked."""
    def figure(run: Recording) -> go.Figure:
        cold = [{**r, "moved": 2 * r["nbytes"]} for r in run.rows if r["cache"] == "cold"]
        fig = plots.sweep_figure(cold, "moved", "gbytes_per_s", name="measured (cold)", log_x=True,
                                 title=f"Latency hiding: cold copies and the fitted model, {run.label}",
                                 x_title="bytes moved per copy (read + written)", y_title="GB/s",
                                 hover=("nbytes", "seconds_per_copy", "gbytes_per_s"))
        fit = _fit(run)
        if fit is None:
            return fig
        model = [{"moved": r["moved"], "gbytes_per_s": r["moved"] / (fit["t0_s"] + r["moved"] / fit["bandwidth"])
                  / 1e9} for r in cold]
        plots.add_sweep(fig, model, "moved", "gbytes_per_s", name="t0 + m / B", dash="dash")
        return plots.vertical_marker(fig, fit["bytes_in_flight"],
                                     f"B t0 = {fit['bytes_in_flight'] / 2**20:.1f} MiB: half of B")
    return plots.by_gpu(runs, figure)


def latency_table(runs: Sequence[Recording]) -> Table:
    """Per GPU: the fitted t0 and B, the bytes B t0 that must be in flight, and those bytes per resident thread."""
    rows = []
    for run in runs:
        fit, row = _fit(run), specs.find(run.device_name)
        resident = row.sms * row.max_threads_per_sm if row else None
        rows.append({"gpu": run.short_label, "t0": fit["t0_s"] * 1e6 if fit else None,
                     "bandwidth": fit["bandwidth"] / 1e9 if fit else None,
                     "in_flight": fit["bytes_in_flight"] / 2**20 if fit else None, "resident": resident,
                     "per_thread": fit["bytes_in_flight"] / resident if fit and resident else None})
    return table(rows, [Column("gpu", "GPU"), Column("t0", "t0", "µs", ",.2f"),
                        Column("bandwidth", "B", "GB/s", ",.0f"),
                        Column("in_flight", "B t0 in flight", "MiB", ",.2f"),
                        Column("resident", "resident threads (SMs x threads per SM)", format=",d"),
                        Column("per_thread", "B t0 per thread", "bytes", ",.0f")],
                 caption="t0 + m / B fitted to the cold copies (a dash: the timings give no positive t0)")
