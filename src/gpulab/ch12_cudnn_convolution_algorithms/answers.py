"""Worked answers to the exercises of chapter 12, "cuDNN and convolution algorithms": every number computed when it
is shown, from the chapter's multiply counts and workspace models, :mod:`gpulab.core.specs`, the time model of its
plan and the recordings. No experiment runs here, and no GPU is needed.
"""

from __future__ import annotations

import math
import statistics

from gpulab.ch05_convolutions_as_gemms import conv
from gpulab.ch12_cudnn_convolution_algorithms import algorithms
from gpulab.ch12_cudnn_convolution_algorithms.backend import BACKENDS
from gpulab.ch12_cudnn_convolution_algorithms.plan import AUTOTUNE_CALLS
from gpulab.core import budget, recordings, specs
from gpulab.core.printing import Answer


def _winograd_per_output(m: int, r: int = 3) -> float:
    """Multiplies per output of F(m x m, r x r): an (m + r - 1)^2 transformed tile gives m^2 outputs."""
    return (m + r - 1) ** 2 / m**2


def exercise_1() -> Answer:
    f2, f4, direct = _winograd_per_output(2), _winograd_per_output(4), 3 * 3
    layer = algorithms.same_padding_layer(1, 64, 56, 64, 3)
    counted = algorithms.multiplies(layer, "Winograd F(2x2)") / (layer.n * layer.k * layer.p * layer.q * layer.c)
    return Answer("Answer to exercise 1", (
        f"F(4 x 4, 3 x 3) multiplies a transformed 6 x 6 tile element by element: 36 multiplies for 16 outputs, "
        f"{f4:g} per output and input channel.",
        f"F(2 x 2, 3 x 3): 16 for 4, {f2:g} per output (`algorithms.multiplies` agrees: {counted:g} on a 56 x 56 "
        f"layer); the direct method {direct}. So F(4 x 4) saves {direct / f4:g}x against the direct method, F(2 x 2) "
        f"{direct / f2:g}x.",
        "What limits the tile: F(m, r) evaluates polynomials at m + r - 2 points besides infinity. F(2, 3) uses 0 and "
        "+-1, and its matrices hold 0, +-1 and 1/2; F(4, 3) needs +-2 as well, and its matrices hold entries up to 8 "
        "and fractions down to 1/24. Each larger tile needs larger and less round numbers.",
        "Those entries amplify rounding: an output adds many terms of very different sizes, and float16's 10 "
        "fraction bits lose the small ones. Lavin and Gray found F(4 x 4, 3 x 3) accurate enough in float32; in "
        "float16 the smaller tile is the safer choice.",
    ))


def exercise_2() -> Answer:
    peak = specs.peak(specs.gpu(algorithms.TALK_GPU_ROW), "float32")
    rows = algorithms.talk_rates([8, 32])
    first = rows[0]
    lines = [f"`algorithms.talk_rates([8, 32])` reads each row's time as N images of the talk's layer. The first row, "
             f"{first['algorithm']} with a {first['filter']} x {first['filter']} filter in {first['milliseconds']} ms, "
             f"would then run at:"]
    for row in rows:
        if (row["algorithm"], row["filter"]) == (first["algorithm"], first["filter"]):
            lines.append(f"- N = {row['batch']}: {row['implied_tflops']:,.1f} TFLOP/s, {row['over_peak']:.1f} times "
                         f"the GV100's float32 peak of {peak.tflops:.1f}; an im2col workspace of "
                         f"{row['im2col_mib']:,.0f} MiB, where the talk printed {first['workspace_mb']:g} MB.")
    single = algorithms.talk_rates([1])[0]["over_peak"]
    batch = next(n for n in range(1, 129) if single * n > 1)
    lines.append(f"The implied rate grows with N: at N = 1 it is {single:.0%} of the peak, and from N = {batch} it "
                 f"exceeds it. The workspace grows with N too and matches the talk's only at N = 1.")
    return Answer("Answer to exercise 2", tuple(lines))


