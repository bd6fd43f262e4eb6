"""Chapter 13's figures and tables for the layers and the fusion of chains: one function per thing the page shows,
drawn from runs of :mod:`.sweeps` (each recorded GPU behind a menu, a GPU column in the tables). The attention
section's are in :mod:`.attention_figures`."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from gpulab.ch13_memory_bound_layers_and_fusion import fusion
from gpulab.ch13_memory_bound_layers_and_fusion.sweeps import HORIZONTAL_METHODS, roofline_of
from gpulab.core import plots, specs
from gpulab.core.printing import format_bytes
from gpulab.core.recordings import Recording
from gpulab.core.tables import Column, Table, table
from gpulab.kernels import cuda_c

LAYERS = ("relu", "gelu", "layer_norm", "softmax", "dropout")  # the single layers of the intensity table
LABEL_SIDE = {"GELU": "middle left", "bias + GELU + dropout (fused, CUDA C)": "top center"}  # the rest: right
HAND_CHAIN = "bias + GELU + dropout (fused, CUDA C)"
EAGER_CHAIN = "bias + GELU + dropout (eager)"
DATASHEET_GPU = "H200 SXM 141GB"  # the datasheet the page reads when no GPU has recorded the layers
MS = {"format": lambda s: f"{1e3 * s:,.3f}"}


def _machine(run: Recording) -> tuple[str, bool]:
    """The device and whether recorded: two runs of one machine (a recording, or the same live session)."""
    return run.device_name, bool(run.provenance.get("recorded"))


def _ok(rows: Sequence[dict]) -> list[dict]:
    return [r for r in rows if r.get("status", "ok") == "ok"]


def layer_costs_table() -> Table:
    """The work, bytes and intensity per element of each layer of :data:`fusion.OPS` and of each chain of
    :data:`fusion.CHAINS`, eager (a kernel per layer) and fused (inputs read once, output written once)."""
    rows = []
    for name in LAYERS:
        op, cost = fusion.OPS[name], fusion.op_cost(name, 1)
        rows.append({"layer": op.label, "flops": cost.flops, "bytes": cost.bytes, "intensity": cost.intensity,
                     "counted": op.formula})
    for chain in fusion.CHAINS.values():
        for fused in (False, True):
            cost = fusion.chain_cost(chain.name, 1, fused=fused)
            how = "inputs read once, output written once" if fused else (
                " -> ".join(fusion.OPS[k].label for k in chain.kernels) + ", a kernel each")
            rows.append({"layer": f"{chain.label} ({'fused' if fused else 'eager'})", "flops": cost.flops,
                         "bytes": cost.bytes, "intensity": cost.intensity, "counted": how})
    return table(rows, [Column("layer", "layer or chain"), Column("flops", "work", "FLOP per element", ",.0f"),
                        Column("bytes", "traffic", "bytes per element", ",.0f"),
                        Column("intensity", "arithmetic intensity", "FLOP/byte", ".3f"),
                        Column("counted", "operations counted")], caption="float32")


def datasheet_ridges(runs: Sequence[Recording]) -> Table:
    """The ridge point of each GPU of ``runs`` from its datasheet (:mod:`gpulab.core.specs`), in float32 on the CUDA
    cores and bfloat16 on the tensor cores; the H200's when no GPU of ``runs`` is in the table of specs."""
    found = {g.name: g for g in (specs.find(run.device_name) for run in runs) if g}
    gpus = list(found.values()) or [specs.gpu(DATASHEET_GPU)]
    rows = []
    for gpu in gpus:
        for precision in ("float32", "bfloat16"):
            peak = specs.peak(gpu, precision)
            rows.append({"gpu": gpu.name, "precision": f"{precision} ({peak.unit})", "peak": peak.tflops,
                         "bandwidth": gpu.bandwidth_gb_s, "ridge": peak.tflops * 1e3 / gpu.bandwidth_gb_s})
    return table(rows, [Column("gpu", "GPU"), Column("precision", "precision (units)"),
                        Column("peak", "peak", "TFLOP/s", ",.0f"), Column("bandwidth", "memory", "GB/s", ",.0f"),
                        Column("ridge", "ridge point", "FLOP/byte", ",.0f")],
                 caption="from the datasheets (gpulab.core.specs)")


