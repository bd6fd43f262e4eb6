"""What chapter 12 states about cuDNN's algorithms, its switches, layouts, channel counts and determinism, as claims
checked on every recorded GPU (:mod:`gpulab.core.claims`)."""

from __future__ import annotations

from gpulab.ch12_cudnn_convolution_algorithms.measured import main_kernels
from gpulab.core import specs
from gpulab.core.claims import Claim, Verdict, verdict
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows

BENCHMARK = "cudnn_benchmark"
SETTINGS = "cudnn_layouts_precisions"
CHANNELS = "cudnn_channels"
FILTERS = "cudnn_filter_sizes"
DETERMINISTIC = "cudnn_deterministic"
TENSOR_CORE_FORMATS = ("tf32", "float16", "bfloat16")
MIB = 2**20


def _pairs(run: Recording) -> dict[str, tuple[dict, dict]]:
    rows = ok_rows(run.rows)
    layers = dict.fromkeys(r["layer"] for r in rows)
    return {layer: tuple(next(r for r in rows if r["layer"] == layer and r["benchmark"] == b) for b in (False, True))
            for layer in layers}


def _autotuner(run: Recording) -> Verdict:
    pairs = _pairs(run)
    ratios = {layer: on["seconds"] / off["seconds"] for layer, (off, on) in pairs.items()}
    changed = [layer for layer, (off, on) in pairs.items() if off["algorithm"] != on["algorithm"]]
    others = [x for layer, x in ratios.items() if layer not in changed]
    holds = (changed == ["res4 3x3"] and pairs["res4 3x3"][1]["algorithm"] == "FFT" and ratios["res4 3x3"] <= 0.8
             and all(0.85 <= x <= 1.02 for x in others))
    return verdict(holds, "on/off " + ", ".join(f"{layer} {x:.2f}" for layer, x in ratios.items())
                   + f"; family changed for {', '.join(changed) or 'none'}")


AUTOTUNER = Claim(
    "autotuner", "With `benchmark` on, every layer but one kept the implicit GEMM family and ran within 15% of its "
    "time with `benchmark` off; res4 3x3 moved to an FFT algorithm and took at most 0.8 times the time.", BENCHMARK,
    _autotuner)


def _first_call(run: Recording) -> Verdict:
    firsts = [on["first_call_seconds"] for _, on in _pairs(run).values()]
    return verdict(min(firsts) >= 0.01 and max(firsts) < 0.1,
                   f"first calls with benchmark on {1e3 * min(firsts):.1f} to {1e3 * max(firsts):.1f} ms")


FIRST_CALL = Claim(
    "first_call", "The autotuner's first call takes tens of milliseconds on every layer.", BENCHMARK, _first_call)


def _workspace(run: Recording) -> Verdict:
    pairs = _pairs(run)
    fft_off, fft_on = pairs["res4 3x3"]
    others = [r for layer, pair in pairs.items() for r in pair if (layer, r["benchmark"]) != ("res4 3x3", True)]
    largest = max(on["first_call_extra_bytes"] for _, on in pairs.values())
    holds = (all(r["peak_extra_bytes"] < MIB for r in others) and fft_on["peak_extra_bytes"] > fft_on["im2col_bytes"]
             and largest > 100 * MIB)
    return verdict(holds, f"res4's FFT {fft_on['peak_extra_bytes'] / fft_on['im2col_bytes']:.1f}x its im2col matrix; "
                          f"every other algorithm at most {max(r['peak_extra_bytes'] for r in others) / MIB:.1f} MiB; "
                          f"largest first call {largest / MIB:,.0f} MiB")


WORKSPACE = Claim(
    "workspace", "The implicit GEMMs ran without a workspace to speak of (under 1 MiB); res4's FFT needs more than the "
    "layer's whole im2col matrix, and the autotuner's first calls allocated up to hundreds of MiB for candidates it "
    "then rejected.", BENCHMARK, _workspace)


def _settings(run: Recording) -> dict[tuple[str, str, str, str], float]:
    return {(r["layer"], r["dtype"], r["layout"], r["method"]): r["tflops"] for r in ok_rows(run.rows)}


def _layers(run: Recording) -> list[str]:
    return list(dict.fromkeys(r["layer"] for r in ok_rows(run.rows)))


def _best(rates: dict, layer: str, dtype: str) -> float:
    return max(rates[layer, dtype, layout, "conv2d"] for layout in ("NCHW", "NHWC"))


def _tensor_formats_faster(run: Recording) -> Verdict:
    rates, layers = _settings(run), _layers(run)
    gains = {(layer, dtype): _best(rates, layer, dtype) / _best(rates, layer, "float32")
             for layer in layers if not layer.startswith("conv1") for dtype in TENSOR_CORE_FORMATS}
    low = min(gains, key=gains.get)
    first = {d: _best(rates, layers[0], d) / _best(rates, layers[0], "float32") for d in TENSOR_CORE_FORMATS}
    return verdict(gains[low] >= 2 and min(first.values()) < min(gains.values()),
                   f"smallest gain past conv1: {low[1]} on {low[0]} {gains[low]:.1f}x; conv1: "
                   + ", ".join(f"{d} {x:.1f}x" for d, x in first.items()))


