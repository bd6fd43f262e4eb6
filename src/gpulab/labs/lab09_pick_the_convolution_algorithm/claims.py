"""What lab 09's summary states from its recordings, as claims checked on every recorded GPU (gpulab.core.claims)."""

from __future__ import annotations

from gpulab.core.claims import Claim, Verdict, verdict
from gpulab.core.recordings import Recording

SIXTY_CHANNELS = "3x3, C=60"  # settings.LAYERS' layer whose channels are a multiple of 4 but not of 8


def _best(run: Recording, layer: str, dtype: str) -> dict:
    """The fastest measured setting of ``layer`` in ``dtype`` (any layout, with or without benchmark mode)."""
    rows = [r for r in run.rows if r["layer"] == layer and r["dtype"] == dtype and r.get("status") == "ok"]
    if not rows:
        raise KeyError(f"no measured {dtype} setting of the layer {layer!r}")
    return min(rows, key=lambda r: r["seconds"])


def _tf32_beats_float16(run: Recording) -> Verdict:
    tf32, half = _best(run, SIXTY_CHANNELS, "tf32"), _best(run, SIXTY_CHANNELS, "float16")
    return verdict(tf32["seconds"] < half["seconds"],
                   f"best TF32 {tf32['seconds'] * 1e6:.0f} µs ({tf32['layout']}), best float16 "
                   f"{half['seconds'] * 1e6:.0f} µs ({half['layout']}): float16 takes "
                   f"{half['seconds'] / tf32['seconds']:.2f}x the time")


TF32_BEATS_FLOAT16_AT_60_CHANNELS = Claim(
    "tf32_beats_float16_at_60_channels", "On the 3x3 layer with 60 channels in and out, the fastest TF32 setting "
    "beats the fastest float16 one.", "lab_conv_choice", _tf32_beats_float16)