def roofline_figure(rows: Sequence[dict], device_name: str, *, title: str) -> go.Figure:
    """The layers of :func:`.sweeps.pointwise_roofline` as points on the roofline of the ceilings measured with them."""
    roofline, points = roofline_of(rows, device_name)
    fig = plots.roofline_figure(roofline, points, title=title)
    for dtype in roofline.peaks:
        plots.vertical_marker(fig, roofline.ridge(dtype), f"ridge {dtype}")
    return fig


def layers_roofline_figure(runs: Sequence[Recording]) -> go.Figure:
    """Each run's layers on its own measured roofline, a point per layer named by it (a menu picks the GPU)."""
    def figure(run: Recording) -> go.Figure:
        fig = roofline_figure(run.rows, run.device_name, title=f"Memory-bound layers on the roofline: {run.label}")
        for trace in fig.data:
            if trace.text:  # a layer's point: named by its layer, its label kept clear of its neighbours
                trace.update(name=trace.text[0], textposition=LABEL_SIDE.get(trace.text[0], "middle right"))
        for i, note in enumerate(fig.layout.annotations):
            note.yshift = -22 * i  # the ridges' labels, one under the other
        tensor = format_bytes(4 * run.params["rows"] * run.params["cols"])
        return fig.update_layout(legend_title_text=f"float32, {tensor} per tensor")
    return plots.by_gpu(runs, figure)


def ceilings_table(runs: Sequence[Recording]) -> Table:
    """Per run: the device copy's bandwidth and the matmul rates measured with the layers, and the ridge points."""
    rows, dtypes = [], []
    for run in runs:
        roof, _ = roofline_of(run.rows, run.device_name)
        dtypes += [d for d in roof.peaks if d not in dtypes]
        rows.append({"gpu": run.short_label, "copy": roof.bandwidth / 1e9,
                     **{f"peak {d}": roof.peak(d) / 1e12 for d in roof.peaks},
                     **{f"ridge {d}": roof.ridge(d) for d in roof.peaks}})
    return table(rows, [Column("gpu", "GPU"), Column("copy", "device copy", "GB/s", ",.0f"),
                        *(Column(f"peak {d}", f"{d} matmul", "TFLOP/s", ",.1f") for d in dtypes),
                        *(Column(f"ridge {d}", f"ridge, {d}", "FLOP/byte", ",.1f") for d in dtypes)],
                 caption="the roofline's ceilings, measured in the same run as the layers")


def layers_table(runs: Sequence[Recording]) -> Table:
    """Per run and layer: its intensity, bandwidth and share of the copy's, rate and share of the float32 matmul's."""
    rows = []
    for run in runs:
        roof, layers = roofline_of(run.rows, run.device_name)
        rows += [{"gpu": run.short_label, "layer": r["op"], "intensity": r["intensity"], "bandwidth": r["gbytes_per_s"],
                  "of_copy": r["fraction_of_copy"], "gflops": r["gflops"],
                  "of_matmul": r["gflops"] * 1e9 / roof.peak("float32")} for r in layers]
    return table(rows, [Column("gpu", "GPU"), Column("layer"), Column("intensity", "intensity", "FLOP/byte", ".3f"),
                        Column("bandwidth", "bandwidth", "GB/s", ",.0f"),
                        Column("of_copy", "of the copy", format=".0%"),
                        Column("gflops", "rate", "GFLOP/s", ",.0f"),
                        Column("of_matmul", "of the float32 matmul", format=".1%")])