def exercise_3() -> Answer:
    counts = algorithms.multiply_counts([1], 128, 128, [3, 5, 7, 9, 11])
    fft, tiled = (algorithms.crossover(counts, method, 1) for method in ("FFT", "FFT tiled"))
    lines = ["On a GPU, set `FILTER_SIZES = [3, 5, 7, 11]` after the cell that chooses the sizes, run the section 6 "
             "cell, and read the `algorithm` of the \"conv2d, benchmark on\" rows and their kernel names.",
             f"The multiply counts of the talk's layer (N = 1, C = K = 128 of 128 x 128) favour the tiled FFT from "
             f"{tiled} x {tiled} on and the untiled one from {fft} x {fft} (`algorithms.crossover`): they depend on "
             "no GPU, a T4's included."]
    for run in recordings.recorded("cudnn_filter_sizes"):
        chosen = {r["filter_size"]: r.get("algorithm") for r in run.rows
                  if r.get("method") == "conv2d" and r.get("benchmark") and r.get("status", "ok") == "ok"}
        same = len(set(chosen.values())) == 1
        lines.append(f"On the {run.short_label} (recorded), cuDNN with `benchmark` on chose "
                     + ", ".join(f"{family} at {r} x {r}" for r, family in sorted(chosen.items()))
                     + (": the same family at every filter size recorded." if same else "."))
    lines.append("So expect cuDNN to switch later than the counts say, if at all: its autotuner times only the "
                 "candidates its heuristics rank first (section 6), and an FFT pays in memory traffic what it saves "
                 "in multiplies.")
    return Answer("Answer to exercise 3", tuple(lines))


