"""What chapter 14 states about batched GEMM and LU factorisations, as claims checked on every recorded GPU
(:mod:`gpulab.core.claims`)."""

from __future__ import annotations

from gpulab.ch14_batched_linear_algebra import batched
from gpulab.core import flops, roofline, specs
from gpulab.core.claims import Claim, Verdict, same_gpu, verdict
from gpulab.core.precision import FORMATS
from gpulab.core.recordings import Recording
from gpulab.core.sweep import ok_rows

GEMM = "batched_gemm"
LU = "batched_lu"
SMALL_LU = "batched_small_lu"
TARGET_N, TARGET_FACTOR = 64, 20


def _pick(run: Recording) -> dict[tuple, dict]:
    """(method, dtype, batch, n) -> row, for the runs of :func:`.batched.gemm_sweep` and
    :func:`.batched.small_lu_sweep`."""
    return {(r["method"], r["dtype"], r["batch"], r["n"]): r for r in ok_rows(run.rows)}


def _axes(run: Recording) -> tuple[list[str], list[int], list[int]]:
    rows = ok_rows(run.rows)
    return (list(dict.fromkeys(r["dtype"] for r in rows)), sorted({r["batch"] for r in rows}),
            sorted({r["n"] for r in rows}))


def _gain(pick: dict, method: str, dtype: str, batch: int, n: int) -> float:
    return pick["loop", dtype, batch, n]["seconds"] / pick[method, dtype, batch, n]["seconds"]


def _bmm_target(run: Recording) -> Verdict:
    pick, (dtypes, batches, _) = _pick(run), _axes(run)
    gains = {(d, b): _gain(pick, "bmm", d, b, TARGET_N) for d in dtypes for b in batches}
    (d, b), low = min(gains.items(), key=lambda item: item[1])
    return verdict(low >= TARGET_FACTOR, f"the smallest ratio at n = {TARGET_N}: {low:,.0f}x ({d}, batch of {b:,})")


BMM_TARGET = Claim(
    "bmm_target", f"At n = {TARGET_N}, `torch.bmm` beats the loop by at least the target's {TARGET_FACTOR}x in every "
    "format and at every batch count measured.", GEMM, _bmm_target)


def _loop_launches(run: Recording) -> Verdict:
    pick, (dtypes, batches, sizes) = _pick(run), _axes(run)
    growth = {(d, b): pick["loop", d, b, sizes[-1]]["seconds"] / pick["loop", d, b, sizes[0]]["seconds"]
              for d in dtypes for b in batches}
    (d, b), most = max(growth.items(), key=lambda item: item[1])
    return verdict(most < 3, f"from n = {sizes[0]} to n = {sizes[-1]} ({(sizes[-1] / sizes[0]) ** 3:,.0f}x the "
                   f"arithmetic) the loop's time grew at most {most:.2f}x ({d}, batch of {b:,})")


LOOP_LAUNCHES = Claim(
    "loop_launches", "The loop measures its launches: from the smallest order to the largest its time grows less than "
    "threefold, in every format and batch count, while its arithmetic grows by a factor of tens of thousands.",
    GEMM, _loop_launches)


def _bmm_shrinks(run: Recording) -> Verdict:
    pick, (_, batches, sizes) = _pick(run), _axes(run)
    first, last = (_gain(pick, "bmm", "float32", batches[-1], n) for n in (sizes[0], sizes[-1]))
    return verdict(last < first / 10, f"float32, batch of {batches[-1]:,}: {first:,.0f}x at n = {sizes[0]}, "
                   f"{last:,.0f}x at n = {sizes[-1]}")


BMM_SHRINKS = Claim(
    "bmm_shrinks", "`torch.bmm`'s speed-up over the loop is largest at the smallest orders: at the largest order it "
    "is less than a tenth of what it is at the smallest.", GEMM, _bmm_shrinks)


def _batch_fills(run: Recording) -> Verdict:
    pick, (dtypes, batches, _) = _pick(run), _axes(run)
    rates = {d: [pick["bmm", d, b, TARGET_N]["gflops"] for b in batches] for d in dtypes}
    holds = all(all(a < b for a, b in zip(r, r[1:], strict=False)) and r[-1] >= 3 * r[0] for r in rates.values())
    return verdict(holds, "; ".join(f"{d} {r[0]:,.0f} to {r[-1]:,.0f} GFLOP/s" for d, r in rates.items())
                   + f" (batches of {batches[0]:,} to {batches[-1]:,})")


BATCH_FILLS = Claim(
    "batch_fills", f"At n = {TARGET_N}, `torch.bmm`'s rate grows with every larger batch, in every format, and the "
    "largest batch runs at least three times the rate of the smallest.", GEMM, _batch_fills)