def roofline_statements(runs: Sequence[Recording]) -> list[str]:
    """Per run: how many layers lie left of the lowest ridge, the share of the copy each kind of layer reaches, and
    the hand-fused chain against the eager one."""
    said = []
    for run in runs:
        roof, layers = roofline_of(run.rows, run.device_name)
        by_op = {r["op"]: r for r in layers}
        ridge = min(roof.ridge(d) for d in roof.peaks)
        left = sum(r["intensity"] < ridge for r in layers)
        said.append(
            f"{run.label}: {left} of {len(layers)} layers lie left of the lowest ridge ({ridge:.1f} FLOP/byte; their "
            f"intensities run from {min(r['intensity'] for r in layers):.2f} to "
            f"{max(r['intensity'] for r in layers):.2f}) and use at most "
            f"{max(r['gflops'] * 1e9 / roof.peak('float32') for r in layers):.1%} of the float32 matmul rate. Of the "
            f"copy's bandwidth, the pointwise ReLU and GELU reach {by_op['ReLU']['fraction_of_copy']:.0%} and "
            f"{by_op['GELU']['fraction_of_copy']:.0%}, the row-wise LayerNorm and softmax "
            f"{by_op['LayerNorm']['fraction_of_copy']:.0%} and {by_op['softmax']['fraction_of_copy']:.0%}.")
        eager, fused = by_op[EAGER_CHAIN], by_op.get(HAND_CHAIN)
        if fused:
            said.append(
                f"Bias + GELU + dropout: eager, its kernels move {eager['bytes'] / eager['n']:.0f} bytes per element "
                f"at {eager['fraction_of_copy']:.0%} of the copy; fused, {fused['bytes'] / fused['n']:.0f} bytes at "
                f"{fused['fraction_of_copy']:.0%}: {fused['intensity'] / eager['intensity']:.2f}x the intensity and "
                f"{fused['gflops'] / eager['gflops']:.2f}x the rate ({fused['gflops']:,.0f} against "
                f"{eager['gflops']:,.0f} GFLOP/s).")
    return said


def _kernel_count(row: dict) -> str:
    kernels = row.get("kernels")
    return f", {kernels:g} kernel{'s' if kernels != 1 else ''}" if kernels else ""


def compile_table(runs: Sequence[Recording]) -> Table:
    """Per run, chain and mode (eager, torch.compile, the copy): kernels, bytes moved, time, effective bandwidth and
    share of the copy, compile time; a case that did not run says why in its mode."""
    rows = [{"gpu": run.short_label, "chain": r["label"], "size": f"{r['rows']:,} x {r['cols']:,}",
             "mode": r["mode"] if r["status"] == "ok" else f"{r['mode']} ({r['status']})",
             **({k: r.get(k) for k in ("kernels", "bytes", "seconds", "effective_gbytes_per_s", "fraction_of_copy",
                                       "compile_seconds")} if r["status"] == "ok" else {})}
            for run in runs for r in run.rows]
    return table(rows, [Column("gpu", "GPU"), Column("chain"), Column("size", "float32 matrix"), Column("mode"),
                        Column("kernels", "GPU kernels", format="g"),
                        Column("bytes", "bytes moved", format=lambda b: format_bytes(int(b))),
                        Column("seconds", "time", "ms", **MS),
                        Column("effective_gbytes_per_s", "effective bandwidth", "GB/s", ",.0f"),
                        Column("fraction_of_copy", "of the copy", format=".0%"),
                        Column("compile_seconds", "compile time", "s", ",.1f")])


def compile_figure(runs: Sequence[Recording]) -> go.Figure:
    def figure(run: Recording) -> go.Figure:
        bars = [{**r, "case": f"{r['label']}<br>{r['mode']}{_kernel_count(r)}"} for r in _ok(run.rows)]
        fig = plots.bars_figure(bars, "case", {"effective GB/s": "effective_gbytes_per_s"},
                                title=f"Eager against torch.compile: {run.label}", x_title="chain, and how it ran",
                                y_title="effective GB/s (fewest bytes the chain needs / time)",
                                hover=("kernels", "seconds", "bytes", "compile_seconds", "kernel_names"))
        return fig.update_traces(texttemplate="%{y:,.0f}")
    return plots.by_gpu(runs, figure)


def compile_statements(runs: Sequence[Recording]) -> list[str]:
    """Per run and chain: the compiled speed-up against what the bytes predict, the compile time, and the shares of
    the copy's bandwidth."""
    said = []
    for run in runs:
        for chain, spec in fusion.CHAINS.items():
            rows = {r["mode"]: r for r in _ok(run.rows) if r["chain"] == chain}
            if "eager" not in rows or "torch.compile" not in rows:
                said.append(f"{run.label}, {spec.label}: no compiled run to compare.")
                continue
            eager, fast = rows["eager"], rows["torch.compile"]
            said.append(f"{run.label}, {spec.label}: compiled, {fast['speedup']:.2f}x eager's speed (the bytes "
                        f"predict {eager['bytes'] / fast['bytes']:.2f}x) after {fast['compile_seconds']:.1f} s of "
                        f"compiling; its fewest bytes move at {fast['fraction_of_copy']:.0%} of the copy's bandwidth, "
                        f"eager's at {eager['fraction_of_copy']:.0%}.")
    return said


