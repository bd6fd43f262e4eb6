"""Chapter 08's figures and tables: one function per thing the page shows, drawn from runs of
:mod:`.memory` (each recorded GPU behind a menu, a column per GPU in the tables)."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gpulab.ch01_cpus_to_gpus import hardware
from gpulab.ch08_memory_hierarchy import memory
from gpulab.core import occupancy, plots, specs
from gpulab.core.printing import format_bytes
from gpulab.core.recordings import Recording
from gpulab.core.tables import Column, Table, by_gpu, table
from gpulab.kernels import cuda_c

TRANSPOSE_TARGET = 0.8  # the padded transpose should reach 80% of the device copy's bandwidth
ELEMENTS = {"float16 (2 B)": 2, "float32 (4 B)": 4, "float64 (8 B)": 8}


def sizes_figure(runs: Sequence[Recording]) -> go.Figure:
    def figure(run: Recording) -> go.Figure:
        mib = [{**row, "per SM": (row["per_sm_bytes"] or 0) / 2**20 or None, "whole GPU": row["total_bytes"] / 2**20}
               for row in run.rows if row["total_bytes"]]
        return plots.bars_figure(mib, "space", {"per SM": "per SM", "whole GPU": "whole GPU"}, log_y=True,
                                 title=f"How much of each memory space: {run.label}", x_title="memory space",
                                 y_title="MiB (log scale)")
    return plots.by_gpu(runs, figure)


def sizes_table(runs: Sequence[Recording]) -> Table:
    bytes_column = Column("total_bytes", "whole GPU", format=lambda b: format_bytes(int(b)))
    return by_gpu(runs, Column("space", "memory space"), bytes_column)


def register_file_and_l2(runs: Sequence[Recording]) -> Table:
    """Per GPU: all register files against the L2, and global memory in L2s."""
    rows = []
    for run in runs:
        by_space = {row["space"]: row["total_bytes"] for row in run.rows}
        rows.append({"gpu": run.short_label, "registers": by_space["registers"], "l2": by_space["L2 cache"],
                     "ratio": by_space["registers"] / by_space["L2 cache"],
                     "global_in_l2s": by_space["global memory"] / by_space["L2 cache"]})
    size = {"format": lambda b: format_bytes(int(b))}
    return table(rows, [Column("gpu", "GPU"), Column("registers", "all register files", **size),
                        Column("l2", "L2 cache", **size), Column("ratio", "registers / L2", format=".2f"),
                        Column("global_in_l2s", "global memory / L2", format=",.0f")])


def kernel_resources(files: Sequence[str]) -> Table:
    """What the assembler reports for each kernel of ``files`` (NVRTC, for Hopper unless a GPU says otherwise)."""
    rows = []
    for file in files:
        report = cuda_c.compile_report(file)
        rows += [{"file": file, "kernel": r.kernel, "registers": r.registers, "shared": r.shared_bytes,
                  "stack": r.stack_bytes, "spills": r.spill_stores_bytes + r.spill_loads_bytes}
                 for r in report.resources.values()]
    return table(rows, [Column("file"), Column("kernel"), Column("registers", "registers per thread"),
                        Column("shared", "shared memory per block", "B"), Column("stack", "stack", "B"),
                        Column("spills", "spills", "B")], caption=f"compiled for {report.arch}")


def _best_rate(rows: Sequence[dict], direction: str, memory_kind: str) -> float:
    """The best bandwidth (bytes/s) of host-device copies of one direction and one kind of host memory."""
    return 1e9 * max(r["gbytes_per_s"] for r in rows
                     if r["status"] == "ok" and r["direction"] == direction and r["memory"] == memory_kind)


def saxpy_over_pcie(transfers: Sequence[Recording], peaks: Sequence[Recording], n: int = 2**28) -> Table:
    """Per GPU and kind of host memory: the copies' rates against device memory, and SAXPY on ``n`` floats on the
    GPU against copying x and y in and y out (8n bytes in, 4n out)."""
    copy = {run.device_name: 1e9 * next(r["measured"] for r in run.rows if r["work"] == "copy") for run in peaks}
    rows = []
    for run in transfers:
        if run.device_name not in copy:
            continue
        device = copy[run.device_name]
        on_device = 12 * n / device
        for kind in ("pinned", "pageable"):
            h2d, d2h = _best_rate(run.rows, "h2d", kind), _best_rate(run.rows, "d2h", kind)
            over_pcie = 8 * n / h2d + 4 * n / d2h
            rows.append({"gpu": run.short_label, "memory": kind, "h2d": h2d / 1e9, "d2h": d2h / 1e9,
                         "slower": device / h2d, "kernel": on_device, "copies": over_pcie,
                         "ratio": over_pcie / on_device})
    ms = {"format": lambda s: f"{s * 1e3:,.2f}"}
    return table(rows, [Column("gpu", "GPU"), Column("memory", "host memory"),
                        Column("h2d", "to the GPU", "GB/s", ",.1f"), Column("d2h", "back", "GB/s", ",.1f"),
                        Column("slower", "device copy / to the GPU", format=",.0f"),
                        Column("kernel", "SAXPY on the GPU", "ms", **ms), Column("copies", "its copies", "ms", **ms),
                        Column("ratio", "copies / kernel", format=",.0f")],
                 caption=f"SAXPY on {n:,} floats: 12 bytes per element in device memory; 8 in and 4 out over PCIe")


def sector_rows(strides: Sequence[int] = (1, 2, 4, 8, 16, 32, 64)) -> list[dict]:
    """For each element size and stride: the sectors a warp fetches and the share of their bytes it uses."""
    return [{"stride": s, "element": name, "sectors": memory.sectors_per_warp(s, size),
             "useful_fraction": occupancy.WARP * size / (memory.sectors_per_warp(s, size) * memory.SECTOR_BYTES)}
            for name, size in ELEMENTS.items() for s in strides]


def sectors_figure(rows: Sequence[dict]) -> go.Figure:
    return plots.sweep_figure(rows, "stride", "useful_fraction", color="element", log_x=True,
                              title="Share of the fetched bytes a strided warp uses (predicted)",
                              x_title="stride s (elements)", y_title="useful bytes / fetched bytes",
                              hover=("stride", "element", "sectors"))


def sectors_table(rows: Sequence[dict]) -> Table:
    wide = {}
    for r in rows:
        wide.setdefault(r["stride"], {"stride": r["stride"]})[r["element"]] = (
            f"{r['sectors']} sectors, {r['useful_fraction']:.1%} used")
    return table(wide.values(), [Column("stride", "stride s"), *(Column(name) for name in ELEMENTS)])


def coalescing_figure(runs: Sequence[Recording], peaks: Sequence[Recording]) -> go.Figure:
    copy = {run.device_name: next(r["measured"] for r in run.rows if r["work"] == "copy") for run in peaks}

    def figure(run: Recording) -> go.Figure:
        fig = plots.sweep_figure(run.rows, "stride", "useful_gbytes_per_s", name="measured", log_x=True,
                                 title=f"Useful bandwidth of a strided read: {run.label}",
                                 x_title="stride s (elements)", y_title="useful GB/s (8 bytes per output)",
                                 hover=("stride", "seconds", "spread", "sectors_per_warp_read",
                                        "bytes_moved_per_element"))
        plots.add_sweep(fig, run.rows, "stride", "predicted_gbytes_per_s", name="predicted from stride 1",
                        dash="dash")
        if run.device_name in copy:  # GB/s, read + written
            at_copy = [{**r, "at_copy": copy[run.device_name] * 8 / r["bytes_moved_per_element"]} for r in run.rows]
            plots.add_sweep(fig, at_copy, "stride", "at_copy", name="sectors at the copy's bandwidth", dash="dot")
        return fig
    return plots.by_gpu(runs, figure)


def coalescing_table(runs: Sequence[Recording], peaks: Sequence[Recording]) -> Table:
    """Per stride and GPU: the useful bandwidth, and measured over what the sectors allow at the copy's rate."""
    copy = {run.device_name: next(r["measured"] for r in run.rows if r["work"] == "copy") for run in peaks}
    rows = {}
    for run in runs:
        for r in run.rows:
            row = rows.setdefault(r["stride"], {"stride": r["stride"]})
            row[f"{run.short_label} GB/s"] = r["useful_gbytes_per_s"]
            if run.device_name in copy:
                row[f"{run.short_label} share"] = r["useful_gbytes_per_s"] / (
                    copy[run.device_name] * 8 / r["bytes_moved_per_element"])
    columns = [Column("stride", "stride s")]
    for run in runs:
        columns.append(Column(f"{run.short_label} GB/s", f"{run.short_label}: useful", "GB/s", ",.0f"))
        if run.device_name in copy:
            columns.append(Column(f"{run.short_label} share", f"{run.short_label}: of the sectors at copy speed",
                                  format=".0%"))
    return table(rows.values(), columns)