def _tall_ratios(run: Recording, dtype: str, batches: list[int] | None = None) -> list[float]:
    pick, (_, all_batches, sizes) = _pick(run), _axes(run)
    return [pick["bmm", dtype, b, n]["seconds"] / pick["one_gemm", dtype, b, n]["seconds"]
            for b in batches or all_batches for n in sizes]


def _tall_near_bmm(run: Recording) -> Verdict:
    ratios = {d: _tall_ratios(run, d) for d in ("float32", "tf32")}
    holds = all(0.5 <= r <= 2 for rs in ratios.values() for r in rs)
    return verdict(holds, "; ".join(f"{d}: {min(r):.2f} to {max(r):.2f}" for d, r in ratios.items())
                   + " (bmm's time / the tall GEMM's)")


TALL_NEAR_BMM = Claim(
    "tall_near_bmm", "In float32 and TF32 the one tall GEMM and `torch.bmm` never took more than twice each other's "
    "time, at any order or batch count.", GEMM, _tall_near_bmm)


def _tall_wins_float16(run: Recording) -> Verdict:
    _, batches, _ = _axes(run)
    ratios = _tall_ratios(run, "float16", [b for b in batches if b >= 300])
    return verdict(min(ratios) > 1, f"float16, batches of 300 or more: {min(ratios):.2f} to {max(ratios):.2f}")


TALL_WINS_FLOAT16 = Claim(
    "tall_wins_float16", "in float16, with batches of 300 or more, the tall GEMM was faster than `torch.bmm` at every "
    "order.", GEMM, _tall_wins_float16, scoped=True)


def _lu_rates(run: Recording) -> dict[tuple[str, str, int], dict]:
    return {(r["device"], r["dtype"], r["n"]): r for r in ok_rows(run.rows)}


def _common(rates: dict, dtype: str) -> list[int]:
    return sorted(n for d, t, n in rates if (d, t) == ("cuda", dtype) and ("cpu", dtype, n) in rates)


def _lu_gpu_every_order(run: Recording) -> Verdict:
    rates, said, holds = _lu_rates(run), [], True
    for dtype in batched.LU_DTYPES:
        ratio = [rates["cuda", dtype, n]["gflops"] / rates["cpu", dtype, n]["gflops"] for n in _common(rates, dtype)]
        holds &= min(ratio) > 1
        said.append(f"{dtype}: {min(ratio):.2f}x to {max(ratio):.1f}x the CPU")
    return verdict(holds, "; ".join(said))


LU_GPU_EVERY_ORDER = Claim(
    "lu_gpu_every_order", "the GPU factorised faster than its host CPU at every order both measured, in both "
    "precisions.", LU, _lu_gpu_every_order, scoped=True)


def _lu_gpu_large(run: Recording) -> Verdict:
    rates, said, holds = _lu_rates(run), [], True
    for dtype in batched.LU_DTYPES:
        n = _common(rates, dtype)[-1]
        ratio = rates["cuda", dtype, n]["gflops"] / rates["cpu", dtype, n]["gflops"]
        holds &= ratio >= 5
        said.append(f"{dtype} at n = {n:,}: {ratio:.1f}x")
    return verdict(holds, "; ".join(said))


LU_GPU_LARGE = Claim(
    "lu_gpu_large", "At the largest order both processors factorised, the GPU was at least five times as fast as its "
    "host CPU, in both precisions: there the trailing GEMMs take most of the time.", LU, _lu_gpu_large)


def _lu_climbing(run: Recording) -> Verdict:
    gpu = specs.find(run.device_name)
    if gpu is None:
        raise KeyError(f"{run.device_name} is not in gpulab.core.specs")
    rates, said, holds = _lu_rates(run), [], True
    for dtype in batched.LU_DTYPES:
        sizes = sorted(n for d, t, n in rates if (d, t) == ("cuda", dtype))
        last, before = rates["cuda", dtype, sizes[-1]]["gflops"], rates["cuda", dtype, sizes[-2]]["gflops"]
        share = last / 1e3 / specs.peak(gpu, dtype).tflops
        holds &= last > 1.1 * before and share < 1
        said.append(f"{dtype} {last / before - 1:+.0%} from n = {sizes[-2]:,} to {sizes[-1]:,}, "
                    f"{share:.0%} of the peak")
    return verdict(holds, "; ".join(said))


LU_CLIMBING = Claim(
    "lu_climbing", "The GPU's rate was still climbing at the largest order, by more than 10% over the order before, "
    "and below the datasheet peak: a larger matrix would come closer to it.", LU, _lu_climbing)


def _lu_accurate(run: Recording) -> Verdict:
    worst = {}
    for r in ok_rows(run.rows):
        error = r["backward_error"] / FORMATS[r["dtype"]].unit_roundoff
        key = f"{r['dtype']} on the {'GPU' if r['device'] == 'cuda' else 'CPU'}"
        worst[key] = max(worst.get(key, 0.0), error)
    return verdict(max(worst.values()) < 0.1 and len(worst) == 4,
                   "the largest: " + ", ".join(f"{k} {v:.3f} u" for k, v in worst.items()))