def kernel_names_table(runs: Sequence[Recording]) -> Table:
    """The GPU kernels each chain launched, eager and compiled, where a GPU counted them."""
    rows = [{"gpu": run.short_label, "chain": r["label"], "mode": r["mode"], "kernels": r["kernels"],
             "names": ", ".join(r["kernel_names"].split("; "))}
            for run in runs for r in _ok(run.rows) if r.get("kernels") is not None and r.get("kernel_names")]
    return table(rows, [Column("gpu", "GPU"), Column("chain"), Column("mode"), Column("kernels", format="g"),
                        Column("names", "kernels launched by one call")])


def kernel_registers_table(defines: Sequence[dict] = ({"GELU_TANH": 0}, {"GELU_TANH": 1})) -> Table:
    """What NVRTC reports for the hand-fused kernel in each form of GELU: registers, shared memory, spills."""
    rows = []
    for define in defines:
        report = cuda_c.compile_report(fusion.KERNEL, defines=define)
        r = report.resources[fusion.KERNEL_FUNCTION]
        rows.append({"gelu": "tanh.approx" if define["GELU_TANH"] else "erf (exact)", "registers": r.registers,
                     "shared": r.shared_bytes, "spilled": r.spill_stores_bytes})
    return table(rows, [Column("gelu", "GELU"), Column("registers", "registers per thread"),
                        Column("shared", "shared memory", "B"), Column("spilled", "spilled", "B")],
                 caption=f"{fusion.KERNEL}.cu compiled by NVRTC for {report.arch}")


def dropout_hash_table(seed: int, p: float, elements: int = 6) -> Table:
    """The first ``elements`` of the dropout mask, element by element: h(i xor h(seed)) against round(p 2^32)."""
    threshold, key = fusion.dropout_threshold(p), fusion.hash32(seed)
    rows = [{"i": i, "hash": fusion.hash32(i ^ key)} for i in range(elements)]
    return table([{**r, "kept": "kept" if r["hash"] >= threshold else "dropped"} for r in rows],
                 [Column("i", "element i"), Column("hash", "h(i xor key)", format="#010x"), Column("kept", "mask")],
                 caption=f"p = {p}: threshold round(p x 2^32) = {threshold:,}; key = h(seed {seed}) = {key:#010x}")


def keep_mask_sentence(seed: int, p: float, n: int = 2**20) -> str:
    mask = fusion.keep_mask(n, p, seed)
    return (f"Of {n:,} elements, `fusion.keep_mask` keeps {mask.double().mean().item():.4f} (1 - p = {1 - p}); its "
            f"first elements, {mask[:6].int().tolist()}, agree with the table.")


def hand_kernel_table(runs: Sequence[Recording]) -> Table:
    """Per run and contender: time, bandwidth, share of the copy, error, and how the CUDA C kernel was launched."""
    rows = []
    for run in runs:
        for r in run.rows:
            launch = (f"grid {r['grid']}, block {r['block']}, {r['registers']} registers" if r["kind"] == "CUDA C"
                      else f"compiled in {r['compile_seconds']:.1f} s" if r.get("compile_seconds") is not None else "")
            shown = {k: r.get(k) for k in ("seconds", "gbytes_per_s", "fraction_of_copy", "relative_error")}
            rows.append({"gpu": run.short_label, "contender": r["contender"], "launch": launch,
                         **(shown if r["status"] == "ok" else {"launch": r["status"]})})
    return table(rows, [Column("gpu", "GPU"), Column("contender"), Column("seconds", "time", "ms", **MS),
                        Column("gbytes_per_s", "bandwidth", "GB/s", ",.0f"),
                        Column("fraction_of_copy", "of the copy", format=".1%"),
                        Column("relative_error", "relative error", format=".1e"), Column("launch")])


def _cuda_kernels(run: Recording) -> list[dict]:
    return [r for r in _ok(run.rows) if r["kind"] == "CUDA C"]