def outputs_at_risk(block: int = memory.STENCIL_BLOCK, radius: int = memory.STENCIL_RADIUS,
                    warp: int = occupancy.WARP) -> int:
    """Threads of a stencil block that read a window slot written by a thread of another warp."""
    def writer_warp(slot: int) -> int:  # slot j is filled by thread j % block (in the loop's first or second round)
        return (slot % block) // warp
    return sum(any(writer_warp(t + k) != t // warp for k in range(2 * radius + 1)) for t in range(block))


def stencil_figure(runs: Sequence[Recording]) -> go.Figure:
    at_risk = outputs_at_risk() / memory.STENCIL_BLOCK

    def figure(run: Recording) -> go.Figure:
        trials = sorted({r["trial"] for r in run.rows})
        bars = [{"trial": f"trial {t + 1}", **{("with" if r["barrier"] else "without"): 100 * r["wrong_fraction"]
                                             for r in run.rows if r["trial"] == t}} for t in trials]
        fig = plots.bars_figure(bars, "trial", {"with __syncthreads()": "with", "without __syncthreads()": "without"},
                                title=f"Wrong outputs of the stencil, n = {run.rows[0]['n']:,}: {run.label}",
                                x_title="trial (one launch of each kernel)", y_title="wrong outputs (% of n)")
        fig.add_hline(y=100 * at_risk, line_dash="dash",
                      annotation_text=f"outputs that read another warp's slots: {at_risk:.1%}")
        return fig
    return plots.by_gpu(runs, figure)


def stencil_table(runs: Sequence[Recording]) -> Table:
    rows = []
    for run in runs:
        without = [r["wrong"] for r in run.rows if not r["barrier"]]
        rows.append({"gpu": run.short_label, "n": run.rows[0]["n"], "launches": len(without),
                     "fewest": min(without), "most": max(without),
                     "with": sum(r["wrong"] for r in run.rows if r["barrier"])})
    return table(rows, [Column("gpu", "run"), Column("n", "outputs per launch"), Column("launches"),
                        Column("fewest", "wrong without the barrier: fewest"), Column("most", "most"),
                        Column("with", "wrong with it, all launches")])


def banks_figure() -> go.Figure:
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=[
        f"rows of {w} floats: a column is a {memory.bank_conflict_degree(w)}-way conflict" for w in (32, 33)])
    for col, width in enumerate((32, 33), start=1):
        banks = [[(r * width + c) % memory.BANKS for c in range(memory.TILE)] for r in range(memory.TILE)]
        fig.add_trace(go.Heatmap(z=banks, colorscale="Twilight", zmin=0, zmax=memory.BANKS - 1, showscale=col == 2,
                                 colorbar=dict(title="bank"),
                                 hovertemplate="row %{y}, column %{x}: bank %{z}<extra></extra>"), row=1, col=col)
        fig.add_shape(type="rect", x0=-0.5, x1=0.5, y0=-0.5, y1=memory.TILE - 0.5, line=dict(width=3), row=1, col=col)
    fig.update_xaxes(title_text="tile column c").update_yaxes(title_text="tile row r", autorange="reversed")
    return fig.update_layout(title="Which bank each element of a 32 x 32 float tile sits in", height=470)


def conflict_table(widths: Sequence[int] = range(30, 41)) -> Table:
    return table([{"width": w, "degree": memory.bank_conflict_degree(w)} for w in widths],
                 [Column("width", "row width", "floats"), Column("degree", "conflict degree of one column")])


def padding_table(files: Sequence[str] = ("13_transpose_tiled", "14_transpose_padded"),
                  compute_capability: str = "9.0") -> Table:
    """Registers, shared memory and the blocks that fit per SM of the tiled and padded transposes."""
    sm = occupancy.limits(compute_capability)
    rows = []
    for file in files:
        r = next(iter(cuda_c.compile_report(file).resources.values()))
        fit = occupancy.theoretical(memory.TILE * memory.BLOCK_ROWS, r.registers, r.shared_bytes, sm)
        rows.append({"file": file, "registers": r.registers, "shared": r.shared_bytes, "blocks": fit.blocks_per_sm,
                     "limit": fit.limited_by, "occupancy": fit.fraction})
    return table(rows, [Column("file"), Column("registers", "registers per thread"),
                        Column("shared", "shared memory per block", "B"), Column("blocks", "blocks per SM"),
                        Column("limit", "limited by"), Column("occupancy", format=".0%")],
                 caption=f"for an SM of compute capability {compute_capability}")


def transpose_figure(runs: Sequence[Recording]) -> go.Figure:
    def figure(run: Recording) -> go.Figure:
        bars = [{**r, "kernel": f"{r['label']}<br>{r['fraction_of_copy']:.0%} of copy"} for r in run.rows]
        return plots.bars_figure(bars, "kernel", {"bandwidth": "gbytes_per_s"},
                                 title=f"Transposes and copies: {run.label}", y_title="GB/s (read + written)",
                                 hover=("seconds", "spread", "fraction_of_copy"))
    return plots.by_gpu(runs, figure)


def transpose_table(runs: Sequence[Recording]) -> Table:
    return by_gpu(runs, Column("label", "kernel"), Column("fraction_of_copy", "share of the copy", format=".1%"))


def transpose_target(runs: Sequence[Recording]) -> list[str]:
    """A sentence per run: the padded transpose against the target, and what padding bought."""
    said = []
    for run in runs:
        by_kernel = {r["kernel"]: r for r in run.rows}
        padded, tiled = by_kernel["14_transpose_padded"], by_kernel["13_transpose_tiled"]
        verdict = "meets" if padded["fraction_of_copy"] >= TRANSPOSE_TARGET else "misses"
        said.append(f"{run.label} (n = {run.params['n']:,}): the padded transpose, at "
                    f"{padded['fraction_of_copy']:.1%} of the device copy, {verdict} the {TRANSPOSE_TARGET:.0%} "
                    f"target; padding made the tiled transpose {padded['gbytes_per_s'] / tiled['gbytes_per_s']:.2f}x "
                    "faster.")
    return said


def in_flight_figure(runs: Sequence[Recording]) -> go.Figure:
    def figure(run: Recording) -> go.Figure:
        best = max(r["gbytes_per_s"] for r in run.rows)
        fig = plots.sweep_figure(run.rows, "bytes_in_flight", "gbytes_per_s", color="loads", name="loads =",
                                 log_x=True, title=f"Copy bandwidth against the bytes in flight: {run.label}",
                                 x_title="bytes in flight, whole GPU (resident threads x loads x 16 B)",
                                 y_title="GB/s (read + written)",
                                 hover=("blocks", "blocks_per_sm", "resident_threads", "loads", "latency_s"))
        try:
            latency = memory.unloaded_latency(run.rows)
        except ValueError:
            return fig
        xs = sorted({r["bytes_in_flight"] for r in run.rows})
        # read bandwidth = in flight / L; the y axis counts read + written, twice that
        little = [{"bytes_in_flight": x, "gbytes_per_s": min(2 * x / latency / 1e9, best)} for x in xs]
        return plots.add_sweep(fig, little, "bytes_in_flight", "gbytes_per_s", dash="dash",
                               name=f"Little's law, L = {latency * 1e9:.0f} ns")
    return plots.by_gpu(runs, figure)


def latency_table(runs: Sequence[Recording], hierarchy: Sequence[Recording]) -> Table:
    """Per GPU: the unloaded latency Little's law reads from the slow grids, in ns and cycles, the bytes in flight
    it needs at the best rate, the threads per SM that takes, and chapter 1's t0 from whole copies."""
    fits = {run.device_name: hardware.latency_fit(run.rows) for run in hierarchy}
    rows = []
    for run in runs:
        try:
            latency = memory.unloaded_latency(run.rows)
        except ValueError:
            continue
        best = max(r["gbytes_per_s"] for r in run.rows) * 1e9 / 2  # read bandwidth
        spec = specs.find(run.device_name)
        needed = best * latency
        fit = fits.get(run.device_name)
        rows.append({
            "gpu": run.short_label, "latency": latency * 1e9,
            "cycles": latency * spec.boost_clock_ghz * 1e9 if spec else None,
            "needed": needed / 2**20,
            "threads_1": needed / 16 / spec.sms if spec else None,
            "threads_4": needed / 64 / spec.sms if spec else None,
            "max_threads": spec.max_threads_per_sm if spec else None,
            "t0": fit["t0_s"] * 1e6 if fit else None, "t0_over_l": fit["t0_s"] / latency if fit else None,
        })
    return table(rows, [Column("gpu", "GPU"), Column("latency", "unloaded latency L", "ns", ",.0f"),
                        Column("cycles", "L at the boost clock", "cycles", ",.0f"),
                        Column("needed", "in flight for the best read rate", "MiB", ",.1f"),
                        Column("threads_1", "threads per SM, one 16 B load each", format=",.0f"),
                        Column("threads_4", "with four loads each", format=",.0f"),
                        Column("max_threads", "threads an SM holds"),
                        Column("t0", "chapter 1's t0", "µs", ",.2f"), Column("t0_over_l", "t0 / L", format=",.1f")])
