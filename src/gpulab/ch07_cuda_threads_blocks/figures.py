"""Chapter 07's figures and tables: the first launches, which thread owns which element of a grid, divergence, the
launch configuration's heatmap and SAXPY against a copy (each recorded GPU behind a menu)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from gpulab.core import occupancy, plots
from gpulab.core.plots import hover_text
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows
from gpulab.core.tables import Column, Table, by_gpu, table

TARGET = 0.9  # the best SAXPY kernel should move at least 90% of a device copy's bandwidth


def heatmap_figure(rows: Sequence[dict], x: str, y: str, z: str, *, title: str, x_title: str, y_title: str,
                   z_title: str, hover: Sequence[str] = (), text_format: str = "{:,.0f}") -> go.Figure:
    """A heatmap of ``row[z]`` over the distinct ``row[x]`` (columns) and ``row[y]`` (rows), each cell labelled.

    x and y are treated as categories, in sorted order, so that sizes such as 32, 64, ... 1024 sit evenly.
    """
    rows = ok_rows(rows)
    xs, ys = sorted({r[x] for r in rows}), sorted({r[y] for r in rows})
    cell = {(r[x], r[y]): r for r in rows}
    values = [[cell[(a, b)][z] if (a, b) in cell else None for a in xs] for b in ys]
    fig = go.Figure(go.Heatmap(
        x=[str(a) for a in xs], y=[str(b) for b in ys], z=values, colorscale="Viridis",
        colorbar=dict(title=dict(text=z_title)),
        text=[[text_format.format(v) if v is not None else "" for v in line] for line in values],
        texttemplate="%{text}",
        hovertext=[[hover_text(cell[(a, b)], hover) if (a, b) in cell else "" for a in xs] for b in ys],
        hoverinfo="text",
    ))
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title)
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return fig


def grid_owner_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """The matrix of :func:`gpulab.ch07_cuda_threads_blocks.threads.grid_2d`: each element coloured by the block that
    wrote it and labelled with the writing thread's (threadIdx.x, threadIdx.y)."""
    rows = list(rows)
    n_rows, n_cols = max(r["row"] for r in rows) + 1, max(r["col"] for r in rows) + 1
    blocks_x = max(r["block_x"] for r in rows) + 1
    cell = {(r["row"], r["col"]): r for r in rows}
    block = [[cell[(i, j)]["block_y"] * blocks_x + cell[(i, j)]["block_x"] for j in range(n_cols)]
             for i in range(n_rows)]
    text = [[f"({cell[(i, j)]['thread_x']},{cell[(i, j)]['thread_y']})" for j in range(n_cols)] for i in range(n_rows)]
    hover = [[f"element [{i}][{j}]<br>blockIdx = ({cell[(i, j)]['block_x']}, {cell[(i, j)]['block_y']})<br>"
              f"threadIdx = ({cell[(i, j)]['thread_x']}, {cell[(i, j)]['thread_y']})" for j in range(n_cols)]
             for i in range(n_rows)]
    fig = go.Figure(go.Heatmap(
        z=block, text=text, texttemplate="%{text}", hovertext=hover, hoverinfo="text", colorscale="Cividis",
        colorbar=dict(title=dict(text="block<br>y * gridDim.x + x")), xgap=1, ygap=1,
    ))
    fig.update_layout(title=title, xaxis_title="column (x = blockIdx.x * blockDim.x + threadIdx.x)",
                      yaxis_title="row (y = blockIdx.y * blockDim.y + threadIdx.y)")
    fig.update_yaxes(autorange="reversed")
    return fig


def guest_book_table(books: Mapping[tuple[int, int], Sequence[dict]]) -> Table:
    """The guest books of :func:`gpulab.ch07_cuda_threads_blocks.threads.hello`, one per launch (blocks, threads per
    block): who signed, in order of arrival."""
    rows = [{"launch": f"<<<{blocks}, {per_block}>>>",
             "signed": " ".join(f"b{row['block']}t{row['thread']}" for row in book)}
            for (blocks, per_block), book in books.items()]
    return table(rows, [Column("launch"), Column("signed", "signed, in order of arrival (b: block, t: thread)")],
                 caption="Hello World from GPU! from 10 threads")


def launch_table(rows: Sequence[dict]) -> Table:
    """Launches of :func:`gpulab.ch07_cuda_threads_blocks.threads.vector_add`: the grid that covers N elements."""
    return table(rows, [Column("n", "N (elements)"), Column("threads_per_block", "M (threads per block)"),
                        Column("blocks", "(N + M - 1) / M blocks"), Column("threads", "threads"),
                        Column("idle_threads", "failing the bounds check")],
                 caption="checked against torch's sum: equal, element by element")


def divergence_figure(runs: Sequence[Recording]) -> go.Figure:
    """Time of the two-path kernel, relative to the fastest, against the width of the groups that share a path."""
    def figure(run: Recording) -> go.Figure:
        fig = plots.sweep_figure(run.rows, "group", "relative_time", name="two-path kernel", log_x=True,
                                 title=f"Time of the two-path kernel against the group width: {run.label}",
                                 x_title="threads in a row taking the same path (log scale)",
                                 y_title="time relative to the fastest", hover=("seconds", "paths_per_warp"))
        return plots.vertical_marker(fig, occupancy.WARP, "one warp")
    return plots.by_gpu(runs, figure)


