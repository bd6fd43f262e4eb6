"""Which device this notebook runs on, and the one-line banner every chapter prints.

A chapter runs on the first CUDA GPU when there is one and falls back to the CPU otherwise.
Set ``GPULAB_DEVICE=cpu`` to force the CPU on a GPU machine (useful to compare the two).
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class DeviceInfo:
    """What the book needs to know about the device that runs the experiments."""

    kind: str  # "cuda" or "cpu"
    name: str  # "NVIDIA H100 80GB HBM3", or the CPU's model name
    memory_bytes: int | None
    multiprocessors: int | None  # SMs on a GPU; logical cores on a CPU
    compute_capability: str | None
    torch_version: str
    cuda_version: str | None
    cudnn_version: str | None
    driver_version: str | None

    @property
    def slug(self) -> str:
        """A folder name for this device's recordings, e.g. 'nvidia-h100-80gb-hbm3'."""
        return slugify(self.name)

    def as_dict(self) -> dict:
        return asdict(self)


def slugify(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def device() -> torch.device:
    """The device the experiments run on: the first CUDA GPU if present (and not disabled), else the CPU."""
    if os.environ.get("GPULAB_DEVICE", "").lower() == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def has_gpu() -> bool:
    return device().type == "cuda"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        )
        return out.stdout.strip().splitlines()[0] or None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def describe(dev: torch.device | None = None) -> DeviceInfo:
    """Describe ``dev`` (default: :func:`device`)."""
    dev = dev or device()
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        return DeviceInfo(
            kind="cuda",
            name=props.name,
            memory_bytes=int(props.total_memory),
            multiprocessors=int(props.multi_processor_count),
            compute_capability=f"{props.major}.{props.minor}",
            torch_version=torch.__version__,
            cuda_version=torch.version.cuda,
            cudnn_version=str(cudnn) if cudnn else None,
            driver_version=_driver_version(),
        )
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        memory = None
    return DeviceInfo(
        kind="cpu",
        name=_cpu_name(),
        memory_bytes=memory,
        multiprocessors=os.cpu_count(),
        compute_capability=None,
        torch_version=torch.__version__,
        cuda_version=None,
        cudnn_version=None,
        driver_version=None,
    )
