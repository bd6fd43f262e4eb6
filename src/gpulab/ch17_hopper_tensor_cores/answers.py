"""Worked answers to the exercises of chapter 17 (``notebooks/17_hopper_tensor_cores.ipynb``).

Every number is computed when the answer is shown: from the ladder's configurations
(:mod:`gpulab.kernels.triton_gemm`), the instruction shapes of the PTX manual, the FP8 formats and the quantization's
operations (:mod:`.quantization`), and the recordings of every GPU that ran the chapter. Nothing here runs an
experiment.
"""

from __future__ import annotations

import math

from gpulab.ch10_tensor_cores.wmma import MAX_SHARED_BYTES
from gpulab.ch17_hopper_tensor_cores import quantization
from gpulab.ch17_hopper_tensor_cores.quantization import config_label, measured_rows
from gpulab.core import recordings
from gpulab.core.printing import Answer
from gpulab.kernels.triton_gemm import step2_pipelined, step3_grouped

WGMMA = (64, 256, 16)  # the largest float16 wgmma tile, m x n x k, issued by a warpgroup of 4 warps
MMA_SYNC = (16, 8, 16)  # the float16 mma.sync tile, m x n x k, issued by one warp
WARPS_PER_WARPGROUP = 4
SMS = 132  # an H100 SXM's (and an H200's) streaming multiprocessors: one program of the ladder's tiles per SM
N = 8192  # the largest size of the ladder


def _recorded(experiment: str) -> list[recordings.Recording]:
    """Every GPU's newest recording of ``experiment`` (no line printed when there is none: the answer says so)."""
    return [run for run in recordings.newest_per_gpu(experiment) if run.on_gpu]


def _shared(stages: int, bm: int, bn: int, bk: int) -> int:
    return stages * (bm + bn) * bk * 2  # A's and B's tiles, 2 bytes an element, once per stage


def exercise_1() -> Answer:
    c = step2_pipelined.CONFIG
    lines = [f"Each stage holds one {c['BLOCK_M']} x {c['BLOCK_K']} tile of A and one {c['BLOCK_K']} x "
             f"{c['BLOCK_N']} tile of B, 2 bytes an element: S x (BM + BN) x BK x 2 bytes. A block may have "
             f"{MAX_SHARED_BYTES / 1024:.0f} KiB on an H100 or H200."]
    for bm, bn in ((c["BLOCK_M"], c["BLOCK_N"]), (c["BLOCK_M"], c["BLOCK_M"])):
        sizes = [(s, _shared(s, bm, bn, c["BLOCK_K"])) for s in range(1, 6)]
        lines.append(f"- {bm} x {bn} x {c['BLOCK_K']}: " + ", ".join(
            f"{s} stage{'s' if s > 1 else ''} {b / 1024:.0f} KiB{'' if b <= MAX_SHARED_BYTES else ' (too much)'}"
            for s, b in sizes) + ".")
    own = _shared(c["num_stages"], c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"])
    deepest = max(s for s in range(1, 9) if _shared(s, c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]) <= MAX_SHARED_BYTES)
    lines.append(f"Step 2's own {c['num_stages']} stages take {own / 1024:.0f} KiB, the figure the compiled kernel "
                 "reports in the table of compiled kernels (the persistent steps add a buffer for the C tile on top). "
                 f"With its tile at most {deepest} stages fit: the depth of the pipeline and the size of the tile "
                 "compete for the same memory, and a larger tile, which reuses each loaded byte more, leaves room for "
                 "fewer stages in flight.")
    return Answer("Answer to exercise 1", tuple(lines))


