"""What chapter 05 states about im2col's memory and the methods' rates, as claims checked on every recorded GPU
(:mod:`gpulab.core.claims`)."""

from __future__ import annotations

from gpulab.core.claims import Claim, Verdict, verdict
from gpulab.core.printing import format_bytes
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows

MEMORY = "conv_memory"
LAYERS = "conv_layers"


def _layers(run: Recording) -> list[dict]:
    rows = ok_rows(run.rows)
    if not rows:
        raise KeyError("no layer measured")
    return rows


def _mb(count: float) -> str:
    return format_bytes(int(count))


def _blowup_matches(run: Recording) -> Verdict:
    rows = _layers(run)
    holds = all(abs(r["blowup"] - r["predicted_blowup"]) < 1e-9 * r["predicted_blowup"] for r in rows)
    return verdict(holds, ", ".join(f"{r['layer']} {r['blowup']:.2f}" for r in rows))


BLOWUP_MATCHES = Claim(
    "blowup_matches", "On every layer the im2col matrix is $R S \\, P Q / (H W)$ times the input.", MEMORY,
    _blowup_matches)


def _im2col_allocates_more(run: Recording) -> Verdict:
    rows = _layers(run)
    holds = all(r["im2col_peak_extra_bytes"] > r["im2col_bytes"] for r in rows)
    return verdict(holds, "extra over the matrix: " + ", ".join(
        f"{r['layer']} {r['im2col_peak_extra_bytes'] / r['im2col_bytes']:.2f} x" for r in rows))


IM2COL_ALLOCATES_MORE = Claim(
    "im2col_allocates_more", "On every layer im2col + GEMM allocates more than its matrix: the padded copy of the "
    "input and the GEMM's $K \\times N P Q$ result come on top.", MEMORY, _im2col_allocates_more)


def _implicit_few_tiles(run: Recording) -> Verdict:
    rows = _layers(run)
    few = all(r["implicit_peak_extra_bytes"] <= 5 * r["tile_bytes"] for r in rows)
    large = [r for r in rows if r["im2col_bytes"] > 2 * r["tile_bytes"]]
    saves = bool(large) and all(r["implicit_peak_extra_bytes"] < r["im2col_peak_extra_bytes"] for r in large)
    return verdict(few and saves, ", ".join(
        f"{r['layer']} {r['implicit_peak_extra_bytes'] / r['tile_bytes']:.1f} tiles "
        f"({r['im2col_peak_extra_bytes'] / r['tile_bytes']:.1f} for im2col + GEMM)" for r in rows))


IMPLICIT_FEW_TILES = Claim(
    "implicit_few_tiles", "The tiled implicit GEMM allocates at most five tiles' worth on every layer, whatever the "
    "size of the layer's matrix, and less than im2col + GEMM wherever that matrix is larger than two tiles.",
    MEMORY, _implicit_few_tiles)


def _cudnn_no_workspace(run: Recording) -> Verdict:
    rows = _layers(run)
    none = [r["layer"] for r in rows if r["torch_peak_extra_bytes"] == 0]
    return verdict(2 * len(none) > len(rows), f"none on {len(none)} of {len(rows)} layers; " + ", ".join(
        f"{r['layer']} {_mb(r['torch_peak_extra_bytes'])}" for r in rows if r["torch_peak_extra_bytes"]))


CUDNN_NO_WORKSPACE = Claim(
    "cudnn_no_workspace", "On most layers torch's conv2d (cuDNN) allocates nothing beyond its output.", MEMORY,
    _cudnn_no_workspace)


def _rates(run: Recording) -> dict[tuple[str, str, str], float]:
    rates = {(r["dtype"], r["layer"], r["method"]): r["tflops"] for r in ok_rows(run.rows)}
    if not rates:
        raise KeyError("no method measured")
    return rates