LU_ACCURATE = Claim(
    "lu_accurate", f"Every backward error was below a tenth of the unit roundoff $u$, on both processors and in both "
    f"precisions: hundreds of times below MAGMA's test of {batched.TOLERANCE_FACTOR} u.", LU, _lu_accurate)


def _lu_precisions(run: Recording, device: str) -> tuple[int, float]:
    rates = _lu_rates(run)
    n = max(n for d, t, n in rates if (d, t) == (device, "float32") and (device, "float64", n) in rates)
    return n, rates[device, "float32", n]["gflops"] / rates[device, "float64", n]["gflops"]


def _gpu_precisions(run: Recording) -> Verdict:
    n, ratio = _lu_precisions(run, "cuda")
    return verdict(ratio < 1.25, f"float32 over float64 at n = {n:,}: {ratio:.2f}x")


GPU_PRECISIONS = Claim(
    "gpu_precisions", "On the GPU, float32 factorised less than 1.25 times as fast as float64 at the largest order: "
    "its float64 tensor cores have the peak of its float32 CUDA cores.", LU, _gpu_precisions)


def _cpu_precisions(run: Recording) -> Verdict:
    n, ratio = _lu_precisions(run, "cpu")
    return verdict(ratio >= 1.5, f"float32 over float64 on the CPU at n = {n:,}: {ratio:.2f}x")


CPU_PRECISIONS = Claim(
    "cpu_precisions", "on the host CPU, float32 factorised at least one and a half times as fast as float64 at the "
    "largest order both ran.", LU, _cpu_precisions, scoped=True)


def _small_lu_batched(run: Recording) -> Verdict:
    pick, (dtypes, batches, sizes) = _pick(run), _axes(run)
    said, holds = [], True
    for dtype in dtypes:
        gains = [_gain(pick, "batched", dtype, batches[-1], n) for n in sizes]
        holds &= gains[0] >= 1000 and min(gains) >= 10
        said.append(f"{dtype}: {gains[0]:,.0f}x at n = {sizes[0]}, at least {min(gains):,.0f}x")
    return verdict(holds, "; ".join(said) + f" (batch of {batches[-1]:,})")


SMALL_LU_BATCHED = Claim(
    "small_lu_batched", "One batched call beat the loop of factorisations by a thousand times or more at the smallest "
    "order and by at least ten times at every order, in both precisions.", SMALL_LU, _small_lu_batched)


def _small_lu_far(run: Recording) -> Verdict:
    gpu = specs.find(run.device_name)
    if gpu is None:
        raise KeyError(f"{run.device_name} is not in gpulab.core.specs")
    pick, (dtypes, batches, sizes) = _pick(run), _axes(run)
    large = _lu_rates(same_gpu(run, LU))
    said, holds = [], True
    for dtype in dtypes:
        n = sizes[-1]
        rate = pick["batched", dtype, batches[-1], n]["gflops"]
        ceilings = roofline.Roofline(gpu.name, gpu.bandwidth_gb_s * 1e9, {dtype: specs.peak_tflops(gpu, dtype) * 1e12})
        bound = ceilings.attainable(batched.lu_flops(n) / (2 * n * n * flops.bytes_per_element(dtype)), dtype) / 1e9
        top = max(r["gflops"] for (d, t, _), r in large.items() if (d, t) == ("cuda", dtype))
        holds &= rate < 0.1 * bound and rate < 0.25 * top
        said.append(f"{dtype}: {rate / bound:.1%} of the roofline bound, {rate / top:.0%} of the large getrf's best")
    return verdict(holds, "; ".join(said))


SMALL_LU_FAR = Claim(
    "small_lu_far", "At the largest order the batched factorisations ran at less than a tenth of the roofline bound "
    "and less than a quarter of the large factorisation's best rate: bandwidth is not what limits them.", SMALL_LU,
    _small_lu_far)


def _lu_loop_slower(run: Recording) -> Verdict:
    lu, gemm = _pick(run), _pick(same_gpu(run, GEMM))
    batch = max(b for _, _, b, _ in lu)
    sizes = sorted(n for m, d, b, n in lu if (m, d, b) == ("loop", "float32", batch) and ("loop", d, b, n) in gemm)
    ratios = [lu["loop", "float32", batch, n]["seconds"] / gemm["loop", "float32", batch, n]["seconds"] for n in sizes]
    return verdict(min(ratios) >= 2, f"float32, batch of {batch:,}: one factorisation in the loop took "
                   f"{min(ratios):.1f}x to {max(ratios):.1f}x the time of one product in the GEMM loop")


LU_LOOP_SLOWER = Claim(
    "lu_loop_slower", "In a loop, one small factorisation takes at least twice as long as one small GEMM of the same "
    "order: it is several dependent steps, and several kernels.", SMALL_LU, _lu_loop_slower)