def hand_kernel_figure(runs: Sequence[Recording]) -> go.Figure:
    def figure(run: Recording) -> go.Figure:
        bars = [{**r, "case": f"{r['contender'].replace(', ', '<br>')}<br><b>{r['fraction_of_copy']:.0%} of copy</b>"}
                for r in _ok(run.rows)]
        copy = next(r for r in run.rows if r["kind"] == "copy")
        fig = plots.bars_figure(bars, "case", {"GB/s": "gbytes_per_s"},
                                title=f"Bias + GELU + dropout, fused by hand, against a copy: {run.label}",
                                x_title="contender", y_title="GB/s (x read once + y written once, per second)",
                                hover=("seconds", "spread", "grid", "block", "registers", "relative_error"))
        target = fusion.TARGET_FRACTION * copy["gbytes_per_s"]
        fig.add_hline(y=target, line_dash="dot", line_color="#444444")
        fig.add_annotation(x=next(b["case"] for b in bars if b["kind"] == "eager"), y=target, yanchor="bottom",
                           showarrow=False, text=f"target: {fusion.TARGET_FRACTION:.0%} of the copy")
        return fig.update_traces(texttemplate="%{y:,.0f}")
    return plots.by_gpu(runs, figure)


def hand_kernel_target(runs: Sequence[Recording]) -> list[str]:
    """Per run: whether the best CUDA C variant reaches :data:`fusion.TARGET_FRACTION` of the copy."""
    said = []
    for run in runs:
        copy, kernels = next(r for r in run.rows if r["kind"] == "copy"), _cuda_kernels(run)
        best = max(kernels, key=lambda r: r["fraction_of_copy"])
        verdict = "meets" if best["fraction_of_copy"] >= fusion.TARGET_FRACTION else "misses"
        said.append(f"{run.label}, {run.params['rows']:,} x {run.params['cols']:,} float32, p = {run.params['p']}: "
                    f"the target is at least {fusion.TARGET_FRACTION:.0%} of the copy's {copy['gbytes_per_s']:,.0f} "
                    f"GB/s, measured in the same run. The best variant, {best['contender']}, {verdict} it with "
                    f"{best['gbytes_per_s']:,.0f} GB/s, {best['fraction_of_copy']:.1%}; the variants run from "
                    f"{min(r['fraction_of_copy'] for r in kernels):.1%} to {best['fraction_of_copy']:.1%}.")
    return said


def hand_kernel_statements(runs: Sequence[Recording]) -> list[str]:
    """Per run: the best hand kernel against eager PyTorch and the bytes' prediction, exact against tanh GELU, eight
    blocks per SM against four, and torch.compile against the best hand kernel."""
    said = []
    eager_bytes = fusion.chain_cost("bias_gelu_dropout", 1).bytes
    for run in runs:
        kernels = _cuda_kernels(run)
        erf = [r for r in kernels if r["approximate"] == "none"]
        tanh = [r for r in kernels if r["approximate"] == "tanh"]
        eager = next(r for r in run.rows if r["kind"] == "eager")
        best = max(kernels, key=lambda r: r["gbytes_per_s"])
        lines = [f"{run.label}: the best hand-fused variant runs at {eager['seconds'] / best['seconds']:.2f}x eager "
                 f"PyTorch's speed (the bytes predict {eager_bytes / 8:.2f}x): eager's three kernels move their "
                 f"{eager_bytes:.0f} bytes per element at {eager['fraction_of_copy'] * eager_bytes / 8:.0%} of the "
                 f"copy, the hand kernel its 8 at {best['fraction_of_copy']:.0%}."]
        if erf and tanh:
            e, t = max(erf, key=lambda r: r["gbytes_per_s"]), max(tanh, key=lambda r: r["gbytes_per_s"])
            four, eight = (next(r for r in erf if r["blocks_per_sm"] == b) for b in (4, 8))
            lines.append(f"Exact GELU {e['gbytes_per_s']:,.0f} GB/s ({e['registers']} registers), tanh approximation "
                         f"{t['gbytes_per_s']:,.0f} GB/s ({t['registers']} registers): the erf costs "
                         f"{1 - e['gbytes_per_s'] / t['gbytes_per_s']:.1%} of the bandwidth. Exact GELU with 8 "
                         f"blocks per SM against 4: {eight['gbytes_per_s'] / four['gbytes_per_s'] - 1:+.1%}.")
        compiled = next((r for r in _ok(run.rows) if r["kind"] == "torch.compile"), None)
        if compiled:
            lines.append(f"torch.compile: {compiled['gbytes_per_s']:,.0f} GB/s, {compiled['fraction_of_copy']:.0%} of "
                         f"the copy; it takes {best['gbytes_per_s'] / compiled['gbytes_per_s']:.2f}x the best hand "
                         "kernel's time.")
        said.append(" ".join(lines))
    return said