def _layer_names(rates: dict, dtype: str) -> list[str]:
    names = list(dict.fromkeys(layer for d, layer, _ in rates if d == dtype))
    if not names:
        raise KeyError(f"no layer measured in {dtype}")
    return names


def _copy_cost(run: Recording) -> Verdict:
    rates = _rates(run)
    limits = {"float32": 0.8, "float16": 0.25}
    shares = {(d, x): rates[d, x, "im2col + GEMM"] / rates[d, x, "GEMM alone"] for d in limits
              for x in _layer_names(rates, d)}
    holds = all(share < limits[d] for (d, _), share in shares.items())
    return verdict(holds, "; ".join(f"{d} from {min(s for (e, _), s in shares.items() if e == d):.0%} to "
                                    f"{max(s for (e, _), s in shares.items() if e == d):.0%}" for d in limits))


COPY_COST = Claim(
    "copy_cost", "On every layer im2col + GEMM runs at less than 80% of the GEMM alone's rate in float32, and at "
    "less than 25% in float16, where the GEMM is fastest and the memory-bound copies weigh most.", LAYERS,
    _copy_cost)


def _conv2d_near_gemm(run: Recording) -> Verdict:
    rates = _rates(run)
    shares = {x: rates["float16", x, "conv2d NHWC"] / rates["float16", x, "GEMM alone"]
              for x in _layer_names(rates, "float16")}
    holds = all(s >= 0.9 for s in shares.values()) and any(s > 1 for s in shares.values())
    return verdict(holds, "conv2d NHWC over the GEMM alone: " + ", ".join(f"{x} {s:.0%}" for x, s in shares.items()))


CONV2D_NEAR_GEMM = Claim(
    "conv2d_near_gemm", "In float16 torch's conv2d on NHWC input, which never builds the matrix, runs at 90% or more "
    "of the GEMM alone's rate on every layer, and faster than it on some.", LAYERS, _conv2d_near_gemm)


def _layout(run: Recording) -> Verdict:
    rates = _rates(run)
    ratio = {(d, x): rates[d, x, "conv2d NHWC"] / rates[d, x, "conv2d NCHW"] for d in ("float16", "float32")
             for x in _layer_names(rates, d)}
    holds = all(r > 1 for (d, _), r in ratio.items() if d == "float16") and all(
        r <= 1.02 for (d, _), r in ratio.items() if d == "float32")
    return verdict(holds, "; ".join(f"{d}: NHWC over NCHW from {min(r for (e, _), r in ratio.items() if e == d):.2f}"
                                    f" to {max(r for (e, _), r in ratio.items() if e == d):.2f}"
                                    for d in ("float16", "float32")))


LAYOUT = Claim(
    "layout", "In float16, on the tensor cores, torch's conv2d is faster on NHWC input than on NCHW on every layer; "
    "in float32, with TF32 off, NHWC gains nothing: on no layer is it more than 2% faster than NCHW.", LAYERS,
    _layout)


def _python_versions_behind(run: Recording) -> Verdict:
    rates = _rates(run)
    direct = [rates[key] / rates[key[0], key[1], "GEMM alone"] for key in rates if key[2] == "direct"]
    tiled = [(rates[key], rates[key[0], key[1], "im2col + GEMM"]) for key in rates
             if key[2] == "implicit GEMM (tiled)"]
    holds = bool(direct) and max(direct) < 0.1 and bool(tiled) and all(t < i for t, i in tiled)
    return verdict(holds, f"direct at most {max(direct, default=float('nan')):.1%} of the GEMM alone; tiled implicit "
                          f"GEMM at most {max((t / i for t, i in tiled), default=float('nan')):.0%} of im2col + GEMM")


PYTHON_VERSIONS_BEHIND = Claim(
    "python_versions_behind", "The direct loop, one small GEMM per output pixel, runs at less than a tenth of the "
    "GEMM alone's rate on every layer it ran, and the tiled implicit GEMM in Python is slower than im2col + GEMM on "
    "every layer.", LAYERS, _python_versions_behind)