TENSOR_FORMATS_FASTER = Claim(
    "tensor_formats_faster", "In its faster layout, each tensor-core format (TF32, float16, bfloat16) is at least "
    "twice as fast as float32 in its faster layout on every layer but the first, where some format gains less than "
    "on any other layer.", SETTINGS,
    _tensor_formats_faster)


def _under_half_peak(run: Recording) -> Verdict:
    rates = _settings(run)
    chip = specs.find(run.device_name)
    if chip is None:
        raise KeyError(f"no specs for {run.device_name}")
    shares = {d: max(v for k, v in rates.items() if k[1] == d and k[3] == "conv2d") / specs.peak_tflops(chip, d)
              for d in TENSOR_CORE_FORMATS}
    return verdict(max(shares.values()) < 0.5, ", ".join(f"{d} best {x:.0%} of its peak" for d, x in shares.items()))


UNDER_HALF_PEAK = Claim(
    "under_half_peak", "Even the fastest layer of each tensor-core format stays under half of that format's peak.",
    SETTINGS, _under_half_peak)


def _nhwc_wins(run: Recording) -> Verdict:
    rates, layers = _settings(run), _layers(run)
    gain = {(layer, d): rates[layer, d, "NHWC", "conv2d"] / rates[layer, d, "NCHW", "conv2d"]
            for layer in layers for d in TENSOR_CORE_FORMATS}
    pointwise = [layer for layer in layers if "1x1" in layer]
    others = {k: x for k, x in gain.items() if k[0] not in pointwise}
    least = all(min(gain, key=lambda k, d=d: gain[k] if k[1] == d else 99)[0] in pointwise
                for d in TENSOR_CORE_FORMATS)
    low = min(others, key=others.get)
    return verdict(others[low] >= 1.3 and least,
                   f"smallest NHWC/NCHW past the 1x1 layer: {low[1]} on {low[0]} {others[low]:.2f}; the 1x1 layer: "
                   + ", ".join(f"{d} {gain[layer, d]:.2f}" for layer in pointwise for d in TENSOR_CORE_FORMATS))


NHWC_WINS = Claim(
    "nhwc_wins", "In the tensor-core formats NHWC is at least 1.3 times as fast as NCHW on every layer but the "
    "$1 \\times 1$ one, and in each format the $1 \\times 1$ layer gains least.", SETTINGS, _nhwc_wins)


def _float32_nchw(run: Recording) -> Verdict:
    rates, layers = _settings(run), _layers(run)
    gain = {layer: rates[layer, "float32", "NHWC", "conv2d"] / rates[layer, "float32", "NCHW", "conv2d"]
            for layer in layers}
    return verdict(max(gain.values()) <= 1.03, ", ".join(f"{layer} {x:.2f}" for layer, x in gain.items()))


FLOAT32_NCHW = Claim(
    "float32_nchw", "In float32 (TF32 off) NHWC is no faster than NCHW on any layer (NHWC/NCHW at most 1.03).",
    SETTINGS, _float32_nchw)


def _im2col(run: Recording, dtypes: tuple[str, ...], factor: float) -> Verdict:
    rates, layers = _settings(run), _layers(run)
    ratio = {(layer, d): rates[layer, d, "NCHW", "conv2d"] / rates[layer, d, "NCHW", "im2col + GEMM"]
             for layer in layers for d in dtypes}
    low = min(ratio, key=ratio.get)
    return verdict(ratio[low] > factor, f"cuDNN/im2col at least {ratio[low]:.2f} ({low[1]}, {low[0]})")


IM2COL_TENSOR_CORES = Claim(
    "im2col_tensor_cores", "In every tensor-core format, im2col + GEMM takes more than three times as long as cuDNN "
    "on every layer, NCHW against NCHW.", SETTINGS, lambda run: _im2col(run, TENSOR_CORE_FORMATS, 3))
IM2COL_FLOAT32 = Claim(
    "im2col_float32", "in float32 too, im2col + GEMM is slower than cuDNN on every layer.", SETTINGS,
    lambda run: _im2col(run, ("float32",), 1), scoped=True)


