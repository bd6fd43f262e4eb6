"""Chapter 12's tables of the cuDNN measurements of :mod:`.cudnn` (the GPUs one under another), and the sentences that
sum them up: the autotuner, the workspace, the kernels that ran, layouts and precisions, channel counts, filter
sizes, determinism; one function per thing the page shows."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpulab.ch12_cudnn_convolution_algorithms import algorithms
from gpulab.ch12_cudnn_convolution_algorithms.backend import algorithm_rows, setting_label, truncated
from gpulab.ch12_cudnn_convolution_algorithms.tables import span
from gpulab.core import specs
from gpulab.core.printing import format_bytes
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows
from gpulab.core.tables import Column, Table, table

SHAPE = ("n", "c", "h", "w", "k", "r", "s", "stride", "padding", "dtype", "layout")  # a point's convolution
MS = {"unit": "ms", "format": lambda s: f"{1e3 * s:,.3f}"}  # a time in seconds, shown in milliseconds
BYTES = {"format": lambda b: format_bytes(int(b))}


def share(row: dict, test: Callable[[dict], bool]) -> float:
    """The share of a row's kernel (or CPU operator) time spent in the kernels for which ``test(kernel)`` holds."""
    return sum(k["share"] for k in row["kernels"] if test(k))


def transposes(row: dict) -> float:
    return share(row, lambda k: k["family"] == "layout transform")


def padding(row: dict) -> float:
    """The share of cuDNN's kernels that pad the channels (named '...AddPadding...')."""
    return share(row, lambda k: "addpadding" in k["name"].lower())


def main_kernels(row: dict, least: float = 0.1) -> list[str]:
    """The names of the kernels (CPU operators on a CPU) that took at least ``least`` of a row's time."""
    return [k["name"].removeprefix("void ") for k in row["kernels"] if k["share"] >= least]


def _code(names: Sequence[str], width: int) -> str:
    return ", ".join(f"`{truncated(n, width)}`" for n in names)


# --- cudnn.benchmark, the workspace and the kernels ---------------------------------------------------------------

def _pairs(run: Recording, key: str = "benchmark") -> dict[str, tuple[dict, dict]]:
    rows = ok_rows(run.rows)
    return {layer: tuple(next(r for r in rows if r["layer"] == layer and r[key] == flag) for flag in (False, True))
            for layer in dict.fromkeys(r["layer"] for r in rows)}


def benchmark_table(runs: Sequence[Recording]) -> Table:
    """Per GPU and layer, benchmark off and on: the first call, a steady call, their ratio, the steady calls whose
    savings repay the autotuning, and the family each setting ran."""
    rows = []
    for run in runs:
        for layer, (off, on) in _pairs(run).items():
            saved, cost = off["seconds"] - on["seconds"], on["first_call_seconds"] - off["first_call_seconds"]
            rows.append({"gpu": run.short_label, "layer": layer, "backend": off["backend"],
                         "first_off": off["first_call_seconds"],
                         "first_on": on["first_call_seconds"], "off": off["seconds"], "on": on["seconds"],
                         "ratio": on["seconds"] / off["seconds"],
                         "repay": round(cost / saved) if saved > 0 and cost > 0 else "never" if cost > 0 else None,
                         "algorithm": f"{off['algorithm']} -> {on['algorithm']}"})
    return table(rows, [Column("gpu", "GPU"), Column("layer"), Column("backend"),
                        Column("first_off", "first call, off", **MS),
                        Column("first_on", "first call, on", **MS), Column("off", "steady, off", **MS),
                        Column("on", "steady, on", **MS), Column("ratio", "on / off", format=".2f"),
                        Column("repay", "calls to repay", format=lambda v: v if isinstance(v, str) else f"{v:,}"),
                        Column("algorithm", "algorithm: off -> on")],
                 caption="float32 (TF32 off), NCHW; times of the first call on the wall clock, steady calls median")


def benchmark_summary(runs: Sequence[Recording]) -> list[str]:
    said = []
    for run in runs:
        pairs = _pairs(run)
        ratios = [on["seconds"] / off["seconds"] for off, on in pairs.values()]
        switched = [f"{layer} ({off['algorithm']} -> {on['algorithm']}, {on['seconds'] / off['seconds']:.2f}x the "
                    "time)" for layer, (off, on) in pairs.items() if off["algorithm"] != on["algorithm"]]
        first_on = [1e3 * on["first_call_seconds"] for _, on in pairs.values()]
        first_off = [1e3 * off["first_call_seconds"] for off, _ in pairs.values()]
        calls = [on["first_call_seconds"] / on["seconds"] for _, on in pairs.values()]
        said.append(f"In short, {run.label}: with benchmark on, the steady time is {span(ratios)} of the time with "
                    f"it off; the family changed for {', '.join(switched) or 'no layer'}. The first call took "
                    f"{span(first_on, '.1f', ' ms')} with benchmark on (the time of {span(calls, ',.0f', '')} "
                    f"steady calls), {span(first_off, '.1f', ' ms')} with it off.")
    return said


