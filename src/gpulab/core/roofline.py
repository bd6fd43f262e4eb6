"""The roofline model: attainable rate = min(peak compute, bandwidth x arithmetic intensity).

Both ceilings come from measurements on the device (see :func:`gpulab.core.rates.ceilings`), not from a
datasheet, so the model describes the machine the reader actually has.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpulab.core.sweep import ok_rows


@dataclass(frozen=True)
class Roofline:
    """Measured ceilings of one device."""

    device_name: str
    bandwidth: float  # bytes per second
    peaks: dict[str, float]  # dtype name -> FLOP per second

    @classmethod
    def from_rows(cls, rows: Iterable[dict], device_name: str) -> Roofline:
        """Build from the rows of :func:`gpulab.core.rates.ceilings`."""
        rows = ok_rows(rows)
        bandwidth = [r["gbytes_per_s"] * 1e9 for r in rows if r["ceiling"] == "bandwidth"]
        if not bandwidth:
            raise ValueError("rows: no successful bandwidth measurement among the ceilings")
        peaks = {r["dtype"]: r["gflops"] * 1e9 for r in rows if r["ceiling"] == "compute"}
        return cls(device_name, max(bandwidth), peaks)

    def peak(self, dtype: str) -> float:
        if dtype not in self.peaks:
            raise ValueError(f"dtype: no measured peak for {dtype!r} on {self.device_name}; "
                             f"measured: {', '.join(self.peaks)}")
        return self.peaks[dtype]

    def attainable(self, intensity: float, dtype: str) -> float:
        """The highest FLOP/s an operation of ``intensity`` FLOP/byte can reach here."""
        if intensity <= 0:
            raise ValueError(f"intensity: must be > 0, got {intensity}")
        return min(self.peak(dtype), self.bandwidth * intensity)

    def ridge(self, dtype: str) -> float:
        """The intensity (FLOP/byte) where the bandwidth roof meets the compute roof: the machine balance."""
        return self.peak(dtype) / self.bandwidth

    def bound(self, intensity: float, dtype: str) -> str:
        return "memory-bound" if intensity < self.ridge(dtype) else "compute-bound"
