"""What clock the GPU really ran at: nvidia-smi sampled in the background while work runs.

Datasheet peaks assume the boost clock. Under a heavy load a GPU lowers its clock to stay within its
power and temperature limits, and a measured rate can only be judged against the clock it ran at.
``nvidia-smi`` reports the current SM clock, the power draw and the temperature; sampling it every
few tens of milliseconds while a kernel loop runs gives the clock that loop saw.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

FIELDS = ("clocks.sm", "power.draw", "temperature.gpu")


@dataclass
class ClockLog:
    """Samples of SM clock (MHz), power (W) and temperature (C); empty where nvidia-smi is not available."""

    sm_mhz: list[float] = field(default_factory=list)
    power_w: list[float] = field(default_factory=list)
    temperature_c: list[float] = field(default_factory=list)

    def median(self, series: str) -> float | None:
        values = getattr(self, series)
        return statistics.median(values) if values else None

    def parse(self, text: str) -> None:
        for line in text.splitlines():
            parts = [p.strip() for p in line.split(",")]
            try:
                clock, power, temperature = (float(p) for p in parts)
            except ValueError:  # a header, an '[N/A]' field or a line cut short when sampling stopped
                continue
            self.sm_mhz.append(clock)
            self.power_w.append(power)
            self.temperature_c.append(temperature)


def _gpu_selector(device: torch.device) -> str:
    """nvidia-smi's -i argument for ``device``: its UUID, which survives CUDA_VISIBLE_DEVICES renumbering."""
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    return f"GPU-{uuid}" if uuid else str(device.index or 0)


@contextmanager
def sampled(device: torch.device, interval_ms: int = 20) -> Iterator[ClockLog]:
    """Within the block, sample ``device``'s clock, power and temperature every ``interval_ms``.

    The log fills when the block ends. On a CPU, or without nvidia-smi, it stays empty.
    """
    log = ClockLog()
    if device.type != "cuda" or shutil.which("nvidia-smi") is None:
        yield log
        return
    command = ["nvidia-smi", "-i", _gpu_selector(device), f"--query-gpu={','.join(FIELDS)}",
               "--format=csv,noheader,nounits", f"-lms={interval_ms}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        yield log
    finally:
        process.terminate()
        try:
            out, _ = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
        log.parse(out)