def _measured(runs: Sequence[Recording]) -> list[Recording]:
    return [run for run in runs if any(r.get("peak_extra_bytes") is not None for r in ok_rows(run.rows))]


def workspace_table(runs: Sequence[Recording]) -> Table:
    """Per GPU (that measured memory) and layer: the im2col matrix, the workspace with benchmark off and on, and
    what the autotuner's first call allocated."""
    rows = [{"gpu": run.short_label, "layer": layer, "im2col": off["im2col_bytes"], "off": off["peak_extra_bytes"],
             "on": on["peak_extra_bytes"], "first": on["first_call_extra_bytes"]}
            for run in _measured(runs) for layer, (off, on) in _pairs(run).items()]
    return table(rows, [Column("gpu", "GPU"), Column("layer"), Column("im2col", "im2col matrix", **BYTES),
                        Column("off", "workspace, off", **BYTES), Column("on", "workspace, on", **BYTES),
                        Column("first", "autotuner's first call", **BYTES)],
                 caption="memory beyond the output, float32")


def workspace_summary(runs: Sequence[Recording]) -> list[str]:
    said = []
    for run in _measured(runs):
        rows = ok_rows(run.rows)
        hungry = [r for r in rows if r["peak_extra_bytes"] > 0]
        tuner = max((r for r in rows if r["benchmark"]), key=lambda r: r["first_call_extra_bytes"])
        needs = ", ".join(f"{r['layer']} with benchmark {'on' if r['benchmark'] else 'off'} ({r['algorithm']}) needs "
                          f"{r['peak_extra_bytes'] / r['im2col_bytes']:.1f}x its im2col matrix" for r in hungry)
        said.append(f"{run.label}: {needs or 'no chosen algorithm needs a workspace'}; the autotuner's largest first "
                    f"call: {tuner['layer']}, {format_bytes(tuner['first_call_extra_bytes'])}.")
    return said


def algorithms_table(runs: Sequence[Recording], kernels: int = 3, width: int = 90) -> Table:
    """Per GPU, layer and setting: the family that did the arithmetic and the longest kernels, by their raw names."""
    rows = [{"gpu": run.short_label, **r, "kernels": "; ".join(r["kernels"])}
            for run in runs for r in algorithm_rows(run.rows, kernels, width)]
    return table(rows, [Column("gpu", "GPU"), Column("layer"), Column("setting"), Column("algorithm"),
                        Column("kernels", f"the {kernels} longest kernels [family, share of the time]")])


# --- layouts and precisions -----------------------------------------------------------------------------------------

def _rate(rows: Sequence[dict], layer: str, dtype: str, method: str, layout: str = "NCHW") -> float | None:
    """The measured TFLOP/s of one point, or None where it did not run."""
    found = [r for r in rows if r["layer"] == layer and r["dtype"] == dtype and r["method"] == method
             and r["layout"] == layout]
    return found[0]["tflops"] if found else None


def settings_notes(runs: Sequence[Recording]) -> list[str]:
    """A sentence per format a run could not measure, and why."""
    notes = {f"{run.label}: {r['dtype']} not run: {r.get('reason', r['status'])}.": None
             for run in runs for r in run.rows if r["status"] != "ok"}
    return list(notes)