def _fft_terms(layer: conv.ConvLayer) -> dict[str, float]:
    """The terms of :func:`algorithms.multiplies` for the untiled FFT: the transforms of the input, filter and output
    planes (L log2 L each, L the padded plane) and the complex products (4 real multiplies each)."""
    hp, wp = layer.h + 2 * layer.padding, layer.w + 2 * layer.padding
    transform = hp * wp * math.log2(hp * wp)
    return {"input transforms": layer.n * layer.c * transform, "filter transforms": layer.k * layer.c * transform,
            "output transforms": layer.n * layer.k * transform,
            "products": 4.0 * layer.n * layer.k * layer.c * hp * (wp // 2 + 1)}


def exercise_4() -> Answer:
    layer = conv.ConvLayer(1, 64, 56, 56, 64, 3, 3, stride=2, padding=1)
    full = conv.ConvLayer(1, 64, 56, 56, 64, 3, 3, stride=1, padding=1)
    terms, total = _fft_terms(layer), algorithms.multiplies(layer, "FFT")
    kept = layer.p * layer.q / (full.p * full.q)
    wasted = (1 - kept) * (terms["products"] + terms["output transforms"])
    # four phases: every other row and column of the padded input, each with the filter taps of the same parity;
    # their products are summed before one inverse transform per output plane
    side = (layer.h + 2 * layer.padding) // 2
    phases = [conv.ConvLayer(1, layer.c, side, side, layer.k, r, s) for r in (2, 1) for s in (2, 1)]
    split = (sum(algorithms.multiplies(phase, "FFT") for phase in phases)
             - 3 * _fft_terms(phases[0])["output transforms"])
    return Answer("Answer to exercise 4", (
        f"`conv2d_fft` computes all {full.p} x {full.q} outputs of the stride-1 convolution and keeps {layer.p} x "
        f"{layer.q}, {kept:.0%} of them. Its {total:,.0f} multiplies (`algorithms.multiplies(layer, \"FFT\")`): "
        + ", ".join(f"{name} {value:,.0f}" for name, value in terms.items()) + ".",
        f"The products and the output transforms serve every output: the share of them that serves discarded ones, "
        f"{wasted:,.0f} multiplies ({wasted / total:.0%}), is wasted. The filters' transforms, at the size of the "
        "image whatever the stride, are most of the work for one image.",
        f"Cheaper: split the padded input into its four even/odd phases of {side} x {side}, and the 3 x 3 filter into "
        "the taps of the same parity (2 x 2, 2 x 1, 1 x 2 and 1 x 1). The stride-2 output is the sum of four "
        "stride-1 convolutions of matching phases, each the size of the output wanted.",
        f"Counted the same way, with the four products summed before one inverse transform: {split:,.0f} "
        f"multiplies, {split / total:.0%} of the full plane's. The output transforms shrink fourfold and the inputs' "
        "stay, but the products do not: four quarter-size planes hold as many frequencies as the full one.",
    ))


def _first_calls(run) -> dict[bool, float]:
    """The median first-call seconds of a benchmark recording, with ``benchmark`` off and on."""
    return {flag: statistics.median(r["first_call_seconds"] for r in run.rows
                                    if r.get("benchmark") is flag and r.get("first_call_seconds") is not None)
            for flag in (False, True)}


def exercise_5() -> Answer:
    t4 = specs.gpu("T4")
    layer = algorithms.same_padding_layer(32, 64, 56, 64, 3)
    call = budget.Work("conv", flops=layer.flops).call_seconds(t4)
    lines = ["In one thread: run `F.conv2d` on a new shape with `torch.backends.cudnn.benchmark = False`, switch it "
             "on, and time the next call of the same shape. It does not autotune: torch's plan cache is per thread "
             "and keyed by shape, dtype, layout and the deterministic and TF32 switches, but not by `benchmark`, so "
             "the plan the heuristics chose is reused.",
             "Inside `cudnn.in_fresh_thread`, the cache starts empty: the first call with `benchmark` on times the "
             "candidates, and takes far longer than a call."]
    for run in recordings.recorded("cudnn_benchmark"):
        first = _first_calls(run)
        lines.append(f"On the {run.short_label} (recorded), first calls took {first[False] * 1e3:.1f} ms with "
                     f"`benchmark` off and {first[True] * 1e3:.1f} ms on (medians over the layers).")
    lines.append(f"On a T4 the model puts one call of res2 3x3 (N = 32, float32) at {call * 1e3:.1f} ms; timing up to "
                 f"10 candidates a few times each, some {AUTOTUNE_CALLS} calls, makes a first call of about "
                 f"{AUTOTUNE_CALLS * call * 1e3:.0f} ms.")
    return Answer("Answer to exercise 5", tuple(lines))


def exercise_6() -> Answer:
    lines = ["Set `torch.backends.cudnn.enabled = False`, run `cudnn.measure_conv(LAYERS[1], benchmark=False)` and ask "
             "`cudnn.conv_backend(x, weight, padding=1)` which backend ran.",
             f"Expect `Slow2d`: {BACKENDS['Slow2d']}. It unfolds one image at a time and calls cuBLAS, like the "
             "chapter's `im2col + GEMM` rows (batched there), so those rows predict its rate."]
    for run in recordings.recorded("cudnn_layouts_precisions"):
        rows = [r for r in run.rows if r.get("status", "ok") == "ok" and r.get("dtype") == "float32"
                and r.get("layout") == "NCHW"]
        cudnn = {r["layer"]: r["tflops"] for r in rows if r["method"] == "conv2d"}
        im2col = {r["layer"]: r["tflops"] for r in rows if r["method"] == "im2col + GEMM"}
        ratios = {layer: im2col[layer] / cudnn[layer] for layer in cudnn if layer in im2col}
        if ratios:
            lines.append(f"On the {run.short_label} (recorded, float32, NCHW), im2col + GEMM ran at "
                         + ", ".join(f"{ratio:.0%} ({layer})" for layer, ratio in ratios.items())
                         + " of cuDNN's rate. Expect `Slow2d` there or below: it does one image per GEMM.")
    lines.append("Set `torch.backends.cudnn.enabled = True` again afterwards.")
    return Answer("Answer to exercise 6", tuple(lines))


def exercise_7() -> Answer:
    layer = algorithms.same_padding_layer(1, 128, 128, 128, 11)
    direct, tiled = (algorithms.multiplies(layer, method) for method in ("direct or GEMM", "FFT tiled"))
    lines = ["With `torch.backends.cudnn.benchmark_limit = 0` every candidate is timed, FFT and FFT_TILING "
             "included. Look at three things in the row: `first_call_seconds` (the autotuning: expect it several "
             "times longer), `algorithm` and `kernels` (`fft` in a name is an FFT), and `seconds` against the "
             "book's tiled FFT.",
             f"The counts say an FFT should win here: the tiled FFT needs {tiled / direct:.0%} of the direct "
             f"method's multiplies at 11 x 11 (`algorithms.multiplies`), on any GPU."]
    for run in recordings.recorded("cudnn_filter_sizes"):
        rows = {(r["method"], r.get("benchmark")): r for r in run.rows
                if r.get("filter_size") == 11 and r.get("status", "ok") == "ok"}
        tuned, book = rows.get(("conv2d", True)), rows.get(("FFT tiled", None))
        if tuned and book:
            lines.append(f"On the {run.short_label} (recorded, limit 10), torch ran {tuned['algorithm']} in "
                         f"{tuned['seconds'] * 1e3:.2f} ms after a first call of "
                         f"{tuned['first_call_seconds'] * 1e3:.0f} ms; the book's tiled FFT took "
                         f"{book['seconds'] * 1e3:.2f} ms. If cuDNN's own FFT_TILING is among the candidates, it "
                         "should now win.")
    lines.append("Set the limit back to 10 afterwards.")
    return Answer("Answer to exercise 7", tuple(lines))
