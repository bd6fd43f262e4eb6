"""What chapter 15 states about 2:4 sparse products in PyTorch, as claims checked on every recorded GPU
(:mod:`gpulab.core.claims`)."""

from __future__ import annotations

from gpulab.ch15_structured_sparsity.speedup import DENSE_BACKEND, sparse_peak
from gpulab.core import specs
from gpulab.core.claims import Claim, Verdict, verdict
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows

ORIENTATIONS = "sparsity_orientations"
SPEEDUP = "sparsity_linear_speedup"
LAYER = "F.linear(X, Ws)"
REFUSED = ("X @ Ws", "X @ Ws.T")


def _expressions(run: Recording) -> dict[tuple[str, str], dict]:
    return {(r["backend"], r["expression"]): r for r in run.rows}


def _layer_product(run: Recording) -> Verdict:
    rows = _expressions(run)
    layer, first = rows["cusparselt", LAYER], rows["cusparselt", "Ws @ X.T"]
    holds = (layer["status"] == first["status"] == "ok" and not layer["output_contiguous"]
             and first["output_contiguous"])
    shape = {True: "contiguous", False: "a transposed view"}
    return verdict(holds, f"F.linear: {layer['status']}, output {shape[bool(layer.get('output_contiguous'))]}; "
                   f"Ws @ X.T: {first['status']}, output {shape[bool(first.get('output_contiguous'))]}")


LAYER_PRODUCT = Claim(
    "layer_product", "Through cuSPARSELt, the layer's product `F.linear(X, Ws)` runs, correct to the format's "
    "rounding, and returns a transposed view; `Ws @ X.T` runs too and returns a contiguous result.", ORIENTATIONS,
    _layer_product)


def _refused(run: Recording) -> Verdict:
    rows = _expressions(run)
    backends = sorted({backend for backend, _ in rows})
    refused = [(b, e) for b in backends for e in REFUSED if rows[b, e]["status"].startswith("not supported")]
    return verdict(len(refused) == len(backends) * len(REFUSED),
                   f"{len(refused)} of {len(backends) * len(REFUSED)} refused ({', '.join(backends)})")


REFUSED_SPELLINGS = Claim(
    "refused_spellings", "Every backend refuses `X @ Ws` and `X @ Ws.T`: write a 2:4 layer as `F.linear`.",
    ORIENTATIONS, _refused)


def _cutlass_capability(run: Recording) -> Verdict:
    capability = run.provenance.get("device", {}).get("compute_capability", "")
    cutlass = [r for r in run.rows if r["backend"] == "cutlass"]
    ran = sum(r["status"] == "ok" for r in cutlass)
    expected = len(cutlass) if capability.startswith("8.") else 0
    if not cutlass:
        raise KeyError("no CUTLASS row")
    return verdict(ran == expected, f"compute capability {capability}: {ran} of {len(cutlass)} CUTLASS products ran")


CUTLASS_CAPABILITY = Claim(
    "cutlass_capability", "PyTorch's CUTLASS 2:4 kernels run on GPUs of compute capability 8.x (Ampere and Ada) only: "
    "on any other GPU it refuses every product, and cuSPARSELt is the only backend.", SPEEDUP, _cutlass_capability)


def _products(run: Recording) -> tuple[list[dict], dict[tuple, dict]]:
    ok = ok_rows(run.rows)
    sparse = [r for r in ok if "speedup" in r]
    if not sparse:
        raise KeyError("no sparse product ran")
    return sparse, {(r["dtype"], r["n"], r["tokens"]): r for r in ok if r["backend"] == DENSE_BACKEND}


def _gpu(run: Recording) -> specs.GPU:
    gpu = specs.find(run.device_name)
    if gpu is None:
        raise KeyError(f"{run.device_name} is not in gpulab.core.specs")
    return gpu


def _small_loses(run: Recording) -> Verdict:
    sparse, dense = _products(run)
    smallest = min(r["n"] for r in sparse)
    worst_small = max(r["speedup"] for r in sparse if r["n"] == smallest)
    floor, quickest = min(r["seconds"] for r in sparse), min(r["seconds"] for r in dense.values())
    return verdict(worst_small < 1 and floor > 10 * quickest,
                   f"n = {smallest:,}: at best {worst_small:.2f}x dense; the quickest sparse call "
                   f"{1e3 * floor:.2f} ms, the quickest dense {1e6 * quickest:.1f} µs")