def divergence_sentences(runs: Sequence[Recording]) -> list[str]:
    """A sentence per run: the times while warps hold both paths, once each takes one, and the ratio of the means."""
    said = []
    for run in runs:
        split = [r["seconds"] for r in run.rows if r["paths_per_warp"] == 2]
        whole = [r["seconds"] for r in run.rows if r["paths_per_warp"] == 1]
        if not split or not whole:
            continue
        ratio = (sum(split) / len(split)) / (sum(whole) / len(whole))
        said.append(f"{run.label}: {min(split) * 1e6:,.1f} to {max(split) * 1e6:,.1f} µs while warps hold both "
                    f"paths, {min(whole) * 1e6:,.1f} to {max(whole) * 1e6:,.1f} µs once each warp takes one: "
                    f"{ratio:.2f} times slower when divergent.")
    return said


def occupancy_table(registers: int, sizes: Sequence[int], compute_capability: str = "9.0", arch: str = "") -> Table:
    """Blocks per SM, threads per SM and occupancy of a kernel of ``registers`` per thread and no shared memory, for
    each block size (:func:`gpulab.core.occupancy.theoretical`)."""
    sm = occupancy.limits(compute_capability)
    rows = []
    for size in sizes:
        o = occupancy.theoretical(size, registers, 0, sm)
        rows.append({"size": size, "blocks": o.blocks_per_sm, "threads": o.threads_per_sm, "fraction": o.fraction,
                     "limit": o.limited_by})
    return table(rows, [Column("size", "threads per block"), Column("blocks", "blocks per SM"),
                        Column("threads", "threads per SM"), Column("fraction", "occupancy", format=".0%"),
                        Column("limit", "limited by")],
                 caption=f"{registers} registers per thread{f' (NVRTC for {arch})' if arch else ''}, no shared memory, "
                 f"on an SM of compute capability {compute_capability}")


def launch_figure(runs: Sequence[Recording]) -> go.Figure:
    """SAXPY's bandwidth for every launch configuration, a heatmap per GPU."""
    def figure(run: Recording) -> go.Figure:
        return heatmap_figure(
            run.rows, "threads_per_block", "elements_per_thread", "gbytes_per_s",
            title=f"SAXPY bandwidth by launch configuration, n = {run.params['n']:,}: {run.label}",
            x_title="threads per block", y_title="elements per thread", z_title="GB/s",
            hover=["blocks", "occupancy", "limited_by", "driver_blocks_per_sm", "registers"])
    return plots.by_gpu(runs, figure)


def launch_sentences(runs: Sequence[Recording]) -> list[str]:
    """A sentence per run: the best configuration, the course's 256 x 1, and 32 x 1 with its occupancy; and whether
    :mod:`gpulab.core.occupancy` agrees with the driver on every configuration."""
    said = []
    for run in runs:
        rows = ok_rows(run.rows)
        at = {(r["threads_per_block"], r["elements_per_thread"]): r for r in rows}
        best = max(rows, key=lambda r: r["gbytes_per_s"])
        sentence = (f"{run.label}: best {best['gbytes_per_s']:,.0f} GB/s with {best['threads_per_block']} threads x "
                    f"{best['elements_per_thread']} elements")
        if (256, 1) in at:
            sentence += f"; the course's 256 x 1 reaches {at[256, 1]['gbytes_per_s']:,.0f} GB/s"
        if (32, 1) in at:
            sentence += f"; 32 x 1 only {at[32, 1]['gbytes_per_s']:,.0f} GB/s"
        agree = all(r["blocks_per_sm"] == r["driver_blocks_per_sm"] for r in rows)
        said.append(sentence + ". gpulab.core.occupancy " + (
            "agrees with the driver's cudaOccupancyMaxActiveBlocksPerMultiprocessor on every configuration."
            if agree else "disagrees with the driver on some configuration."))
    return said


def saxpy_figure(runs: Sequence[Recording]) -> go.Figure:
    def figure(run: Recording) -> go.Figure:
        return plots.bars_figure(run.rows, "kernel", {"GB/s": "gbytes_per_s"}, x_title="kernel",
                                 y_title="GB/s (bytes read + written per second)",
                                 title=f"SAXPY against a device copy, n = {run.params['n']:,}: {run.label}",
                                 hover=["how", "blocks", "fraction_of_copy"])
    return plots.by_gpu(runs, figure)


def saxpy_table(runs: Sequence[Recording]) -> Table:
    """Each kernel's bandwidth as a share of the copy's, a column per GPU, with how the kernel works."""
    shares = by_gpu(runs, Column("kernel"), Column("fraction_of_copy", "of the copy", format=".1%"))
    how = {r["kernel"]: r["how"] for run in runs for r in run.rows}
    return Table([*shares.headers, "how"], [[*row, how.get(row[0], "")] for row in shares.cells],
                 numeric=[*shares.numeric, False])


def saxpy_target(runs: Sequence[Recording], target: float = TARGET) -> list[str]:
    """A sentence per run: the best SAXPY kernel against the target share of the copy."""
    said = []
    for run in runs:
        best = max((r for r in run.rows if r["kernel"] != "copy"), key=lambda r: r["fraction_of_copy"])
        verdict = "meets" if best["fraction_of_copy"] >= target else "misses"
        said.append(f"{run.label}: the best kernel, {best['kernel']}, moves {best['fraction_of_copy']:.1%} of the "
                    f"copy's bandwidth and {verdict} the target of {target:.0%}.")
    return said