def settings_table(runs: Sequence[Recording]) -> Table:
    """Per GPU, format and layer: cuDNN's rate in NCHW, and against it NHWC, chapter 5's im2col + GEMM and float32;
    the share of the NCHW time spent in layout transforms, and the family each layout ran."""
    rows = []
    for run in runs:
        ok = ok_rows(run.rows)
        for dtype in dict.fromkeys(r["dtype"] for r in ok):
            for layer in dict.fromkeys(r["layer"] for r in ok):
                nchw, nhwc = _rate(ok, layer, dtype, "conv2d"), _rate(ok, layer, dtype, "conv2d", "NHWC")
                if nchw is None or nhwc is None:
                    continue
                im2col, base = _rate(ok, layer, dtype, "im2col + GEMM"), _rate(ok, layer, "float32", "conv2d")
                chosen = {r["layout"]: r for r in ok if r["dtype"] == dtype and r["layer"] == layer
                          and r["method"] == "conv2d"}
                rows.append({"gpu": run.short_label, "dtype": dtype, "layer": layer, "nchw": nchw,
                             "nhwc": nhwc / nchw, "im2col": im2col / nchw if im2col else None,
                             "float32": nchw / base if base and dtype != "float32" else None,
                             "transposes": transposes(chosen["NCHW"]),
                             "algorithm": f"{chosen['NCHW']['algorithm']} -> {chosen['NHWC']['algorithm']}"})
    ratio = {"format": lambda v: f"{v:.2f}x"}
    return table(rows, [Column("gpu", "GPU"), Column("dtype", "format"), Column("layer"),
                        Column("nchw", "conv2d NCHW", "TFLOP/s", ",.3g"), Column("nhwc", "NHWC / NCHW", **ratio),
                        Column("im2col", "im2col + GEMM / NCHW", **ratio),
                        Column("float32", "NCHW / float32's", **ratio),
                        Column("transposes", "NCHW: time in layout transforms", format=".0%"),
                        Column("algorithm", "algorithm: NCHW -> NHWC")])


def settings_summary(runs: Sequence[Recording]) -> Table:
    """Per GPU and format, over the layers: NHWC against NCHW, NCHW's layout transforms, im2col + GEMM against
    cuDNN, and the fastest point with its share of the format's peak."""
    rows = []
    for run in runs:
        ok = ok_rows(run.rows)
        chip = specs.find(run.device_name)
        for dtype in dict.fromkeys(r["dtype"] for r in ok):
            mine = [r for r in ok if r["dtype"] == dtype and r["method"] == "conv2d"]
            nchw = [r for r in mine if r["layout"] == "NCHW"]
            best = max(mine, key=lambda r: r["tflops"])
            peak = specs.peak_tflops(chip, dtype) if chip else None
            rows.append({"gpu": run.short_label, "dtype": dtype,
                         "nhwc": span([_rate(ok, r["layer"], dtype, "conv2d", "NHWC") / r["tflops"] for r in nchw
                                       if _rate(ok, r["layer"], dtype, "conv2d", "NHWC")]),
                         "transposes": span([100 * transposes(r) for r in nchw], ".0f", "%"),
                         "im2col": span([_rate(ok, r["layer"], dtype, "im2col + GEMM") / r["tflops"] for r in nchw
                                         if _rate(ok, r["layer"], dtype, "im2col + GEMM")]),
                         "fastest": f"{best['layer']} {best['layout']}", "rate": best["tflops"],
                         "share": best["tflops"] / peak if peak else None})
    return table(rows, [Column("gpu", "GPU"), Column("dtype", "format"), Column("nhwc", "NHWC / NCHW"),
                        Column("transposes", "NCHW: time in layout transforms"),
                        Column("im2col", "im2col + GEMM / cuDNN"), Column("fastest"),
                        Column("rate", "its rate", "TFLOP/s", ",.3g"), Column("share", "of the peak", format=".0%")],
                 caption="over the layers, by format")


# --- channel counts -------------------------------------------------------------------------------------------------

def channels_table(runs: Sequence[Recording]) -> Table:
    """Per GPU, layout and channel count: the rate, and for a count that is not a multiple of 8 its rate and time
    against the nearest multiple of 8, the share of its time spent padding the channels, and its family."""
    rows = []
    for run in runs:
        ok = ok_rows(run.rows)
        for layout in dict.fromkeys(r["layout"] for r in ok):
            line = {r["c"]: r for r in ok if r["layout"] == layout}
            eights = [c for c in line if c % 8 == 0]
            for c in sorted(line):
                near = line[min(eights, key=lambda e: abs(e - c))] if eights and c % 8 else None
                rows.append({"gpu": run.short_label, "layout": layout, "c": c, "tflops": line[c]["tflops"],
                             "rate": line[c]["tflops"] / near["tflops"] if near else None,
                             "time": line[c]["seconds"] / near["seconds"] if near else None,
                             "near": near["c"] if near else None, "padding": padding(line[c]),
                             "algorithm": line[c]["algorithm"]})
    ratio = {"format": lambda v: f"{v:.2f}x"}
    return table(rows, [Column("gpu", "GPU"), Column("layout"), Column("c", "C = K"),
                        Column("tflops", "rate", "TFLOP/s", ",.3g"), Column("near", "nearest multiple of 8"),
                        Column("rate", "its rate, times", **ratio), Column("time", "its time, times", **ratio),
                        Column("padding", "time padding the channels", format=".0%"), Column("algorithm")])