def horizontal_table(runs: Sequence[Recording]) -> Table:
    """Per run, model width and method: tensors, parameters, kernels, time of a step, bandwidth and speed-up."""
    rows = [{"gpu": run.short_label, **r} for run in runs for r in run.rows]
    return table(rows, [Column("gpu", "GPU"), Column("d_model", "d_model"), Column("tensors"),
                        Column("elements", "parameters"), Column("method"), Column("kernels", format="g"),
                        Column("seconds", "time per step", "µs", format=lambda s: f"{1e6 * s:,.1f}"),
                        Column("gbytes_per_s", "bandwidth", "GB/s", ",.0f"),
                        Column("speedup", "speed-up over a kernel per tensor", format=".2f")])


def horizontal_figure(runs: Sequence[Recording]) -> go.Figure:
    def figure(run: Recording) -> go.Figure:
        bars = [{**r, "case": f"d_model {r['d_model']}, {r['tensors']} tensors", "us": r["seconds"] * 1e6}
                for r in run.rows]
        fig = go.Figure()
        for i, method in enumerate(HORIZONTAL_METHODS):
            chosen = [b for b in bars if b["method"] == method]
            fig.add_bar(x=[b["case"] for b in chosen], y=[b["us"] for b in chosen], name=method,
                        marker_color=plots.PALETTE[i], marker_pattern_shape=plots.PATTERNS[i],
                        text=[f"{b['us']:,.0f}" for b in chosen], textposition="outside",
                        hovertext=[plots.hover_text(b, ("kernels", "seconds", "gbytes_per_s", "speedup"))
                                   for b in chosen])
        fig.update_layout(title=f"One update of every parameter, three ways: {run.label}",
                          xaxis_title="model: width and number of parameter tensors",
                          yaxis_title="microseconds per step (log scale)", barmode="group")
        return fig.update_yaxes(type="log")
    return plots.by_gpu(runs, figure)


def horizontal_statements(runs: Sequence[Recording], rooflines: Sequence[Recording]) -> list[str]:
    """Per run and model width: foreach's and the flat buffer's speed-ups, one kernel per tensor's time per tensor,
    and the bandwidths against the copy of ``rooflines``' run on the same device; then how the times grow."""
    copies = {_machine(r): roofline_of(r.rows, r.device_name)[0].bandwidth for r in rooflines}
    said = []
    for run in runs:
        copy = copies.get(_machine(run))
        steps = {}
        for d_model in dict.fromkeys(r["d_model"] for r in run.rows):
            rows = {r["method"]: r for r in run.rows if r["d_model"] == d_model}
            loop, foreach, flat = steps[d_model] = [rows[m] for m in HORIZONTAL_METHODS]
            counts = ("" if loop["kernels"] is None else f" ({loop['kernels']:g}, {foreach['kernels']:g} and "
                      f"{flat['kernels']:g} kernels)")
            of_copy = "" if copy is None else f", {flat['gbytes_per_s'] * 1e9 / copy:.0%} of the copy"
            loop_of_copy = "" if copy is None else f" ({loop['gbytes_per_s'] * 1e9 / copy:.1%} of the copy)"
            said.append(f"{run.label}, d_model {d_model}, {loop['tensors']} tensors, "
                        f"{format_bytes(12 * loop['elements'])} moved: foreach {foreach['speedup']:.1f}x and the flat "
                        f"buffer {flat['speedup']:.1f}x the speed of one kernel per tensor{counts}. One kernel per "
                        f"tensor: {loop['seconds'] / loop['tensors'] * 1e6:.1f} µs per tensor, "
                        f"{loop['gbytes_per_s']:,.0f} GB/s{loop_of_copy}; the flat buffer: "
                        f"{flat['gbytes_per_s']:,.0f} GB/s{of_copy}.")
        if len(steps) > 1:
            (small, (loop_s, _, flat_s)), (large, (loop_l, _, flat_l)) = list(steps.items())[0], list(steps.items())[-1]
            said.append(f"From d_model {small} to {large} the bytes grow "
                        f"{loop_l['elements'] / loop_s['elements']:.1f}x, the time of one kernel per tensor "
                        f"{loop_l['seconds'] / loop_s['seconds']:.2f}x, the flat buffer's "
                        f"{flat_l['seconds'] / flat_s['seconds']:.1f}x.")
    return said
