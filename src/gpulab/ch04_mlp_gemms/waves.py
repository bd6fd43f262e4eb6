"""Tile and wave quantization of a GEMM: how many output tiles a GEMM's shape makes, how many waves of them
the SMs run, and the steps in time this predicts as a size grows (compared with measured drops).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpulab.core.sweep import ok_rows
from gpulab.core.validation import positive_int


@dataclass(frozen=True)
class TileWaves:
    """How an M x N output is cut into tiles, and the tiles into waves over the SMs.

    Each tile is one thread block; each SM runs one at a time (the model of NVIDIA's matmul guide).
    On Hopper a *cluster* of thread blocks can share one larger tile across ``cluster`` SMs: the
    waves are then counted in clusters, ``sms // cluster`` of them side by side.
    """

    m: int
    n: int
    tile_m: int
    tile_n: int
    sms: int
    cluster: int = 1

    @property
    def slots(self) -> int:
        """How many tiles run at once: one per SM, or one per cluster of SMs."""
        return self.sms // self.cluster

    @property
    def tiles(self) -> int:
        return math.ceil(self.m / self.tile_m) * math.ceil(self.n / self.tile_n)

    @property
    def waves(self) -> int:
        return math.ceil(self.tiles / self.slots)

    @property
    def tile_efficiency(self) -> float:
        """Useful outputs over computed ones: below 1 when a dimension is not a multiple of the tile."""
        return self.m * self.n / (self.tiles * self.tile_m * self.tile_n)

    @property
    def wave_efficiency(self) -> float:
        """Busy SM-slots over all slots of all waves: below 1 when the last wave is partly empty."""
        return self.tiles / (self.waves * self.slots)

    @property
    def efficiency(self) -> float:
        """The share of the GPU's peak the model allows: the useful work over waves x SMs x tile."""
        return self.tile_efficiency * self.wave_efficiency


# Tile models the chapter's figures offer: (tile_m, tile_n, SMs per tile). cuBLAS picks its tile per shape.
TILE_MODELS = ((128, 128, 1), (256, 128, 2), (128, 256, 1))


def tile_label(tile: Sequence[int]) -> str:
    """'128x128 per SM' or '256x128 per 2-SM cluster'."""
    tile_m, tile_n, cluster = _tile(tile)
    return f"{tile_m}x{tile_n} per SM" if cluster == 1 else f"{tile_m}x{tile_n} per {cluster}-SM cluster"


def _tile(tile: Sequence[int]) -> tuple[int, int, int]:
    if isinstance(tile, str | bytes) or len(tile) not in (2, 3):
        raise ValueError(f"tile: expected (tile_m, tile_n) or (tile_m, tile_n, SMs per tile), got {tile!r}")
    tile_m, tile_n, *cluster = (positive_int("tile", t) for t in tile)
    return tile_m, tile_n, cluster[0] if cluster else 1


def tile_waves(m: int, n: int, tile: Sequence[int] = (128, 128), sms: int = 132) -> TileWaves:
    """The tile/wave model of an output of M x N (NVIDIA's terms: for a linear layer's forward GEMM, M = outputs
    and N = batch), computed in tiles of ``tile`` = (tile_m, tile_n[, SMs per tile]) on ``sms`` SMs."""
    tile_m, tile_n, cluster = _tile(tile)
    sms = positive_int("sms", sms)
    if cluster > sms:
        raise ValueError(f"tile: a tile spread over {cluster} SMs needs at least that many, the device has {sms}")
    return TileWaves(positive_int("m", m), positive_int("n", n), tile_m, tile_n, sms, cluster)


def wave_steps(lo: int, hi: int, fixed: int, *, vary: str, tile: Sequence[int] = (128, 128),
               sms: int = 132) -> list[int]:
    """The sizes in (lo, hi] at which one more wave starts, as ``vary`` ('m' or 'n') grows with the other fixed.

    Each is the first size whose tiles no longer fit in the waves of the size before: a step down in rate.
    """
    if vary not in ("m", "n"):
        raise ValueError(f"vary: must be 'm' or 'n', got {vary!r}")
    lo, hi, fixed = positive_int("lo", lo), positive_int("hi", hi), positive_int("fixed", fixed)

    def waves(x):
        return tile_waves(x, fixed, tile, sms).waves if vary == "m" else tile_waves(fixed, x, tile, sms).waves

    return [x for x in range(lo + 1, hi + 1) if waves(x) > waves(x - 1)]


def measured_drops(rows: Sequence[dict], x: str, threshold: float = 0.04) -> list[dict]:
    """Where a measured rate falls, per dtype: each point more than ``threshold`` (a fraction) below the one before."""
    drops = []
    good = ok_rows(rows)
    for dtype in dict.fromkeys(r["dtype"] for r in good):
        series = sorted((r for r in good if r["dtype"] == dtype), key=lambda r: r[x])
        for before, after in zip(series, series[1:], strict=False):
            if after["tflops"] < (1 - threshold) * before["tflops"]:
                drops.append({"dtype": dtype, x: after[x], "from": before[x],
                              "drop": 1 - after["tflops"] / before["tflops"]})
    return drops


def step_agreement(rows: Sequence[dict], x: str, *, vary: str, tile: Sequence[int], sms: int,
                   threshold: float = 0.04) -> list[dict]:
    """Per dtype: how many of the model's wave steps show as a measured drop, and how many drops it explains.

    A predicted step at s is *seen* if the rate falls by more than ``threshold`` between the last
    measured size below s and the first at or above it.
    """
    good = ok_rows(rows)
    summary = []
    for dtype in dict.fromkeys(r["dtype"] for r in good):
        series = sorted((r for r in good if r["dtype"] == dtype), key=lambda r: r[x])
        fixed = series[0]["N"] if vary == "m" else series[0]["M"]
        steps = wave_steps(series[0][x], series[-1][x], fixed, vary=vary, tile=tile, sms=sms)
        drops = {d[x] for d in measured_drops(series, x, threshold)}
        seen = [s for s in steps if min(r[x] for r in series if r[x] >= s) in drops]
        summary.append({"dtype": dtype, "tile": tile_label(tile), "predicted": len(steps), "seen": len(seen),
                        "drops": len(drops), "explained": len(seen) / len(drops) if drops else 0.0,
                        "steps": steps})
    return summary


def predicted_rows(rows: Sequence[dict], x: str, *, tile: Sequence[int], sms: int) -> list[dict]:
    """The tile/wave model's rate at each measured point, per dtype, scaled to that dtype's best measured rate.

    The model predicts the *shape* (the share of the peak the quantization leaves), not the height.
    """
    good = ok_rows(rows)
    predictions = []
    for dtype in dict.fromkeys(r["dtype"] for r in good):
        series = [r for r in good if r["dtype"] == dtype]
        models = [tile_waves(r["M"], r["N"], tile, sms) for r in series]
        best = max(range(len(series)), key=lambda j: series[j]["tflops"])
        scale = series[best]["tflops"] / models[best].efficiency  # the model meets the best measurement
        for r, model in zip(series, models, strict=True):
            predictions.append({x: r[x], "tflops": scale * model.efficiency, "dtype": dtype, "tiles": model.tiles,
                                "waves": model.waves, "efficiency": model.efficiency})
    return predictions
