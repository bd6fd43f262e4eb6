"""What chapter 03 states about the roofline's ceilings, the three BLAS levels on it and blocking, as claims checked
on every recorded GPU (:mod:`gpulab.core.claims`).

A claim's test reads one recording; the roofline a level or blocking claim holds its points against is that GPU's
newest recording of ``blas_ceilings``, the roofline the page draws."""

from __future__ import annotations

from gpulab.core.claims import Claim, Verdict, same_gpu, verdict
from gpulab.core.recordings import Recording
from gpulab.core.roofline import Roofline
from gpulab.core.sweep import ok_rows

CEILINGS, LEVELS, BLOCKING = "blas_ceilings", "blas_levels", "blas_blocking"
VECTOR_OPS = ("axpy", "dot", "gemv")
TENSOR_FORMATS = ("tf32", "float16", "bfloat16")
SIXTEEN_BITS = ("float16", "bfloat16")


def _roof(run: Recording) -> Roofline:
    """The roofline of ``run``'s GPU, from its newest ``blas_ceilings`` recording (KeyError where it has none)."""
    ceilings = same_gpu(run, CEILINGS)
    return Roofline.from_rows(ceilings.rows, ceilings.device_name)


def _largest(run: Recording, op: str, dtype: str) -> dict:
    rows = [r for r in ok_rows(run.rows) if (r["op"], r["dtype"]) == (op, dtype)]
    if not rows:
        raise KeyError(f"no {op} in {dtype}")
    return max(rows, key=lambda r: r["n"])


def _share(roof: Roofline, row: dict) -> float:
    """A row's rate as a share of its roofline bound."""
    return row["gflops"] * 1e9 / roof.attainable(row["intensity"], row["dtype"])


def _ridges(run: Recording) -> Verdict:
    roof = Roofline.from_rows(run.rows, run.device_name)
    ridges = {d: roof.ridge(d) for d in roof.peaks}
    wide = [d for d in ridges if d not in TENSOR_FORMATS]
    holds = (all(10 <= r <= 1000 for r in ridges.values()) and set(TENSOR_FORMATS) <= set(ridges)
             and min(ridges[d] for d in TENSOR_FORMATS) > max(ridges[d] for d in wide))
    return verdict(holds, ", ".join(f"{d} {r:,.0f}" for d, r in ridges.items()) + " FLOP/byte")


RIDGES = Claim(
    "ridges", "Every ridge point lies between 10 and 1,000 FLOP per byte, and those of the formats only the tensor "
    "cores multiply (TF32 and the 16-bit ones) are higher than those of float64 and float32.", CEILINGS, _ridges)


def _vectors_at_roof(run: Recording) -> Verdict:
    roof, shares = _roof(run), {}
    for op in VECTOR_OPS:
        for dtype in roof.peaks:
            if not (op == "dot" and dtype in SIXTEEN_BITS):
                shares[f"{op} {dtype}"] = _largest(run, op, dtype)["gbytes_per_s"] * 1e9 / roof.bandwidth
    low = min(shares, key=shares.get)
    return verdict(shares[low] >= 0.9, f"lowest {low} at {shares[low]:.0%} of the copy, highest "
                                       f"{max(shares, key=shares.get)} at {max(shares.values()):.0%}")


VECTORS_AT_ROOF = Claim(
    "vectors_at_roof", "At its largest size, every level-1 and level-2 call moves its bytes at 90% or more of the "
    "copy's bandwidth, except the 16-bit dot products.", LEVELS, _vectors_at_roof)


def _sixteen_bit_dot(run: Recording) -> Verdict:
    roof = _roof(run)
    shares = {d: _largest(run, "dot", d)["gbytes_per_s"] * 1e9 / roof.bandwidth for d in SIXTEEN_BITS}
    return verdict(all(s < 0.9 for s in shares.values()),
                   ", ".join(f"dot {d} {s:.0%} of the copy" for d, s in shares.items()))


SIXTEEN_BIT_DOT = Claim(
    "sixteen_bit_dot", "The 16-bit dot products (`torch.dot` in float16 and bfloat16) stay below 90% of the copy's "
    "bandwidth even at their largest size: a limit of the kernel, since the memory serves the other calls faster.",
    LEVELS, _sixteen_bit_dot)


def _reads_pass_copy(run: Recording) -> Verdict:
    roof = _roof(run)
    calls = [("axpy", d) for d in roof.peaks] + [("dot", d) for d in roof.peaks if d not in SIXTEEN_BITS]
    shares = {f"{op} {d}": _largest(run, op, d)["gbytes_per_s"] * 1e9 / roof.bandwidth for op, d in calls}
    low, high = min(shares, key=shares.get), max(shares, key=shares.get)
    return verdict(shares[low] > 1, f"from {low} at {shares[low]:.1%} of the copy to {high} at {shares[high]:.1%}")


READS_PASS_COPY = Claim(
    "reads_pass_copy", "At its largest size, axpy in every format, and dot in float64, float32 and TF32, move their "
    "bytes faster than the copy that sets the bandwidth roof.", LEVELS, _reads_pass_copy)


def _tf32_changes_nothing(run: Recording) -> Verdict:
    ratios = {op: _largest(run, op, "tf32")["gflops"] / _largest(run, op, "float32")["gflops"] for op in VECTOR_OPS}
    return verdict(all(abs(r - 1) <= 0.02 for r in ratios.values()),
                   ", ".join(f"{op} {r:.3f}" for op, r in ratios.items()) + " times the float32 rate")