def channels_summary(runs: Sequence[Recording], settings: Sequence[Recording] = ()) -> list[str]:
    """Per run and layout: the rates of the multiples of 8 and of the others, the slowest count against the largest
    multiple of 8, and the kernels of the fastest and the slowest; then the same convolution measured in section 4."""
    said = []
    for run in runs:
        ok = ok_rows(run.rows)
        for layout in dict.fromkeys(r["layout"] for r in ok):
            line = {r["c"]: r for r in ok if r["layout"] == layout}
            eights, odd = [line[c] for c in line if c % 8 == 0], [line[c] for c in line if c % 8]
            if not eights or not odd:
                continue
            worst, largest = min(odd, key=lambda r: r["tflops"]), max(eights, key=lambda r: r["c"])
            best = max(eights, key=lambda r: r["tflops"])
            rates = span([r["tflops"] for r in eights], ".3g", ""), span([r["tflops"] for r in odd], ".3g", "")
            said.append(
                f"In short, {run.short_label}, {layout}: multiples of 8 {rates[0]} TFLOP/s, the others {rates[1]}; "
                f"C = K = {worst['c']} took "
                f"{worst['seconds'] / largest['seconds']:.2f}x the time of {largest['c']}, which has "
                f"{(largest['c'] / worst['c']) ** 2:.2f}x its arithmetic. Kernels at {best['c']}: "
                f"{_code(main_kernels(best), 60)}; at {worst['c']}: {_code(main_kernels(worst), 60)}.")
        twins = [(r, s) for s_run in settings if s_run.device_name == run.device_name for s in ok_rows(s_run.rows)
                 if s["method"] == "conv2d" for r in ok if all(r[f] == s[f] for f in SHAPE)]
        said += [f"{run.short_label}: the same convolution in section 4 ({s['layer']}, {s['dtype']} {s['layout']}) "
                 f"ran at {s['tflops']:.3g} TFLOP/s against {r['tflops']:.3g} here, "
                 f"{abs(s['tflops'] / r['tflops'] - 1):.0%} apart." for r, s in twins]
    return said


# --- filter sizes ---------------------------------------------------------------------------------------------------

def filter_table(runs: Sequence[Recording]) -> Table:
    rows = [{"gpu": run.short_label, "setting": setting_label(r), "filter": f"{r['r']} x {r['s']}", **r}
            for run in runs for r in ok_rows(run.rows)]
    return table(rows, [Column("gpu", "GPU"), Column("filter"), Column("setting", "method"),
                        Column("seconds", "time", **MS), Column("tflops", "rate", "TFLOP/s", ",.3g"),
                        Column("peak_extra_bytes", "extra memory", **BYTES), Column("algorithm")],
                 caption="N = 1, C = K = 128 channels of 128 x 128 pixels, float32 (TF32 off)" if rows and
                 (rows[0]["n"], rows[0]["c"], rows[0]["h"]) == (1, 128, 128) else "float32 (TF32 off)")


def _times(ratio: float) -> str:
    """'takes 2.0x as long as' for a ratio of times above 1, 'is 4.6x faster than' below."""
    return f"takes {ratio:.1f}x as long as" if ratio >= 1 else f"is {1 / ratio:.1f}x faster than"