def _first_wave(group_m: int, tiles_m: int, tiles_n: int, programs: int) -> tuple[int, int]:
    """Distinct rows and columns of tiles that programs 0 .. programs-1 compute: step 3's grouped order (the same
    arithmetic as :func:`gpulab.kernels.triton_gemm.step3_grouped.grouped_tile`; GROUP_M = tiles_m numbers the tiles
    down each column, as step 2's 2-D grid does)."""
    rows, columns = set(), set()
    for tile in range(programs):
        per_group = group_m * tiles_n
        first = tile // per_group * group_m
        height = min(tiles_m - first, group_m)
        rows.add(first + tile % per_group % height)
        columns.add(tile % per_group // height)
    return len(rows), len(columns)


def exercise_2() -> Answer:
    c = step3_grouped.CONFIG
    tiles_m, tiles_n = N // c["BLOCK_M"], N // c["BLOCK_N"]
    a_panel, b_panel = c["BLOCK_M"] * N * 2, N * c["BLOCK_N"] * 2  # a row panel of A, a column panel of B (bytes)
    lines = [f"At {N:,}^3 with {c['BLOCK_M']} x {c['BLOCK_N']} tiles C has {tiles_m} x {tiles_n} tiles, and each "
             f"tile reads a panel of A ({a_panel / 2**20:.0f} MiB) and one of B ({b_panel / 2**20:.0f} MiB). The first "
             f"wave is the first {SMS} programs."]
    for label, group in (("step 2 (down each column of tiles)", tiles_m), (f"GROUP_M = {c['GROUP_M']}", c["GROUP_M"])):
        rows, columns = _first_wave(group, tiles_m, tiles_n, SMS)
        lines.append(f"- {label}: {rows} panels of A and {columns} of B, "
                     f"{(rows * a_panel + columns * b_panel) / 2**20:,.0f} MiB for the wave.")
    lines.append("Fewer distinct panels mean more programs sharing each one while it is in L2, so fewer bytes from "
                 "DRAM. Whether it shows in the time depends on whether DRAM was the limit:")
    found = False
    for run in _recorded("triton_gemm_ladder"):
        rows = {(r["dtype"], r["kernel"]): r for r in run.rows if r.get("n") == N}
        for dtype in dict.fromkeys(d for d, _ in rows):
            two, three = rows.get((dtype, "step2_pipelined")), rows.get((dtype, "step3_grouped"))
            if two and three:
                found = True
                lines.append(f"- {run.label}, {dtype}: step 3 ran at {three['tflops'] / two['tflops']:.2f}x step 2's "
                             "rate.")
    if not found:
        lines.append("no GPU has recorded the ladder yet; on a GPU, compare step 2 and step 3 at this size.")
    return Answer("Answer to exercise 2", tuple(lines))


def exercise_3() -> Answer:
    c = step2_pipelined.CONFIG
    warpgroups = c["num_warps"] // WARPS_PER_WARPGROUP
    m_per_group = c["BLOCK_M"] // warpgroups
    k_steps = c["BLOCK_K"] // WGMMA[2]
    hgmma = (m_per_group // WGMMA[0]) * (c["BLOCK_N"] // WGMMA[1]) * k_steps
    per_warp = c["BLOCK_M"] * c["BLOCK_N"] // c["num_warps"]  # elements of C each warp accumulates
    hmma = per_warp // (MMA_SYNC[0] * MMA_SYNC[1]) * (c["BLOCK_K"] // MMA_SYNC[2])
    lines = [f"One step of step 2's K loop multiplies a {c['BLOCK_M']} x {c['BLOCK_K']} tile of A by a "
             f"{c['BLOCK_K']} x {c['BLOCK_N']} tile of B with {c['num_warps']} warps.",
             f"- Hopper: {warpgroups} warpgroups, each owning {m_per_group} x {c['BLOCK_N']} of C. A wgmma covers "
             f"{WGMMA[0]} x {WGMMA[1]} of C and {WGMMA[2]} of K, so each warpgroup issues "
             f"{(m_per_group // WGMMA[0]) * (c['BLOCK_N'] // WGMMA[1])} per {WGMMA[2]} of K, {k_steps} along the "
             f"step's {c['BLOCK_K']}: **{hgmma} HGMMA** in the code.",
             f"- Ampere: each warp owns {per_warp:,} elements of C, {per_warp // (MMA_SYNC[0] * MMA_SYNC[1])} tiles of "
             f"{MMA_SYNC[0]} x {MMA_SYNC[1]}, each needing {c['BLOCK_K'] // MMA_SYNC[2]} mma.sync along K: "
             f"**{hmma} HMMA** per warp per step.",
             "Both are the counts of the table of compiled kernels. A warp on Hopper issues "
             f"{hmma // hgmma} times fewer tensor-core instructions, and they are asynchronous: wgmma can read its "
             "operands from shared memory itself, so the warp's issue slots stay free for the rest of the loop."]
    return Answer("Answer to exercise 3", tuple(lines))


def _e4m3_tensor(run) -> list[dict]:
    return sorted((r for r in measured_rows(run.rows) if (r["format"], r["granularity"]) == ("e4m3", "tensor")),
                  key=lambda r: r["n"])


def exercise_4() -> Answer:
    lines = ["A weight quantized once per optimizer step costs nothing per call; only the activation A is quantized "
             "in the call. A and B are the same size here, so quantizing A alone takes about half of the measured "
             "quantization: path = FP8 matmul + quantization / 2. For e4m3 with one scale per tensor:"]
    runs = _recorded("fp8_matmul")
    for run in runs:
        rows = _e4m3_tensor(run)
        estimates = [{"n": r["n"], "speedup": r["bfloat16_seconds"] / (r["fp8_seconds"] + r["quantize_seconds"] / 2)}
                     for r in rows]
        pays = quantization.pays_from(estimates, "speedup")
        lines.append(f"- {run.label}: " + ", ".join(f"n = {e['n']:,} {e['speedup']:.2f}x" for e in estimates)
                     + (f"; FP8 pays from n = {pays:,} on." if pays else "; it still does not pay in the sweep."))
    if not runs:
        lines.append("No GPU has recorded fp8_matmul yet: the estimate needs its times.")
    lines.append("Halving the casts is not enough where they run at the memory's speed and the matmul at the tensor "
                 "cores': the next exercise removes most of their bytes.")
    return Answer("Answer to exercise 4", tuple(lines))


def exercise_5() -> Answer:
    traffic = quantization.quantize_traffic()
    least = quantization.LEAST_BYTES["delayed scaling"]
    lines = [f"As written, quantizing one operand runs {traffic['operations']} operations that move "
             f"{traffic['bytes_per_element']:.0f} bytes per element (the operations table). A fused kernel with a "
             f"delayed scale reads each bfloat16 element once and writes one byte: {least} bytes, "
             f"{traffic['bytes_per_element'] / least:.0f} times fewer, and one launch instead of "
             f"{traffic['operations']}."]
    runs = _recorded("fp8_matmul")
    for run in runs:
        try:
            copy = quantization.copy_gbytes_per_s(run)
        except KeyError:
            lines.append(f"- {run.label}: no copy rate recorded on this GPU.")
            continue
        row = next((r for r in _e4m3_tensor(run) if r["n"] == N), None)
        if row is None:
            continue
        now = 2 * traffic["bytes_per_element"] * N * N / (copy * 1e9)
        fused = 2 * least * N * N / (copy * 1e9)
        speedup = row["bfloat16_seconds"] / (row["fp8_seconds"] + fused)
        lines.append(f"- {run.label}, n = {N:,}: at the copy's {copy:,.0f} GB/s the two operands' casts take at "
                     f"least {1e3 * now:.2f} ms as written (measured: {1e3 * row['quantize_seconds']:.2f} ms) and "
                     f"{1e3 * fused:.3f} ms fused; the FP8 matmul takes {1e3 * row['fp8_seconds']:.2f} ms, so the "
                     f"fused path would run at {speedup:.2f}x bfloat16, near the matmul's own "
                     f"{row['speedup_matmul']:.2f}x.")
    if not runs:
        lines.append("No GPU has recorded fp8_matmul yet: the times of the matmul are needed for the last step.")
    return Answer("Answer to exercise 5", tuple(lines))


def exercise_6() -> Answer:
    u4, u5 = (quantization.fp8.UNIT_ROUNDOFF[f] for f in ("e4m3", "e5m2"))
    model = quantization.error_ratio_model()
    lines = [f"Write each rounded element as x(1 + d) with d of standard deviation proportional to the format's unit "
             f"roundoff (e4m3 {u4:g}, e5m2 {u5:g}). An element of C is a sum of K products a b (1 + d_a + d_b), so "
             "its error is a sum of K independent terms of variance proportional to (u_A^2 + u_B^2): the relative "
             "error of C grows as sqrt(u_A^2 + u_B^2), whatever K.",
             f"e5m2 x e4m3 over e4m3 x e4m3: sqrt({u5:g}^2 + {u4:g}^2) / sqrt(2 x {u4:g}^2) = "
             f"sqrt({(u5 ** 2 + u4 ** 2) / (2 * u4 ** 2):g}) = **{model:.3f}**."]
    live = {r["format"]: r["fp8_error"] for r in quantization.error_rows(64, 64, 128, spreads=(0.0,))
            if r["granularity"] == "tensor"}
    lines.append(f"- emulated here (64 x 128 by 128 x 64): {live['e5m2 x e4m3'] / live['e4m3']:.3f}.")
    for run in _recorded("fp8_matmul"):
        rows = {(r["n"], config_label(r)): r["relative_error"] for r in measured_rows(run.rows)}
        ratios = [rows[(n, "e5m2 x e4m3, tensor-wise")] / rows[(n, "e4m3, tensor-wise")] for n, c in rows
                  if c == "e4m3, tensor-wise" and (n, "e5m2 x e4m3, tensor-wise") in rows]
        if ratios:
            lines.append(f"- {run.label}: {min(ratios):.3f} to {max(ratios):.3f} over the sizes of the sweep.")
    lines.append(f"The same argument gives e5m2 x e5m2 {u5 / u4:g} times the error of e4m3 x e4m3: "
                 f"{math.log2(u5 / u4):g} fraction bit fewer on each side. So FP8 training takes e5m2 only where its "
                 "range is needed, for the gradients, and keeps e4m3 for the weights and activations.")
    return Answer("Answer to exercise 6", tuple(lines))