TF32_CHANGES_NOTHING = Claim(
    "tf32_changes_nothing", "In TF32, axpy, dot and gemv run at their float32 rate, within 2%: TF32 changes only how "
    "the tensor cores multiply matrices, and these calls never reach them.", LEVELS, _tf32_changes_nothing)


def _gemm_near_roof(run: Recording) -> Verdict:
    roof = _roof(run)
    gemms = [r for r in ok_rows(run.rows) if r["op"] == "gemm" and r["dtype"] in roof.peaks]
    large = [_share(roof, r) for r in gemms if r["n"] >= 2048]
    small = [_share(roof, r) for r in gemms if r["n"] == 1024]
    if not large or not small:
        raise KeyError("no gemm of order 1024, or none of 2048 and more")
    return verdict(min(large) >= 0.85 and max(small) < 0.8,
                   f"order 2048 and more: {min(large):.0%} to {max(large):.0%} of the gemm ceiling; "
                   f"order 1024: {min(small):.0%} to {max(small):.0%}")


GEMM_NEAR_ROOF = Claim(
    "gemm_near_roof", "From order 2048 on, every gemm runs at 85% or more of its format's gemm ceiling; at order "
    "1024 none reaches 80%.", LEVELS, _gemm_near_roof)


def _over_bound(run: Recording) -> Verdict:
    roof = _roof(run)
    points = [r for r in ok_rows(run.rows) if r["dtype"] in roof.peaks]
    over = [r for r in points if _share(roof, r) > 1]
    top = max(points, key=lambda r: _share(roof, r))
    return verdict(_share(roof, top) <= 1.1,
                   f"{len(over)} of {len(points)} points above their bound, the highest {top['op']} of order "
                   f"{top['n']:,} in {top['dtype']} at {_share(roof, top):.1%}")


OVER_BOUND = Claim(
    "over_bound", "Some recorded calls run above the bound of the roofline drawn from the ceilings, but none by more "
    "than 10%.", LEVELS, _over_bound)


def _sixteen_bit_gemm(run: Recording) -> Verdict:
    roof = _roof(run)
    shares = {d: _share(roof, r) for d in SIXTEEN_BITS for r in ok_rows(run.rows)
              if (r["op"], r["n"], r["dtype"]) == ("gemm", 4096, d)}
    if set(shares) != set(SIXTEEN_BITS):
        raise KeyError("no 16-bit gemm of order 4096")
    return verdict(all(s >= 1.03 for s in shares.values()),
                   ", ".join(f"{d} {s:.1%}" for d, s in shares.items()) + " of the ceiling's rate")


SIXTEEN_BIT_GEMM = Claim(
    "sixteen_bit_gemm", "The 16-bit gemms of order 4096 run at least 3% faster than the gemm of order 8192 that sets "
    "their ceiling.", LEVELS, _sixteen_bit_gemm)


def _blocks(run: Recording) -> tuple[Roofline, list[dict]]:
    rows = sorted(ok_rows(run.rows), key=lambda r: r["block"])
    if len(rows) < 3:
        raise KeyError("fewer than three block sizes")
    return _roof(run), rows


def _doubling(run: Recording) -> Verdict:
    roof, rows = _blocks(run)
    ridge = roof.ridge(rows[0]["dtype"])
    pairs = [(a, b) for a, b in zip(rows, rows[1:], strict=False) if b["intensity"] < ridge]
    if not pairs:
        raise KeyError("no two block sizes below the ridge")
    gains = [b["gflops"] / a["gflops"] for a, b in pairs]
    shares = [_share(roof, r) for a, b in pairs for r in (a, b)]
    return verdict(min(gains) >= 1.5, f"below the ridge ({ridge:.0f} FLOP/byte), each doubling of b gains "
                                      f"{min(gains):.2f}x to {max(gains):.2f}x, at {min(shares):.0%} to "
                                      f"{max(shares):.0%} of the sloped roof")


DOUBLING = Claim(
    "doubling", "Below the ridge point, each doubling of the block size multiplies the blocked product's rate by 1.5 "
    "or more.", BLOCKING, _doubling)


def _large_blocks(run: Recording) -> Verdict:
    roof, rows = _blocks(run)
    large = [r for r in rows if r["block"] >= 1024]
    mid = [r for r in rows if 64 <= r["block"] <= 256]
    if not large or not mid:
        raise KeyError("no blocks of 64 to 256, or none of 1024 and more")
    smaller = [_share(roof, r) for r in rows if r["block"] < 1024]
    return verdict(min(_share(roof, r) for r in large) >= 0.9 and max(_share(roof, r) for r in mid) < 0.8
                   and max(smaller) < 0.9,
                   f"blocks of 64 to 256 at {min(_share(roof, r) for r in mid):.0%} to "
                   f"{max(_share(roof, r) for r in mid):.0%} of the bound, blocks of 1,024 and more at "
                   f"{min(_share(roof, r) for r in large):.0%} to {max(_share(roof, r) for r in large):.0%}")


LARGE_BLOCKS = Claim(
    "large_blocks", "Around and past the ridge, blocks of 64 to 256 reach less than 80% of the roofline's bound; only "
    "blocks of 1,024 and more come within 10% of it.", BLOCKING, _large_blocks)