def _channels(run: Recording) -> Verdict:
    rows = {(r["c"], r["layout"]): r for r in ok_rows(run.rows)}
    nhwc = {c: r for (c, layout), r in rows.items() if layout == "NHWC"}
    eights = [r["tflops"] for c, r in nhwc.items() if c % 8 == 0]
    others = [r["tflops"] for c, r in nhwc.items() if c % 8]
    fastest = max(nhwc, key=lambda c: nhwc[c]["tflops"])
    slower = all(rows[65, lay]["seconds"] > rows[72, lay]["seconds"] for lay in ("NCHW", "NHWC"))
    holds = fastest == 64 and min(eights) > max(others) and max(others) < 0.5 * nhwc[64]["tflops"] and slower
    return verdict(holds, f"NHWC: multiples of 8 {min(eights):.0f} to {max(eights):.0f} TFLOP/s (fastest at "
                          f"{fastest}), the others {min(others):.0f} to {max(others):.0f}; 65 channels "
                          + ", ".join(f"{lay} {rows[65, lay]['seconds'] / rows[72, lay]['seconds']:.2f}x"
                                      for lay in ("NCHW", "NHWC")) + " the time of 72")


CHANNEL_MULTIPLES = Claim(
    "channel_multiples", "In float16 and NHWC every multiple of 8 ran faster than every other count, 64 fastest of "
    "all, and every other count at under half of 64's rate; in both layouts 65 channels took longer than 72, which "
    "has more arithmetic.", CHANNELS, _channels)


def _filters(run: Recording) -> Verdict:
    rows = ok_rows(run.rows)

    def time(size: int, method: str, benchmark: bool | None = None) -> float:
        return next(r["seconds"] for r in rows if r["filter_size"] == size and r["method"] == method
                    and (benchmark is None or r["benchmark"] == benchmark))

    book = [m for m in dict.fromkeys(r["method"] for r in rows) if m != "conv2d"]
    torch_3 = max(time(3, "conv2d", b) for b in (False, True))
    fft = next(m for m in book if "FFT tiled" in m)
    beats = min(time(11, "conv2d", b) for b in (False, True)) / time(11, fft)
    growth = {"conv2d": time(11, "conv2d", True) / time(3, "conv2d", True), "fft": time(11, fft) / time(3, fft)}
    holds = all(time(3, m) > torch_3 for m in book) and beats >= 3 and growth["conv2d"] > 121 / 9 \
        and growth["fft"] < 1.5
    return verdict(holds, f"3 x 3: torch's conv2d fastest; 11 x 11: the tiled FFT {beats:.1f}x faster than conv2d; "
                          f"from 3 x 3 to 11 x 11 conv2d's time grew {growth['conv2d']:.1f}x, the tiled FFT's "
                          f"{growth['fft']:.1f}x")


FILTER_SIZES = Claim(
    "filter_sizes", "At $3 \\times 3$ torch's convolution (an implicit GEMM) beats every one of the book's versions, "
    "`benchmark` off and on; at $11 \\times 11$ its time grows by more than the arithmetic's 13.4 times, while the "
    "book's tiled FFT grows by less than half and beats it at least three times over.", FILTERS, _filters)


def _passes(run: Recording) -> dict[tuple[str, str, bool], dict]:
    return {(r["layer"], r["pass"], r["deterministic"]): r for r in ok_rows(run.rows)}


def _determinism(run: Recording) -> Verdict:
    rows = _passes(run)
    varied = sorted(f"{layer} {which}" for (layer, which, flag), r in rows.items() if not flag and not r["identical"])
    fixed = all(r["identical"] for (_, _, flag), r in rows.items() if flag)
    forward = all(r["identical"] for (_, which, _), r in rows.items() if which == "forward")
    price = {(layer, which): rows[layer, which, True]["seconds"] / rows[layer, which, False]["seconds"]
             for (layer, which, flag) in rows if not flag}
    dearest = max(price, key=price.get)
    return verdict(fixed and forward and bool(varied) and dearest == ("conv1 7x7/2", "weight gradient"),
                   f"differed with the flag off: {', '.join(varied)}; with it on: none; dearest: "
                   f"{' '.join(dearest)} {price[dearest]:.2f}x")


DETERMINISM = Claim(
    "determinism", "Every forward pass repeated bit for bit; with the flag off some backward convolutions did not, "
    "with it on all did, and the flag cost most on conv1's weight gradient.", DETERMINISTIC, _determinism)


def _only_varied_changed(run: Recording) -> Verdict:
    rows = _passes(run)
    changed = {(layer, which) for (layer, which, flag), r in rows.items()
               if flag and set(main_kernels(r)) != set(main_kernels(rows[layer, which, False]))}
    varied = {(layer, which) for (layer, which, flag), r in rows.items() if not flag and not r["identical"]}
    extra = sorted(" ".join(k) for k in changed - varied)
    return verdict(changed == varied, f"kernels changed for {len(changed)} passes, {len(varied)} had differed"
                   + (f"; also changed: {', '.join(extra)}" if extra else ""))


ONLY_VARIED_CHANGED = Claim(
    "only_varied_changed", "the flag changed the kernels of exactly the passes whose results had varied.",
    DETERMINISTIC, _only_varied_changed, scoped=True)