def filter_summary(runs: Sequence[Recording]) -> list[str]:
    """Per run: for each filter, the fastest method and the book's fastest family against torch's convolution;
    how the times grew from the smallest filter to the largest; and, for an FFT, its effective rate."""
    talk_ms = {(a, r): ms for a, r, ms, _ in algorithms.TALK_TABLE}
    said = []
    for run in runs:
        ok, best = ok_rows(run.rows), {}
        for size in dict.fromkeys(r["r"] for r in ok):
            same = [r for r in ok if r["r"] == size]
            fastest = min(same, key=lambda r: r["seconds"])
            ours = min((r for r in same if r["method"] != "conv2d"), key=lambda r: r["seconds"])
            off, on = (next(r for r in same if r["method"] == "conv2d" and r["benchmark"] == f) for f in (False, True))
            best[size] = ours, on
            said.append(f"{run.short_label}, {size} x {size}: fastest {setting_label(fastest)}. The book's fastest "
                        f"family, {ours['method']} ({1e3 * ours['seconds']:.3f} ms), "
                        f"{_times(ours['seconds'] / on['seconds'])} torch's conv2d with benchmark on "
                        f"({1e3 * on['seconds']:.3f} ms, {on['algorithm']}) and "
                        f"{_times(ours['seconds'] / off['seconds'])} conv2d with it off.")
        small, large = min(best), max(best)
        (ours, on), on_small = best[large], best[small][1]
        ours_small = next(r for r in ok if r["r"] == small and r["method"] == ours["method"])
        talk = [f"{a} {talk_ms[a, large] / talk_ms[a, small]:.1f}x" for a in ("IMPLICIT_PRECOMP_GEMM", "FFT_TILING")
                if talk_ms.get((a, small)) and talk_ms.get((a, large))]
        said.append(f"From {small} x {small} to {large} x {large} the time grew: conv2d, benchmark on "
                    f"{on['seconds'] / on_small['seconds']:.1f}x, the book's {ours['method']} "
                    f"{ours['seconds'] / ours_small['seconds']:.1f}x"
                    + (f" (the talk's GV100: {', '.join(talk)})" if talk else "")
                    + f"; the direct method's arithmetic grows {(large / small) ** 2:.1f}x.")
        if ours["method"] in ("FFT", "FFT tiled"):
            layer = algorithms.same_padding_layer(ours["n"], ours["c"], ours["h"], ours["k"], large)
            fewer = algorithms.multiplies(layer, "direct or GEMM") / algorithms.multiplies(layer, ours["method"])
            chip = specs.find(run.device_name)
            peak = (f"; the {chip.name}'s float32 peak is {specs.peak_tflops(chip, 'float32'):.3g} TFLOP/s"
                    if chip else "")
            said.append(f"The book's {ours['method']} rate, {ours['tflops']:.3g} TFLOP/s, is an effective rate: it "
                        f"counts the direct method's operations, and the {ours['method']} does {fewer:.0f}x fewer "
                        f"multiplies{peak}.")
    return said


# --- determinism ----------------------------------------------------------------------------------------------------

def _repeated(row: dict) -> str:
    return "identical" if row["identical"] else f"differ by {row['max_difference']:.0e}"


def deterministic_table(runs: Sequence[Recording]) -> Table:
    """Per GPU, layer and pass, deterministic off and on: the time, and whether the repeated runs were identical."""
    rows = []
    for run in runs:
        ok = ok_rows(run.rows)
        for layer in dict.fromkeys(r["layer"] for r in ok):
            for which in dict.fromkeys(r["pass"] for r in ok):
                off, on = (next(r for r in ok if r["layer"] == layer and r["pass"] == which
                                and r["deterministic"] == f) for f in (False, True))
                rows.append({"gpu": run.short_label, "layer": layer, "pass": which, "off": off["seconds"],
                             "off_runs": _repeated(off), "on": on["seconds"], "on_runs": _repeated(on),
                             "ratio": on["seconds"] / off["seconds"]})
    return table(rows, [Column("gpu", "GPU"), Column("layer"), Column("pass"), Column("off", "off", **MS),
                        Column("off_runs", "off: repeated runs"), Column("on", "on", **MS),
                        Column("on_runs", "on: repeated runs"), Column("ratio", "on / off", format=".2f")],
                 caption="cudnn.deterministic off and on, float32, benchmark on")


def deterministic_summary(runs: Sequence[Recording]) -> list[str]:
    said = []
    for run in runs:
        ok = ok_rows(run.rows)
        changed = []
        for layer in dict.fromkeys(r["layer"] for r in ok):
            for which in dict.fromkeys(r["pass"] for r in ok):
                off, on = (next(r for r in ok if r["layer"] == layer and r["pass"] == which
                                and r["deterministic"] == f) for f in (False, True))
                if set(main_kernels(off)) != set(main_kernels(on)):
                    changed.append((off, on))
        differing = [r for r in ok if not r["identical"]]
        varied = {(r["layer"], r["pass"]) for r in differing if not r["deterministic"]}
        worst = max((r["max_difference"] for r in differing), default=0) / 2**-23  # float32's epsilon
        ratios = [on["seconds"] / off["seconds"] for off, on in changed]
        said.append(
            f"In short, {run.label}: with the flag off, {len(varied)} of {len(ok) // 2} passes differed between runs"
            + (f", by at most {worst:.1f} times float32's epsilon of the largest value" if varied else "")
            + f"; with it on, {sum(r['deterministic'] for r in differing)}. The flag changed the kernels of "
            + (f"{len(changed)} passes, at {span(ratios)} their time" if changed else "none")
            + ("; they are exactly the passes that differed" if varied and varied == {(o["layer"], o["pass"])
                                                                                     for o, _ in changed} else "")
            + ".")
        said += [f"The flag changed the kernels of {off['layer']} {off['pass']} ({on['seconds'] / off['seconds']:.2f}x "
                 f"the time): off {_code(main_kernels(off), 40)}; on {_code(main_kernels(on), 40)}."
                 for off, on in changed]
    return said
