"""The lines every chapter prints first: what runs this notebook, what that means for the numbers on the
page, and where its kernels run.
"""

from __future__ import annotations

from gpulab.core import kernel_mode
from gpulab.core.env import DeviceInfo, describe


def banner(info: DeviceInfo | None = None) -> str:
    """What runs this notebook (first line), what that means for the numbers on the page (second), and
    where its kernels run (third, from :func:`gpulab.core.kernel_mode.describe`)."""

    info = info or describe()
    if info.kind == "cuda":
        gib = info.memory_bytes / 2**30 if info.memory_bytes else float("nan")
        return (
            f"GPU: {info.name} ({info.multiprocessors} SMs, {gib:.0f} GiB, compute capability "
            f"{info.compute_capability}), torch {info.torch_version}, CUDA {info.cuda_version}\n"
            "Experiments run live on this GPU, with the recorded GPU runs drawn beside them.\n"
            f"{kernel_mode.describe()}"
        )
    return (
        f"CPU - no CUDA device ({info.name}, torch {info.torch_version})\n"
        "Experiments run small, on this CPU; GPU figures are drawn from recordings, labelled with their GPU and date.\n"
        f"{kernel_mode.describe()}"
    )