SMALL_LOSES = Claim(
    "small_loses", "No sparse call took less than a floor more than ten times the time of the quickest dense "
    "product, so the sparse layer lost every product of the smallest weight.", SPEEDUP, _small_loses)


def _never_2x(run: Recording) -> Verdict:
    sparse, _ = _products(run)
    best = max(sparse, key=lambda r: r["speedup"])
    return verdict(best["speedup"] < 1.75, f"the best: {best['speedup']:.2f}x ({best['dtype']}, n = {best['n']:,}, "
                   f"{best['tokens']:,} tokens)")


NEVER_2X = Claim(
    "never_2x", "No 2:4 product came near the 2x of the peaks: the best speed-up over the dense product with the same "
    "pruned weight stayed below 1.75x.", SPEEDUP, _never_2x)


def _largest_wins(run: Recording) -> Verdict:
    sparse, _ = _products(run)
    largest = max(r["n"] * r["n"] * r["tokens"] for r in sparse)
    big = [r for r in sparse if r["n"] * r["n"] * r["tokens"] == largest]
    return verdict(all(r["speedup"] > 1 for r in big),
                   ", ".join(f"{r['dtype']} {r['speedup']:.2f}x" for r in big) + f" at n = {big[0]['n']:,}, "
                   f"{big[0]['tokens']:,} tokens")


LARGEST_WINS = Claim(
    "largest_wins", "The largest product, the largest weight with the most tokens, ran faster sparse than dense in "
    "every format.", SPEEDUP, _largest_wins)


def _above_dense_peak(run: Recording) -> Verdict:
    sparse, _ = _products(run)
    gpu = _gpu(run)
    above = [r for r in sparse if r["tflops"] > specs.peak(gpu, r["dtype"], specs.TENSOR_CORES).tflops]
    best = max(sparse, key=lambda r: r["tflops"])
    peak = specs.peak(gpu, best["dtype"], specs.TENSOR_CORES).tflops
    return verdict(above, f"{len(above)} of {len(sparse)} above the dense peak; the fastest "
                   f"{best['tflops']:,.0f} TFLOP/s against {peak:,.0f}")


ABOVE_DENSE_PEAK = Claim(
    "above_dense_peak", "some 2:4 products ran faster than the GPU's dense tensor-core peak, a rate no dense product "
    "can reach: the sparse tensor cores do skip the zeros.", SPEEDUP, _above_dense_peak, scoped=True)


def _share_of_peak(run: Recording) -> Verdict:
    sparse, dense = _products(run)
    gpu = _gpu(run)
    best_sparse = max(r["tflops"] / sparse_peak(gpu, r["dtype"]).tflops for r in sparse)
    best_dense = max(r["tflops"] / specs.peak(gpu, r["dtype"], specs.TENSOR_CORES).tflops for r in dense.values())
    return verdict(best_sparse < best_dense, f"the best sparse product at {best_sparse:.0%} of the sparse peak, the "
                   f"best dense at {best_dense:.0%} of the dense peak")


SHARE_OF_PEAK = Claim(
    "share_of_peak", "The best sparse product reached a smaller share of the sparse peak than the best dense product "
    "reached of the dense peak: the sparse library leaves more of its hardware unused.", SPEEDUP, _share_of_peak)


def _compress_once(run: Recording) -> Verdict:
    sparse, dense = _products(run)
    largest = max(r["n"] for r in sparse)
    compress = max(r["compress_seconds"] for r in sparse if r["n"] == largest)
    tokens = max(r["tokens"] for r in sparse if r["n"] == largest)
    product = min(dense[d, largest, tokens]["seconds"] for d in {r["dtype"] for r in sparse})
    stored = {r["stored_fraction"] for r in sparse}
    return verdict(compress < product and stored == {0.5625},
                   f"compressing the {largest:,} x {largest:,} weight: {1e3 * compress:.1f} ms, one dense product of "
                   f"{tokens:,} tokens {1e3 * product:.1f} ms; stored share {', '.join(f'{s:.2%}' for s in stored)}")


COMPRESS_ONCE = Claim(
    "compress_once", "Compressing the largest weight takes less time than one dense product with it at the most "
    "tokens, and the compressed weight stores 56.25% of the dense bytes, as the format's arithmetic says.", SPEEDUP,
    _compress_once)
